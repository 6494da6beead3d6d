// `topolaunch run job.toml [-- command...]` and `topolaunch agent`: start and supervise a job.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.hpp"
#include "preflight_stage.hpp"
#include "topolaunch/launcher/agent.hpp"

namespace topolaunch::launcher {

void register_run_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "run a job: its workers bound, supervised and reported");
  auto options = std::make_shared<RunOptions>();
  cmd->add_option("config", options->config_path, "the job config (TOML)")->required();
  cmd->add_option("command", options->command_override,
                  "after --: the worker command, replacing [worker].command");
  cmd->add_option("--topology", options->topology_path,
                  "hwloc XML or NodeTopology JSON to map on instead of this machine");
  cmd->add_option("--job-dir", options->job_dir_override, "replaces [job].job_dir");
  cmd->add_flag("-q,--quiet", options->quiet, "no worker output on the terminal (logs only)");
  cmd->add_flag("--json", options->print_json, "print the JSON report instead of the summary");
  cmd->add_flag("--resume", options->resume,
                "continue in a job dir that holds an earlier run (its files move to earlier/N)");
  cmd->add_flag("--local", options->local,
                "inside a multi-node Slurm allocation, run on this node only");
  options->preflight = run_preflight_stage;
  cmd->callback([options, &exit_code] { exit_code = run_job(*options); });
}

void register_agent_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("agent", "(internal) one node's agent, started by `run` via srun");
  cmd->group("");
  auto options = std::make_shared<AgentOptions>();
  cmd->add_option("config", options->run.config_path)->required();
  cmd->add_option("command", options->run.command_override);
  cmd->add_option("--topology", options->run.topology_path);
  cmd->add_option("--job-dir", options->run.job_dir_override)->required();
  cmd->add_option("--run-id", options->run_id)->required();
  cmd->add_option("--attempt", options->attempt)->required();
  cmd->add_option("--config-digest", options->run.probed_config_digest);
  cmd->add_flag("-q,--quiet", options->run.quiet);
  options->run.preflight = run_preflight_stage;
  cmd->callback([options, &exit_code] { exit_code = run_agent(*options); });
}

}  // namespace topolaunch::launcher
