// The TCP store server: one thread, one poll() loop over non-blocking sockets.
//
// Each connection carries at most one request at a time (the client is synchronous), so a
// blocking request (get, wait, fence, allgather) simply parks the connection until its keys
// appear, its collective completes or its deadline passes. No request can block the loop.
//
// A relay (options.upstream) is the same loop with an upstream: what it cannot answer from its
// own table goes upstream through UpstreamLanes (relay_lanes.hpp) and the answer comes back to
// this loop; a fence or allgather goes up once, as one fence_group / allgather_group for all of
// options.ranks, and its one reply frame is shared by every waiter's output queue.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "auth.hpp"
#include "connection.hpp"
#include "frame.hpp"
#include "net.hpp"
#include "relay_lanes.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::wireup {
namespace {

using net::Clock;
using proto::Op;
using ConnId = std::uint64_t;

constexpr std::size_t kMaxKeyBytes = 4096;
constexpr std::size_t kRecvChunkBytes = 64 * 1024;
constexpr std::size_t kMaxMissingListed = 16;
constexpr std::size_t kMaxRelayPayload = std::size_t{1} << 31;
// A relay holding a collective asks its upstream this often whether it is still there.
constexpr std::chrono::milliseconds kUpstreamProbeEvery{1000};
constexpr const char* kUpstreamProbeKey = "topolaunch/relay-probe";  // a key no one sets

using SharedFrame = std::shared_ptr<const Bytes>;

SharedFrame shared_frame(Op op, std::span<const std::byte> payload) {
  return std::make_shared<const Bytes>(proto::encode_frame(op, payload));
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string ranks_text(const std::vector<int>& ranks) {  // "0-7,16-23"
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

Bytes to_bytes(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  char host[128] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char serv[16] = "?";
  getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
              NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string(host) + ":" + serv;
}

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(TcpStoreServerOptions options, net::Fd listener, net::Fd wake, std::string address)
      : options_(std::move(options)),
        listener_(std::move(listener)),
        wake_(std::move(wake)),
        address_(std::move(address)),
        port_(net::local_port(listener_.get())),
        world_size_(options_.world_size),
        relay_(!options_.upstream.empty()),
        below_(options_.ranks.begin(), options_.ranks.end()) {
    if (!options_.log) {
      options_.log = [](std::string_view line) {
        std::fprintf(stderr, "topolaunch wireup: %.*s\n", static_cast<int>(line.size()),
                     line.data());
      };
    }
    max_payload_bytes_ = options_.max_value_bytes + kMaxKeyBytes + 64;
    if (relay_) {
      StoreConnectionOptions upstream{options_.upstream,
                                      options_.secret,
                                      kRelayRank,
                                      options_.world_size,
                                      options_.upstream_connect_timeout,
                                      std::chrono::seconds(30)};
      int wake_fd = wake_.get();
      lanes_ = std::make_unique<UpstreamLanes>(upstream, options_.upstream_lanes, [wake_fd] {
        std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
      });
    }
  }

  void start() {
    thread_ = std::thread([this] {
      try {
        run();
      } catch (const std::exception& e) {
        options_.log(std::string("the store stopped: ") + e.what());
      }
    });
  }

  void stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
    thread_.join();
    lanes_.reset();  // interrupts what is in flight upstream; callbacks are not run any more
    conns_.clear();  // closes every client socket
    listener_.reset();
  }

  std::uint16_t port() const { return port_; }
  const std::string& address() const { return address_; }

  Stats stats() const {
    Stats out;
    out.clients = counters_.clients;
    out.peak_clients = counters_.peak_clients;
    out.peak_rank_clients = counters_.peak_rank_clients;
    out.refused_auth = counters_.refused_auth;
    out.refused_frames = counters_.refused_frames;
    out.keys = counters_.keys;
    out.stored_bytes = counters_.stored_bytes;
    out.requests = counters_.requests;
    out.bytes_in = counters_.bytes_in;
    out.bytes_out = counters_.bytes_out;
    out.relay_bytes_in = counters_.relay_bytes_in;
    out.relay_bytes_out = counters_.relay_bytes_out;
    out.cpu_seconds = counters_.cpu_seconds;
    if (lanes_) {
      out.upstream_bytes_in = lanes_->bytes_in();
      out.upstream_bytes_out = lanes_->bytes_out();
    }
    return out;
  }

 private:
  enum class Waiting { none, get, wait, get_many, fence, allgather, upstream };

  struct Conn {
    net::Fd fd;
    std::string peer;
    bool authenticated = false;
    Bytes server_nonce;
    Clock::time_point auth_deadline;
    int rank = -1;
    bool relay = false;  // a relay below this store, standing for several ranks
    Bytes in;
    std::deque<SharedFrame> out;  // frames to send; a collective's reply is shared by all
    std::size_t out_sent = 0;     // of out.front()
    bool closing = false;         // refused: flush the error reply, then close
    bool dead = false;
    Waiting waiting = Waiting::none;
    std::vector<std::string> keys;       // get/wait/get_many: the keys still missing
    std::vector<std::string> requested;  // get_many: every key asked for, in order
    std::uint64_t generation = 0;        // fence
    std::string gather;                  // allgather: its name
    std::vector<int> arrived_for;        // fence/allgather: the ranks this connection brought
    Clock::time_point deadline;
    std::uint64_t timeout_ms = 0;
  };

  struct Fence {
    std::set<int> arrived;
    std::vector<ConnId> waiters;
    std::uint64_t timeout_ms = 0;
    bool forwarded = false;  // relay: gone upstream, the upstream's answer decides
  };

  struct Gather {
    std::map<int, Bytes> values;
    std::vector<ConnId> waiters;
    std::uint64_t timeout_ms = 0;
    bool forwarded = false;
  };

  // --- participants: who a fence or an allgather waits for -------------------------------------
  bool participates(int rank) const {
    return relay_ ? below_.count(rank) != 0 : rank >= 0 && rank < world_size_;
  }
  std::size_t participant_count() const {
    return relay_ ? below_.size() : static_cast<std::size_t>(std::max(world_size_, 0));
  }
  std::vector<int> participant_list() const {
    if (relay_) return std::vector<int>(below_.begin(), below_.end());
    std::vector<int> all(static_cast<std::size_t>(std::max(world_size_, 0)));
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return all;
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<ConnId> ids;
    while (!stopping_.load()) {
      fds.clear();
      ids.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      // While out of fds, stop polling the listener (it would stay readable: a busy loop).
      fds.push_back({listener_.get(),
                     static_cast<short>(Clock::now() < accept_paused_until_ ? 0 : POLLIN), 0});
      for (auto& [id, conn] : conns_) {
        short events = conn.closing ? 0 : POLLIN;
        if (!conn.out.empty()) events |= POLLOUT;
        fds.push_back({conn.fd.get(), events, 0});
        ids.push_back(id);
      }
      int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
      if (n < 0 && errno != EINTR) {
        options_.log(std::string("poll failed: ") + std::strerror(errno) + "; the store stops");
        break;
      }
      if (n > 0) {
        if (fds[0].revents != 0) {
          std::uint64_t drained;
          [[maybe_unused]] auto r = ::read(wake_.get(), &drained, sizeof drained);
        }
        if (stopping_.load()) break;
        if (fds[1].revents & POLLIN) accept_clients();
        for (std::size_t i = 0; i < ids.size(); ++i) {
          auto revents = fds[i + 2].revents;
          auto it = conns_.find(ids[i]);
          if (revents == 0 || it == conns_.end() || it->second.dead) continue;
          if (revents & POLLOUT) flush(it->second);
          if (revents & (POLLIN | POLLHUP | POLLERR)) read_from(ids[i]);
        }
      }
      if (lanes_) {
        lanes_->run_completions();
        flush_sets();
      }
      expire(Clock::now());
      watch_upstream(Clock::now());
      sweep();
      publish_stats();
      summarize_refusals(Clock::now(), false);
    }
    summarize_refusals(Clock::now(), true);
  }

  // --- refused peers, logged without flooding the job's log (TcpStoreServerOptions::log) -----
  enum class Refusal { secret, capacity, frame };

  void log_refusal(Refusal kind, const std::string& line) {
    const auto now = Clock::now();
    if (refusals_.suppressed == 0 && refusals_.in_full > 0 &&
        now - refusals_.last >= options_.refusal_summary_every)
      refusals_.in_full = 0;  // quiet for a while: a new burst starts with lines of its own
    refusals_.last = now;
    if (refusals_.in_full < options_.refusals_in_full) {
      ++refusals_.in_full;
      options_.log(line);
      if (refusals_.in_full == options_.refusals_in_full) {
        char every[32];
        std::snprintf(every, sizeof every, "%g",
                      std::chrono::duration<double>(options_.refusal_summary_every).count());
        options_.log(std::string("further refused peers are counted, one line every ") + every +
                     " s");
      }
      return;
    }
    if (refusals_.suppressed == 0) refusals_.since = now;
    ++refusals_.suppressed;
    ++refusals_.by_kind[static_cast<int>(kind)];
  }

  void summarize_refusals(Clock::time_point now, bool final) {
    if (refusals_.suppressed == 0 ||
        (!final && now - refusals_.since < options_.refusal_summary_every))
      return;
    static constexpr const char* kKinds[] = {"wrong secret", "too many clients",
                                             "bad frames or no authentication"};
    std::string kinds;
    for (int k = 0; k < 3; ++k) {
      if (refusals_.by_kind[k] == 0) continue;
      kinds += (kinds.empty() ? "" : ", ") + std::to_string(refusals_.by_kind[k]) + " " + kKinds[k];
    }
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f",
                  std::chrono::duration<double>(now - refusals_.since).count());
    options_.log("refused " + std::to_string(refusals_.suppressed) + " more peer" +
                 (refusals_.suppressed == 1 ? "" : "s") + " in " + seconds + " s: " + kinds);
    refusals_.suppressed = 0;
    refusals_.by_kind[0] = refusals_.by_kind[1] = refusals_.by_kind[2] = 0;
    refusals_.since = now;
  }

  int poll_timeout_ms() const {
    auto next = Clock::time_point::max();
    for (const auto& [id, conn] : conns_) {
      if (!conn.authenticated) next = std::min(next, conn.auth_deadline);
      if (conn.waiting != Waiting::none && conn.waiting != Waiting::upstream)
        next = std::min(next, conn.deadline);
    }
    if (accept_paused_until_ > Clock::now()) next = std::min(next, accept_paused_until_);
    if (next == Clock::time_point::max()) return 1000;
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<long long>(ms, 0, 1000));
  }

  void accept_clients() {
    for (;;) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE) {
          options_.log("accept failed: too many open files with " + std::to_string(conns_.size()) +
                       " clients (raise the limit: ulimit -n); retrying in 100 ms");
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
          options_.log(std::string("accept failed: ") + std::strerror(errno));
        }
        return;
      }
      net::Fd owned(fd);
      // A get_many or allgather reply carries every rank's value; a large send buffer lets it
      // leave in one send instead of many poll rounds (loopback starts at 16 KiB, grows slowly).
      int send_buffer_bytes = 4 << 20, one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &send_buffer_bytes, sizeof send_buffer_bytes);
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (conns_.size() >= options_.max_clients) {
        log_refusal(Refusal::capacity, "refused " + peer_name(fd) + ": too many clients (" +
                                           std::to_string(conns_.size()) + ")");
        continue;
      }
      ConnId id = next_id_++;
      Conn& conn = conns_[id];
      conn.fd = std::move(owned);
      conn.peer = peer_name(fd);
      conn.server_nonce = auth::random_nonce();
      conn.auth_deadline = Clock::now() + options_.auth_timeout;
      send(conn, Op::challenge, proto::PayloadWriter().bytes(conn.server_nonce).take());
      counters_.peak_clients = std::max(counters_.peak_clients.load(), conns_.size());
    }
  }

  void read_from(ConnId id) {
    Conn& conn = conns_.at(id);
    std::byte chunk[kRecvChunkBytes];
    for (;;) {
      ssize_t n = ::recv(conn.fd.get(), chunk, sizeof chunk, MSG_DONTWAIT);
      if (n == 0) return drop(conn);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return drop(conn);
      }
      counters_.bytes_in += static_cast<std::uint64_t>(n);
      if (conn.relay) counters_.relay_bytes_in += static_cast<std::uint64_t>(n);
      if (conn.closing) continue;  // refused: ignore whatever else it sends
      conn.in.insert(conn.in.end(), chunk, chunk + n);
      process_frames(id);
      if (conn.dead) return;
    }
  }

  void process_frames(ConnId id) {
    Conn& conn = conns_.at(id);
    while (!conn.closing && conn.in.size() >= proto::kHeaderBytes) {
      // A relay's group requests carry the values or ranks of everything below it.
      auto limit = !conn.authenticated ? proto::kMaxUnauthenticatedPayload
                   : conn.relay        ? kMaxRelayPayload
                                       : max_payload_bytes_;
      auto header = proto::decode_header(conn.in, limit);
      if (!header) return refuse(conn, header.error().message);
      std::size_t frame_bytes = proto::kHeaderBytes + header->payload_bytes;
      if (conn.in.size() < frame_bytes) return;
      if (conn.waiting != Waiting::none)
        return refuse(conn, "request sent while another is pending");
      Bytes payload(conn.in.begin() + proto::kHeaderBytes, conn.in.begin() + frame_bytes);
      conn.in.erase(conn.in.begin(), conn.in.begin() + frame_bytes);
      if (!conn.authenticated) {
        authenticate(id, conn, header->op, payload);
      } else {
        ++counters_.requests;
        handle(id, conn, header->op, payload);
      }
    }
  }

  void authenticate(ConnId id, Conn& conn, Op op, std::span<const std::byte> payload) {
    if (op != Op::auth)
      return refuse(conn, "expected an auth frame, got " + std::string(proto::op_name(op)));
    proto::PayloadReader in(payload);
    auto rank = in.i64();
    auto world_size = in.i64();
    auto client_nonce = in.bytes();
    auto mac = in.bytes();
    if (!rank || !world_size || !client_nonce || !mac || !in.at_end())
      return refuse(conn, "malformed auth frame");
    auto expected = auth::client_proof(options_.secret, conn.server_nonce, *rank, *world_size);
    if (!auth::equal_constant_time(expected, *mac)) {
      ++counters_.refused_auth;
      log_refusal(Refusal::secret, "refused " + conn.peer + " (claims rank " +
                                       std::to_string(*rank) +
                                       "): wrong secret, authentication failed");
      reply_error(conn, "authentication failed: wrong secret (check TOPOLAUNCH_STORE_SECRET)");
      return close_after_reply(conn);
    }
    if (*rank >= 0 || *rank == kRelayRank) {
      if (world_size_ == 0 && *world_size > 0) world_size_ = static_cast<int>(*world_size);
      if (*world_size != world_size_ || *rank >= world_size_) {
        return refuse(conn, "rank " + std::to_string(*rank) + " of world size " +
                                std::to_string(*world_size) +
                                " does not fit this store's world size " +
                                std::to_string(world_size_));
      }
    }
    if (*rank == kRelayRank) {
      conn.relay = true;
    } else if (*rank >= 0) {
      if (!participates(static_cast<int>(*rank))) {
        return refuse(conn, "rank " + std::to_string(*rank) +
                                " is not below this relay (it stands for ranks " +
                                ranks_text(participant_list()) + ")");
      }
      conn.rank = static_cast<int>(*rank);
      if (rank_conn_.count(conn.rank) != 0) {
        options_.log("rank " + std::to_string(conn.rank) + " connected again from " + conn.peer);
      }
      rank_conn_[conn.rank] = id;
      departed_.erase(conn.rank);
      counters_.peak_rank_clients = std::max(counters_.peak_rank_clients.load(), rank_conn_.size());
    } else if (*rank != -1) {
      return refuse(conn, "bad rank " + std::to_string(*rank));
    }
    conn.authenticated = true;
    send(conn, Op::auth_ok,
         proto::PayloadWriter()
             .i64(world_size_)
             .bytes(auth::server_proof(options_.secret, *client_nonce))
             .u64(options_.max_value_bytes)
             .take());
  }

  void handle(ConnId id, Conn& conn, Op op, std::span<const std::byte> payload) {
    proto::PayloadReader in(payload);
    auto malformed = [&] {
      refuse(conn, "malformed " + std::string(proto::op_name(op)) + " frame");
    };
    switch (op) {
      case Op::set: {
        auto key = in.str();
        auto value = in.bytes();
        if (!key || !value || !in.at_end()) return malformed();
        if (key->size() > kMaxKeyBytes) return reply_error(conn, "key longer than 4096 bytes");
        if (relay_) pending_sets_.emplace_back(*key, Bytes(value->begin(), value->end()));
        store(*key, Bytes(value->begin(), value->end()));
        return send(conn, Op::ok, {});
      }
      case Op::set_many: {
        auto count = in.u64();
        if (!count || *count > payload.size() / 8) return malformed();
        std::vector<std::pair<std::string, Bytes>> entries;
        for (std::uint64_t i = 0; i < *count; ++i) {
          auto key = in.str();
          auto value = in.bytes();
          if (!key || !value) return malformed();
          if (key->size() > kMaxKeyBytes) return reply_error(conn, "key longer than 4096 bytes");
          entries.emplace_back(std::move(*key), Bytes(value->begin(), value->end()));
        }
        if (!in.at_end()) return malformed();
        if (relay_) pending_sets_.insert(pending_sets_.end(), entries.begin(), entries.end());
        for (auto& [key, value] : entries) store(key, std::move(value));
        return send(conn, Op::ok, {});
      }
      case Op::get: {
        auto key = in.str();
        auto timeout_ms = in.u64();
        if (!key || !timeout_ms || !in.at_end()) return malformed();
        if (auto it = data_.find(*key); it != data_.end()) {
          return send(conn, Op::ok, proto::PayloadWriter().bytes(it->second).take());
        }
        park(id, conn, Waiting::get, {*key}, *timeout_ms);
        if (relay_) fetch({*key}, *timeout_ms);
        return;
      }
      case Op::add:
      case Op::remove: {
        auto key = in.str();
        if (!key) return malformed();
        if (op == Op::remove) {
          if (!in.at_end()) return malformed();
          bool existed = forget(*key);
          if (relay_) return pass_upstream(id, conn, op, payload, 0);
          return send(conn, Op::ok, proto::PayloadWriter().u64(existed ? 1 : 0).take());
        }
        auto delta = in.i64();
        if (!delta || !in.at_end()) return malformed();
        if (relay_) {  // the counter lives at the root; a copy here would go stale
          forget(*key);
          return pass_upstream(id, conn, op, payload, 0);
        }
        std::int64_t value = 0;
        if (auto it = data_.find(*key); it != data_.end()) {
          auto text =
              std::string_view(reinterpret_cast<const char*>(it->second.data()), it->second.size());
          auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
          if (ec != std::errc() || end != text.data() + text.size()) {
            return reply_error(conn, "add: key '" + *key + "' holds a value that is not a counter");
          }
        }
        value += *delta;
        store(*key, to_bytes(std::to_string(value)));
        return send(conn, Op::ok, proto::PayloadWriter().i64(value).take());
      }
      case Op::wait:
      case Op::get_many: {
        auto count = in.u64();
        if (!count || *count > payload.size() / 4) return malformed();
        std::vector<std::string> keys, missing;
        for (std::uint64_t i = 0; i < *count; ++i) {
          auto key = in.str();
          if (!key) return malformed();
          if (data_.count(*key) == 0) missing.push_back(*key);
          keys.push_back(std::move(*key));
        }
        auto timeout_ms = in.u64();
        if (!timeout_ms || !in.at_end()) return malformed();
        if (op == Op::get_many) conn.requested = std::move(keys);
        if (missing.empty()) return finish_wait(conn, op == Op::get_many);
        if (relay_) fetch(missing, *timeout_ms);
        return park(id, conn, op == Op::get_many ? Waiting::get_many : Waiting::wait,
                    std::move(missing), *timeout_ms);
      }
      case Op::fence:
      case Op::fence_group: {
        auto generation = in.u64();
        auto timeout_ms = in.u64();
        if (!generation || !timeout_ms) return malformed();
        std::vector<int> ranks;
        if (op == Op::fence_group) {
          if (!conn.relay) return reply_error(conn, "fence_group: only a relay may send it");
          auto count = in.u64();
          if (!count || *count > payload.size() / 8) return malformed();
          for (std::uint64_t i = 0; i < *count; ++i) {
            auto rank = in.u64();
            if (!rank) return malformed();
            ranks.push_back(static_cast<int>(*rank));
          }
        } else if (conn.rank < 0) {
          return reply_error(conn, "fence: this client has no rank (connect with a rank to fence)");
        } else {
          ranks.push_back(conn.rank);
        }
        if (!in.at_end()) return malformed();
        return arrive_at_fence(id, conn, *generation, ranks, *timeout_ms);
      }
      case Op::allgather:
      case Op::allgather_group: {
        auto name = in.str();
        auto timeout_ms = in.u64();
        if (!name || !timeout_ms) return malformed();
        if (name->size() > kMaxKeyBytes - 16)
          return reply_error(conn, "name longer than 4080 bytes");
        std::vector<std::pair<int, Bytes>> values;
        if (op == Op::allgather_group) {
          if (!conn.relay) return reply_error(conn, "allgather_group: only a relay may send it");
          auto count = in.u64();
          if (!count || *count > payload.size() / 12) return malformed();
          for (std::uint64_t i = 0; i < *count; ++i) {
            auto rank = in.u64();
            auto value = in.bytes();
            if (!rank || !value) return malformed();
            values.emplace_back(static_cast<int>(*rank), Bytes(value->begin(), value->end()));
          }
        } else if (conn.rank < 0) {
          return reply_error(conn, "allgather: this client has no rank");
        } else {
          auto value = in.bytes();
          if (!value) return malformed();
          values.emplace_back(conn.rank, Bytes(value->begin(), value->end()));
        }
        if (!in.at_end()) return malformed();
        return contribute(id, conn, *name, std::move(values), *timeout_ms);
      }
      default:
        return refuse(conn, "unexpected " + std::string(proto::op_name(op)) + " frame");
    }
  }

  // --- fences ------------------------------------------------------------------------------------
  void arrive_at_fence(ConnId id, Conn& conn, std::uint64_t generation,
                       const std::vector<int>& ranks, std::uint64_t timeout_ms) {
    Fence& fence = fences_[generation];
    for (int rank : ranks) {
      if (!participates(rank)) {
        return reply_error(conn, "fence " + std::to_string(generation) + ": rank " +
                                     std::to_string(rank) + " is not a participant here");
      }
      if (fence.arrived.count(rank) != 0) {
        return reply_error(conn, "fence " + std::to_string(generation) + ": rank " +
                                     std::to_string(rank) +
                                     " arrived twice (two clients with the same rank?)");
      }
    }
    fence.arrived.insert(ranks.begin(), ranks.end());
    fence.waiters.push_back(id);
    fence.timeout_ms = std::max(fence.timeout_ms, timeout_ms);
    conn.generation = generation;
    conn.arrived_for = ranks;
    park(id, conn, Waiting::fence, {}, timeout_ms);
    if (fence.arrived.size() == participant_count()) complete_fence(generation);
  }

  void complete_fence(std::uint64_t generation) {
    Fence& fence = fences_.at(generation);
    if (!relay_) {
      auto reply = shared_frame(Op::ok, {});
      release(fence.waiters, Waiting::fence, reply);
      fences_.erase(generation);
      return;
    }
    forward(fence.waiters);
    fence.forwarded = true;
    proto::PayloadWriter request;
    request.u64(generation).u64(fence.timeout_ms).u64(fence.arrived.size());
    for (int rank : fence.arrived) request.u64(static_cast<std::uint64_t>(rank));
    after_sets(
        [this, generation, request = request.take(), timeout_ms = fence.timeout_ms]() mutable {
          if (!set_failure_.empty()) {
            auto it = fences_.find(generation);
            if (it == fences_.end()) return;
            release(it->second.waiters, Waiting::fence, error_frame(set_failure_));
            fences_.erase(it);
            return;
          }
          lanes_->submit(Op::fence_group, std::move(request), milliseconds(timeout_ms),
                         [this, generation](Result<Bytes> result) {
                           auto it = fences_.find(generation);
                           if (it == fences_.end()) return;
                           // A fence ends what was read before it: fetched copies may be stale now.
                           if (result) drop_fetched();
                           auto reply = result ? shared_frame(Op::ok, {})
                                               : error_frame(result.error().message);
                           release(it->second.waiters, Waiting::fence, reply);
                           fences_.erase(it);
                         });
        });
  }

  // --- allgather ---------------------------------------------------------------------------------
  void contribute(ConnId id, Conn& conn, const std::string& name,
                  std::vector<std::pair<int, Bytes>> values, std::uint64_t timeout_ms) {
    Gather& gather = gathers_[name];
    if (gather.forwarded) {
      return reply_error(conn, "allgather '" + name + "': already complete here, still upstream");
    }
    std::vector<int> ranks;
    for (const auto& [rank, value] : values) {
      if (!participates(rank)) {
        return reply_error(conn, "allgather '" + name + "': rank " + std::to_string(rank) +
                                     " is not a participant here");
      }
      if (gather.values.count(rank) != 0) {
        return reply_error(conn, "allgather '" + name + "': rank " + std::to_string(rank) +
                                     " arrived twice (two clients with the same rank?)");
      }
      if (value.size() > options_.max_value_bytes) {
        return reply_error(conn, "allgather '" + name + "': value of rank " + std::to_string(rank) +
                                     " above the store's limit");
      }
      ranks.push_back(rank);
    }
    for (auto& [rank, value] : values) gather.values.emplace(rank, std::move(value));
    gather.waiters.push_back(id);
    gather.timeout_ms = std::max(gather.timeout_ms, timeout_ms);
    conn.gather = name;
    conn.arrived_for = std::move(ranks);
    park(id, conn, Waiting::allgather, {}, timeout_ms);
    if (gather.values.size() == participant_count()) complete_gather(name);
  }

  void complete_gather(const std::string& name) {
    Gather& gather = gathers_.at(name);
    if (!relay_) {
      // One reply, built once and shared by every waiter; then the values stay readable under
      // their rank keys like the values of put + fence.
      std::vector<const Bytes*> ordered;
      ordered.reserve(gather.values.size());
      for (const auto& [rank, value] : gather.values) ordered.push_back(&value);
      auto reply = shared_frame(Op::ok, proto::encode_gathered(ordered));
      for (auto& [rank, value] : gather.values) store(rank_key(name, rank), std::move(value));
      release(gather.waiters, Waiting::allgather, reply);
      gathers_.erase(name);
      return;
    }
    forward(gather.waiters);
    gather.forwarded = true;
    proto::PayloadWriter request;
    std::size_t bytes = 32 + name.size();
    for (const auto& [rank, value] : gather.values) bytes += 12 + value.size();
    request.reserve(bytes);
    request.str(name).u64(gather.timeout_ms).u64(gather.values.size());
    for (const auto& [rank, value] : gather.values)
      request.u64(static_cast<std::uint64_t>(rank)).bytes(value);
    gather.values.clear();
    after_sets([this, name, request = request.take(), timeout_ms = gather.timeout_ms]() mutable {
      if (!set_failure_.empty()) {
        auto it = gathers_.find(name);
        if (it == gathers_.end()) return;
        release(it->second.waiters, Waiting::allgather, error_frame(set_failure_));
        gathers_.erase(it);
        return;
      }
      lanes_->submit(Op::allgather_group, std::move(request), milliseconds(timeout_ms),
                     [this, name](Result<Bytes> result) {
                       auto it = gathers_.find(name);
                       if (it == gathers_.end()) return;
                       if (result) drop_fetched();
                       // The upstream's reply is already what every waiter needs: pass it on.
                       auto reply = result ? shared_frame(Op::ok, *result)
                                           : error_frame(result.error().message);
                       release(it->second.waiters, Waiting::allgather, reply);
                       gathers_.erase(it);
                     });
    });
  }

  // The waiters of a collective that went upstream wait for the upstream's answer, not for their
  // own deadline (it arrives by then, or the lane's reply deadline makes it an error).
  void forward(const std::vector<ConnId>& waiters) {
    for (ConnId waiter : waiters) {
      if (auto it = conns_.find(waiter); it != conns_.end())
        it->second.deadline = Clock::time_point::max();
    }
  }

  // Replies to every waiter of a collective with one shared frame.
  void release(const std::vector<ConnId>& waiters, Waiting what, const SharedFrame& reply) {
    for (ConnId waiter : waiters) {
      auto it = conns_.find(waiter);
      if (it == conns_.end() || it->second.waiting != what) continue;
      it->second.waiting = Waiting::none;
      it->second.arrived_for.clear();
      enqueue(it->second, reply);
    }
  }

  // --- relay: upstream -------------------------------------------------------------------------
  // Forwards a request as it came; the client's reply is the upstream's.
  void pass_upstream(ConnId id, Conn& conn, Op op, std::span<const std::byte> payload,
                     std::uint64_t blocking_ms) {
    conn.waiting = Waiting::upstream;
    after_sets(
        [this, id, op, request = Bytes(payload.begin(), payload.end()), blocking_ms]() mutable {
          lanes_->submit(op, std::move(request), milliseconds(blocking_ms),
                         [this, id](Result<Bytes> result) {
                           auto it = conns_.find(id);
                           if (it == conns_.end() || it->second.waiting != Waiting::upstream)
                             return;
                           it->second.waiting = Waiting::none;
                           if (result) return send(it->second, Op::ok, *result);
                           reply_error(it->second, result.error().message);
                         });
        });
  }

  // A collective held here, waiting for a rank below this relay, sends nothing upstream until
  // it is complete: an upstream that died meanwhile (its host killed) would go unnoticed until
  // the waiters' deadlines (wireup.timeout). While one is held the relay asks upstream for
  // something cheap once a second (the remove of a key no one sets, which reaches the root
  // through every relay above); when that fails, every collective held here fails at once.
  void watch_upstream(Clock::time_point now) {
    if (!lanes_ || probe_in_flight_ || now < next_probe_) return;
    const bool held = std::any_of(fences_.begin(), fences_.end(),
                                  [](const auto& f) { return !f.second.forwarded; }) ||
                      std::any_of(gathers_.begin(), gathers_.end(),
                                  [](const auto& g) { return !g.second.forwarded; });
    if (!held) return;
    probe_in_flight_ = true;
    next_probe_ = now + kUpstreamProbeEvery;
    lanes_->submit(Op::remove, proto::PayloadWriter().str(kUpstreamProbeKey).take(),
                   milliseconds(0), [this](Result<Bytes> result) {
                     probe_in_flight_ = false;
                     if (result) return;
                     fail_held_collectives("relay: the upstream store at " + options_.upstream +
                                           " is gone (" + result.error().message + ")");
                   });
  }

  void fail_held_collectives(const std::string& message) {
    options_.log(message);
    const SharedFrame reply = error_frame(message);
    for (auto it = fences_.begin(); it != fences_.end();) {
      if (it->second.forwarded) {
        ++it;
        continue;
      }
      release(it->second.waiters, Waiting::fence, reply);
      it = fences_.erase(it);
    }
    for (auto it = gathers_.begin(); it != gathers_.end();) {
      if (it->second.forwarded) {
        ++it;
        continue;
      }
      release(it->second.waiters, Waiting::allgather, reply);
      it = gathers_.erase(it);
    }
  }

  // Runs submit once every value set here so far has reached upstream: a collective or a counter
  // goes up behind the values it may depend on. Values are acknowledged here at once and go up
  // together, one set_many per round of the serving loop (flush_sets).
  void after_sets(std::function<void()> submit) { behind_sets_.push_back(std::move(submit)); }

  void flush_sets() {
    if (!pending_sets_.empty()) {
      proto::PayloadWriter batch;
      std::size_t bytes = 8;
      for (const auto& [key, value] : pending_sets_) bytes += 8 + key.size() + value.size();
      batch.reserve(bytes);
      batch.u64(pending_sets_.size());
      for (const auto& [key, value] : pending_sets_) batch.str(key).bytes(value);
      pending_sets_.clear();
      ++sets_in_flight_;
      lanes_->submit(Op::set_many, batch.take(), milliseconds(0), [this](Result<Bytes> result) {
        --sets_in_flight_;
        if (!result && set_failure_.empty()) {
          set_failure_ = "values set through this relay did not reach the upstream store: " +
                         result.error().message;
          options_.log(set_failure_);
        }
      });
    }
    if (sets_in_flight_ > 0) return;
    auto ready = std::move(behind_sets_);
    behind_sets_.clear();
    for (auto& submit : ready) submit();
  }

  // Asks upstream for keys not here, unless already asked; the answers are kept (fetched_)
  // and wake whoever waits for them.
  void fetch(const std::vector<std::string>& keys, std::uint64_t timeout_ms) {
    std::vector<std::string> wanted;
    for (const auto& key : keys) {
      if (data_.count(key) == 0 && in_flight_.insert(key).second) wanted.push_back(key);
    }
    if (wanted.empty()) return;
    proto::PayloadWriter request;
    request.u64(wanted.size());
    for (const auto& key : wanted) request.str(key);
    request.u64(timeout_ms);
    lanes_->submit(Op::get_many, request.take(), milliseconds(timeout_ms),
                   [this, wanted](Result<Bytes> result) {
                     for (const auto& key : wanted) in_flight_.erase(key);
                     std::optional<std::vector<Bytes>> values;
                     if (result) values = proto::decode_values(std::move(*result), wanted.size());
                     if (!values) {
                       fail_waiters_of(wanted, result ? std::string("relay: malformed reply")
                                                      : result.error().message);
                       return;
                     }
                     for (std::size_t i = 0; i < wanted.size(); ++i) {
                       if (data_.count(wanted[i]) != 0) continue;  // set here meanwhile
                       store(wanted[i], std::move((*values)[i]));
                       fetched_.insert(wanted[i]);
                     }
                   });
  }

  void drop_fetched() {
    for (const auto& key : fetched_) {
      if (auto it = data_.find(key); it != data_.end()) {
        stored_bytes_ -= key.size() + it->second.size();
        data_.erase(it);
      }
    }
    fetched_.clear();
  }

  void fail_waiters_of(const std::vector<std::string>& keys, const std::string& message) {
    std::set<ConnId> failing;
    for (const auto& key : keys) {
      if (auto it = key_waiters_.find(key); it != key_waiters_.end())
        failing.insert(it->second.begin(), it->second.end());
    }
    for (ConnId id : failing) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      unpark(id, it->second);
      reply_error(it->second, message);
    }
  }

  // --- keys ----------------------------------------------------------------------------------
  void park(ConnId id, Conn& conn, Waiting what, std::vector<std::string> keys,
            std::uint64_t timeout_ms) {
    conn.waiting = what;
    conn.keys = std::move(keys);
    conn.timeout_ms = timeout_ms;
    conn.deadline =
        Clock::now() + std::chrono::milliseconds(std::min<std::uint64_t>(timeout_ms, 1ull << 40));
    for (const auto& key : conn.keys) key_waiters_[key].insert(id);
  }

  void store(const std::string& key, Bytes value) {
    auto [slot, inserted] = data_.try_emplace(key);
    if (!inserted) stored_bytes_ -= key.size() + slot->second.size();
    slot->second = std::move(value);
    stored_bytes_ += key.size() + slot->second.size();
    if (relay_) fetched_.erase(key);  // callers that fetched re-add it
    auto it = key_waiters_.find(key);
    if (it == key_waiters_.end()) return;
    auto waiters = std::move(it->second);
    key_waiters_.erase(it);
    for (ConnId waiter : waiters) {
      auto conn_it = conns_.find(waiter);
      if (conn_it == conns_.end()) continue;
      Conn& conn = conn_it->second;
      if (conn.waiting == Waiting::get) {
        conn.waiting = Waiting::none;
        conn.keys.clear();
        send(conn, Op::ok, proto::PayloadWriter().bytes(data_[key]).take());
      } else if (conn.waiting == Waiting::wait || conn.waiting == Waiting::get_many) {
        std::erase(conn.keys, key);
        if (conn.keys.empty()) finish_wait(conn, conn.waiting == Waiting::get_many);
      }
    }
  }

  bool forget(const std::string& key) {
    auto it = data_.find(key);
    if (it == data_.end()) return false;
    stored_bytes_ -= key.size() + it->second.size();
    data_.erase(it);
    fetched_.erase(key);
    return true;
  }

  // Every key of a wait/get_many exists: reply (with the values, in order, for get_many).
  void finish_wait(Conn& conn, bool with_values) {
    conn.waiting = Waiting::none;
    if (!with_values) return send(conn, Op::ok, {});
    std::vector<const Bytes*> values;
    values.reserve(conn.requested.size());
    for (const auto& key : conn.requested) {
      auto it = data_.find(key);
      if (it == data_.end()) {  // removed by another client while this one waited
        conn.requested.clear();
        return reply_error(conn,
                           "get_many: key '" + key + "' was removed while waiting for the others");
      }
      values.push_back(&it->second);
    }
    conn.requested.clear();
    send(conn, Op::ok, proto::encode_gathered(values));
  }

  // Takes conn out of whatever it waits for (timeout, disconnect).
  void unpark(ConnId id, Conn& conn) {
    for (const auto& key : conn.keys) {
      if (auto it = key_waiters_.find(key); it != key_waiters_.end()) {
        it->second.erase(id);
        if (it->second.empty()) key_waiters_.erase(it);
      }
    }
    conn.keys.clear();
    conn.requested.clear();
    conn.waiting = Waiting::none;
  }

  // --- timeouts and diagnostics ----------------------------------------------------------------
  std::string describe_missing(const std::set<int>& arrived) const {
    std::string missing;
    std::size_t listed = 0, total = 0;
    for (int rank : participant_list()) {
      if (arrived.count(rank) != 0) continue;
      ++total;
      if (listed == kMaxMissingListed) continue;
      ++listed;
      const char* state = rank_conn_.count(rank) != 0  ? "connected, not at the fence"
                          : departed_.count(rank) != 0 ? "disconnected"
                          : relays_ > 0                ? "not arrived"
                                                       : "never connected";
      if (!missing.empty()) missing += ", ";
      missing += std::to_string(rank) + " (" + state + ")";
    }
    if (total > listed) missing += ", and " + std::to_string(total - listed) + " more";
    return std::to_string(arrived.size()) + " of " + std::to_string(participant_count()) +
           " ranks arrived; missing ranks: " + missing;
  }

  void expire(Clock::time_point now) {
    for (auto& [id, conn] : conns_) {
      if (conn.dead) continue;
      if (!conn.authenticated && !conn.closing && now >= conn.auth_deadline) {
        refuse(conn, "did not authenticate within " +
                         std::to_string(options_.auth_timeout.count()) + " ms");
        continue;
      }
      if (conn.waiting == Waiting::none || conn.waiting == Waiting::upstream || now < conn.deadline)
        continue;
      auto after = " timed out after " + std::to_string(conn.timeout_ms) + " ms";
      if (conn.waiting == Waiting::get) {
        reply_error(conn, "get '" + conn.keys.front() + "'" + after + " (no one set it)");
        unpark(id, conn);
      } else if (conn.waiting == Waiting::wait || conn.waiting == Waiting::get_many) {
        std::string keys;
        for (const auto& key : conn.keys) keys += (keys.empty() ? "'" : ", '") + key + "'";
        if (keys.size() > 400) keys = keys.substr(0, 400) + "...";
        reply_error(conn, std::string(conn.waiting == Waiting::wait ? "wait" : "get_many") + after +
                              "; missing keys: " + keys);
        unpark(id, conn);
      } else if (conn.waiting == Waiting::fence) {
        fail_fence(conn.generation, "fence " + std::to_string(conn.generation) + after + ": ");
      } else {
        fail_gather(conn.gather, "allgather '" + conn.gather + "'" + after + ": ");
      }
    }
  }

  // A collective fails for all its waiters at once, with the same message, when the first
  // deadline passes: they all wait for the same missing ranks. One that went upstream is the
  // upstream's to fail (its answer names the missing ranks of the whole job).
  void fail_fence(std::uint64_t generation, const std::string& prefix) {
    auto it = fences_.find(generation);
    if (it == fences_.end() || it->second.forwarded) return;
    auto message = prefix + describe_missing(it->second.arrived);
    options_.log(message);
    release(it->second.waiters, Waiting::fence, error_frame(message));
    fences_.erase(it);
  }

  void fail_gather(const std::string& name, const std::string& prefix) {
    auto it = gathers_.find(name);
    if (it == gathers_.end() || it->second.forwarded) return;
    std::set<int> arrived;
    for (const auto& [rank, value] : it->second.values) arrived.insert(rank);
    auto message = prefix + describe_missing(arrived);
    options_.log(message);
    release(it->second.waiters, Waiting::allgather, error_frame(message));
    gathers_.erase(it);
  }

  // --- output ----------------------------------------------------------------------------------
  static SharedFrame error_frame(const std::string& message) {
    return shared_frame(Op::error, proto::PayloadWriter().str(message).take());
  }

  void reply_error(Conn& conn, const std::string& message) { enqueue(conn, error_frame(message)); }

  void refuse(Conn& conn, const std::string& why) {
    ++counters_.refused_frames;
    log_refusal(Refusal::frame,
                "refused " + conn.peer +
                    (conn.rank >= 0 ? " (rank " + std::to_string(conn.rank) + ")" : "") + ": " +
                    why);
    reply_error(conn, why);
    close_after_reply(conn);
  }

  void close_after_reply(Conn& conn) {
    conn.closing = true;
    conn.in.clear();
    if (conn.out.empty()) conn.dead = true;
  }

  void send(Conn& conn, Op op, std::span<const std::byte> payload) {
    enqueue(conn, shared_frame(op, payload));
  }

  void enqueue(Conn& conn, SharedFrame frame) {
    conn.out.push_back(std::move(frame));
    flush(conn);
  }

  void flush(Conn& conn) {
    while (!conn.out.empty()) {
      const Bytes& front = *conn.out.front();
      ssize_t n = ::send(conn.fd.get(), front.data() + conn.out_sent, front.size() - conn.out_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        conn.dead = true;
        return;
      }
      counters_.bytes_out += static_cast<std::uint64_t>(n);
      if (conn.relay) counters_.relay_bytes_out += static_cast<std::uint64_t>(n);
      conn.out_sent += static_cast<std::size_t>(n);
      if (conn.out_sent == front.size()) {
        conn.out.pop_front();
        conn.out_sent = 0;
      }
    }
    if (conn.closing) conn.dead = true;
  }

  void drop(Conn& conn) { conn.dead = true; }

  // Removes dead connections: their arrivals at a collective that has not gone upstream no
  // longer count (the peer is gone), and their rank is remembered as departed for diagnostics.
  void sweep() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& conn = it->second;
      if (!conn.dead) {
        ++it;
        continue;
      }
      if (conn.waiting == Waiting::fence) {
        if (auto f = fences_.find(conn.generation); f != fences_.end() && !f->second.forwarded) {
          for (int rank : conn.arrived_for) f->second.arrived.erase(rank);
          std::erase(f->second.waiters, it->first);
          if (f->second.waiters.empty()) fences_.erase(f);
        }
      } else if (conn.waiting == Waiting::allgather) {
        if (auto g = gathers_.find(conn.gather); g != gathers_.end() && !g->second.forwarded) {
          for (int rank : conn.arrived_for) g->second.values.erase(rank);
          std::erase(g->second.waiters, it->first);
          if (g->second.waiters.empty()) gathers_.erase(g);
        }
      }
      unpark(it->first, conn);
      if (conn.rank >= 0) {
        if (auto r = rank_conn_.find(conn.rank); r != rank_conn_.end() && r->second == it->first) {
          rank_conn_.erase(r);
          departed_.insert(conn.rank);
        }
      }
      it = conns_.erase(it);
    }
    relays_ = 0;
    for (const auto& [id, conn] : conns_) relays_ += conn.relay ? 1 : 0;
  }

  void publish_stats() {
    counters_.clients = conns_.size();
    counters_.keys = data_.size();
    counters_.stored_bytes = stored_bytes_;
    counters_.cpu_seconds = thread_cpu_seconds();
  }

  TcpStoreServerOptions options_;
  net::Fd listener_;
  net::Fd wake_;
  std::string address_;
  std::uint16_t port_ = 0;
  std::size_t max_payload_bytes_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  // Owned by the serving thread.
  int world_size_ = 0;
  const bool relay_;
  const std::set<int> below_;  // relay: the ranks it stands for
  std::unique_ptr<UpstreamLanes> lanes_;
  ConnId next_id_ = 1;
  Clock::time_point accept_paused_until_{};
  std::map<ConnId, Conn> conns_;
  std::size_t relays_ = 0;  // relay clients connected now
  std::unordered_map<std::string, Bytes> data_;
  std::size_t stored_bytes_ = 0;
  std::set<std::string> fetched_;    // relay: keys held as copies of upstream values
  std::set<std::string> in_flight_;  // relay: keys asked upstream, no answer yet
  std::vector<std::pair<std::string, Bytes>> pending_sets_;  // relay: set here, not yet upstream
  int sets_in_flight_ = 0;                                   // relay: set_many batches upstream
  std::vector<std::function<void()>> behind_sets_;           // relay: waiting for them
  std::string set_failure_;       // relay: why values set here did not reach upstream
  bool probe_in_flight_ = false;  // relay: watch_upstream's request
  Clock::time_point next_probe_{};
  std::unordered_map<std::string, std::set<ConnId>> key_waiters_;
  std::map<std::uint64_t, Fence> fences_;
  std::map<std::string, Gather> gathers_;
  std::map<int, ConnId> rank_conn_;
  std::set<int> departed_;
  struct RefusalCounts {
    std::size_t in_full = 0;     // lines of their own in this burst
    std::size_t suppressed = 0;  // counted since `since`, not yet said
    std::size_t by_kind[3] = {0, 0, 0};
    Clock::time_point since, last;
  };
  RefusalCounts refusals_;
  // Written by the serving thread, read by stats() from any thread.
  struct Counters {
    std::atomic<std::size_t> clients{0}, peak_clients{0}, peak_rank_clients{0}, refused_auth{0},
        refused_frames{0}, keys{0}, stored_bytes{0};
    std::atomic<std::uint64_t> requests{0}, bytes_in{0}, bytes_out{0}, relay_bytes_in{0},
        relay_bytes_out{0};
    std::atomic<double> cpu_seconds{0};
  };
  Counters counters_;
};

TcpStoreListener::TcpStoreListener(TcpStoreListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

TcpStoreListener& TcpStoreListener::operator=(TcpStoreListener&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

TcpStoreListener::~TcpStoreListener() {
  if (fd_ >= 0) ::close(fd_);
}

Result<TcpStoreListener> TcpStoreListener::open(const std::string& bind_host, std::uint16_t port) {
  auto listener = net::listen_tcp({bind_host, port}, 4096);
  if (!listener) return listener.error();
  auto bound = net::local_port(listener->get());
  return TcpStoreListener(listener->release(), bound);
}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(TcpStoreServerOptions options) {
  auto listener = TcpStoreListener::open(options.bind_host, options.port);
  if (!listener) return listener.error();
  return start(std::move(options), std::move(*listener));
}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(TcpStoreServerOptions options,
                                                              TcpStoreListener listener) {
  if (options.secret.empty())
    return make_error("wireup tcp store: empty secret (every job needs one)");
  if (options.world_size < 0) return make_error("wireup tcp store: negative world size");
  if (!options.upstream.empty()) {
    if (options.world_size == 0) return make_error("wireup tcp relay: world size not set");
    if (auto where = net::parse_host_port(options.upstream, "relay upstream"); !where)
      return where.error();
    for (int rank : options.ranks) {
      if (rank < 0 || rank >= options.world_size) {
        return make_error("wireup tcp relay: rank " + std::to_string(rank) +
                          " is outside the world size " + std::to_string(options.world_size));
      }
    }
  }
  net::Fd fd(std::exchange(listener.fd_, -1));
  net::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid())
    return make_error(std::string("wireup tcp store: eventfd: ") + std::strerror(errno));
  auto port = net::local_port(fd.get());
  auto host = options.bind_host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  auto impl = std::make_unique<Impl>(std::move(options), std::move(fd), std::move(wake),
                                     host + ":" + std::to_string(port));
  impl->start();
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() { stop(); }
std::uint16_t TcpStoreServer::port() const { return impl_->port(); }
std::string TcpStoreServer::address() const { return impl_->address(); }
void TcpStoreServer::stop() { impl_->stop(); }
TcpStoreServer::Stats TcpStoreServer::stats() const { return impl_->stats(); }

}  // namespace topolaunch::wireup
