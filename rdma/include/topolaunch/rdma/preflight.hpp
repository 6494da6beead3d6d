// Fabric preflight, staged: local (the selected port is ACTIVE/LinkUp at the expected rate, the
// GID exists, GPUDirect as the policy requires), connectivity (an 8-byte RDMA write around the
// ring, verified), bandwidth (large RDMA writes to the next rank, one sender at a time, against a
// threshold) and latency (8-byte write ping-pong median against a bound). Every stage has its
// own timeout and writes one JSON line per rank and result; failures name node, NIC and port
// (and the peer's). Collective: every rank of the store runs it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/rdma/endpoint.hpp"
#include "topolaunch/rdma/probe.hpp"
#include "topolaunch/rdma/select.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::rdma {

enum class PreflightLevel { off, quick, full };                       // quick: local + connectivity
Result<PreflightLevel> parse_preflight_level(std::string_view text);  // "off|quick|full"

inline constexpr int kPreflightFailedExit = 4;  // the fabric is unhealthy (not bad input)

struct PreflightConfig {
  PreflightLevel level = PreflightLevel::full;
  std::string transport = "ucx";  // "ucx" | "verbs"
  UcxTransportOptions ucx;        // transport == "ucx"
  VerbsTransportOptions verbs;    // transport == "verbs": device, port, GID index
  std::string node;               // this node's name, for messages
  // Local stage: what selection chose for this rank (absent: nothing to check locally, e.g.
  // UCX over tcp on a node without RDMA NICs) and the probe of the node.
  std::optional<RankRdmaChoice> selected;
  std::vector<RdmaDevice> devices;
  double expected_rate_gbps = 0;  // 0 = any rate
  bool require_gpudirect = false;

  std::chrono::milliseconds local_timeout{5'000};
  std::chrono::milliseconds connectivity_timeout{15'000};
  std::chrono::milliseconds bandwidth_timeout{60'000};
  std::chrono::milliseconds latency_timeout{20'000};

  std::size_t buffer_bytes = std::size_t{64} << 20;  // registered per rank (fresh memory)
  std::size_t message_bytes = std::size_t{1} << 20;
  std::size_t bandwidth_total_bytes = std::size_t{256} << 20;
  // Pass: >= fraction x port rate (NVIDIA's 0.9), or >= min_gbytes_per_s when set (> 0).
  double min_rate_fraction = 0.9;
  double min_gbytes_per_s = 0;
  int latency_iterations = 2000;
  int latency_warmup = 200;
  double max_latency_us = 0;       // 0 = report only
  std::string name = "preflight";  // store key prefix
};

struct StageResult {
  std::string stage;  // "local", "connectivity", "bandwidth", "latency"
  bool ok = false;
  int rank = -1;
  int peer = -1;        // -1 when the stage has no peer
  std::string message;  // the failure (or a short note)
  double seconds = 0;
  double gbytes_per_s = 0;  // bandwidth
  double median_us = 0;     // latency (one way = round trip / 2)
  double p99_us = 0;
  double threshold = 0;  // the bound the value was held against, 0 = none
};

struct PreflightReport {
  std::vector<StageResult> results;
  bool ok() const;
  int exit_status() const { return ok() ? 0 : kPreflightFailedExit; }
};

std::string to_json_line(const StageResult& r, const std::string& node, const std::string& nic);

// Runs the stages the level asks for; a failed stage stops the later ones (their results say
// "skipped"). JSON lines go to `jsonl` as they happen. Returns an Error only for bad input
// (exit 2); an unhealthy fabric is a report with ok() == false.
Result<PreflightReport> run_preflight(wireup::KvStore& store, const PreflightConfig& config,
                                      std::ostream* jsonl);

// The schedule of the bandwidth and latency stages: the ring's edges (edge p: rank p -> rank
// p+1 mod n, named by p) in rounds, greedily in edge order, so that no NIC (`nic_ids[r]` is
// rank r's node and NIC) appears twice in a round. n distinct NICs: 2 rounds (n even) or 3
// (n odd, > 1); all ranks on one NIC: n rounds of one edge. Pure: every rank computes the same.
std::vector<std::vector<int>> ring_rounds(const std::vector<std::string>& nic_ids);

// From job-level settings to a PreflightConfig for one rank: probes the node (sysfs root,
// CUDA driver), selects NIC/port/GID for the rank and picks the transport. What `topolaunch
// preflight job.toml` and the `[rdma] preflight` stage of `topolaunch run` both call.
struct PreflightPlanInput {
  PreflightLevel level = PreflightLevel::quick;
  int rank = 0;
  std::string node;
  std::vector<std::string> nics;  // [rdma] nics for this rank ("" = closest / any)
  int gpu = -1;                   // the rank's GPU in `topology`, -1 = none
  const topology::NodeTopology* topology = nullptr;  // for closest NICs; may be null
  std::string transport = "verbs";  // "verbs" | "ucx"; without RDMA devices: ucx (tcp/shm)
  std::string sysfs_root = "/sys";
  bool probe_cuda = true;
  bool require_gpudirect = false;
  double min_bandwidth_gbps = 0;  // Gb/s; 0 = 0.9 x port rate when known
  double max_latency_us = 0;      // 0 = report only
  std::chrono::milliseconds stage_timeout{60'000};
};
// Errors (exit 2): a NIC named that does not exist, no healthy port, GPUDirect required but
// impossible — each naming node, NIC and port.
Result<PreflightConfig> plan_preflight(const PreflightPlanInput& input);

}  // namespace topolaunch::rdma
