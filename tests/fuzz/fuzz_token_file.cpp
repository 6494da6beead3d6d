// GPT-2 tokens in llm.c's .bin layout, [data] kind = "tokens": kernels::load_token_file(path).
// An accepted file's tokens are all below its vocabulary size.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_check.hpp"
#include "topolaunch/kernels/data.hpp"

using namespace topolaunch;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/topolaunch-fuzz-tokens." +
           std::to_string(::getpid()) + ".bin";
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  fuzz::require(f != nullptr, "cannot write the scratch file", path);
  fuzz::require(std::fwrite(data, 1, size, f) == size && std::fclose(f) == 0,
                "cannot write the scratch file", path);
  auto loaded = kernels::load_token_file(path);
  ::unlink(path.c_str());
  if (!loaded) {
    fuzz::require_one_line(loaded.error().message);
    return 0;
  }
  fuzz::require(loaded->vocab_size > 0, "an accepted token file without a vocabulary");
  for (auto t : loaded->tokens)
    fuzz::require(t >= 0 && t < loaded->vocab_size, "a token outside the vocabulary");
  return 0;
}
