// safetensors files, [train] init_from's model.safetensors: kernels::read_safetensors(path). An
// accepted file's tensors each hold as many values as their shape says.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_check.hpp"
#include "topolaunch/kernels/interchange.hpp"

using namespace topolaunch;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
           "/topolaunch-fuzz-safetensors." + std::to_string(::getpid()) + ".safetensors";
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  fuzz::require(f != nullptr, "cannot write the scratch file", path);
  fuzz::require(std::fwrite(data, 1, size, f) == size && std::fclose(f) == 0,
                "cannot write the scratch file", path);
  auto read = kernels::read_safetensors(path);
  ::unlink(path.c_str());
  if (!read) {
    fuzz::require_one_line(read.error().message);
    return 0;
  }
  for (const auto& t : *read) {
    std::uint64_t elements = 1;
    for (auto d : t.shape) elements *= static_cast<std::uint64_t>(d);
    fuzz::require(elements == t.values.size(), "a tensor whose values are not its shape's", t.name);
  }
  return 0;
}
