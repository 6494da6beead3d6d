// `topolaunch check job.toml`: validate a job config without running anything.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.hpp"
#include "topolaunch/jobspec/job_config.hpp"

namespace topolaunch::launcher {

void register_check_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("check", "validate a job config without running anything");
  auto path = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option("config", *path, "the job config (TOML)")->required();
  cmd->add_flag("-q,--quiet", *quiet, "print nothing when the config is valid");
  cmd->callback([path, quiet, &exit_code] {
    auto config = jobspec::load_job_config(*path);
    if (!config) {
      std::fprintf(stderr, "topolaunch: %s\n", config.error().message.c_str());
      exit_code = config.error().exit_code;
      return;
    }
    if (!*quiet) std::printf("%s%s: ok\n", describe(*config).c_str(), path->c_str());
    exit_code = 0;
  });
}

}  // namespace topolaunch::launcher
