// `topolaunch report JOB_DIR`: the job's page (report_page.hpp) written into the job directory.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "commands.hpp"
#include "report_page.hpp"

namespace topolaunch::launcher {

void register_report_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "report", "write the job's page, JOB_DIR/report.html: plots, cost, attempts, timeline");
  auto dir = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("job_dir", *dir, "the job directory (the one `topolaunch run` printed)")
      ->required();
  cmd->add_option("-o,--output", *output, "where to write the page (default JOB_DIR/report.html)");
  cmd->callback([dir, output, &exit_code] {
    std::string error;
    const ReportPageInputs inputs = read_report_inputs(*dir, error);
    if (!error.empty()) {
      std::fprintf(stderr, "topolaunch report: %s\n", error.c_str());
      exit_code = 2;
      return;
    }
    auto page = render_report_page(inputs);
    if (!page) {
      std::fprintf(stderr, "topolaunch report: %s/%s\n", dir->c_str(),
                   page.error().message.c_str());
      exit_code = page.error().exit_code;
      return;
    }
    const std::string path = output->empty() ? *dir + "/report.html" : *output;
    std::ofstream out(path, std::ios::trunc);
    out << *page;
    out.close();
    if (!out) {
      std::fprintf(stderr, "topolaunch report: %s: cannot write the page\n", path.c_str());
      exit_code = 1;
      return;
    }
    std::printf("%s\n", path.c_str());
    exit_code = 0;
  });
}

}  // namespace topolaunch::launcher
