// `topolaunch run job.toml` and `topolaunch agent`: start and supervise a job.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.hpp"

namespace topolaunch::launcher {

void register_run_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "run a job: here, or on every node of a Slurm allocation");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    std::fprintf(stderr, "topolaunch run: not implemented yet\n");
    exit_code = 2;
  });
}

void register_agent_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("agent", "(internal) one node's agent, started by `run` via srun");
  cmd->group("");
  cmd->allow_extras();
  cmd->callback([&exit_code] { exit_code = 2; });
}

}  // namespace topolaunch::launcher
