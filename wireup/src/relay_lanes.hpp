// Private: a relay's requests to its upstream store. A few threads ("lanes"), each with its own
// blocking connection, take requests from one queue, so that a fence held upstream for seconds
// does not hold up a get behind it. Results come back to the relay's serving thread: a lane
// queues the callback and calls `wake`; the serving thread then calls run_completions().
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "connection.hpp"

namespace topolaunch::wireup {

class UpstreamLanes {
 public:
  using Done = std::function<void(Result<Bytes>)>;

  UpstreamLanes(StoreConnectionOptions options, std::size_t max_lanes, std::function<void()> wake);
  ~UpstreamLanes();  // interrupts requests in flight and joins the lanes
  UpstreamLanes(const UpstreamLanes&) = delete;
  UpstreamLanes& operator=(const UpstreamLanes&) = delete;

  // Queues a request; a lane is started when none is idle and fewer than max_lanes run.
  void submit(proto::Op op, Bytes payload, milliseconds blocking_for, Done done);
  // Runs the callbacks of the requests that finished since the last call (caller's thread).
  void run_completions();

  std::uint64_t bytes_in() const;   // reply frames from upstream
  std::uint64_t bytes_out() const;  // request frames to upstream

 private:
  struct Job {
    proto::Op op;
    Bytes payload;
    milliseconds blocking_for;
    Done done;
  };
  struct Lane {
    std::thread thread;
    std::unique_ptr<StoreConnection> connection;  // opened by the lane, guarded by mutex_
  };
  void serve(Lane& lane);

  StoreConnectionOptions options_;
  std::size_t max_lanes_;
  std::function<void()> wake_;

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Job> jobs_;
  std::deque<std::pair<Done, Result<Bytes>>> finished_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
  bool reached_ = false;  // a lane has been connected upstream once
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;
};

}  // namespace topolaunch::wireup
