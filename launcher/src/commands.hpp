// The subcommands of the `topolaunch` program. Each owner registers its own subcommand on the
// CLI11 app (options + callback) in its own file; main.cpp only calls these. The callback stores
// its exit status in `exit_code` (0 ok, 1 the job/check failed, 2 bad input) and prints its
// own one-line errors to stderr as "topolaunch <cmd>: <message>".
//   check, run, agent: launcher owner (cmd_check.cpp, cmd_run.cpp)
//   map:               rank mapping owner (cmd_map.cpp)
//   preflight:         rdma owner (cmd_preflight.cpp)
//   report:            the job's page (cmd_report.cpp, report_page.cpp)
#pragma once

namespace CLI {
class App;
}

namespace topolaunch::launcher {

void register_check_command(CLI::App& app, int& exit_code);
void register_run_command(CLI::App& app, int& exit_code);
void register_agent_command(CLI::App& app, int& exit_code);
void register_map_command(CLI::App& app, int& exit_code);
void register_preflight_command(CLI::App& app, int& exit_code);
void register_report_command(CLI::App& app, int& exit_code);

}  // namespace topolaunch::launcher
