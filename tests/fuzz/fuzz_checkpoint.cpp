// The worker's resume reads a checkpoint file that may be torn, corrupt or foreign:
// kernels::load_checkpoint(path, graph, write) against a tiny MLP's training graph
// (tiny_model.hpp). Nothing may reach `write` unless the whole file checked out, and then exactly
// the layout's entries, each of its size.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_check.hpp"
#include "tiny_model.hpp"
#include "topolaunch/kernels/checkpoint.hpp"

using namespace topolaunch;
using namespace topolaunch::kernels;

namespace {

const Graph& tiny_graph() {
  static const Graph graph = fuzz::tiny_training_graph();
  return graph;
}

std::string scratch_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/topolaunch-fuzz-ckpt." +
         std::to_string(::getpid());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = scratch_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  fuzz::require(f != nullptr, "cannot write the scratch file", path);
  fuzz::require(std::fwrite(data, 1, size, f) == size && std::fclose(f) == 0,
                "cannot write the scratch file", path);
  const Graph& g = tiny_graph();
  const auto layout = checkpoint_layout(g);
  std::size_t written = 0;
  auto loaded = load_checkpoint(path, g, [&](const CheckpointEntry& e, std::span<const float> v) {
    fuzz::require(
        written < layout.size() && e.name == layout[written].name && v.size() == e.elements,
        "load_checkpoint wrote an entry out of the layout", e.name);
    ++written;
    return ok_status();
  });
  ::unlink(path.c_str());
  if (!loaded) {
    fuzz::require(written == 0, "a refused checkpoint reached the model");
    fuzz::require_one_line(loaded.error().message);
  } else {
    fuzz::require(written == layout.size(), "an accepted checkpoint left entries unwritten");
  }
  return 0;
}
