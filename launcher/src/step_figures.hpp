// Private to the launcher: a rank's step figures (TOPOLAUNCH_STEP_METRICS_FILE, JSON lines the
// worker appends) read as they are written, by the attempt's supervision loop.
#pragma once

#include <sys/types.h>

#include <string>

#include "topolaunch/launcher/cost.hpp"

namespace topolaunch::launcher {

class StepFiguresTail {
 public:
  explicit StepFiguresTail(std::string path = "") : path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  // Adds the whole lines appended since the last call to `figures`; true when one was added. A
  // file not there yet is not an error (the worker writes it after its start).
  bool poll(StepFigures& figures);

 private:
  std::string path_;
  off_t offset_ = 0;
  std::string partial_;
};

}  // namespace topolaunch::launcher
