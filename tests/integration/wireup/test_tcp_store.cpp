// The TCP store with real sockets on loopback: in-process clients for the operations, real
// processes (wireup_peer) for the exchange, the wrong secret and the rank killed mid-fence.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "auth.hpp"
#include "catch.hpp"
#include "frame.hpp"
#include "net.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

extern char** environ;

using namespace topolaunch::wireup;
using namespace std::chrono_literals;

namespace {

Bytes bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
}

struct LogLines {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view line) {
      std::lock_guard lock(mutex);
      lines.emplace_back(line);
    };
  }
  bool contains(std::string_view text) {
    std::lock_guard lock(mutex);
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

std::unique_ptr<TcpStoreServer> start_server(int world_size, LogLines& log,
                                             std::chrono::milliseconds auth_timeout = 10000ms) {
  TcpStoreServerOptions options;
  options.secret = "s3cret";
  options.world_size = world_size;
  options.auth_timeout = auth_timeout;
  options.log = log.sink();
  auto server = TcpStoreServer::start(options);
  REQUIRE(server.ok());
  return std::move(*server);
}

std::unique_ptr<TcpStoreClient> client(const TcpStoreServer& server, int rank, int world_size,
                                       std::string secret = "s3cret") {
  auto c = TcpStoreClient::connect(
      {server.address(), std::move(secret), rank, world_size, 5000ms, 5000ms});
  REQUIRE(c.ok());
  return std::move(*c);
}

std::size_t entries_in(const char* path) {
  std::size_t n = 0;
  if (DIR* dir = opendir(path)) {
    while (readdir(dir) != nullptr) ++n;
    closedir(dir);
  }
  return n;
}
std::size_t open_fds() { return entries_in("/proc/self/fd"); }
std::size_t threads() { return entries_in("/proc/self/task"); }

// The thread count once it has settled to `expected` (or after 2 s): a joined thread's entry can
// stay in /proc/self/task for a moment after pthread_join returned (the kernel wakes the joiner
// before it reaps the task), so one read right after stop() can still count it.
std::size_t threads_settled(std::size_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::size_t n = threads();
  while (n != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = threads();
  }
  return n;
}

std::string peer_path() {
  const char* path = std::getenv("WIREUP_PEER");
  if (path == nullptr) FAIL("WIREUP_PEER is not set (run through meson test)");
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A wireup_peer process with its own environment; stdout/stderr go to files.
struct Peer {
  pid_t pid = -1;
  std::string out_path, err_path;
  int status = -1;

  std::string out() const { return read_file(out_path); }
  std::string err() const { return read_file(err_path); }
};

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/wireup-test-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;  // a leftover temp dir is no test failure
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Peer spawn_peer(const TempDir& dir, const std::vector<std::string>& args,
                const std::vector<std::string>& env) {
  Peer peer;
  static int serial = 0;
  auto base = dir.path() + "/peer" + std::to_string(serial++);
  peer.out_path = base + ".out";
  peer.err_path = base + ".err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, peer.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, peer.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<std::string> argv_text{peer_path()};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text(env);
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  int rc = posix_spawn(&peer.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return peer;
}

std::vector<std::string> peer_env(const TcpStoreServer& server, int rank, int world_size,
                                  std::string secret = "s3cret") {
  return {"TOPOLAUNCH_STORE_ADDR=" + server.address(), "TOPOLAUNCH_STORE_SECRET=" + secret,
          "TOPOLAUNCH_RANK=" + std::to_string(rank),
          "TOPOLAUNCH_WORLD_SIZE=" + std::to_string(world_size)};
}

// Waits for the peer with a deadline; a peer still running then is killed and the test fails.
void wait_peer(Peer& peer, std::chrono::milliseconds limit = 20000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(peer.pid, &peer.status, WNOHANG) == peer.pid) return;
    std::this_thread::sleep_for(5ms);
  }
  kill(peer.pid, SIGKILL);
  waitpid(peer.pid, &peer.status, 0);
  FAIL("peer " << peer.pid << " did not finish in time; stderr: " << peer.err());
}

bool exited_with(const Peer& peer, int code) {
  return WIFEXITED(peer.status) && WEXITSTATUS(peer.status) == code;
}

}  // namespace

TEST_CASE("binary values round-trip; get blocks until another client sets the key") {
  LogLines log;
  auto server = start_server(2, log);
  auto a = client(*server, 0, 2);
  auto b = client(*server, 1, 2);
  CHECK(a->size() == 2);

  Bytes binary{std::byte{0}, std::byte{0xff}, std::byte{0}, std::byte{'\n'}};
  REQUIRE(a->set("bin", binary).ok());
  auto got = b->get("bin", 1000ms);
  REQUIRE(got.ok());
  CHECK(*got == binary);

  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    CHECK(a->set("late", bytes_of("here")).ok());
  });
  auto start = std::chrono::steady_clock::now();
  auto late = b->get_string("late", 5000ms);
  setter.join();
  REQUIRE(late.ok());
  CHECK(*late == "here");
  CHECK(std::chrono::steady_clock::now() - start >= 90ms);
}

TEST_CASE("get_many returns values in the order asked, waiting for late keys") {
  LogLines log;
  auto server = start_server(2, log);
  auto a = client(*server, 0, 2);
  auto b = client(*server, 1, 2);
  REQUIRE(a->set("k2", bytes_of("two")).ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    CHECK(a->set("k1", bytes_of("one")).ok());
  });
  auto values = b->get_many({"k2", "k1", "k2"}, 5000ms);
  setter.join();
  REQUIRE(values.ok());
  REQUIRE(values->size() == 3);
  CHECK((*values)[0] == bytes_of("two"));
  CHECK((*values)[1] == bytes_of("one"));
  CHECK((*values)[2] == bytes_of("two"));

  auto missing = b->get_many({"k1", "k3"}, 100ms);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("get_many timed out after 100 ms; missing keys: 'k3'") !=
        std::string::npos);
  auto none = b->get_many({}, 100ms);
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("values above the store's limit are refused by the client with the limit named") {
  LogLines log;
  TcpStoreServerOptions options;
  options.secret = "s3cret";
  options.max_value_bytes = 1000;
  options.log = log.sink();
  auto server = TcpStoreServer::start(options).value();
  auto c = client(*server, -1, 0);
  auto big = c->set("big", Bytes(1001));
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().message.find("above the store's limit of 1000") != std::string::npos);
  CHECK_FALSE(c->put("big", Bytes(5000)).ok());
  CHECK(c->set("fits", Bytes(1000)).ok());
  CHECK(c->get("fits", 100ms).value().size() == 1000);
  CHECK(c->get("fits", std::chrono::milliseconds::max()).ok());  // "forever" does not overflow
}

TEST_CASE("get, wait and fence time out with errors that say what was missing") {
  LogLines log;
  auto server = start_server(2, log);
  auto a = client(*server, 0, 2);

  auto start = std::chrono::steady_clock::now();
  auto missing = a->get("nobody", 200ms);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("get 'nobody' timed out after 200 ms") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 2000ms);

  REQUIRE(a->set("x", bytes_of("1")).ok());
  auto waited = a->wait({"x", "y"}, 150ms);
  REQUIRE_FALSE(waited.ok());
  CHECK(waited.error().message.find("missing keys: 'y'") != std::string::npos);

  auto fence = a->fence(200ms);
  REQUIRE_FALSE(fence.ok());
  CHECK(fence.error().message.find("1 of 2 ranks arrived; missing ranks: 1 (never connected)") !=
        std::string::npos);
  CHECK(log.contains("missing ranks: 1"));
}

TEST_CASE("add is atomic across clients; wait and remove work; repeated fences use generations") {
  LogLines log;
  constexpr int kRanks = 4;
  auto server = start_server(kRanks, log);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto c = TcpStoreClient::connect({server->address(), "s3cret", rank, kRanks, 5000ms, 5000ms});
      if (!c) {
        ++failures;
        return;
      }
      for (int i = 0; i < 50; ++i) {
        if (!(*c)->add("counter", 1).ok()) ++failures;
      }
      for (int generation = 0; generation < 3; ++generation) {
        if (!(*c)->put(rank_key("g" + std::to_string(generation), rank), "v").ok()) ++failures;
        if (!(*c)->fence(5000ms).ok()) ++failures;
        // After a fence every rank's value of this generation is there.
        std::vector<std::string> keys;
        for (int peer = 0; peer < kRanks; ++peer)
          keys.push_back(rank_key("g" + std::to_string(generation), peer));
        auto values = (*c)->get_many(keys, 1ms);
        if (!values || values->size() != kRanks) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);

  auto c = client(*server, -1, 0);  // an observer: no rank
  auto counter = c->get_string("counter", 100ms);
  REQUIRE(counter.ok());
  CHECK(*counter == std::to_string(kRanks * 50));
  CHECK(c->add("counter", -200).value() == 0);
  CHECK(c->wait({"g0/0", "g2/3"}, 100ms).ok());
  CHECK(c->remove("g0/0").value());
  CHECK_FALSE(c->remove("g0/0").value());
  CHECK_FALSE(c->get("g0/0", 10ms).ok());
  auto not_counter = c->add("g1/1", 1);
  REQUIRE_FALSE(not_counter.ok());
  CHECK(not_counter.error().message.find("not a counter") != std::string::npos);
  auto observer_fence = c->fence(100ms);
  REQUIRE_FALSE(observer_fence.ok());
  CHECK(observer_fence.error().message.find("no rank") != std::string::npos);
}

TEST_CASE("a wrong secret is refused and logged, and the server keeps serving the others") {
  LogLines log;
  auto server = start_server(1, log);
  auto bad = TcpStoreClient::connect({server->address(), "guess", 0, 1, 2000ms, 2000ms});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("wrong secret") != std::string::npos);
  CHECK(log.contains("wrong secret"));
  CHECK(server->stats().refused_auth == 1);

  auto good = client(*server, 0, 1);
  CHECK(good->set("k", bytes_of("v")).ok());
  CHECK(good->fence(1000ms).ok());
}

TEST_CASE("a client refuses a server that cannot prove it knows the secret") {
  // A fake store that accepts any client and answers with a made-up proof.
  auto listener = net::listen_tcp({"127.0.0.1", 0}, 4).value();
  auto port = net::local_port(listener.get());
  std::thread fake([&] {
    pollfd p{listener.get(), POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return;
    net::Fd fd(accept(listener.get(), nullptr, nullptr));
    auto deadline = net::Clock::now() + 2000ms;
    auto nonce = auth::random_nonce();
    (void)net::send_all(
        fd.get(),
        proto::encode_frame(proto::Op::challenge, proto::PayloadWriter().bytes(nonce).take()),
        deadline);
    Bytes header(proto::kHeaderBytes);
    if (!net::recv_exact(fd.get(), header, deadline).ok()) return;
    Bytes payload(proto::decode_header(header, 4096).value().payload_bytes);
    if (!net::recv_exact(fd.get(), payload, deadline).ok()) return;
    auto reply = proto::PayloadWriter().i64(1).bytes(auth::random_nonce()).take();
    (void)net::send_all(fd.get(), proto::encode_frame(proto::Op::auth_ok, reply), deadline);
    Bytes rest(1);
    (void)net::recv_exact(fd.get(), rest, deadline);  // until the client hangs up
  });
  auto c = TcpStoreClient::connect(
      {"127.0.0.1:" + std::to_string(port), "s3cret", 0, 1, 2000ms, 2000ms});
  fake.join();
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("does not know the job secret") != std::string::npos);
}

TEST_CASE("junk bytes, oversized frames and silent peers are refused; the server survives") {
  LogLines log;
  auto server = start_server(1, log, 300ms);
  auto where = net::parse_host_port(server->address(), "test").value();
  auto deadline = [] { return net::Clock::now() + 2000ms; };

  auto expect_closed = [&](net::Fd& fd) {
    Bytes sink(1 << 16);
    for (;;) {  // read the challenge and the error reply until the server closes
      auto r = net::recv_exact(fd.get(), std::span(sink).first(1), deadline());
      if (!r) {
        CHECK(r.error().message.find("closed") != std::string::npos);
        return;
      }
    }
  };

  SECTION("random junk instead of an auth frame") {
    auto fd = net::connect_tcp(where, deadline()).value();
    Bytes junk(4096);
    for (std::size_t i = 0; i < junk.size(); ++i)
      junk[i] = static_cast<std::byte>((i * 7919) & 0xff);
    REQUIRE(net::send_all(fd.get(), junk, deadline()).ok());
    expect_closed(fd);
    CHECK(log.contains("bad frame magic"));
  }
  SECTION("an auth header announcing 1 GiB") {
    auto fd = net::connect_tcp(where, deadline()).value();
    auto frame = proto::encode_frame(proto::Op::auth, {});
    frame[11] = std::byte{0x40};  // payload_bytes = 0x40000000
    REQUIRE(net::send_all(fd.get(), frame, deadline()).ok());
    expect_closed(fd);
    CHECK(log.contains("exceeds the limit"));
  }
  SECTION("a peer that never authenticates") {
    auto fd = net::connect_tcp(where, deadline()).value();
    expect_closed(fd);
    CHECK(log.contains("did not authenticate within 300 ms"));
  }
  SECTION("an authenticated peer sending an oversized and then a malformed frame") {
    auto fd = net::connect_tcp(where, deadline()).value();
    Bytes header(proto::kHeaderBytes);
    REQUIRE(net::recv_exact(fd.get(), header, deadline()).ok());
    auto h = proto::decode_header(header, 1024).value();
    Bytes payload(h.payload_bytes);
    REQUIRE(net::recv_exact(fd.get(), payload, deadline()).ok());
    auto nonce = proto::PayloadReader(payload).bytes().value();
    auto client_nonce = auth::random_nonce();
    auto hello = proto::PayloadWriter()
                     .i64(0)
                     .i64(1)
                     .bytes(client_nonce)
                     .bytes(auth::client_proof("s3cret", nonce, 0, 1))
                     .take();
    REQUIRE(net::send_all(fd.get(), proto::encode_frame(proto::Op::auth, hello), deadline()).ok());
    REQUIRE(net::recv_exact(fd.get(), header, deadline()).ok());
    REQUIRE(proto::decode_header(header, 1024).value().op == proto::Op::auth_ok);
    // A set whose value length field lies about the payload.
    auto lying = proto::PayloadWriter().str("k").u64(0xffffffffffffull).take();
    REQUIRE(net::send_all(fd.get(), proto::encode_frame(proto::Op::set, lying), deadline()).ok());
    expect_closed(fd);
    CHECK(log.contains("malformed set frame"));
  }

  // Whatever happened above, a proper client is served.
  auto good = client(*server, 0, 1);
  REQUIRE(good->set("still", bytes_of("alive")).ok());
  CHECK(good->get_string("still", 100ms).value() == "alive");
  CHECK(server->stats().refused_frames >= 1);
}

TEST_CASE("a burst of hostile peers is logged as a few lines and a count, not a line each") {
  // One line per refused peer put 1,272 lines into a job's stderr in 23 s.
  LogLines log;
  TcpStoreServerOptions options;
  options.secret = "s3cret";
  options.world_size = 1;
  options.refusal_summary_every = 300ms;
  options.log = log.sink();
  auto server = TcpStoreServer::start(options).value();
  auto where = net::parse_host_port(server->address(), "test").value();
  auto junk_peer = [&] {
    auto fd = net::connect_tcp(where, net::Clock::now() + 2000ms).value();
    Bytes junk(64, std::byte{0x5a});
    REQUIRE(net::send_all(fd.get(), junk, net::Clock::now() + 2000ms).ok());
    Bytes sink(1 << 12);
    while (net::recv_exact(fd.get(), std::span(sink).first(1), net::Clock::now() + 2000ms)) {
    }
  };
  constexpr std::size_t kPeers = 200;
  for (std::size_t i = 0; i < kPeers; ++i) junk_peer();
  auto counted = [&] {
    std::lock_guard lock(log.mutex);
    std::size_t in_full = 0, summarized = 0, summaries = 0;
    for (const auto& line : log.lines) {
      unsigned long n = 0;
      if (line.find(" more peer") != std::string::npos &&
          std::sscanf(line.c_str(), "refused %lu more peer", &n) == 1) {
        summarized += n;
        ++summaries;
      } else if (line.rfind("refused ", 0) == 0) {
        ++in_full;
      }
    }
    return std::tuple{in_full, summarized, summaries};
  };
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::get<0>(counted()) + std::get<1>(counted()) < kPeers &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  const auto [in_full, summarized, summaries] = counted();
  CHECK(server->stats().refused_frames == kPeers);
  CHECK(in_full == options.refusals_in_full);
  CHECK(summarized == kPeers - options.refusals_in_full);  // every refusal counted once
  CHECK(summaries >= 1);
  CHECK(summaries <= 20);  // one per 300 ms at most while the burst lasted
  CHECK(log.contains("further refused peers are counted, one line every 0.3 s"));
  CHECK(log.contains("bad frames or no authentication"));
  std::printf("%zu hostile peers: %zu lines (%zu in full, %zu counts)\n", kPeers, log.lines.size(),
              in_full, summaries);

  // After a quiet interval the next refusal is a line of its own again.
  std::this_thread::sleep_for(400ms);
  junk_peer();
  std::this_thread::sleep_for(100ms);
  CHECK(std::get<0>(counted()) == options.refusals_in_full + 1);
  auto good = client(*server, 0, 1);
  CHECK(good->set("k", bytes_of("v")).ok());
}

TEST_CASE("a port in use is a clear error naming the port") {
  LogLines log;
  auto first = start_server(1, log);
  TcpStoreServerOptions options;
  options.secret = "s";
  options.port = first->port();
  auto second = TcpStoreServer::start(options);
  REQUIRE_FALSE(second.ok());
  CHECK(second.error().message.find("port " + std::to_string(first->port()) +
                                    " on 127.0.0.1 is already in use") != std::string::npos);
}

TEST_CASE("stop() ends blocked clients' calls with an error and leaks no fd or thread") {
  auto fds_before = open_fds();
  auto threads_before = threads();
  {
    LogLines log;
    auto server = start_server(2, log);
    auto c = client(*server, 0, 2);
    std::thread stopper([&] {
      std::this_thread::sleep_for(100ms);
      server->stop();
    });
    auto start = std::chrono::steady_clock::now();
    auto r = c->get("never", 10000ms);
    stopper.join();
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("closed") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < 3000ms);
    auto after = c->set("k", bytes_of("v"));
    REQUIRE_FALSE(after.ok());
    CHECK(after.error().message.find("connection unusable") != std::string::npos);
    server->stop();  // idempotent
  }
  CHECK(open_fds() == fds_before);
  CHECK(threads_settled(threads_before) == threads_before);
}

TEST_CASE("8 processes exchange 4 KiB values: allgather, and put + fence + get_many") {
  for (const char* mode : {"exchange", "exchange-kv"}) {
    INFO("wireup_peer " << mode);
    LogLines log;
    constexpr int kRanks = 8;
    auto server = start_server(kRanks, log);
    TempDir dir;
    std::vector<Peer> peers;
    for (int rank = 0; rank < kRanks; ++rank) {
      peers.push_back(
          spawn_peer(dir, {mode, "4096", "10000", "2"}, peer_env(*server, rank, kRanks)));
    }
    for (auto& peer : peers) {
      wait_peer(peer);
      INFO("stderr: " << peer.err());
      CHECK(exited_with(peer, 0));
      CHECK(peer.out().find("\"exchange_us\":[") != std::string::npos);
    }
    CHECK(server->stats().keys == 2 * kRanks);
  }
}

TEST_CASE("a process started with the wrong secret exits with the reason") {
  LogLines log;
  auto server = start_server(1, log);
  TempDir dir;
  auto peer = spawn_peer(dir, {"exchange", "16", "1000"}, peer_env(*server, 0, 1, "wrong"));
  wait_peer(peer);
  CHECK(exited_with(peer, 1));
  CHECK(peer.err().find("wrong secret") != std::string::npos);
  CHECK(log.contains("wrong secret"));
}

TEST_CASE("a rank killed mid-job makes the next fence fail at its timeout, naming that rank") {
  LogLines log;
  constexpr int kRanks = 4;
  auto server = start_server(kRanks, log);
  TempDir dir;
  std::vector<Peer> peers;
  for (int rank = 0; rank < kRanks - 1; ++rank) {
    peers.push_back(spawn_peer(dir, {"exchange", "64", "1500"}, peer_env(*server, rank, kRanks)));
  }
  auto victim = spawn_peer(dir, {"hang"}, peer_env(*server, kRanks - 1, kRanks));
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (victim.out().find("ready") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(victim.out().find("ready") != std::string::npos);
  kill(victim.pid, SIGKILL);
  waitpid(victim.pid, &victim.status, 0);

  auto start = std::chrono::steady_clock::now();
  for (auto& peer : peers) {
    wait_peer(peer, 10000ms);
    INFO("stderr: " << peer.err());
    CHECK(exited_with(peer, 1));
    CHECK(peer.err().find(
              "timed out after 1500 ms: 3 of 4 ranks arrived; missing ranks: 3 (disconnected)") !=
          std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 5000ms);
}

TEST_CASE("topolaunch-store serves as its own process and stops cleanly on SIGTERM") {
  const char* store_path = std::getenv("WIREUP_STORE");
  if (store_path == nullptr) FAIL("WIREUP_STORE is not set (run through meson test)");
  TempDir dir;
  auto out = dir.path() + "/store.out";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::string path = store_path, flag = "--world-size", two = "2",
              secret = "TOPOLAUNCH_STORE_SECRET=s3cret";
  char* argv[] = {path.data(), flag.data(), two.data(), nullptr};
  char* envp[] = {secret.data(), nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv, envp) == 0);
  posix_spawn_file_actions_destroy(&actions);
  std::string address;
  for (int i = 0; i < 500 && address.find('\n') == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
    address = read_file(out);
  }
  REQUIRE(address.find('\n') != std::string::npos);
  address.pop_back();

  std::vector<std::string> env{"TOPOLAUNCH_STORE_ADDR=" + address, "TOPOLAUNCH_STORE_SECRET=s3cret",
                               "WORLD_SIZE=2"};
  std::vector<Peer> peers;
  for (int rank = 0; rank < 2; ++rank) {
    auto peer_env_rank = env;
    peer_env_rank.push_back("RANK=" + std::to_string(rank));  // the torchrun names work too
    peers.push_back(spawn_peer(dir, {"exchange", "1000", "5000"}, peer_env_rank));
  }
  for (auto& peer : peers) {
    wait_peer(peer);
    INFO("stderr: " << peer.err());
    CHECK(exited_with(peer, 0));
  }
  kill(pid, SIGTERM);
  Peer store{pid, out, out};
  wait_peer(store, 5000ms);
  CHECK(exited_with(store, 0));
}
