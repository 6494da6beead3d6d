#include "relay_lanes.hpp"

namespace topolaunch::wireup {
namespace {

// A lane retries a refused connection in short tries, so that stopping the relay never waits
// for a whole connect timeout (the upstream relay may start after this one).
constexpr milliseconds kConnectTry{200};
// Once the upstream has been reached, a lane that loses its connection tries again for this
// long at most: a store that was there and refuses now has gone (its host died), and the
// relay's waiters must hear so, not wait out the whole connect timeout.
constexpr milliseconds kReconnectWindow{3000};

}  // namespace

UpstreamLanes::UpstreamLanes(StoreConnectionOptions options, std::size_t max_lanes,
                             std::function<void()> wake)
    : options_(std::move(options)),
      max_lanes_(std::max<std::size_t>(max_lanes, 1)),
      wake_(std::move(wake)) {}

UpstreamLanes::~UpstreamLanes() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (auto& lane : lanes_) {
      if (lane->connection) lane->connection->interrupt();
    }
  }
  work_.notify_all();
  for (auto& lane : lanes_) lane->thread.join();
}

void UpstreamLanes::submit(proto::Op op, Bytes payload, milliseconds blocking_for, Done done) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back({op, std::move(payload), blocking_for, std::move(done)});
    if (idle_ < jobs_.size() && lanes_.size() < max_lanes_) {
      auto lane = std::make_unique<Lane>();
      Lane* raw = lane.get();
      lanes_.push_back(std::move(lane));
      raw->thread = std::thread([this, raw] { serve(*raw); });
    }
  }
  work_.notify_one();
}

void UpstreamLanes::run_completions() {
  std::deque<std::pair<Done, Result<Bytes>>> finished;
  {
    std::lock_guard lock(mutex_);
    finished.swap(finished_);
  }
  for (auto& [done, result] : finished) done(std::move(result));
}

std::uint64_t UpstreamLanes::bytes_in() const {
  std::lock_guard lock(mutex_);
  return bytes_in_;
}

std::uint64_t UpstreamLanes::bytes_out() const {
  std::lock_guard lock(mutex_);
  return bytes_out_;
}

void UpstreamLanes::serve(Lane& lane) {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    --idle_;
    if (stopping_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    Result<Bytes> result = make_error("");
    if (!lane.connection || lane.connection->broken()) {
      lane.connection.reset();
      lock.unlock();
      auto deadline =
          net::Clock::now() + (reached_ ? std::min(options_.connect_timeout, kReconnectWindow)
                                        : options_.connect_timeout);
      Result<std::unique_ptr<StoreConnection>> opened = make_error("");
      do {
        auto attempt = options_;
        attempt.connect_timeout = kConnectTry;
        opened = StoreConnection::open(attempt);
      } while (!opened && net::Clock::now() < deadline && [&] {
        std::lock_guard check(mutex_);
        return !stopping_;
      }());
      lock.lock();
      if (stopping_) return;
      if (opened) {
        lane.connection = std::move(*opened);
        reached_ = true;
      } else {
        result = make_error("relay: cannot reach the upstream store: " + opened.error().message);
      }
    }
    if (lane.connection) {
      StoreConnection* connection = lane.connection.get();
      bytes_out_ += proto::kHeaderBytes + job.payload.size();
      lock.unlock();
      result = connection->request(job.op, job.payload, job.blocking_for);
      lock.lock();
      if (result) bytes_in_ += proto::kHeaderBytes + result->size();
      if (stopping_) return;
    }
    finished_.emplace_back(std::move(job.done), std::move(result));
    lock.unlock();
    wake_();
    lock.lock();
  }
}

}  // namespace topolaunch::wireup
