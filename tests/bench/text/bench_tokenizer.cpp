// Tokenizer speed: encoding the whole Jane Austen corpus with a BPE model trained on it, our
// encoder (encode_parallel: 16 KiB pieces on every core, and on one) against Debian's spm_encode
// (the SentencePiece CLI, one thread, one line at a time) on the same model and the same text, in
// the same run. Both encode line by line, so the token ids must be the same (ours has one more
// token per line break, "<nl>", which is not counted). One JSON line per measurement, medians of 3.
//
// usage: bench_tokenizer [VOCAB]   (default 1024)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/prepare.hpp"
#include "topolaunch/kernels/tokenizer.hpp"

using namespace topolaunch::kernels;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_tokenizer: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t vocab = argc > 1 ? std::atoll(argv[1]) : 1024;
  if (!have_sentencepiece()) die(without_sentencepiece());
  auto text = decode_r_lazyload_text(topolaunch::jobspec::kJaneAustenRdb);
  if (!text) die(text.error().message);
  const fs::path dir =
      fs::temp_directory_path() / ("tl-bench-tokenizer-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string corpus = (dir / "austen.txt").string(), model = (dir / "m.model").string();
  std::ofstream(corpus, std::ios::binary) << *text;
  std::vector<std::string_view> lines;
  for (std::string_view rest = *text; !rest.empty();) {
    const auto nl = rest.find('\n');
    lines.push_back(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  TokenizerTraining training;
  training.vocab_size = vocab;
  auto tokenizer = Tokenizer::train(lines, training, model);
  if (!tokenizer) die(tokenizer.error().message);

  // spm_encode's ids, and its time (the process: reading the model, encoding, writing the ids).
  const std::string ids_path = (dir / "spm.ids").string();
  const std::string command =
      "spm_encode --model=" + model + " --output_format=id < " + corpus + " > " + ids_path;
  std::vector<double> peer_s;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    if (std::system(command.c_str()) != 0) die("spm_encode failed (apt-get install sentencepiece)");
    peer_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::vector<std::int32_t> peer_ids;
  {
    std::ifstream in(ids_path);
    for (std::int32_t id; in >> id;) peer_ids.push_back(id);
  }

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {cores, 1}) {
    std::vector<double> ours_s;
    std::vector<std::int32_t> ours;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      ours = encode_parallel(*tokenizer, *text, threads);
      ours_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::vector<std::int32_t> without_newlines;
    for (auto t : ours)
      if (t != tokenizer->newline_id()) without_newlines.push_back(t);
    const double n = static_cast<double>(without_newlines.size());
    const double ours_rate = n / median(ours_s), peer_rate = n / median(peer_s);
    std::printf(
        "{\"bench\":\"tokenizer_encode\",\"corpus\":\"janeaustenr\",\"bytes\":%zu,\"vocab\":%lld,"
        "\"model\":\"bpe\",\"threads\":%d,\"tokens\":%zu,\"ours_s\":%.4f,\"ours_tokens_per_s\":%."
        "0f,"
        "\"peer\":\"spm_encode (sentencepiece 0.1.97, 1 thread, process incl. model load and "
        "output)\",\"peer_s\":%.4f,\"peer_tokens_per_s\":%.0f,\"ratio\":%.3f,"
        "\"same_ids\":%s}\n",
        text->size(), static_cast<long long>(vocab), threads, without_newlines.size(),
        median(ours_s), ours_rate, median(peer_s), peer_rate, ours_rate / peer_rate,
        without_newlines == peer_ids ? "true" : "false");
  }
  fs::remove_all(dir);
  return 0;
}
