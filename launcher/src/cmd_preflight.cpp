// PLACEHOLDER for the rdma owner: replace this file with the real `preflight` subcommand.
// (Kept so the program links before the preflight lands.)
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.hpp"

namespace topolaunch::launcher {

void register_preflight_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("preflight", "check the RDMA fabric between the job's nodes");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    std::fprintf(stderr, "topolaunch preflight: not implemented yet\n");
    exit_code = 2;
  });
}

}  // namespace topolaunch::launcher
