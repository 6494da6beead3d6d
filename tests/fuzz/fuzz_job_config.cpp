// The job file as every reader parses it: jobspec::parse_job_config, the guard against toml++
// 3.3's known crashes included, in this process (no isolated child), so a new crash shape of the
// library is found here rather than absorbed by the isolation. Input: the TOML text (NUL bytes
// and all, as a file may hold them), optionally followed by two NULs and NUL-separated `--set`
// overrides ("<toml>\0\0train.steps=3\0job.name=x").
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "topolaunch/jobspec/job_config.hpp"

using namespace topolaunch;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto split = input.find(std::string_view("\0\0", 2));
  const std::string_view text = input.substr(0, split);
  jobspec::Overrides overrides;
  if (split != std::string_view::npos) {
    std::string_view rest = input.substr(split + 2);
    while (!rest.empty() || overrides.empty()) {
      const auto next = rest.find('\0');
      overrides.emplace_back(rest.substr(0, next));
      if (next == std::string_view::npos) break;
      rest.remove_prefix(next + 1);
    }
  }
  auto config = jobspec::parse_job_config(text, "fuzz.toml", overrides);
  if (!config) {
    fuzz::require(config.error().exit_code == 2, "a refused job file must exit 2",
                  config.error().message);
    fuzz::require_one_line(config.error().message);
    return 0;
  }
  // What `topolaunch check` prints of an accepted file.
  const std::string summary = jobspec::describe(*config);
  fuzz::require(!summary.empty(), "empty summary of an accepted job file");
  return 0;
}
