// The TCP store's allgather and its relays, with real sockets on loopback: a tree of relays
// (root <- A <- B, C) must answer every KvStore call as the root alone would, send each value
// out of the root once per child relay, and name a missing rank when a fence times out.
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "catch.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

using namespace topolaunch::wireup;
using topolaunch::Result;
using namespace std::chrono_literals;

namespace {

constexpr const char* kSecret = "relay-secret";

Bytes bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
}

std::string text_of(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

struct Log {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view line) {
      std::lock_guard lock(mutex);
      lines.emplace_back(line);
    };
  }
};

std::unique_ptr<TcpStoreServer> root_store(int world_size, Log& log) {
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = world_size;
  options.log = log.sink();
  auto server = TcpStoreServer::start(options);
  REQUIRE(server.ok());
  return std::move(*server);
}

std::unique_ptr<TcpStoreServer> relay(const TcpStoreServer& upstream, int world_size,
                                      std::vector<int> ranks, Log& log) {
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = world_size;
  options.upstream = upstream.address();
  options.ranks = std::move(ranks);
  options.upstream_connect_timeout = 5000ms;
  options.log = log.sink();
  auto server = TcpStoreServer::start(options);
  REQUIRE(server.ok());
  return std::move(*server);
}

std::unique_ptr<TcpStoreClient> client(const TcpStoreServer& server, int rank, int world_size) {
  auto c = TcpStoreClient::connect({server.address(), kSecret, rank, world_size, 5000ms, 5000ms});
  REQUIRE(c.ok());
  return std::move(*c);
}

// A three-level tree for six ranks: 0,1 at relay A (below the root), 2,3 at relay B and 4,5 at
// relay C (both below A).
struct Tree {
  Log log;
  std::unique_ptr<TcpStoreServer> root, a, b, c;
  Tree() {
    root = root_store(6, log);
    a = relay(*root, 6, {0, 1, 2, 3, 4, 5}, log);
    b = relay(*a, 6, {2, 3}, log);
    c = relay(*a, 6, {4, 5}, log);
  }
  const TcpStoreServer& home_of(int rank) const { return rank < 2 ? *a : rank < 4 ? *b : *c; }
};

// The server's figures once `ready` holds for them (they are published once per serving round).
TcpStoreServer::Stats settled(const TcpStoreServer& server,
                              const std::function<bool(const TcpStoreServer::Stats&)>& ready) {
  auto deadline = std::chrono::steady_clock::now() + 2s;
  auto stats = server.stats();
  while (!ready(stats) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    stats = server.stats();
  }
  return stats;
}

// Runs fn(rank, client) for every rank of the tree at once; returns what each returned.
template <class Fn>
auto on_every_rank(const Tree& tree, Fn fn) {
  using Out = decltype(fn(0, std::declval<TcpStoreClient&>()));
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  for (int rank = 0; rank < 6; ++rank) clients.push_back(client(tree.home_of(rank), rank, 6));
  std::vector<std::future<Out>> futures;
  for (int rank = 0; rank < 6; ++rank) {
    futures.push_back(
        std::async(std::launch::async, [&, rank] { return fn(rank, *clients[rank]); }));
  }
  std::vector<Out> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

}  // namespace

TEST_CASE("allgather gives every rank all values in rank order; rank keys hold them afterwards") {
  Log log;
  auto root = root_store(4, log);
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  for (int rank = 0; rank < 4; ++rank) clients.push_back(client(*root, rank, 4));
  std::vector<std::future<Result<Gathered>>> futures;
  for (int rank = 0; rank < 4; ++rank) {
    futures.push_back(std::async(std::launch::async, [&, rank] {
      return clients[rank]->allgather("addr", bytes_of("rank " + std::to_string(rank)), 5000ms);
    }));
  }
  for (auto& f : futures) {
    auto values = f.get();
    REQUIRE(values.ok());
    REQUIRE(values->size() == 4);
    for (int r = 0; r < 4; ++r) CHECK(text_of((*values)[r]) == "rank " + std::to_string(r));
  }
  // One round trip per rank: auth aside, the store served exactly four allgather requests.
  CHECK(settled(*root, [](const auto& s) { return s.requests >= 4; }).requests == 4);
  CHECK(clients[0]->get_string(rank_key("addr", 3), 1000ms).value() == "rank 3");
}

TEST_CASE("allgather that a rank misses fails at its timeout, naming the rank") {
  Log log;
  auto root = root_store(3, log);
  auto c0 = client(*root, 0, 3);
  auto c1 = client(*root, 1, 3);
  auto f0 = std::async(std::launch::async, [&] { return c0->allgather("x", {}, 400ms); });
  auto r1 = c1->allgather("x", {}, 400ms);
  auto r0 = f0.get();
  REQUIRE_FALSE(r1.ok());
  REQUIRE_FALSE(r0.ok());
  CHECK(r1.error().message.find("allgather 'x' timed out after 400 ms: 2 of 3 ranks arrived; "
                                "missing ranks: 2 (never connected)") != std::string::npos);
}

TEST_CASE("through a tree of relays: allgather, fence, put + get and get_many answer as the root") {
  Tree tree;
  auto results = on_every_rank(tree, [](int rank, TcpStoreClient& kv) -> std::string {
    auto values = kv.allgather("ep", bytes_of("ep of " + std::to_string(rank)), 5000ms);
    if (!values) return values.error().message;
    for (int r = 0; r < 6; ++r) {
      if (text_of((*values)[r]) != "ep of " + std::to_string(r))
        return "wrong value of " + std::to_string(r);
    }
    // An NCCL-style unique id: rank 5 puts, everyone reads it after the fence.
    if (rank == 5 && !kv.put("nccl/id", bytes_of("unique-id"))) return "put failed";
    if (auto s = kv.fence(5000ms); !s) return s.error().message;
    auto id = kv.get_string("nccl/id", 5000ms);
    if (!id || *id != "unique-id") return "nccl id: " + (id ? *id : id.error().message);
    // Each rank reads the ranks next to it in a ring (verbs QP blobs).
    std::vector<std::string> keys{rank_key("ep", (rank + 1) % 6), rank_key("ep", (rank + 5) % 6)};
    auto ring = kv.get_many(keys, 5000ms);
    if (!ring) return ring.error().message;
    if (text_of((*ring)[0]) != "ep of " + std::to_string((rank + 1) % 6)) return "wrong ring value";
    return "ok";
  });
  for (const auto& r : results) CHECK(r == "ok");
  // The root served relay A (its lanes) and no rank; A served ranks 0 and 1 and two relays.
  CHECK(tree.root->stats().peak_rank_clients == 0);
  CHECK(tree.root->stats().peak_clients <= 8);  // TcpStoreServerOptions::upstream_lanes
  CHECK(tree.a->stats().peak_rank_clients == 2);
}

TEST_CASE("each allgather value leaves the root once per child relay, not once per rank") {
  Tree tree;
  constexpr std::size_t kValueBytes = 64 * 1024;
  auto results = on_every_rank(tree, [&](int rank, TcpStoreClient& kv) {
    return kv.allgather("big", Bytes(kValueBytes, std::byte(rank)), 5000ms).ok();
  });
  for (bool ok : results) CHECK(ok);
  const std::size_t gathered = 6 * (kValueBytes + 4) + 8;
  auto root = settled(*tree.root, [&](const auto& s) { return s.bytes_out >= gathered; });
  CHECK(root.bytes_out >= gathered);
  CHECK(root.bytes_out < gathered + 4096);  // one reply to relay A, plus the handshake
  auto a = settled(*tree.a, [&](const auto& s) { return s.relay_bytes_out >= 2 * gathered; });
  CHECK(a.relay_bytes_out >= 2 * gathered);  // to B and C
  CHECK(a.relay_bytes_out < 2 * gathered + 8192);
  CHECK(a.upstream_bytes_out >= 6 * (kValueBytes + 12));  // every value went up once
}

TEST_CASE("a value set below one relay is read below another, fetched once per relay") {
  Tree tree;
  auto writer = client(*tree.c, 4, 6);
  REQUIRE(writer->set("blob", bytes_of("from rank 4")).ok());
  auto r2 = client(*tree.b, 2, 6);
  auto r3 = client(*tree.b, 3, 6);
  CHECK(r2->get_string("blob", 2000ms).value() == "from rank 4");
  auto fetched = tree.b->stats().upstream_bytes_out;
  CHECK(r3->get_string("blob", 2000ms).value() == "from rank 4");
  CHECK(tree.b->stats().upstream_bytes_out == fetched);  // the second read stayed at relay B
  // get waits for a key set later, across relays.
  auto late = std::async(std::launch::async, [&] { return r2->get_string("late", 5000ms); });
  std::this_thread::sleep_for(100ms);
  REQUIRE(writer->set("late", bytes_of("now")).ok());
  CHECK(late.get().value() == "now");
  // add and remove pass through to the root.
  auto r0 = client(*tree.a, 0, 6);
  CHECK(r0->add("counter", 2).value() == 2);
  CHECK(r2->add("counter", 3).value() == 5);
  CHECK(writer->remove("blob").value());
}

TEST_CASE("a fence through relays that a rank misses fails for all at the timeout, naming it") {
  Tree tree;
  auto results = on_every_rank(tree, [](int rank, TcpStoreClient& kv) -> std::string {
    if (rank == 4) {
      std::this_thread::sleep_for(1500ms);  // arrives after the others gave up
      return "late";
    }
    auto s = kv.fence(500ms);
    return s ? std::string("ok") : s.error().message;
  });
  for (int rank = 0; rank < 6; ++rank) {
    if (rank == 4) continue;
    INFO("rank " << rank << ": " << results[rank]);
    CHECK(results[rank].find("timed out after 500 ms") != std::string::npos);
    CHECK(results[rank].find("missing ranks: 4 (") != std::string::npos);
  }
}

TEST_CASE("a relay refuses a rank that is not below it, naming the ranks it stands for") {
  Tree tree;
  auto wrong = TcpStoreClient::connect({tree.b->address(), kSecret, 5, 6, 2000ms, 2000ms});
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message.find("rank 5 is not below this relay (it stands for ranks 2-3)") !=
        std::string::npos);
}

TEST_CASE("a relay whose upstream never comes fails the next fence with that reason") {
  Log log;
  auto root = root_store(2, log);
  std::string gone = root->address();
  root->stop();
  root.reset();
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = 2;
  options.upstream = gone;
  options.ranks = {0};
  options.upstream_connect_timeout = 600ms;
  options.log = log.sink();
  auto lonely = TcpStoreServer::start(options);
  REQUIRE(lonely.ok());
  auto c = client(**lonely, 0, 2);
  REQUIRE(c->set("k", bytes_of("v")).ok());  // acknowledged here, on its way up
  CHECK(c->get_string("k", 100ms).value() == "v");
  auto s = c->fence(5000ms);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message.find("values set through this relay did not reach the upstream store: "
                               "relay: cannot reach the upstream store") != std::string::npos);
  auto start = std::chrono::steady_clock::now();
  (*lonely)->stop();
  CHECK(std::chrono::steady_clock::now() - start < 1000ms);
}

TEST_CASE("a relay holding an allgather fails it within seconds once its upstream is gone") {
  // Ranks 0 and 1 wait at relay A for rank 2, which never comes; nothing of the allgather has
  // gone upstream when the root's host dies. The waiters hear it from A's watch of its upstream,
  // long before their own deadline or A's connect timeout.
  Log log;
  auto root = root_store(3, log);
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = 3;
  options.upstream = root->address();
  options.ranks = {0, 1, 2};
  options.upstream_connect_timeout = 60000ms;
  options.log = log.sink();
  auto a = TcpStoreServer::start(options);
  REQUIRE(a.ok());
  auto c0 = client(**a, 0, 3);
  auto c1 = client(**a, 1, 3);
  auto wait0 = std::async(std::launch::async,
                          [&] { return c0->allgather("held", bytes_of("zero"), 60000ms); });
  auto wait1 = std::async(std::launch::async,
                          [&] { return c1->allgather("held", bytes_of("one"), 60000ms); });
  std::this_thread::sleep_for(1500ms);  // A has reached its upstream by now (its first probe)
  CHECK(wait0.wait_for(0ms) == std::future_status::timeout);
  const auto died = std::chrono::steady_clock::now();
  root->stop();
  root.reset();
  for (auto* waiting : {&wait0, &wait1}) {
    REQUIRE(waiting->wait_for(10s) == std::future_status::ready);
    auto result = waiting->get();
    REQUIRE_FALSE(result.ok());
    INFO(result.error().message);
    CHECK(result.error().message.find("relay: the upstream store at " + options.upstream +
                                      " is gone") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - died < 6s);
}

TEST_CASE("a listener opened first takes clients that connect before its server starts") {
  auto listener = TcpStoreListener::open("127.0.0.1");
  REQUIRE(listener.ok());
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  auto early = std::async(std::launch::async, [&] {
    return TcpStoreClient::connect({address, kSecret, 0, 1, 5000ms, 5000ms});
  });
  std::this_thread::sleep_for(200ms);  // the client now waits in the listen backlog
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = 1;
  auto server = TcpStoreServer::start(options, std::move(*listener));
  REQUIRE(server.ok());
  CHECK((*server)->address() == address);
  auto c = early.get();
  REQUIRE(c.ok());
  CHECK((*c)->allgather("solo", bytes_of("me"), 1000ms).ok());
}

TEST_CASE("workers that reach their node's relay before it serves wait for it (early start)") {
  // job.start = "early": a node's workers start before the agents' exchange and connect to the
  // relay's listener, which serves only once the exchange has told it the ranks below it; their
  // connections wait in the backlog and then fence with the other node's ranks as usual.
  Log log;
  auto root = root_store(2, log);
  auto listener = TcpStoreListener::open("127.0.0.1");
  REQUIRE(listener.ok());
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  auto early = std::async(std::launch::async, [&]() -> topolaunch::Status {
    auto c = TcpStoreClient::connect({address, kSecret, 1, 2, 30000ms, 30000ms});
    if (!c) return c.error();
    auto all = (*c)->allgather("hello", bytes_of("one"), 10000ms);
    if (!all) return all.error();
    if (all->size() != 2 || text_of((*all)[0]) != "zero") return topolaunch::make_error("bad");
    return topolaunch::ok_status();
  });
  auto direct = std::async(std::launch::async, [&]() -> topolaunch::Status {
    auto c = TcpStoreClient::connect({root->address(), kSecret, 0, 2, 5000ms, 5000ms});
    if (!c) return c.error();
    auto all = (*c)->allgather("hello", bytes_of("zero"), 10000ms);
    if (!all) return all.error();
    return topolaunch::ok_status();
  });
  std::this_thread::sleep_for(500ms);  // the exchange: rank 1 waits in the relay's backlog
  CHECK(early.wait_for(0ms) == std::future_status::timeout);
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = 2;
  options.upstream = root->address();
  options.ranks = {1};
  auto relay = TcpStoreServer::start(options, std::move(*listener));
  REQUIRE(relay.ok());
  auto waited = early.get();
  INFO((waited.ok() ? std::string() : waited.error().message));
  CHECK(waited.ok());
  CHECK(direct.get().ok());
}
