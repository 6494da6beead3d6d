// The findings engine: checks of one topology, and expected (baseline) vs actual (R-DIAG-2).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "describe.hpp"
#include "topolaunch/topology/diagnose.hpp"
#include "topolaunch/topology/relation.hpp"

namespace topolaunch::topology {

namespace {

constexpr int kPortActive = 4;

Finding make(std::string_view code, Severity severity, std::string object, std::string message,
             std::string expected = {}, std::string actual = {}) {
  return Finding{std::string(code),   severity,          std::move(object),
                 std::move(expected), std::move(actual), std::move(message)};
}

bool is_compute(const Nic& nic) { return nic.role == NicRole::compute; }

// Position of a device in its topology's vector: what DeviceRef and nvlinks index by. (The
// devices' own `index` fields equal it in every loaded topology; positions stay right even for
// a hand-edited one.)
int position(const NodeTopology& topo, const Gpu* gpu) {
  return static_cast<int>(gpu - topo.gpus.data());
}
int position(const NodeTopology& topo, const Nic* nic) {
  return static_cast<int>(nic - topo.nics.data());
}

// ---- checks without a baseline ----------------------------------------------------------------

void check_links(const std::string& object, const PcieLink& link, bool is_gpu,
                 std::vector<Finding>& out) {
  if (link.max_width > 0 && link.width > 0 && link.width < link.max_width) {
    out.push_back(make(codes::kPcieWidthBelowMax, Severity::warning, object,
                       "PCIe link width below the device maximum",
                       fmt::format("x{}", link.max_width), fmt::format("x{}", link.width)));
  }
  if (link.max_gen > 0 && link.gen > 0 && link.gen < link.max_gen) {
    // Idle NVIDIA GPUs train their link down to Gen1 to save power: not a fault by itself.
    out.push_back(make(codes::kPcieGenBelowMax, is_gpu ? Severity::info : Severity::warning, object,
                       is_gpu ? "PCIe link generation below the maximum (normal for an idle GPU)"
                              : "PCIe link generation below the maximum",
                       fmt::format("Gen{}", link.max_gen), fmt::format("Gen{}", link.gen)));
  }
}

}  // namespace

std::string_view to_string(Severity severity) {
  switch (severity) {
    case Severity::info:
      return "info";
    case Severity::warning:
      return "warning";
    case Severity::error:
      return "error";
  }
  return "error";
}

std::vector<Finding> check_topology(const NodeTopology& topo) {
  std::vector<Finding> out;
  if (topo.gpus.empty()) {
    out.push_back(make(codes::kNoGpu, Severity::info, "node", "no NVIDIA GPU found"));
  }
  if (topo.nics.empty()) {
    out.push_back(make(codes::kNoNic, Severity::info, "node", "no RDMA NIC found"));
  }
  if (!topo.locality_known) {
    out.push_back(make(codes::kLocalityUnknown, Severity::warning, "node",
                       "PCI devices have no locality (VM or BIOS without _PXM): NUMA placement "
                       "of GPUs and NICs is unknown"));
  }

  // R-MAP-5: a GPU whose best compute NIC is across the SMP interconnect.
  const bool have_compute_nic = std::any_of(topo.nics.begin(), topo.nics.end(), is_compute);
  if (have_compute_nic) {
    for (const Gpu& gpu : topo.gpus) {
      const int at = position(topo, &gpu);
      const std::vector<int> best = closest_nics(topo, at);
      if (best.empty()) {
        continue;
      }
      const Relation r =
          pcie_relation(topo, {DeviceRef::Kind::gpu, at}, {DeviceRef::Kind::nic, best.front()});
      if (r.kind == RelationKind::SYS) {
        std::vector<std::string> names;
        for (int k : best) {
          const Nic& nic = topo.nics[static_cast<std::size_t>(k)];
          names.push_back(nic.name.empty() ? nic.busid.to_string() : nic.name);
        }
        out.push_back(make(codes::kGpuWithoutLocalNic, Severity::warning, describe::gpu_object(gpu),
                           fmt::format("closest compute NIC ({})", fmt::join(names, ",")),
                           "NODE or closer", "SYS"));
      }
    }
  }

  for (const Gpu& gpu : topo.gpus) {
    check_links(describe::gpu_object(gpu), gpu.link, true, out);
  }
  for (const Nic& nic : topo.nics) {
    const std::string object = describe::nic_object(nic);
    check_links(object, nic.link, false, out);
    if (!nic.has_driver) {
      out.push_back(make(codes::kNicNoDriver, Severity::warning, object,
                         "InfiniBand-class device without an RDMA driver bound"));
    }
    for (const NicPort& port : nic.ports) {
      if (port.state != 0 && port.state != kPortActive) {
        out.push_back(make(
            codes::kNicMissingOrDown, is_compute(nic) ? Severity::error : Severity::warning, object,
            fmt::format("port {} state", port.number), "ACTIVE", describe::port_state(port.state)));
      }
    }
  }

  if (!topo.nvswitches.empty() && topo.gpus.size() > 1 && topo.nvlinks.empty()) {
    out.push_back(make(codes::kNvlinkUnknown, Severity::warning, "node",
                       fmt::format("{} NVSwitches but no NVLink data (NVML not available?): "
                                   "NV# relations cannot be checked",
                                   topo.nvswitches.size()),
                       "NVLink counts", "none"));
  }
  return out;
}

namespace {

// ---- baseline comparison ----------------------------------------------------------------------

struct GpuPair {
  const Gpu* expected;
  const Gpu* actual;  // nullptr when missing
};

// NICs match by RDMA name; a NIC without driver (no name) matches by bus id.
const Nic* find_nic(const NodeTopology& topo, const Nic& wanted) {
  if (!wanted.name.empty()) {
    return topo.nic_by_name(wanted.name);
  }
  for (const Nic& nic : topo.nics) {
    if (nic.name.empty() && nic.busid == wanted.busid) {
      return &nic;
    }
  }
  return nullptr;
}

void compare_link(const std::string& object, const PcieLink& expected, const PcieLink& actual,
                  std::vector<Finding>& out) {
  if (expected.width > 0 && actual.width > 0 && actual.width < expected.width) {
    out.push_back(make(codes::kPcieWidthLow, Severity::error, object, "PCIe width",
                       fmt::format("x{}", expected.width), fmt::format("x{}", actual.width)));
  }
  if (expected.gen > 0 && actual.gen > 0 && actual.gen < expected.gen) {
    out.push_back(make(codes::kPcieGenLow, Severity::warning, object, "PCIe generation",
                       fmt::format("Gen{}", expected.gen), fmt::format("Gen{}", actual.gen)));
  }
}

void compare_cpus_and_memory(const NodeTopology& expected, const NodeTopology& actual,
                             const DiagnoseOptions& options, std::vector<Finding>& out) {
  auto count = [&](std::string_view code, const char* what, std::size_t e, std::size_t a) {
    if (e != a) {
      out.push_back(make(code, Severity::error, "node", fmt::format("{} count", what),
                         std::to_string(e), std::to_string(a)));
    }
  };
  count(codes::kSocketCount, "socket", expected.packages.size(), actual.packages.size());
  count(codes::kCoreCount, "core", expected.cores.size(), actual.cores.size());
  count(codes::kThreadCount, "hardware thread", expected.pu_count(), actual.pu_count());
  const auto expected_numa = describe::host_numa_nodes(expected);
  const auto actual_numa = describe::host_numa_nodes(actual);
  count(codes::kNumaCount, "NUMA node", expected_numa.size(), actual_numa.size());

  for (const NumaNode* e : expected_numa) {
    const NumaNode* a = actual.numa(e->os_index);
    const std::string object = fmt::format("NUMA{}", e->os_index);
    if (a == nullptr || a->gpu_memory) {
      continue;  // already counted by TOPO704
    }
    const double floor =
        static_cast<double>(e->memory_bytes) * (1.0 - options.memory_tolerance_percent / 100.0);
    if (static_cast<double>(a->memory_bytes) < floor) {
      out.push_back(make(codes::kNumaMemoryLow, Severity::error, object,
                         fmt::format("memory (tolerance {:g}%)", options.memory_tolerance_percent),
                         describe::bytes(e->memory_bytes), describe::bytes(a->memory_bytes)));
    }
    if (e->cpus != a->cpus) {
      out.push_back(make(codes::kNumaCpusChanged, Severity::error, object, "CPUs",
                         e->cpus.to_list(), a->cpus.to_list()));
    }
  }
}

}  // namespace

std::vector<Finding> compare_to_baseline(const NodeTopology& expected, const NodeTopology& actual,
                                         const DiagnoseOptions& options) {
  std::vector<Finding> out;
  compare_cpus_and_memory(expected, actual, options, out);

  const bool locality_lost = expected.locality_known && !actual.locality_known;
  if (locality_lost) {
    // One finding instead of one TOPO301 per device: the cause is the node, not each device.
    out.push_back(make(codes::kLocalityUnknown, Severity::error, "node", "PCI device locality",
                       "known", "unknown"));
  }

  // GPUs by bus id. Missing bus ids are "moved" when the count is unchanged.
  std::vector<GpuPair> gpus;
  std::vector<const Gpu*> missing;
  for (const Gpu& e : expected.gpus) {
    const Gpu* a = actual.gpu_by_busid(e.busid);
    gpus.push_back({&e, a});
    if (a == nullptr) {
      missing.push_back(&e);
    }
  }
  std::vector<const Gpu*> unexpected;
  for (const Gpu& a : actual.gpus) {
    if (expected.gpu_by_busid(a.busid) == nullptr) {
      unexpected.push_back(&a);
    }
  }
  if (expected.gpus.size() != actual.gpus.size()) {
    const bool fewer = actual.gpus.size() < expected.gpus.size();
    out.push_back(make(fewer ? codes::kGpuMissing : codes::kGpuUnexpected,
                       fewer ? Severity::error : Severity::warning, "node", "GPU count",
                       std::to_string(expected.gpus.size()), std::to_string(actual.gpus.size())));
  }
  for (std::size_t m = 0; m < missing.size(); ++m) {
    const Gpu& e = *missing[m];
    if (m < unexpected.size() && expected.gpus.size() == actual.gpus.size()) {
      out.push_back(make(codes::kGpuMoved, Severity::error, describe::gpu_object(e), "GPU bus id",
                         e.busid.to_string(), unexpected[m]->busid.to_string()));
    } else {
      out.push_back(make(codes::kGpuMissing, Severity::error, describe::gpu_object(e), "GPU",
                         "present", "missing"));
    }
  }
  if (expected.gpus.size() != actual.gpus.size()) {
    for (const Gpu* a : unexpected) {
      out.push_back(make(codes::kGpuUnexpected, Severity::warning, describe::gpu_object(*a),
                         "GPU not in the baseline"));
    }
  }

  for (const GpuPair& pair : gpus) {
    if (pair.actual == nullptr) {
      continue;
    }
    const Gpu& e = *pair.expected;
    const Gpu& a = *pair.actual;
    const std::string object = describe::gpu_object(a);
    if (e.device_id != 0 && a.device_id != 0 && e.device_id != a.device_id) {
      out.push_back(make(codes::kGpuModelChanged, Severity::warning, object, "GPU model",
                         describe::gpu_model(e), describe::gpu_model(a)));
    }
    if (!locality_lost && e.numa != a.numa) {
      out.push_back(make(codes::kNumaMismatch, Severity::error, object, "NUMA node",
                         describe::numa(e.numa), describe::numa(a.numa)));
    }
    compare_link(object, e.link, a.link, out);
  }

  // NICs.
  for (const Nic& e : expected.nics) {
    const Nic* found = find_nic(actual, e);
    const std::string expected_object = describe::nic_object(e);
    const Severity severity = is_compute(e) ? Severity::error : Severity::warning;
    if (found == nullptr) {
      out.push_back(
          make(codes::kNicMissingOrDown, severity, expected_object, "NIC", "present", "missing"));
      continue;
    }
    const Nic& a = *found;
    const std::string object = describe::nic_object(a);
    if (a.busid != e.busid) {
      out.push_back(make(codes::kNicMoved, Severity::error, object, "NIC bus id",
                         e.busid.to_string(), a.busid.to_string()));
    }
    if (!locality_lost && e.numa != a.numa) {
      out.push_back(make(codes::kNumaMismatch, Severity::error, object, "NUMA node",
                         describe::numa(e.numa), describe::numa(a.numa)));
    }
    compare_link(object, e.link, a.link, out);
    for (const NicPort& ep : e.ports) {
      const auto ap = std::find_if(a.ports.begin(), a.ports.end(),
                                   [&](const NicPort& p) { return p.number == ep.number; });
      if (ap == a.ports.end()) {
        out.push_back(make(codes::kNicMissingOrDown, severity, object,
                           fmt::format("port {} missing", ep.number), "present", "missing"));
        continue;
      }
      if (ep.state == kPortActive && ap->state != kPortActive) {
        out.push_back(make(codes::kNicMissingOrDown, severity, object,
                           fmt::format("port {} state", ep.number), describe::port_state(ep.state),
                           describe::port_state(ap->state)));
      }
      if (ep.rate_gbps > 0.0 && ap->rate_gbps > 0.0 && ap->rate_gbps < ep.rate_gbps) {
        out.push_back(make(codes::kNicRateLow, severity, object,
                           fmt::format("port {} rate", ep.number), describe::rate(ep.rate_gbps),
                           describe::rate(ap->rate_gbps)));
      }
    }
  }
  for (const Nic& a : actual.nics) {
    if (find_nic(expected, a) == nullptr) {
      out.push_back(make(codes::kNicUnexpected, Severity::warning, describe::nic_object(a),
                         "NIC not in the baseline"));
    }
  }

  // NVLink counts per GPU pair (R-NV-4).
  if (!expected.nvlinks.empty()) {
    if (actual.nvlinks.empty()) {
      if (actual.gpus.size() > 1) {
        out.push_back(make(codes::kNvlinkDataMissing, Severity::warning, "node",
                           "baseline has NVLink counts but this topology has none (NVML not "
                           "available?): NVLink not checked",
                           "NVLink counts", "none"));
      }
    } else {
      for (std::size_t i = 0; i < gpus.size(); ++i) {
        for (std::size_t j = i + 1; j < gpus.size(); ++j) {
          const Gpu* ai = gpus[i].actual;
          const Gpu* aj = gpus[j].actual;
          if (ai == nullptr || aj == nullptr || i >= expected.nvlinks.size() ||
              j >= expected.nvlinks[i].size()) {
            continue;
          }
          const int want = expected.nvlinks[i][j];
          const auto ia = static_cast<std::size_t>(position(actual, ai));
          const auto ja = static_cast<std::size_t>(position(actual, aj));
          const int have = ia < actual.nvlinks.size() && ja < actual.nvlinks[ia].size()
                               ? actual.nvlinks[ia][ja]
                               : 0;
          if (have < want) {
            out.push_back(make(codes::kNvlinkLow, Severity::error,
                               fmt::format("GPU{}-GPU{}", ai->index, aj->index), "NVLink count",
                               fmt::format("NV{}", want),
                               have > 0 ? fmt::format("NV{}", have) : std::string("none")));
          }
        }
      }
    }
  }

  // PCIe relations (NV# is compared above): GPU-GPU pairs and GPU-NIC pairs present in both.
  auto worse = [&](DeviceRef ea, DeviceRef eb, DeviceRef aa, DeviceRef ab, std::string object) {
    const Relation want = pcie_relation(expected, ea, eb);
    const Relation have = pcie_relation(actual, aa, ab);
    if (!want.closer_than(have)) {
      return;
    }
    // Without locality every NODE pair becomes SYS: TOPO302 already says why.
    if (locality_lost && want.kind == RelationKind::NODE && have.kind == RelationKind::SYS) {
      return;
    }
    out.push_back(make(codes::kRelationWorse, Severity::error, std::move(object), "relation",
                       want.to_string(), have.to_string()));
  };
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const Gpu* ai = gpus[i].actual;
    if (ai == nullptr) {
      continue;
    }
    const DeviceRef ei_ref{DeviceRef::Kind::gpu, position(expected, gpus[i].expected)};
    const DeviceRef ai_ref{DeviceRef::Kind::gpu, position(actual, ai)};
    for (std::size_t j = i + 1; j < gpus.size(); ++j) {
      const Gpu* aj = gpus[j].actual;
      if (aj == nullptr) {
        continue;
      }
      worse(ei_ref, {DeviceRef::Kind::gpu, position(expected, gpus[j].expected)}, ai_ref,
            {DeviceRef::Kind::gpu, position(actual, aj)},
            fmt::format("GPU{}-GPU{}", ai->index, aj->index));
    }
    for (const Nic& e : expected.nics) {
      const Nic* a = find_nic(actual, e);
      if (a == nullptr) {
        continue;
      }
      worse(ei_ref, {DeviceRef::Kind::nic, position(expected, &e)}, ai_ref,
            {DeviceRef::Kind::nic, position(actual, a)},
            fmt::format("GPU{}-{}", ai->index, a->name.empty() ? a->busid.to_string() : a->name));
    }
  }
  return out;
}

namespace {

int severity_rank(Severity s) {
  switch (s) {
    case Severity::error:
      return 0;
    case Severity::warning:
      return 1;
    case Severity::info:
      return 2;
  }
  return 2;
}

}  // namespace

std::vector<Finding> diagnose(const NodeTopology& actual, const NodeTopology* baseline,
                              const DiagnoseOptions& options) {
  std::vector<Finding> out;
  if (baseline != nullptr) {
    out = compare_to_baseline(*baseline, actual, options);
  }
  // The baseline comparison says the same thing better (with the expected value): drop the
  // no-baseline finding for the same object, also when it is the "below maximum" twin.
  std::set<std::pair<std::string, std::string>> said;
  for (const Finding& f : out) {
    said.insert({f.code, f.object});
  }
  const std::map<std::string_view, std::string_view> twin = {
      {codes::kPcieWidthBelowMax, codes::kPcieWidthLow},
      {codes::kPcieGenBelowMax, codes::kPcieGenLow},
  };
  for (Finding& f : check_topology(actual)) {
    std::string code = f.code;
    if (auto it = twin.find(code); it != twin.end()) {
      code = std::string(it->second);
    }
    if (said.count({code, f.object}) == 0 && said.count({f.code, f.object}) == 0) {
      out.push_back(std::move(f));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    return std::tuple(severity_rank(a.severity), a.code) <
           std::tuple(severity_rank(b.severity), b.code);
  });
  return out;
}

int exit_status(const std::vector<Finding>& findings) {
  bool warning = false;
  bool data_missing = false;
  for (const Finding& f : findings) {
    if (f.severity == Severity::error) {
      return 1;
    }
    if (f.code == codes::kNvlinkDataMissing) {
      data_missing = true;
    } else if (f.severity == Severity::warning) {
      warning = true;
    }
  }
  if (data_missing) {
    return 4;
  }
  return warning ? 3 : 0;
}

std::string format_finding(const Finding& f) {
  std::string line =
      fmt::format("{} {} {}: {}", f.code, to_string(f.severity), f.object, f.message);
  if (!f.expected.empty() || !f.actual.empty()) {
    line += fmt::format(" expected {}, found {}", f.expected.empty() ? "?" : f.expected,
                        f.actual.empty() ? "?" : f.actual);
  }
  return line;
}

}  // namespace topolaunch::topology
