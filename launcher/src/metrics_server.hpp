// Private to the launcher: the agent's live metrics ([observe] metrics_port), served in the
// Prometheus text exposition format (version 0.0.4) on every interface. One thread answers
// `GET /metrics` from the last snapshot the supervision loop published; a scrape never waits for
// the loop, nor the loop for a scrape.
//
// Series, each with job (the run id), node and rank labels (the node's own series without rank):
// topolaunch_step, topolaunch_loss, topolaunch_tokens_per_second, topolaunch_step_seconds,
// topolaunch_step_part_seconds{part=...}, topolaunch_memory_bytes{kind="host"|"gpu"},
// topolaunch_comm_bytes_total, topolaunch_comm_exposed_seconds_total,
// topolaunch_heartbeat_age_seconds, topolaunch_rank_running, topolaunch_restarts_total,
// topolaunch_scrapes_total. A Prometheus that scrapes it should keep these labels
// (`honor_labels: true`), since its own `job` label would otherwise rename ours exported_job.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::launcher {

struct RankMetrics {
  int rank = 0;
  bool running = false;
  std::int64_t step = 0;
  std::optional<double> loss;
  double tokens_per_s = 0;
  double step_s = 0;      // the last interval's wall time per step
  double part_s[7] = {};  // its parts per step, as cost.hpp's kStepPartNames name them
  bool has_step_figures = false;
  std::uint64_t host_bytes = 0, gpu_bytes = 0;
  std::uint64_t comm_bytes_total = 0;
  double comm_exposed_s_total = 0;
  std::optional<double> heartbeat_age_s;
};

struct MetricsSnapshot {
  std::string job;  // the run id
  std::string node;
  int restarts = 0;  // the attempt number
  std::vector<RankMetrics> ranks;
};

// The text format of a snapshot; `scrapes` is this endpoint's count so far.
std::string render_prometheus(const MetricsSnapshot& snapshot, std::uint64_t scrapes);

class MetricsServer {
 public:
  // Listens on 0.0.0.0:`port` (SO_REUSEADDR, so a restarted agent gets its port back). An error
  // names the port and why (another process has it: "Address already in use").
  static Result<std::unique_ptr<MetricsServer>> start(int port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  void publish(MetricsSnapshot snapshot);
  std::uint64_t scrapes() const { return scrapes_.load(); }

 private:
  MetricsServer() = default;
  void serve();
  void answer(int client);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::mutex mutex_;
  MetricsSnapshot snapshot_;
  std::atomic<std::uint64_t> scrapes_{0};
  std::thread thread_;
};

}  // namespace topolaunch::launcher
