// Private to the launcher: the error file of a failed rank (TORCHELASTIC_ERROR_FILE).
// torch.distributed.elastic's @record writes, when the decorated function raises:
//   {"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack": "Traceback ...",
//                "timestamp": "..."}}}
// (torch 1.13, torch/distributed/elastic/multiprocessing/errors/error_handler.py); later
// releases and other writers may put a plain string in "message". Any other JSON object with a
// "message" is taken as it is; a file that is not JSON is not an error file.
#pragma once

#include <optional>
#include <string>

namespace topolaunch::launcher {

struct WorkerError {
  std::string message;    // one line: "RuntimeError: rank 1 failed on purpose"
  std::string traceback;  // "" when the file has none
};

std::optional<WorkerError> parse_error_file(const std::string& text);
// nullopt when the file is absent, empty or not an error file.
std::optional<WorkerError> read_error_file(const std::string& path);

}  // namespace topolaunch::launcher
