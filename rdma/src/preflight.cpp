// Preflight stages over a Transport. Every rank has the transport allocate one control buffer
// (slots for the connectivity marker, "done" flags and ping-pong words) and one data buffer
// (UCX: ucp_mem_map ALLOCATE, like ucx_perftest, so shared memory maps them into the peer), and
// publishes both with its node and NIC. Bandwidth and latency measure the ring's edges
// (edge p: rank p -> rank p+1), each one unidirectional like ib_write_bw and ucx_perftest, in
// rounds: edges that share no NIC run in the same round (Azure's health checks run all HCAs of
// a node at once), edges that do share one never do; ranks that all share one NIC (loopback
// tests) therefore run one edge at a time. A world of one rank tests its own port in loopback.
#include "topolaunch/rdma/preflight.hpp"

#include <sched.h>

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "topolaunch/rdma/blob.hpp"

namespace topolaunch::rdma {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Control buffer slots (8 bytes each).
constexpr std::size_t kSlotMarker = 0;
constexpr std::size_t kSlotDone = 1;
constexpr std::size_t kSlotPing = 2;
constexpr std::size_t kSlotPong = 3;
constexpr std::size_t kSlotArrive = 4;  // barrier tokens (see Runner::barrier)
constexpr std::size_t kSlotRelease = 5;
constexpr std::size_t kControlBytes = 4096;
// How long a wait polls before it also yields the core (see wait_slot).
constexpr std::chrono::microseconds kSpinBeforeYield{2000};
// How often a passive wait (bandwidth receiver on verbs) looks at its slot.
constexpr std::chrono::microseconds kPassivePoll{50};

struct PeerInfo {
  std::string node;
  std::string nic;
  RemoteMemory control;
  RemoteMemory data;
};

std::string hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::optional<std::string> unhex(const std::string& s) {
  if (s.size() % 2) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < s.size(); i += 2) {
    auto v = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int hi = v(s[i]), lo = v(s[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::uint64_t load(const LocalMemory& m, std::size_t slot) {
  return std::atomic_ref<std::uint64_t>(static_cast<std::uint64_t*>(m.address)[slot])
      .load(std::memory_order_acquire);
}

class Runner {
 public:
  Runner(wireup::KvStore& store, const PreflightConfig& c, std::ostream* out)
      : store_(store), c_(c), out_(out), rank_(store.rank()), world_(store.size()) {
    nic_ = c.transport == "verbs"
               ? fmt::format("{}:{}", c.verbs.device, c.verbs.port)
               : (c.selected ? fmt::format("{}:{}", c.selected->nic, c.selected->port)
                             : "ucx " + (c.ucx.transports.empty() ? std::string("default")
                                                                  : c.ucx.transports));
  }

  PreflightReport run() {
    run_stages();
    // The last barrier's release token is the last write: its writer flushes it while its
    // reader may already be tearing down (UCX tcp: "Connection reset by remote peer"). So ranks
    // that got through their last barrier wait for each other in the store before closing.
    if (transport_ && last_barrier_ok_) {
      auto done = std::async(std::launch::async, [&] { return store_.fence(c_.latency_timeout); });
      while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
        transport_->progress();  // answers a peer's flush meanwhile
        sched_yield();
      }
      (void)done.get();  // a rank gone now has passed every stage already
    }
    return report_;
  }

  void run_stages() {
    const bool local_ok = stage_local();
    if (c_.level == PreflightLevel::off) return;
    if (!local_ok) return (void)skip_rest("connectivity");
    if (!stage_connectivity()) return (void)skip_rest("bandwidth");
    if (c_.level == PreflightLevel::quick) return;
    if (!stage_bandwidth()) return (void)skip_rest("latency");
    stage_latency();
  }

 private:
  void emit(StageResult r) {
    r.rank = rank_;
    if (out_) (*out_) << to_json_line(r, c_.node, nic_) << '\n' << std::flush;
    report_.results.push_back(std::move(r));
  }

  PreflightReport skip_rest(const std::string& from) {
    last_barrier_ok_ = false;  // the others may be gone or still going: no final fence
    static const std::vector<std::string> order = {"connectivity", "bandwidth", "latency"};
    bool on = false;
    for (const auto& s : order) {
      if (s == from) on = true;
      if (!on || (c_.level == PreflightLevel::quick && s != "connectivity")) continue;
      StageResult r;
      r.stage = s;
      r.ok = false;
      r.message = "skipped: an earlier stage failed";
      emit(r);
    }
    return report_;
  }

  std::string peer_where(int peer) const {
    auto it = peers_.find(peer);
    if (it == peers_.end()) return fmt::format("rank {}", peer);
    return fmt::format("rank {} (node {}, {})", peer, it->second.node, it->second.nic);
  }
  std::string me() const { return fmt::format("rank {} (node {}, {})", rank_, c_.node, nic_); }

  bool stage_local() {
    const auto t0 = Clock::now();
    StageResult r;
    r.stage = "local";
    r.ok = true;
    if (!c_.selected && c_.transport != "verbs") {
      r.message = "no RDMA port selected for this rank: nothing to check locally";
    } else {
      const std::string dev = c_.transport == "verbs" ? c_.verbs.device : c_.selected->nic;
      const int port = c_.transport == "verbs" ? c_.verbs.port : c_.selected->port;
      const int gid_index = c_.transport == "verbs" ? c_.verbs.gid_index : c_.selected->gid_index;
      const RdmaDevice* d = nullptr;
      for (const auto& x : c_.devices)
        if (x.name == dev) d = &x;
      const PortInfo* p = d ? d->port(port) : nullptr;
      if (!d) {
        r.ok = false;
        r.message = fmt::format("node {}: NIC {} does not exist", c_.node, dev);
      } else if (!p) {
        r.ok = false;
        r.message = fmt::format("node {}: NIC {} has no port {}", c_.node, dev, port);
      } else if (!p->active() || !p->link_up()) {
        r.ok = false;
        r.message = fmt::format("node {}: {}:{} is {}/{} (need ACTIVE/LinkUp)", c_.node, dev, port,
                                p->state_name, p->physical_state_name);
      } else if (c_.expected_rate_gbps > 0 && p->rate_gbps + 1e-9 < c_.expected_rate_gbps) {
        r.ok = false;
        r.message = fmt::format("node {}: {}:{} runs at {} Gb/s, expected {} Gb/s ({})", c_.node,
                                dev, port, p->rate_gbps, c_.expected_rate_gbps, p->rate_text);
      } else if (std::none_of(p->gids.begin(), p->gids.end(),
                              [&](const GidEntry& g) { return g.index == gid_index; })) {
        r.ok = false;
        r.message =
            fmt::format("node {}: {}:{} has no GID at index {}", c_.node, dev, port, gid_index);
      } else if (c_.require_gpudirect && c_.selected &&
                 c_.selected->registration == RegistrationMethod::host_staging) {
        r.ok = false;
        r.message = fmt::format("node {}: GPUDirect RDMA required but {}:{} would use host staging",
                                c_.node, dev, port);
      } else {
        r.message = fmt::format("{}:{} {}/{} {} Gb/s, GID {}", dev, port, p->state_name,
                                p->physical_state_name, p->rate_gbps, gid_index);
      }
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.seconds * 1000 > static_cast<double>(c_.local_timeout.count())) {
      r.ok = false;
      r.message = fmt::format("local checks took {:.1f} s (limit {} ms)", r.seconds,
                              c_.local_timeout.count());
    }
    emit(r);
    return r.ok;
  }

  bool fail(const std::string& stage, const std::string& message, int peer = -1) {
    last_barrier_ok_ = false;
    StageResult r;
    r.stage = stage;
    r.ok = false;
    r.peer = peer;
    r.message = message;
    emit(r);
    return false;
  }

  bool stage_connectivity() {
    const auto t0 = Clock::now();
    const milliseconds timeout = c_.connectivity_timeout;
    Result<std::unique_ptr<Transport>> t = c_.transport == "verbs"
                                               ? open_verbs_transport(rank_, c_.verbs)
                                               : open_ucx_transport(rank_, c_.ucx);
    if (!t) return fail("connectivity", me() + ": " + t.error().message);
    transport_ = std::move(*t);
    auto control = transport_->allocate_memory(kControlBytes);
    if (!control) return fail("connectivity", me() + ": " + control.error().message);
    control_ = std::move(*control);
    std::memset(control_.address, 0, kControlBytes);
    auto data = transport_->allocate_memory(c_.buffer_bytes);
    if (!data) return fail("connectivity", me() + ": " + data.error().message);
    data_ = std::move(*data);
    // Touch every page now: the bandwidth stage measures the fabric, not first-touch faults.
    std::memset(data_.address, rank_ & 0xff, c_.buffer_bytes);

    // Who am I and where can peers write: one JSON payload in a checked blob.
    nlohmann::json hello{{"node", c_.node},
                         {"nic", nic_},
                         {"control", hex(serialize(describe(control_)))},
                         {"data", hex(serialize(describe(data_)))}};
    const std::string hello_key = fmt::format("{}/hello/{}", c_.name, rank_);
    if (auto st = store_.put(hello_key, encode_blob(BlobKind::preflight, rank_, hello.dump())); !st)
      return fail("connectivity", me() + ": " + st.error().message);
    // Every rank's NIC, small, for the bandwidth/latency schedule (fetched with one get_many).
    if (auto st = store_.put(nic_key(rank_), encode_blob(BlobKind::preflight, rank_, nic_id()));
        !st)
      return fail("connectivity", me() + ": " + st.error().message);
    right_ = (rank_ + 1) % world_;
    left_ = (rank_ + world_ - 1) % world_;
    std::vector<int> neighbours{right_};
    if (left_ != right_) neighbours.push_back(left_);
    if (auto st = connect_peers(*transport_, store_, neighbours, c_.name, timeout); !st)
      return fail("connectivity", me() + ": " + st.error().message);
    for (int peer : neighbours) {
      const std::string key = fmt::format("{}/hello/{}", c_.name, peer);
      auto raw = store_.get_string(key, timeout);
      if (!raw) return fail("connectivity", me() + ": " + raw.error().message, peer);
      auto payload = decode_blob(*raw, BlobKind::preflight, peer, key);
      if (!payload) return fail("connectivity", me() + ": " + payload.error().message, peer);
      auto j = nlohmann::json::parse(*payload, nullptr, false);
      std::optional<std::string> ctl, dat;
      if (!j.is_discarded() && j.contains("control") && j.contains("data")) {
        ctl = unhex(j["control"].get<std::string>());
        dat = unhex(j["data"].get<std::string>());
      }
      if (!ctl || !dat)
        return fail(
            "connectivity",
            fmt::format("{}: malformed preflight blob from rank {} (key \"{}\")", me(), peer, key),
            peer);
      auto cm = parse_remote_memory(*ctl, peer, key);
      auto dm = parse_remote_memory(*dat, peer, key);
      if (!cm || !dm)
        return fail("connectivity", me() + ": " + (!cm ? cm.error() : dm.error()).message, peer);
      peers_[peer] = PeerInfo{j.value("node", "?"), j.value("nic", "?"), *cm, *dm};
      for (const RemoteMemory* m : {&*cm, &*dm})
        if (auto st = transport_->prepare_remote(peer, *m); !st)
          return fail("connectivity",
                      fmt::format("{} -> {}: {}", me(), peer_where(peer), st.error().message),
                      peer);
    }
    // 8 bytes to the right: a marker only our rank would write.
    const std::uint64_t marker = 0x5446000000000000ull | static_cast<std::uint64_t>(rank_ + 1);
    std::uint64_t& src = staging_word(0);
    src = marker;
    if (auto st = transport_->write(right_, control_, (8 + 0) * 8, peers_[right_].control,
                                    kSlotMarker * 8, 8);
        !st)
      return fail("connectivity",
                  fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                  right_);
    if (auto st = transport_->flush(right_, timeout); !st)
      return fail("connectivity",
                  fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                  right_);
    const std::uint64_t expected = 0x5446000000000000ull | static_cast<std::uint64_t>(left_ + 1);
    const auto deadline = Clock::now() + timeout;
    if (!wait_slot(kSlotMarker, expected, deadline, left_))
      return fail(
          "connectivity",
          fmt::format("{}: no RDMA write arrived from {} {} (path {} -> {} broken)", me(),
                      peer_where(left_), wait_failure(left_, timeout), peer_where(left_), me()),
          left_);
    if (auto st = barrier(timeout); !st) return fail("connectivity", st.error().message, left_);
    StageResult r;
    r.stage = "connectivity";
    r.ok = true;
    r.peer = right_;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.message = fmt::format("wrote to {} and received from {} ({})", peer_where(right_),
                            peer_where(left_), transport_->description());
    emit(r);
    return true;
  }

  // A barrier over the ranks through the transport itself, around the ring: an "arrived" token
  // goes 0 -> 1 -> ... -> n-1 -> 0, then a "release" token 0 -> 1 -> ... -> n-1. Every wait is a
  // wait_slot() on the left neighbour, so a dead neighbour ends it within UCX's keepalive (1 s)
  // instead of at a store fence's timeout, and the transport keeps progressing throughout (UCX
  // tcp completes a peer's flush only when we progress). Tokens are sequence numbers in slots
  // only the left neighbour writes; each write is flushed before the next, so they stay ordered.
  Status barrier(milliseconds timeout) {
    last_barrier_ok_ = false;
    if (world_ == 1) return ok_status();
    const std::uint64_t seq = ++barrier_seq_;
    const auto deadline = Clock::now() + timeout;
    auto pass = [&](std::size_t slot) -> Status {
      staging_word(static_cast<int>(slot)) = seq;
      if (auto st = transport_->write(right_, control_, (8 + slot) * 8, peers_[right_].control,
                                      slot * 8, 8);
          !st)
        return make_error(fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                          3);
      // The release token is the barrier's last write to the right neighbour, which may be the
      // last rank and leave (or fail its next stage and exit) as soon as it sees the token, so
      // its flush can end in "connection reset": not an error of this barrier (a dead
      // neighbour shows in the next wait). Arrival tokens are always awaited by a live reader.
      if (auto st = transport_->flush(right_, timeout); !st && slot == kSlotArrive)
        return make_error(fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                          3);
      return ok_status();
    };
    auto await = [&](std::size_t slot, const char* what) -> Status {
      if (wait_slot(slot, seq, deadline, left_)) return ok_status();
      return make_error(fmt::format("{}: barrier {}: {} token from {} did not come {}", me(), seq,
                                    what, peer_where(left_), wait_failure(left_, timeout)),
                        3);
    };
    if (rank_ != 0)
      if (auto st = await(kSlotArrive, "arrival"); !st) return st;
    if (auto st = pass(kSlotArrive); !st) return st;
    if (rank_ == 0)
      if (auto st = await(kSlotArrive, "arrival"); !st) return st;
    if (rank_ != 0)
      if (auto st = await(kSlotRelease, "release"); !st) return st;
    if (rank_ != world_ - 1)
      if (auto st = pass(kSlotRelease); !st) return st;
    last_barrier_ok_ = true;
    return ok_status();
  }

  // A word inside our control buffer used as a registered source for small writes.
  std::uint64_t& staging_word(int i) {
    return static_cast<std::uint64_t*>(control_.address)[8 + static_cast<std::size_t>(i)];
  }

  std::string nic_key(int rank) const { return fmt::format("{}/nic/{}", c_.name, rank); }
  // What two ranks must differ in to measure at the same time: node and NIC (and port).
  std::string nic_id() const { return c_.node + "\n" + nic_; }

  // The rounds of ring edges (sender ranks) from every rank's NIC, same on every rank.
  Status plan_rounds(milliseconds timeout) {
    if (!rounds_.empty()) return ok_status();
    std::vector<std::string> keys;
    for (int r = 0; r < world_; ++r) keys.push_back(nic_key(r));
    auto values = store_.get_many(keys, timeout);
    if (!values) return values.error();
    std::vector<std::string> ids;
    for (int r = 0; r < world_; ++r) {
      const auto& v = (*values)[static_cast<std::size_t>(r)];
      auto id = decode_blob(std::string_view(reinterpret_cast<const char*>(v.data()), v.size()),
                            BlobKind::preflight, r, keys[static_cast<std::size_t>(r)]);
      if (!id) return id.error();
      ids.push_back(std::move(*id));
    }
    rounds_ = ring_rounds(ids);
    return ok_status();
  }

  // "round 1 of 2, with rank 2 -> rank 3" for messages.
  std::string round_text(std::size_t k) const {
    if (rounds_.size() <= 1 && rounds_[0].size() <= 1) return "";
    std::string with;
    for (int p : rounds_[k])
      if (p != rank_) with += fmt::format("{}{} -> {}", with.empty() ? "" : ", ", p, right_of(p));
    return fmt::format(" (round {} of {}{}{})", k + 1, rounds_.size(),
                       with.empty() ? "" : ", at the same time as ", with);
  }

  // Waits until our control slot holds `value` (progressing), or the deadline.
  // Waits until our control slot holds `value`, written by `peer`: false at the deadline or
  // when the transport reports the peer failed (wait_failure() says which).
  // `passive`: nothing on this side moves the data (see Transport::target_needs_progress), so
  // after the first polls the wait sleeps instead of spinning: in a Soft-RoCE guest a spinning
  // receiver took the CPU from rxe's kernel work and halved the sender's bandwidth.
  bool wait_slot(std::size_t slot, std::uint64_t value, Clock::time_point deadline, int peer,
                 bool passive = false) {
    wait_error_.clear();
    // Busy-poll with progress, as ucx_perftest does. Yielding after a fixed number of polls
    // (4096 here before) gave the core away whenever the peer was a few microseconds late; on a
    // loaded host the pair then rarely ran at the same time again and the median shm ping-pong
    // was 34-55 us instead of perftest's 0.8. So yield only after kSpinBeforeYield of waiting:
    // then the peer is not running at all (ranks outnumber cores) and our core helps it most.
    Clock::time_point yield_after{};
    for (unsigned spins = 0; load(control_, slot) != value; ++spins) {
      transport_->progress();
      if (spins % 256 == 255) {
        const auto now = Clock::now();
        if (now > deadline) return false;
        if (auto st = transport_->check_peer(peer); !st) {
          wait_error_ = st.error().message;
          return false;
        }
        if (spins == 255)
          yield_after = now + kSpinBeforeYield;
        else if (passive)
          std::this_thread::sleep_for(kPassivePoll);
        else if (now > yield_after)
          sched_yield();
      }
    }
    return true;
  }

  // "within 20000 ms" or "(rank 1 (node n1, mlx5_0:1) failed: ...)" after a failed wait_slot.
  std::string wait_failure(int peer, milliseconds timeout) const {
    return wait_error_.empty() ? fmt::format("within {} ms", timeout.count())
                               : fmt::format("({} failed: {})", peer_where(peer), wait_error_);
  }

  bool stage_bandwidth() {
    const milliseconds timeout = c_.bandwidth_timeout;
    const double rate_gbytes = c_.selected ? c_.selected->rate_gbps / 8.0 : 0.0;
    const double threshold =
        c_.min_gbytes_per_s > 0 ? c_.min_gbytes_per_s : c_.min_rate_fraction * rate_gbytes;
    if (auto st = plan_rounds(timeout); !st)
      return fail("bandwidth", me() + ": " + st.error().message);
    bool all_ok = true;
    for (std::size_t round = 0; round < rounds_.size(); ++round) {
      const auto deadline = Clock::now() + timeout;
      const auto& senders = rounds_[round];
      const bool sending = std::find(senders.begin(), senders.end(), rank_) != senders.end();
      const bool receiving = std::find(senders.begin(), senders.end(), left_) != senders.end();
      const int phase = sending ? rank_ : left_;
      const std::uint64_t done_value = 0xB0000000ull + static_cast<std::uint64_t>(phase) + 1;
      if (sending) {
        const std::size_t msg = std::min(c_.message_bytes, c_.buffer_bytes);
        const std::size_t count = std::max<std::size_t>(1, c_.bandwidth_total_bytes / msg);
        // Warm-up, untimed: one pass over the whole buffer. Over shared memory the first write
        // to each page of the peer's mapping faults (on this project's nested-virtualisation
        // CI host ~50 us a page: 64 MiB fresh measured 0.2-0.6 GB/s against 7-12 GB/s
        // re-written); a NIC's registration has pinned the pages already. Like ib_write_bw
        // --perform_warm_up and ucx_perftest's warm-up iterations.
        Status st = ok_status();
        for (std::size_t off = 0; off + msg <= c_.buffer_bytes && st; off += msg)
          st = transport_->write(right_, data_, off, peers_[right_].data, off, msg);
        if (st) st = transport_->flush(right_, timeout);
        const auto t0 = Clock::now();
        std::size_t off = 0;
        // The transports bound their own writes in flight (UCX: retire(), verbs: the send
        // queue), so one flush at the end makes it remote-complete, as in ucx_perftest.
        for (std::size_t i = 0; i < count && st; ++i) {
          st = transport_->write(right_, data_, off, peers_[right_].data, off, msg);
          off += msg;
          if (off + msg > c_.buffer_bytes) off = 0;
        }
        if (st) st = transport_->flush(right_, timeout);
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        StageResult r;
        r.stage = "bandwidth";
        r.peer = right_;
        r.seconds = secs;
        r.threshold = threshold;
        if (!st) {
          r.ok = false;
          r.message = fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message);
        } else {
          r.gbytes_per_s = static_cast<double>(count * msg) / secs / 1e9;
          r.ok = threshold <= 0 || r.gbytes_per_s >= threshold;
          r.message = fmt::format(
              "{} x {} B RDMA writes to {} after one untimed pass over the {} B buffer{}{}", count,
              msg, peer_where(right_), c_.buffer_bytes, round_text(round),
              r.ok ? ""
                   : fmt::format(": {:.2f} GB/s below {:.2f} GB/s", r.gbytes_per_s, threshold));
        }
        all_ok = all_ok && r.ok;
        emit(r);
        // A transport error ends the stage here, without the barrier: the peer may be dead,
        // and the barrier would only wait for it. (A figure below the threshold is
        // a failed result, and the stage goes on.)
        if (!st) return false;
        staging_word(1) = done_value;
        st = transport_->write(right_, control_, (8 + 1) * 8, peers_[right_].control, kSlotDone * 8,
                               8);
        if (st) st = transport_->flush(right_, timeout);
        if (!st)
          return fail("bandwidth",
                      fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                      right_);
      }
      if (receiving && !(sending && world_ == 1)) {
        if (!wait_slot(kSlotDone, done_value, deadline, phase,
                       !transport_->target_needs_progress()))
          return fail("bandwidth",
                      fmt::format("{}: {} did not finish writing {}", me(), peer_where(phase),
                                  wait_failure(phase, timeout)),
                      phase);
      }
      if (auto st = barrier(timeout); !st) return fail("bandwidth", st.error().message, left_);
    }
    return all_ok;
  }

  int right_of(int r) const { return (r + 1) % world_; }

  bool stage_latency() {
    const milliseconds timeout = c_.latency_timeout;
    if (auto st = plan_rounds(timeout); !st)
      return fail("latency", me() + ": " + st.error().message);
    bool all_ok = true;
    for (std::size_t round = 0; round < rounds_.size(); ++round) {
      const auto deadline = Clock::now() + timeout;
      const auto& senders = rounds_[round];
      const bool pinging = std::find(senders.begin(), senders.end(), rank_) != senders.end();
      const bool ponging = std::find(senders.begin(), senders.end(), left_) != senders.end();
      const int phase = pinging ? rank_ : left_;  // the edge: phase -> phase + 1
      const int total = c_.latency_warmup + c_.latency_iterations;
      const std::uint64_t base = (static_cast<std::uint64_t>(phase) + 1) << 32;
      if (world_ == 1) {
        // Loopback: ping our own slot and time the arrival.
        std::vector<double> us;
        for (int i = 1; i <= total; ++i) {
          staging_word(2) = base + static_cast<std::uint64_t>(i);
          const auto t0 = Clock::now();
          if (auto st = transport_->write(rank_, control_, (8 + 2) * 8, peers_[rank_].control,
                                          kSlotPing * 8, 8);
              !st)
            return fail("latency", me() + ": " + st.error().message, rank_);
          if (!wait_slot(kSlotPing, base + static_cast<std::uint64_t>(i), deadline, rank_))
            return fail("latency",
                        me() + ": loopback write did not arrive " + wait_failure(rank_, timeout),
                        rank_);
          if (i > c_.latency_warmup)
            us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        (void)transport_->flush(rank_, timeout);
        all_ok = report_latency(us, rank_, 1.0, round) && all_ok;
      } else if (pinging) {
        std::vector<double> us;
        us.reserve(static_cast<std::size_t>(c_.latency_iterations));
        for (int i = 1; i <= total; ++i) {
          staging_word(2) = base + static_cast<std::uint64_t>(i);
          const auto t0 = Clock::now();
          if (auto st = transport_->write(right_, control_, (8 + 2) * 8, peers_[right_].control,
                                          kSlotPing * 8, 8);
              !st)
            return fail("latency",
                        fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                        right_);
          if (!wait_slot(kSlotPong, base + static_cast<std::uint64_t>(i), deadline, right_))
            return fail("latency",
                        fmt::format("{}: no reply from {} {}", me(), peer_where(right_),
                                    wait_failure(right_, timeout)),
                        right_);
          if (i > c_.latency_warmup)
            us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
          // Retire completed writes now and then (outside the timed part): UCX over tcp stalls
          // once a few thousand puts are left unflushed.
          if (i % 128 == 0)
            if (auto st = transport_->flush(right_, timeout); !st)
              return fail("latency",
                          fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                          right_);
        }
        if (auto st = transport_->flush(right_, timeout); !st)
          return fail("latency",
                      fmt::format("{} -> {}: {}", me(), peer_where(right_), st.error().message),
                      right_);
        all_ok = report_latency(us, right_, 2.0, round) && all_ok;
      } else if (ponging) {
        for (int i = 1; i <= total; ++i) {
          if (!wait_slot(kSlotPing, base + static_cast<std::uint64_t>(i), deadline, phase))
            return fail("latency",
                        fmt::format("{}: ping {} from {} did not arrive {}", me(), i,
                                    peer_where(phase), wait_failure(phase, timeout)),
                        phase);
          staging_word(3) = base + static_cast<std::uint64_t>(i);
          if (auto st = transport_->write(phase, control_, (8 + 3) * 8, peers_[phase].control,
                                          kSlotPong * 8, 8);
              !st)
            return fail("latency",
                        fmt::format("{} -> {}: {}", me(), peer_where(phase), st.error().message),
                        phase);
          if (i % 128 == 0)
            if (auto st = transport_->flush(phase, timeout); !st)
              return fail("latency",
                          fmt::format("{} -> {}: {}", me(), peer_where(phase), st.error().message),
                          phase);
        }
        if (auto st = transport_->flush(phase, timeout); !st)
          return fail("latency",
                      fmt::format("{} -> {}: {}", me(), peer_where(phase), st.error().message),
                      phase);
      }
      if (auto st = barrier(timeout); !st) return fail("latency", st.error().message, left_);
    }
    return all_ok;
  }

  bool report_latency(std::vector<double>& us, int peer, double divisor, std::size_t round) {
    StageResult r;
    r.stage = "latency";
    r.peer = peer;
    std::sort(us.begin(), us.end());
    r.median_us = us.empty() ? 0 : us[us.size() / 2] / divisor;
    r.p99_us = us.empty() ? 0 : us[std::min(us.size() - 1, us.size() * 99 / 100)] / divisor;
    r.threshold = c_.max_latency_us;
    r.ok = c_.max_latency_us <= 0 || r.median_us <= c_.max_latency_us;
    r.message = fmt::format(
        "8 B write ping-pong with {}, {} iterations{}{}", peer_where(peer), us.size(),
        round_text(round),
        r.ok ? ""
             : fmt::format(": median {:.2f} us above {:.2f} us", r.median_us, c_.max_latency_us));
    emit(r);
    return r.ok;
  }

  wireup::KvStore& store_;
  const PreflightConfig& c_;
  std::ostream* out_;
  int rank_;
  int world_;
  int right_ = 0;
  int left_ = 0;
  std::string nic_;
  PreflightReport report_;
  std::unique_ptr<Transport> transport_;
  std::vector<std::vector<int>> rounds_;  // ring edges (by sender) measured together
  std::string wait_error_;                // why the last wait_slot() failed, "" = timeout
  std::uint64_t barrier_seq_ = 0;
  bool last_barrier_ok_ = false;
  LocalMemory control_;
  LocalMemory data_;
  std::map<int, PeerInfo> peers_;
};

}  // namespace

std::vector<std::vector<int>> ring_rounds(const std::vector<std::string>& nic_ids) {
  const int n = static_cast<int>(nic_ids.size());
  std::vector<std::vector<int>> rounds;
  std::vector<std::set<std::string_view>> busy;  // NICs used per round
  for (int p = 0; p < n; ++p) {
    const std::string_view from = nic_ids[static_cast<std::size_t>(p)];
    const std::string_view to = nic_ids[static_cast<std::size_t>((p + 1) % n)];
    std::size_t k = 0;
    while (k < rounds.size() && (busy[k].count(from) || busy[k].count(to))) ++k;
    if (k == rounds.size()) {
      rounds.emplace_back();
      busy.emplace_back();
    }
    rounds[k].push_back(p);
    busy[k].insert(from);
    busy[k].insert(to);
  }
  return rounds;
}

Result<PreflightLevel> parse_preflight_level(std::string_view text) {
  if (text == "off") return PreflightLevel::off;
  if (text == "quick") return PreflightLevel::quick;
  if (text == "full") return PreflightLevel::full;
  return make_error(fmt::format("rdma.preflight: \"{}\" is not one of off, quick, full", text));
}

bool PreflightReport::ok() const {
  return std::all_of(results.begin(), results.end(), [](const StageResult& r) { return r.ok; });
}

std::string to_json_line(const StageResult& r, const std::string& node, const std::string& nic) {
  nlohmann::json j{{"stage", r.stage},    {"ok", r.ok}, {"rank", r.rank},
                   {"node", node},        {"nic", nic}, {"seconds", r.seconds},
                   {"message", r.message}};
  if (r.peer >= 0) j["peer"] = r.peer;
  if (r.stage == "bandwidth") {
    j["gbytes_per_s"] = r.gbytes_per_s;
    j["threshold_gbytes_per_s"] = r.threshold;
  }
  if (r.stage == "latency") {
    j["median_us"] = r.median_us;
    j["p99_us"] = r.p99_us;
    j["threshold_us"] = r.threshold;
  }
  return j.dump();
}

Result<PreflightConfig> plan_preflight(const PreflightPlanInput& in) {
  if (in.transport != "ucx" && in.transport != "verbs")
    return make_error(fmt::format("--transport: \"{}\" is not one of ucx, verbs", in.transport));
  PreflightConfig c;
  c.level = in.level;
  c.node = in.node;
  c.require_gpudirect = in.require_gpudirect;
  c.local_timeout = std::min(in.stage_timeout, milliseconds(5000));
  c.connectivity_timeout = c.bandwidth_timeout = c.latency_timeout = in.stage_timeout;
  c.min_gbytes_per_s = in.min_bandwidth_gbps / 8.0;
  c.max_latency_us = in.max_latency_us;
  auto inv = probe_node(in.sysfs_root, in.probe_cuda);
  if (!inv) return inv.error();
  c.devices = inv->devices;
  if (c.devices.empty() && in.nics.empty()) {
    // No RDMA on this node: check the host path (UCX tcp/shm) so the stages still run.
    c.transport = "ucx";
    return c;
  }
  static const topology::NodeTopology empty_topology;
  const topology::NodeTopology& topo = in.topology ? *in.topology : empty_topology;
  SelectionPolicy policy;
  policy.require_gpudirect = in.require_gpudirect;
  RankSelectionInput sel{in.rank, in.topology ? in.gpu : -1, in.nics, in.node};
  auto choice = select_for_rank(sel, c.devices, inv->cuda, inv->peermem, topo, policy);
  if (!choice) return choice.error();
  c.selected = *choice;
  c.transport = in.transport;
  c.verbs.device = choice->nic;
  c.verbs.port = choice->port;
  c.verbs.gid_index = choice->gid_index;
  c.ucx.net_devices = choice->env.at("UCX_NET_DEVICES");
  c.ucx.transports = choice->env.at("UCX_TLS");
  return c;
}

Result<PreflightReport> run_preflight(wireup::KvStore& store, const PreflightConfig& config,
                                      std::ostream* jsonl) {
  if (config.transport != "ucx" && config.transport != "verbs")
    return make_error(
        fmt::format("--transport: \"{}\" is not one of ucx, verbs", config.transport));
  if (config.buffer_bytes < 4096 || config.message_bytes == 0)
    return make_error("rdma preflight: buffer must be >= 4 KiB and messages > 0 bytes");
  if (config.transport == "verbs" && config.verbs.device.empty())
    return make_error(
        "rdma preflight: the verbs transport needs a device (rdma.nics or selection)");
  Runner runner(store, config, jsonl);
  return runner.run();
}

}  // namespace topolaunch::rdma
