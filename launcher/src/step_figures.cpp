// A rank's step figures read as the worker appends them; see step_figures.hpp.
#include "step_figures.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace topolaunch::launcher {

bool StepFiguresTail::poll(StepFigures& figures) {
  if (path_.empty()) return false;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  bool added = false;
  char buffer[65536];
  for (int round = 0; round < 256; ++round) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, offset_);
    if (n <= 0) break;
    offset_ += n;
    partial_.append(buffer, static_cast<std::size_t>(n));
    std::size_t start = 0;
    for (std::size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
      added =
          add_step_figures_line(figures, std::string_view(partial_).substr(start, nl - start)) ||
          added;
    partial_.erase(0, start);
    if (partial_.size() > (1u << 20)) partial_.clear();  // not lines: not the worker's figures
  }
  ::close(fd);
  return added;
}

}  // namespace topolaunch::launcher
