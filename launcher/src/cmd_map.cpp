// PLACEHOLDER for the rank mapping owner: replace this file with the real `map` subcommand.
// (Kept so the program links before rank mapping lands.)
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.hpp"

namespace topolaunch::launcher {

void register_map_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("map", "show the rank map of a job without starting anything");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    std::fprintf(stderr, "topolaunch map: not implemented yet\n");
    exit_code = 2;
  });
}

}  // namespace topolaunch::launcher
