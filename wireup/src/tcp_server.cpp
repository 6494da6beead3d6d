// The TCP store server: one thread, one poll() loop over non-blocking sockets.
//
// Each connection carries at most one request at a time (the client is synchronous), so a
// blocking request (get, wait, fence) simply parks the connection until its keys appear, its
// fence completes or its deadline passes. No request can block the loop.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "auth.hpp"
#include "frame.hpp"
#include "net.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::wireup {
namespace {

using net::Clock;
using proto::Op;
using ConnId = std::uint64_t;

constexpr std::size_t kMaxKeyBytes = 4096;
constexpr std::size_t kRecvChunkBytes = 64 * 1024;
constexpr std::size_t kMaxMissingListed = 16;

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
        world_size_(options_.world_size) {
    if (!options_.log) {
      options_.log = [](std::string_view line) {
        std::fprintf(stderr, "topolaunch wireup: %.*s\n", static_cast<int>(line.size()),
                     line.data());
      };
    }
    max_payload_bytes_ = options_.max_value_bytes + kMaxKeyBytes + 64;
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
    conns_.clear();  // closes every client socket
    listener_.reset();
  }

  std::uint16_t port() const { return port_; }
  const std::string& address() const { return address_; }

  Stats stats() const {
    std::lock_guard lock(stats_mutex_);
    return stats_;
  }

 private:
  enum class Waiting { none, get, wait, get_many, fence };

  struct Conn {
    net::Fd fd;
    std::string peer;
    bool authenticated = false;
    Bytes server_nonce;
    Clock::time_point auth_deadline;
    int rank = -1;
    Bytes in;
    Bytes out;
    std::size_t out_sent = 0;
    bool closing = false;  // refused: flush the error reply, then close
    bool dead = false;
    Waiting waiting = Waiting::none;
    std::vector<std::string> keys;       // get/wait/get_many: the keys still missing
    std::vector<std::string> requested;  // get_many: every key asked for, in order
    std::uint64_t generation = 0;        // fence
    Clock::time_point deadline;
    std::uint64_t timeout_ms = 0;
  };

  struct Fence {
    std::set<int> arrived;
    std::vector<ConnId> waiters;
  };

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
        if (conn.out_sent < conn.out.size()) events |= POLLOUT;
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
      expire(Clock::now());
      sweep();
    }
  }

  int poll_timeout_ms() const {
    auto next = Clock::time_point::max();
    for (const auto& [id, conn] : conns_) {
      if (!conn.authenticated) next = std::min(next, conn.auth_deadline);
      if (conn.waiting != Waiting::none) next = std::min(next, conn.deadline);
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
      // A get_many reply carries every rank's value; a large send buffer lets it leave in one
      // send instead of many poll rounds (loopback starts at 16 KiB and grows slowly).
      int send_buffer_bytes = 4 << 20, one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &send_buffer_bytes, sizeof send_buffer_bytes);
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (conns_.size() >= options_.max_clients) {
        options_.log("refused " + peer_name(fd) + ": too many clients (" +
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
      update_client_count();
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
      if (conn.closing) continue;  // refused: ignore whatever else it sends
      conn.in.insert(conn.in.end(), chunk, chunk + n);
      process_frames(id);
      if (conn.dead) return;
    }
  }

  void process_frames(ConnId id) {
    Conn& conn = conns_.at(id);
    while (!conn.closing && conn.in.size() >= proto::kHeaderBytes) {
      auto limit = conn.authenticated ? max_payload_bytes_ : proto::kMaxUnauthenticatedPayload;
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
      {
        std::lock_guard lock(stats_mutex_);
        ++stats_.refused_auth;
      }
      options_.log("refused " + conn.peer + " (claims rank " + std::to_string(*rank) +
                   "): wrong secret, authentication failed");
      reply_error(conn, "authentication failed: wrong secret (check TOPOLAUNCH_STORE_SECRET)");
      return close_after_reply(conn);
    }
    if (*rank >= 0) {
      if (world_size_ == 0 && *world_size > 0) world_size_ = static_cast<int>(*world_size);
      if (*world_size != world_size_ || *rank >= world_size_) {
        return refuse(conn, "rank " + std::to_string(*rank) + " of world size " +
                                std::to_string(*world_size) +
                                " does not fit this store's world size " +
                                std::to_string(world_size_));
      }
      conn.rank = static_cast<int>(*rank);
      if (rank_conn_.count(conn.rank) != 0) {
        options_.log("rank " + std::to_string(conn.rank) + " connected again from " + conn.peer);
      }
      rank_conn_[conn.rank] = id;
      departed_.erase(conn.rank);
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
        return park(id, conn, Waiting::get, {*key}, *timeout_ms);
      }
      case Op::add: {
        auto key = in.str();
        auto delta = in.i64();
        if (!key || !delta || !in.at_end()) return malformed();
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
        return park(id, conn, op == Op::get_many ? Waiting::get_many : Waiting::wait,
                    std::move(missing), *timeout_ms);
      }
      case Op::fence:
        return arrive_at_fence(id, conn, in);
      case Op::remove: {
        auto key = in.str();
        if (!key || !in.at_end()) return malformed();
        bool existed = data_.erase(*key) > 0;
        update_key_count();
        return send(conn, Op::ok, proto::PayloadWriter().u64(existed ? 1 : 0).take());
      }
      default:
        return refuse(conn, "unexpected " + std::string(proto::op_name(op)) + " frame");
    }
  }

  void arrive_at_fence(ConnId id, Conn& conn, proto::PayloadReader& in) {
    auto generation = in.u64();
    auto timeout_ms = in.u64();
    if (!generation || !timeout_ms || !in.at_end()) return refuse(conn, "malformed fence frame");
    if (conn.rank < 0)
      return reply_error(conn, "fence: this client has no rank (connect with a rank to fence)");
    Fence& fence = fences_[*generation];
    if (!fence.arrived.insert(conn.rank).second) {
      return reply_error(conn, "fence " + std::to_string(*generation) + ": rank " +
                                   std::to_string(conn.rank) +
                                   " arrived twice (two clients with the same rank?)");
    }
    fence.waiters.push_back(id);
    conn.generation = *generation;
    if (static_cast<int>(fence.arrived.size()) == world_size_) {
      for (ConnId waiter : fence.waiters) {
        if (auto it = conns_.find(waiter); it != conns_.end()) {
          it->second.waiting = Waiting::none;
          send(it->second, Op::ok, {});
        }
      }
      fences_.erase(*generation);
      return;
    }
    park(id, conn, Waiting::fence, {}, *timeout_ms);
  }

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
    data_[key] = std::move(value);
    update_key_count();
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
        send(conn, Op::ok, proto::PayloadWriter().bytes(data_[key]).take());
      } else if (conn.waiting == Waiting::wait || conn.waiting == Waiting::get_many) {
        std::erase(conn.keys, key);
        if (conn.keys.empty()) finish_wait(conn, conn.waiting == Waiting::get_many);
      }
    }
  }

  // Every key of a wait/get_many exists: reply (with the values, in order, for get_many).
  void finish_wait(Conn& conn, bool with_values) {
    conn.waiting = Waiting::none;
    if (!with_values) return send(conn, Op::ok, {});
    proto::PayloadWriter reply;
    reply.u64(conn.requested.size());
    for (const auto& key : conn.requested) {
      auto it = data_.find(key);
      if (it == data_.end()) {  // removed by another client while this one waited
        conn.requested.clear();
        return reply_error(conn,
                           "get_many: key '" + key + "' was removed while waiting for the others");
      }
      reply.bytes(it->second);
    }
    conn.requested.clear();
    send(conn, Op::ok, reply.data());
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

  std::string describe_missing(std::uint64_t generation) const {
    const Fence* fence = nullptr;
    if (auto it = fences_.find(generation); it != fences_.end()) fence = &it->second;
    std::string missing;
    std::size_t listed = 0, total = 0;
    for (int rank = 0; rank < world_size_; ++rank) {
      if (fence != nullptr && fence->arrived.count(rank) != 0) continue;
      ++total;
      if (listed == kMaxMissingListed) continue;
      ++listed;
      const char* state = rank_conn_.count(rank) != 0  ? "connected, not at the fence"
                          : departed_.count(rank) != 0 ? "disconnected"
                                                       : "never connected";
      if (!missing.empty()) missing += ", ";
      missing += std::to_string(rank) + " (" + state + ")";
    }
    if (total > listed) missing += ", and " + std::to_string(total - listed) + " more";
    std::size_t arrived = fence != nullptr ? fence->arrived.size() : 0;
    return std::to_string(arrived) + " of " + std::to_string(world_size_) +
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
      if (conn.waiting == Waiting::none || now < conn.deadline) continue;
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
      } else {
        fail_fence(conn.generation, "fence " + std::to_string(conn.generation) + after + ": ");
      }
    }
  }

  // A fence fails for all its waiters at once, with the same message, when the first deadline
  // passes: they all wait for the same missing ranks.
  void fail_fence(std::uint64_t generation, const std::string& prefix) {
    auto it = fences_.find(generation);
    if (it == fences_.end()) return;
    auto message = prefix + describe_missing(generation);
    options_.log(message);
    for (ConnId waiter : it->second.waiters) {
      if (auto c = conns_.find(waiter); c != conns_.end() && c->second.waiting == Waiting::fence) {
        c->second.waiting = Waiting::none;
        reply_error(c->second, message);
      }
    }
    fences_.erase(it);
  }

  void reply_error(Conn& conn, const std::string& message) {
    send(conn, Op::error, proto::PayloadWriter().str(message).take());
  }

  void refuse(Conn& conn, const std::string& why) {
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.refused_frames;
    }
    options_.log("refused " + conn.peer +
                 (conn.rank >= 0 ? " (rank " + std::to_string(conn.rank) + ")" : "") + ": " + why);
    reply_error(conn, why);
    close_after_reply(conn);
  }

  void close_after_reply(Conn& conn) {
    conn.closing = true;
    conn.in.clear();
    if (conn.out_sent == conn.out.size()) conn.dead = true;
  }

  void send(Conn& conn, Op op, std::span<const std::byte> payload) {
    auto frame = proto::encode_frame(op, payload);
    conn.out.insert(conn.out.end(), frame.begin(), frame.end());
    flush(conn);
  }

  void flush(Conn& conn) {
    while (conn.out_sent < conn.out.size()) {
      ssize_t n = ::send(conn.fd.get(), conn.out.data() + conn.out_sent,
                         conn.out.size() - conn.out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        conn.dead = true;
        return;
      }
      conn.out_sent += static_cast<std::size_t>(n);
    }
    conn.out.clear();
    conn.out_sent = 0;
    if (conn.closing) conn.dead = true;
  }

  void drop(Conn& conn) { conn.dead = true; }

  // Removes dead connections: their fence arrivals no longer count (the peer is gone), and
  // their rank is remembered as departed for fence diagnostics.
  void sweep() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& conn = it->second;
      if (!conn.dead) {
        ++it;
        continue;
      }
      if (conn.waiting == Waiting::fence) {
        if (auto f = fences_.find(conn.generation); f != fences_.end()) {
          f->second.arrived.erase(conn.rank);
          std::erase(f->second.waiters, it->first);
          if (f->second.waiters.empty()) fences_.erase(f);
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
    update_client_count();
  }

  void update_client_count() {
    std::lock_guard lock(stats_mutex_);
    stats_.clients = conns_.size();
  }
  void update_key_count() {
    std::lock_guard lock(stats_mutex_);
    stats_.keys = data_.size();
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
  ConnId next_id_ = 1;
  Clock::time_point accept_paused_until_{};
  std::map<ConnId, Conn> conns_;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::set<ConnId>> key_waiters_;
  std::map<std::uint64_t, Fence> fences_;
  std::map<int, ConnId> rank_conn_;
  std::set<int> departed_;

  mutable std::mutex stats_mutex_;
  Stats stats_;
};

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(TcpStoreServerOptions options) {
  if (options.secret.empty())
    return make_error("wireup tcp store: empty secret (every job needs one)");
  if (options.world_size < 0) return make_error("wireup tcp store: negative world size");
  auto listener = net::listen_tcp({options.bind_host, options.port}, 4096);
  if (!listener) return listener.error();
  net::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid())
    return make_error(std::string("wireup tcp store: eventfd: ") + std::strerror(errno));
  auto port = net::local_port(listener->get());
  auto host = options.bind_host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*listener), std::move(wake),
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
