// Simulation benchmark: the wireup of a job of <agents> nodes x <ranks-per-node> workers on this
// one host, against the real TCP store, relays, exchange and map code, in the design of this
// tree ("tree") and in the one before it ("flat"), measured the same way.
//
//   bench_wireup_scale --fixtures DIR [--agents 1024] [--ranks-per-node 8] [--processes 4]
//                      [--design tree|flat] [--parse-records auto|yes|no] [--timeout-s 300]
//
// This process hosts the root stores (the agents' and the workers', as `topolaunch run` does) and
// forks --processes children, each playing a contiguous block of nodes: one thread per agent and
// per worker (a job's processes are threads here; every byte still goes through loopback TCP).
// Nodes cycle through the slurm fixtures (DGX H100, DGX H100, 8x L40S, DGX A100: three types).
//
// tree: each agent runs connect_agents_tree + describe_node (both before the clock starts: what
//       an agent does once it knows its topology) + exchange_node_inputs (the launcher's code:
//       records + distinct topologies through a fan-out-16 relay tree), then start_workers_relay;
//       workers connect to their node's relay.
// flat: each agent connects to the root as its rank, puts its whole node record (topology JSON
//       inside, the format the agents used before) and reads every other agent's one get at a
//       time, parsing each (--parse-records: "auto" parses up to 256 agents; beyond, the parse
//       is timed on one record and the total is estimated); workers connect to the root store.
//
// The workers' exchange, what a GPU job's ranks do before training (each phase ends in a fence):
//   connect   every rank connected and at a first fence
//   nccl_id   rank 0 puts a 128-byte unique id; fence; every rank reads it
//   ring      each rank puts a 256-byte endpoint blob for each ring neighbour; fence; reads the
//             two meant for it (verbs QP / UCX address style)
//   allgather every rank's 64-byte value to every rank (N^2 bytes in all, whatever the design);
//             flat: put + fence + get_many, tree: KvStore::allgather
// Also: the rank map of the whole job (compute_rank_map, once), the report merge (1 fragment per
// node, report.hpp's code), the heartbeat watch (stat of every rank's file, as the agent does
// every 100 ms). One JSON object per measurement on stdout; no pass/fail on timing.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/launcher/agent_wireup.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/serialize.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace fs = std::filesystem;
namespace tl = topolaunch::launcher;
namespace tt = topolaunch::topology;
namespace tw = topolaunch::wireup;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr const char* kSecret = "bench-scale-secret";

struct Options {
  std::string fixtures;
  int agents = 1024;
  int ranks_per_node = 8;
  int processes = 4;
  std::string design = "tree";
  std::string parse_records = "auto";
  int timeout_s = 300;
};

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the same clock in every process of this host
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double process_cpu_s(int who = RUSAGE_SELF) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

double load_1m() {
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  return load;
}

// --- pipes between this process and its children: one JSON object per line -------------------
class Channel {
 public:
  Channel() = default;
  Channel(int read_fd, int write_fd) : in_(fdopen(read_fd, "r")), out_(fdopen(write_fd, "w")) {}
  void send(const json& message) {
    std::fputs((message.dump() + "\n").c_str(), out_);
    std::fflush(out_);
  }
  json receive() {
    std::string line;
    for (int c; (c = std::fgetc(in_)) != EOF && c != '\n';) line += static_cast<char>(c);
    if (line.empty()) return json{{"error", "the other side closed the pipe"}};
    return json::parse(line, nullptr, false);
  }

 private:
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// --- the nodes ---------------------------------------------------------------------------------
std::vector<std::shared_ptr<const tt::NodeTopology>> load_types(const std::string& fixtures) {
  std::vector<std::shared_ptr<const tt::NodeTopology>> types;
  for (const char* name : {"dgx-h100", "dgx-h100", "pcie-l40s-8gpu", "dgx-a100"}) {
    auto topo = tt::load_topology_file(fixtures + "/" + name + ".pci.xml");
    if (!topo) {
      std::fprintf(stderr, "bench_wireup_scale: %s\n", topo.error().message.c_str());
      std::exit(2);
    }
    types.push_back(std::make_shared<const tt::NodeTopology>(std::move(*topo)));
  }
  return types;
}

tt::NodeInput node_of(int agent, const std::vector<std::shared_ptr<const tt::NodeTopology>>& t) {
  tt::NodeInput node;
  node.name = "n" + std::to_string(agent + 1);
  node.topology = t[static_cast<std::size_t>(agent + 1) % t.size()];
  return node;
}

// The record the agents exchanged before fingerprints: the whole topology JSON inside.
std::string flat_record(const tt::NodeInput& node) {
  json j;
  j["name"] = node.name;
  j["topology"] = tt::to_json(*node.topology);
  j["all_gpus"] = true;
  j["gpus"] = std::vector<int>{};
  j["gpu_uuids"] = std::vector<std::string>{};
  j["cuda_naming"] = 0;
  j["cpus"] = "*";
  return j.dump();
}

bool parse_flat_record(const std::string& text, int agent) {
  auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("topology")) return false;
  return tt::from_json(j["topology"].get<std::string>(), "agent " + std::to_string(agent)).ok();
}

// Phase timings of the threads of one process: earliest start, latest end, failures.
struct Span {
  std::mutex mutex;
  double start = 1e300, end = 0;
  int failures = 0;
  std::string first_error;
  void record(double s, double e) {
    std::lock_guard lock(mutex);
    start = std::min(start, s);
    end = std::max(end, e);
  }
  void fail(const std::string& why) {
    std::lock_guard lock(mutex);
    if (failures++ == 0) first_error = why;
  }
  json to_json() {
    std::lock_guard lock(mutex);
    return {{"start", start}, {"end", end}, {"failures", failures}, {"error", first_error}};
  }
};

// A gate the parent opens: the threads wait for it, then all start at once.
class Gate {
 public:
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

tw::TcpStoreServer::Stats add(tw::TcpStoreServer::Stats a, const tw::TcpStoreServer::Stats& b) {
  a.bytes_in += b.bytes_in;
  a.bytes_out += b.bytes_out;
  a.relay_bytes_in += b.relay_bytes_in;
  a.relay_bytes_out += b.relay_bytes_out;
  a.upstream_bytes_in += b.upstream_bytes_in;
  a.upstream_bytes_out += b.upstream_bytes_out;
  a.cpu_seconds += b.cpu_seconds;
  a.requests += b.requests;
  return a;
}

json stats_json(const tw::TcpStoreServer::Stats& s) {
  return {{"bytes_in", s.bytes_in},
          {"bytes_out", s.bytes_out},
          {"relay_bytes_in", s.relay_bytes_in},
          {"relay_bytes_out", s.relay_bytes_out},
          {"upstream_bytes_in", s.upstream_bytes_in},
          {"upstream_bytes_out", s.upstream_bytes_out},
          {"requests", s.requests},
          {"cpu_s", s.cpu_seconds},
          {"peak_clients", s.peak_clients},
          {"stored_bytes", s.stored_bytes}};
}

// --- one child: the nodes [first, last)
// -----------------------------------------------------------
int run_block(const Options& o, int first, int last, const std::string& agents_root,
              const std::string& workers_root, Channel parent) {
  const auto types = load_types(o.fixtures);
  const int agents = o.agents, rpn = o.ranks_per_node, world = agents * rpn;
  const int local = last - first;
  const bool tree = o.design == "tree";
  const auto timeout = std::chrono::milliseconds(o.timeout_s * 1000);
  const bool parse = o.parse_records == "yes" || (o.parse_records == "auto" && agents <= 256);

  Gate agents_go, workers_go;
  Span exchange, setup;
  std::latch agents_ready(local), exchanged(local), map_ready(1), workers_ready(local * rpn),
      workers_done(local * rpn);
  std::mutex exchange_mutex;
  std::optional<tl::AgentExchange> first_exchange;
  tt::RankMap map;
  std::vector<std::unique_ptr<tw::TcpStoreServer>> agent_relays(local), worker_relays(local);
  std::vector<std::string> relay_addresses(local);
  Span connect, nccl, ring, gather;
  std::atomic<long> records_parsed{0};

  auto worker = [&](int rank, std::string address) {
    double t0 = now_s();
    auto client = tw::TcpStoreClient::connect({address, kSecret, rank, world, timeout, timeout});
    if (!client) {
      connect.fail(client.error().message);
      workers_ready.count_down();
      workers_done.count_down();
      return;
    }
    auto& kv = **client;
    workers_ready.count_down();
    workers_go.wait();
    t0 = now_s();
    auto step = [&](Span& span, double from, auto&& body) -> std::optional<double> {
      std::string error = body();
      double t = now_s();
      if (!error.empty()) {
        span.fail(error);
        return std::nullopt;
      }
      span.record(from, t);
      return t;
    };
    auto t1 = step(connect, t0, [&] {
      auto s = kv.fence(timeout);
      return s ? std::string() : s.error().message;
    });
    if (!t1) return workers_done.count_down();
    auto t2 = step(nccl, *t1, [&]() -> std::string {
      if (rank == 0) {
        if (auto s = kv.put("nccl/unique-id", tw::Bytes(128, std::byte{7})); !s)
          return s.error().message;
      }
      if (auto s = kv.fence(timeout); !s) return s.error().message;
      auto id = kv.get("nccl/unique-id", timeout);
      return id && id->size() == 128 ? std::string() : std::string("nccl id not read");
    });
    if (!t2) return workers_done.count_down();
    auto t3 = step(ring, *t2, [&]() -> std::string {
      const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      for (int peer : {next, prev}) {
        auto key = "ep/" + std::to_string(rank) + "/" + std::to_string(peer);
        if (auto s = kv.put(key, tw::Bytes(256, std::byte(rank & 0xff))); !s)
          return s.error().message;
      }
      if (auto s = kv.fence(timeout); !s) return s.error().message;
      std::vector<std::string> keys{"ep/" + std::to_string(next) + "/" + std::to_string(rank),
                                    "ep/" + std::to_string(prev) + "/" + std::to_string(rank)};
      auto blobs = kv.get_many(keys, timeout);
      if (!blobs) return blobs.error().message;
      return (*blobs)[0] == tw::Bytes(256, std::byte(next & 0xff)) ? std::string()
                                                                   : std::string("bad blob");
    });
    if (!t3) return workers_done.count_down();
    step(gather, *t3, [&]() -> std::string {
      tw::Bytes mine(64, std::byte(rank & 0xff));
      if (tree) {
        auto all = kv.allgather("addr", mine, timeout);
        if (!all) return all.error().message;
        return all->size() == static_cast<std::size_t>(world) ? std::string() : "short";
      }
      if (auto s = kv.put(tw::rank_key("addr", rank), mine); !s) return s.error().message;
      if (auto s = kv.fence(timeout); !s) return s.error().message;
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back(tw::rank_key("addr", r));
      auto all = kv.get_many(keys, timeout);
      return all ? std::string() : all.error().message;
    });
    workers_done.count_down();
  };

  std::vector<std::thread> workers;
  std::mutex workers_mutex;
  // An agent that failed starts no workers: it counts its workers off so that the block ends.
  auto abandon = [&](bool before_ready) {
    if (before_ready) agents_ready.count_down();
    if (before_ready) exchanged.count_down();
    workers_ready.count_down(rpn);
    workers_done.count_down(rpn);
  };
  auto agent = [&](int index) {
    const int me = first + index;
    const tt::NodeInput node = node_of(me, types);
    const double t_setup = now_s();
    std::unique_ptr<tw::KvStore> store;
    auto listener = tw::TcpStoreListener::open("127.0.0.1");
    if (!listener) {
      setup.fail(listener.error().message);
      return abandon(true);
    }
    const std::string relay = "127.0.0.1:" + std::to_string(listener->port());
    if (tree) {
      auto joined = tl::connect_agents_tree(agents_root, kSecret, me, agents, "127.0.0.1", timeout);
      if (!joined) {
        setup.fail(joined.error().message);
        return abandon(true);
      }
      agent_relays[index] = std::move(joined->relay);
      store = std::move(joined->store);
    } else {
      auto client =
          tw::TcpStoreClient::connect({agents_root, kSecret, me, agents, timeout, timeout});
      if (!client) {
        setup.fail(client.error().message);
        return abandon(true);
      }
      store = std::move(*client);
    }
    // An agent describes its node (serialises its topology) once it has discovered it, before
    // it takes part in the exchange: that is local work, not the exchange's.
    auto described = tl::describe_node(node, relay);
    if (!described) {
      setup.fail(described.error().message);
      return abandon(true);
    }
    const std::string flat = tree ? std::string() : flat_record(node);
    setup.record(t_setup, now_s());
    agents_ready.count_down();
    agents_go.wait();
    const double t0 = now_s();
    if (tree) {
      auto x = tl::exchange_node_inputs(*store, *described, timeout);
      if (!x) {
        exchange.fail(x.error().message);
        exchanged.count_down();
        return abandon(false);
      }
      exchange.record(t0, now_s());
      {
        std::lock_guard lock(exchange_mutex);
        if (!first_exchange) first_exchange = std::move(*x);
      }
      exchanged.count_down();
    } else {
      auto failed = [&](const std::string& why) {
        exchange.fail(why);
        exchanged.count_down();
        abandon(false);
      };
      if (auto s = store->put(tw::rank_key("node", me), flat); !s) return failed(s.error().message);
      if (auto s = store->fence(timeout); !s) return failed(s.error().message);
      for (int a = 0; a < agents; ++a) {
        auto text = store->get_string(tw::rank_key("node", a), timeout);
        if (!text) return failed(text.error().message);
        if (parse) {
          if (!parse_flat_record(*text, a)) return failed("bad record " + std::to_string(a));
          ++records_parsed;
        }
      }
      exchange.record(t0, now_s());
      exchanged.count_down();
    }
    map_ready.wait();
    std::string address = workers_root;
    if (tree) {
      auto started = tl::start_workers_relay(std::move(*listener), map, *first_exchange, me,
                                             workers_root, kSecret);
      if (!started) {
        setup.fail(started.error().message);
        return abandon(false);
      }
      worker_relays[index] = std::move(*started);
      address = relay;
    }
    std::lock_guard lock(workers_mutex);
    for (int rank : map.nodes[static_cast<std::size_t>(me)].rank_ids)
      workers.emplace_back(worker, rank, address);
  };

  std::vector<std::thread> agent_threads;
  for (int i = 0; i < local; ++i) agent_threads.emplace_back(agent, i);
  agents_ready.wait();
  parent.send({{"ready", "agents"}, {"setup", setup.to_json()}});
  if (parent.receive().value("go", "") != "agents") std::_Exit(1);
  agents_go.open();
  for (auto& t : agent_threads) t.detach();  // they go on to start the workers
  // The map: every agent computes the same one; here it is computed once for the block, after
  // the exchange of every agent of the block ended.
  exchanged.wait();
  std::vector<tt::NodeInput> nodes;
  if (tree) {
    std::lock_guard lock(exchange_mutex);
    if (first_exchange) nodes = first_exchange->nodes;
  } else {
    for (int a = 0; a < agents; ++a) nodes.push_back(node_of(a, types));
  }
  if (!nodes.empty()) {
    tt::RankMapOptions map_options;
    map_options.environment = false;
    tt::MappingSpec spec;
    spec.ranks_per_node = rpn;
    auto computed = tt::compute_rank_map(nodes, spec, nullptr, map_options);
    if (computed) map = std::move(*computed);
  }
  if (map.nodes.size() != static_cast<std::size_t>(agents)) {
    parent.send({{"error", "no map: the exchange failed"}, {"exchange", exchange.to_json()}});
    std::_Exit(1);
  }
  map_ready.count_down();
  workers_ready.wait();
  parent.send({{"ready", "workers"},
               {"exchange", exchange.to_json()},
               {"records_parsed", records_parsed.load()}});
  if (parent.receive().value("go", "") != "workers") std::_Exit(1);
  workers_go.open();
  workers_done.wait();
  tw::TcpStoreServer::Stats agent_relay_sum{}, worker_relay_sum{}, node0_agents{}, node0_workers{};
  for (int i = 0; i < local; ++i) {
    if (agent_relays[i]) {
      agent_relay_sum = add(agent_relay_sum, agent_relays[i]->stats());
      if (first + i == 0) node0_agents = agent_relays[i]->stats();
    }
    if (worker_relays[i]) {
      worker_relay_sum = add(worker_relay_sum, worker_relays[i]->stats());
      if (first + i == 0) node0_workers = worker_relays[i]->stats();
    }
  }
  parent.send({{"done", true},
               {"connect", connect.to_json()},
               {"nccl_id", nccl.to_json()},
               {"ring", ring.to_json()},
               {"allgather", gather.to_json()},
               {"agent_relays", stats_json(agent_relay_sum)},
               {"worker_relays", stats_json(worker_relay_sum)},
               {"node0_agent_relay", stats_json(node0_agents)},
               {"node0_worker_relay", stats_json(node0_workers)},
               {"cpu_s", process_cpu_s()},
               {"peak_rss_kib", peak_rss_kib()}});
  parent.receive();  // the parent says when: stopping relays earlier would fail other blocks
  std::fflush(nullptr);
  std::_Exit(0);  // threads and relays end with the process
}

// --- this process: the root stores and the measurement ------------------------------------------
json span_of(const std::vector<json>& blocks, const char* what) {
  double start = 1e300, end = 0;
  int failures = 0;
  std::string error;
  for (const auto& b : blocks) {
    const auto& s = b.at(what);
    start = std::min(start, s.value("start", 1e300));
    end = std::max(end, s.value("end", 0.0));
    failures += s.value("failures", 0);
    if (error.empty()) error = s.value("error", "");
  }
  json out{{"s", end > 0 && start < 1e300 ? end - start : -1}, {"failures", failures}};
  if (!error.empty()) out["error"] = error;
  return out;
}

tw::TcpStoreServer::Stats stats_from(const json& j) {
  tw::TcpStoreServer::Stats s{};
  s.bytes_in = j.value("bytes_in", 0ull);
  s.bytes_out = j.value("bytes_out", 0ull);
  s.relay_bytes_in = j.value("relay_bytes_in", 0ull);
  s.relay_bytes_out = j.value("relay_bytes_out", 0ull);
  s.upstream_bytes_in = j.value("upstream_bytes_in", 0ull);
  s.upstream_bytes_out = j.value("upstream_bytes_out", 0ull);
  s.cpu_seconds = j.value("cpu_s", 0.0);
  s.requests = j.value("requests", 0ull);
  return s;
}

int run(const Options& o) {
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  const int world = o.agents * o.ranks_per_node;
  // The listeners first and the children next, so that no store thread runs while forking.
  auto agents_listener = tw::TcpStoreListener::open("127.0.0.1");
  auto workers_listener = tw::TcpStoreListener::open("127.0.0.1");
  if (!agents_listener || !workers_listener) {
    std::fprintf(stderr, "bench_wireup_scale: cannot listen on loopback\n");
    return 1;
  }
  const std::string agents_address = "127.0.0.1:" + std::to_string(agents_listener->port());
  const std::string workers_address = "127.0.0.1:" + std::to_string(workers_listener->port());
  std::vector<pid_t> children;
  std::vector<Channel> channels;
  const int per = (o.agents + o.processes - 1) / o.processes;
  for (int p = 0; p < o.processes; ++p) {
    const int first = p * per, last = std::min(o.agents, first + per);
    if (first >= last) break;
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return 1;
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      { auto drop = std::move(*agents_listener); }
      { auto drop = std::move(*workers_listener); }
      std::_Exit(
          run_block(o, first, last, agents_address, workers_address, Channel(down[0], up[1])));
    }
    close(down[0]);
    close(up[1]);
    children.push_back(pid);
    channels.emplace_back(up[0], down[1]);
  }
  tw::TcpStoreServerOptions agents_options;
  agents_options.secret = kSecret;
  agents_options.world_size = o.agents;
  agents_options.log = [](std::string_view) {};
  auto agents_root = tw::TcpStoreServer::start(agents_options, std::move(*agents_listener));
  tw::TcpStoreServerOptions workers_options = agents_options;
  workers_options.world_size = 0;  // from the first client, as `run` does
  auto workers_root = tw::TcpStoreServer::start(workers_options, std::move(*workers_listener));
  if (!agents_root || !workers_root) {
    std::fprintf(stderr, "bench_wireup_scale: cannot start the root stores\n");
    for (pid_t pid : children) kill(pid, SIGKILL);
    return 1;
  }
  auto gather_all = [&](const char* expect) {
    std::vector<json> out;
    for (auto& c : channels) {
      auto m = c.receive();
      if (!m.contains(expect)) {
        std::fprintf(stderr, "bench_wireup_scale: a block failed: %s\n", m.dump().c_str());
        for (pid_t pid : children) kill(pid, SIGKILL);
        std::exit(1);
      }
      out.push_back(std::move(m));
    }
    return out;
  };
  auto ready = gather_all("ready");
  const json setup = span_of(ready, "setup");
  const auto agents_before = (*agents_root)->stats();
  for (auto& c : channels) c.send({{"go", "agents"}});
  auto exchanged = gather_all("ready");
  const auto agents_after = (*agents_root)->stats();
  const auto workers_before = (*workers_root)->stats();
  for (auto& c : channels) c.send({{"go", "workers"}});
  auto done = gather_all("done");
  const auto workers_after = (*workers_root)->stats();
  const long root_rss_kib = peak_rss_kib();
  for (auto& c : channels) c.send({{"stop", true}});
  for (pid_t pid : children) waitpid(pid, nullptr, 0);

  long parsed = 0;
  for (auto& b : exchanged) parsed += b.value("records_parsed", 0L);
  tw::TcpStoreServer::Stats agent_relays{}, worker_relays{}, node0_agents{}, node0_workers{};
  double children_cpu = 0;
  long children_rss = 0;
  for (auto& b : done) {
    children_cpu += b.value("cpu_s", 0.0);
    children_rss = std::max(children_rss, b.value("peak_rss_kib", 0L));
    agent_relays = add(agent_relays, stats_from(b["agent_relays"]));
    worker_relays = add(worker_relays, stats_from(b["worker_relays"]));
    node0_agents = add(node0_agents, stats_from(b["node0_agent_relay"]));
    node0_workers = add(node0_workers, stats_from(b["node0_worker_relay"]));
  }
  auto delta = [](const tw::TcpStoreServer::Stats& a, const tw::TcpStoreServer::Stats& b) {
    json j = stats_json(b);
    j["bytes_in"] = b.bytes_in - a.bytes_in;
    j["bytes_out"] = b.bytes_out - a.bytes_out;
    j["requests"] = b.requests - a.requests;
    j["cpu_s"] = b.cpu_seconds - a.cpu_seconds;
    return j;
  };
  json common{{"benchmark", "wireup_scale"},
              {"design", o.design},
              {"agents", o.agents},
              {"ranks_per_node", o.ranks_per_node},
              {"world_size", world},
              {"processes", static_cast<int>(children.size())},
              {"host_cpus", std::thread::hardware_concurrency()},
              {"host_load_1m", load_1m()}};
  // Bytes through node 0: what the root stores moved (run hosts them on node 0; this counts the
  // root's traffic with agent 0's relays too, which stays inside node 0) plus what node 0's relays
  // moved with the relays below them.
  json agents_line = common;
  agents_line["phase"] = "agents_exchange";
  agents_line["setup"] = setup;
  agents_line["exchange"] = span_of(exchanged, "exchange");
  agents_line["root_store"] = delta(agents_before, agents_after);
  const std::uint64_t agents_root_bytes = (agents_after.bytes_in - agents_before.bytes_in) +
                                          (agents_after.bytes_out - agents_before.bytes_out);
  agents_line["node0_relay_bytes_below"] =
      node0_agents.relay_bytes_in + node0_agents.relay_bytes_out;
  agents_line["bytes_through_node0"] =
      agents_root_bytes + node0_agents.relay_bytes_in + node0_agents.relay_bytes_out;
  agents_line["relays_all"] = stats_json(agent_relays);
  if (o.design == "flat") {
    agents_line["records_parsed"] = parsed;
    if (parsed == 0) {
      // The parse cost of one record, times the N^2 records the design reads.
      auto types = load_types(o.fixtures);
      const std::string record = flat_record(node_of(0, types));
      const double t0 = now_s();
      for (int i = 0; i < 20; ++i) (void)parse_flat_record(record, 0);
      const double per_record = (now_s() - t0) / 20;
      agents_line["parse_s_per_record"] = per_record;
      agents_line["parse_cpu_s_estimated"] =
          per_record * static_cast<double>(o.agents) * static_cast<double>(o.agents);
    }
  }
  std::printf("%s\n", agents_line.dump().c_str());

  json workers_line = common;
  workers_line["phase"] = "workers_exchange";
  for (const char* p : {"connect", "nccl_id", "ring", "allgather"})
    workers_line[p] = span_of(done, p);
  double start = 1e300, end = 0;
  for (auto& b : done) {
    start = std::min(start, b["connect"].value("start", 1e300));
    end = std::max(end, b["ring"].value("end", 0.0));
  }
  workers_line["connect_nccl_ring_s"] = end > 0 ? end - start : -1;
  workers_line["root_store"] = delta(workers_before, workers_after);
  const std::uint64_t workers_root_bytes = (workers_after.bytes_in - workers_before.bytes_in) +
                                           (workers_after.bytes_out - workers_before.bytes_out);
  workers_line["node0_relay_bytes_below"] =
      node0_workers.relay_bytes_in + node0_workers.relay_bytes_out;
  workers_line["bytes_through_node0"] =
      workers_root_bytes + node0_workers.relay_bytes_in + node0_workers.relay_bytes_out;
  workers_line["relays_all"] = stats_json(worker_relays);
  workers_line["root_stores_cpu_s"] = workers_after.cpu_seconds + agents_after.cpu_seconds;
  workers_line["root_process_peak_rss_kib"] = root_rss_kib;
  workers_line["children_cpu_s"] = children_cpu;
  workers_line["children_peak_rss_kib"] = children_rss;
  std::printf("%s\n", workers_line.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// The rank map of the whole job, a report merge of one fragment per node, the heartbeat watch.
int run_parts(const Options& o) {
  const auto types = load_types(o.fixtures);
  std::vector<tt::NodeInput> nodes;
  for (int a = 0; a < o.agents; ++a) nodes.push_back(node_of(a, types));
  tt::MappingSpec spec;
  spec.ranks_per_node = o.ranks_per_node;
  json line{{"benchmark", "wireup_scale_parts"},
            {"agents", o.agents},
            {"ranks_per_node", o.ranks_per_node},
            {"host_load_1m", load_1m()}};
  (void)tt::compute_rank_map(nodes, spec);  // warm: the first call also faults in the code
  for (bool one_node : {true, false}) {
    tt::RankMapOptions options;
    options.environment_node = one_node ? "n1" : "";
    const double t0 = now_s();
    auto map = tt::compute_rank_map(nodes, spec, nullptr, options);
    const double t = now_s() - t0;
    if (!map) {
      std::fprintf(stderr, "bench_wireup_scale: map: %s\n", map.error().message.c_str());
      return 1;
    }
    line[one_node ? "map_s_env_one_node" : "map_s_env_all_nodes"] = t;
  }
  // Report: one fragment per node as agents write it, merged as `run` merges them.
  std::vector<std::string> fragments;
  for (int a = 0; a < o.agents; ++a) {
    tl::JobReport fragment;
    fragment.job_name = "scale";
    fragment.status = "succeeded";
    fragment.agent_wireup = "tcp";
    tl::AttemptReport attempt;
    attempt.outcome = "succeeded";
    for (int l = 0; l < o.ranks_per_node; ++l) {
      tl::RankOutcome r;
      r.rank = a * o.ranks_per_node + l;
      r.local_rank = l;
      r.node = a;
      r.node_name = "n" + std::to_string(a + 1);
      r.pid = 1000 + r.rank;
      r.exit_code = 0;
      r.peak_rss_bytes = 1ull << 30;
      r.wall_s = 12.5;
      r.heartbeat = "600";
      attempt.ranks.push_back(r);
    }
    fragment.attempts.push_back(attempt);
    fragments.push_back(tl::to_json(fragment));
  }
  const double t0 = now_s();
  tl::JobReport merged;
  merged.job_name = "scale";
  tl::AttemptReport all;
  for (const auto& text : fragments) {
    auto fragment = tl::report_from_json(text);
    if (!fragment || fragment->attempts.empty()) return 1;
    const auto& a = fragment->attempts.front();
    all.ranks.insert(all.ranks.end(), a.ranks.begin(), a.ranks.end());
  }
  std::sort(all.ranks.begin(), all.ranks.end(),
            [](const tl::RankOutcome& a, const tl::RankOutcome& b) { return a.rank < b.rank; });
  merged.attempts.push_back(std::move(all));
  const std::string report = tl::to_json(merged);
  const std::string summary = tl::summarize(merged);
  line["report_merge_s"] = now_s() - t0;
  line["report_bytes"] = report.size();
  line["summary_lines"] = std::count(summary.begin(), summary.end(), '\n');
  // Heartbeat watch: every rank's file, stat()ed as the agent does each round (<= 100 ms).
  char pattern[] = "/tmp/bench-heartbeat-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  const int world = o.agents * o.ranks_per_node;
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) {
    files.push_back(dir + "/rank-" + std::to_string(r));
    std::ofstream(files.back()) << "1\n";
  }
  const int rounds = 20;
  const double cpu0 = process_cpu_s(), w0 = now_s();
  long changed = 0;
  std::vector<timespec> seen(files.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < files.size(); ++i) {
      struct stat st {};
      if (::stat(files[i].c_str(), &st) == 0 && st.st_mtim.tv_nsec != seen[i].tv_nsec) {
        seen[i] = st.st_mtim;
        ++changed;
      }
    }
  }
  const double per_round = (process_cpu_s() - cpu0) / rounds;
  line["heartbeat_watch_round_s_all_ranks"] = per_round;
  line["heartbeat_watch_wall_round_s"] = (now_s() - w0) / rounds;
  // An agent watches its own ranks ten times a second: the share of one core it spends.
  line["heartbeat_watch_core_share_per_agent"] = per_round / o.agents * 10;
  fs::remove_all(dir);
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool parts = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_wireup_scale: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--fixtures")
      o.fixtures = next();
    else if (a == "--agents")
      o.agents = std::stoi(next());
    else if (a == "--ranks-per-node")
      o.ranks_per_node = std::stoi(next());
    else if (a == "--processes")
      o.processes = std::stoi(next());
    else if (a == "--design")
      o.design = next();
    else if (a == "--parse-records")
      o.parse_records = next();
    else if (a == "--timeout-s")
      o.timeout_s = std::stoi(next());
    else if (a == "--parts")
      parts = true;
    else {
      std::fprintf(stderr, "bench_wireup_scale: unknown argument %s (see the header)\n", a.c_str());
      return 2;
    }
  }
  if (o.fixtures.empty() || (o.design != "tree" && o.design != "flat") || o.agents < 1 ||
      o.ranks_per_node < 1 || o.processes < 1) {
    std::fprintf(stderr, "bench_wireup_scale: --fixtures DIR is required; --design tree|flat\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  return parts ? run_parts(o) : run(o);
}
