// topolaunch: parse the command line, hand over to a subcommand, return its exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "topolaunch/topology/discover.hpp"

int main(int argc, char** argv) {
  topolaunch::topology::prefer_minimal_xml_importer();
  CLI::App app{"topolaunch: start GPU training jobs the way the hardware wants them started"};
  app.require_subcommand(1);
  int exit_code = 0;
  topolaunch::launcher::register_check_command(app, exit_code);
  topolaunch::launcher::register_run_command(app, exit_code);
  topolaunch::launcher::register_agent_command(app, exit_code);
  topolaunch::launcher::register_map_command(app, exit_code);
  topolaunch::launcher::register_preflight_command(app, exit_code);
  topolaunch::launcher::register_report_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "topolaunch: %s (see topolaunch --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topolaunch: internal error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
