#include "topolaunch/rdma/select.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cstdlib>

#include "topolaunch/topology/relation.hpp"

namespace topolaunch::rdma {
namespace {

std::string where(const RankSelectionInput& in) {
  return in.node.empty() ? fmt::format("rank {}", in.rank)
                         : fmt::format("rank {} on node {}", in.rank, in.node);
}

std::string port_state(const PortInfo& p) {
  return fmt::format(
      "{}/{}", p.state_name.empty() ? std::to_string(p.state) : p.state_name,
      p.physical_state_name.empty() ? std::to_string(p.physical_state) : p.physical_state_name);
}

std::string names_of(const std::vector<RdmaDevice>& devices) {
  std::string out;
  for (const auto& d : devices) out += (out.empty() ? "" : ", ") + d.name;
  return out.empty() ? "none" : out;
}

// "mlx5_0:1" -> {"mlx5_0", 1}; "mlx5_0" -> {"mlx5_0", nullopt}
std::pair<std::string, std::optional<int>> split_port(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) return {text, std::nullopt};
  return {text.substr(0, colon), std::atoi(text.c_str() + colon + 1)};
}

const RdmaDevice* find_device(const std::vector<RdmaDevice>& devices, const std::string& name) {
  for (const auto& d : devices)
    if (d.name == name) return &d;
  return nullptr;
}

const GpuRdmaCaps* caps_for(const CudaProbe& cuda, const topology::Gpu& gpu) {
  for (const auto& c : cuda.gpus)
    if (c.pci && *c.pci == gpu.busid) return &c;
  return nullptr;
}

}  // namespace

std::string to_string(RegistrationMethod method) {
  switch (method) {
    case RegistrationMethod::dma_buf:
      return "dma-buf";
    case RegistrationMethod::peermem:
      return "peermem";
    case RegistrationMethod::host_staging:
      break;
  }
  return "host staging";
}

Result<GidChoice> select_gid(const RdmaDevice& device, const PortInfo& port,
                             const SelectionPolicy& policy) {
  const std::string name = fmt::format("{}:{}", device.name, port.number);
  if (!port.roce()) return GidChoice{0, "InfiniBand port: GID index 0 (NCCL's rule)"};
  if (policy.gid_index) {
    for (const auto& g : port.gids)
      if (g.index == *policy.gid_index)
        return GidChoice{g.index,
                         fmt::format("GID index {} from the policy (NCCL_IB_GID_INDEX)", g.index)};
    return make_error(
        fmt::format("{}: GID index {} (NCCL_IB_GID_INDEX) is empty on this port; "
                    "populated indexes: {}",
                    name, *policy.gid_index, [&] {
                      std::string s;
                      for (const auto& g : port.gids)
                        s += (s.empty() ? "" : ",") + std::to_string(g.index);
                      return s.empty() ? std::string("none") : s;
                    }()));
  }
  const GidType wanted = policy.roce_version == 1 ? GidType::ib_roce_v1 : GidType::roce_v2;
  for (const auto& g : port.gids) {
    if (g.index < 1) continue;
    const bool family_ok =
        policy.address_family == AddressFamily::ipv4 ? g.ipv4_mapped() : !g.ipv4_mapped();
    if (!family_ok || g.link_local()) continue;
    if (g.type != wanted && g.type != GidType::unknown) continue;
    return GidChoice{
        g.index,
        fmt::format("RoCE: GID index {} is the first {} {} non-link-local entry ({})", g.index,
                    to_string(g.type),
                    policy.address_family == AddressFamily::ipv4 ? "IPv4" : "IPv6", g.gid)};
  }
  return make_error(fmt::format(
      "{}: no RoCE v{} GID with an {} address on this port (configure an IP address on {} or set "
      "NCCL_IB_GID_INDEX)",
      name, policy.roce_version, policy.address_family == AddressFamily::ipv4 ? "IPv4" : "IPv6",
      device.netdevs.empty() ? std::string("its netdev") : device.netdevs.front()));
}

Result<RankRdmaChoice> select_for_rank(const RankSelectionInput& input,
                                       const std::vector<RdmaDevice>& devices,
                                       const CudaProbe& cuda, bool peermem,
                                       const topology::NodeTopology& topo,
                                       const SelectionPolicy& policy) {
  RankRdmaChoice out;
  out.gpu = input.gpu;
  if (input.gpu >= static_cast<int>(topo.gpus.size()))
    return make_error(fmt::format("{}: GPU {} does not exist (node has {} GPUs)", where(input),
                                  input.gpu, topo.gpus.size()));

  // 1. Candidate (device, port) pairs in preference order.
  struct Candidate {
    const RdmaDevice* device;
    std::optional<int> port;
  };
  std::vector<Candidate> candidates;
  if (!input.nics.empty()) {
    for (const auto& text : input.nics) {
      auto [name, port] = split_port(text);
      const RdmaDevice* d = find_device(devices, name);
      if (!d)
        return make_error(
            fmt::format("{}: NIC \"{}\" named in the config does not exist on this "
                        "node (RDMA devices: {})",
                        where(input), name, names_of(devices)));
      if (port && !d->port(*port))
        return make_error(fmt::format("{}: NIC {} has no port {} (ports 1..{})", where(input), name,
                                      *port, d->ports.size()));
      candidates.push_back({d, port});
    }
    out.notes.push_back("NICs from the rank map: " + [&] {
      std::string s;
      for (const auto& n : input.nics) s += (s.empty() ? "" : ",") + n;
      return s;
    }());
  } else if (input.gpu >= 0) {
    const std::vector<int> closest = topology::closest_nics(topo, input.gpu);
    // GPUs that share the same closest set split it: the k-th of them takes NIC k mod n.
    int position = 0;
    for (int g = 0; g < input.gpu; ++g)
      if (topology::closest_nics(topo, g) == closest) ++position;
    for (std::size_t i = 0; i < closest.size(); ++i) {
      const auto& nic = topo.nics[closest[(position + i) % closest.size()]];
      if (const RdmaDevice* d = find_device(devices, nic.name)) candidates.push_back({d, {}});
    }
    if (!candidates.empty())
      out.notes.push_back(fmt::format("{} is the closest compute NIC of GPU {} ({})",
                                      candidates.front().device->name, input.gpu,
                                      topo.gpus[input.gpu].busid.to_string()));
  }
  if (candidates.empty()) {
    for (const auto& d : devices) candidates.push_back({&d, {}});
    if (!devices.empty())
      out.notes.push_back("no NIC named and no GPU-local NIC known: any device of the node");
  }
  if (candidates.empty())
    return make_error(fmt::format("{}: this node has no RDMA device (no /sys/class/infiniband "
                                  "entries); use the tcp transport or fix the driver",
                                  where(input)),
                      2);

  // 2. The first healthy port; remember every healthy port of the candidates for NCCL_IB_HCA.
  const RdmaDevice* chosen = nullptr;
  const PortInfo* chosen_port = nullptr;
  std::vector<std::string> unhealthy;
  for (const auto& c : candidates) {
    for (const auto& p : c.device->ports) {
      if (c.port && p.number != *c.port) continue;
      const std::string id = fmt::format("{}:{}", c.device->name, p.number);
      if (!p.healthy()) {
        unhealthy.push_back(fmt::format("{} is {}", id, port_state(p)));
        continue;
      }
      if (!chosen) {
        chosen = c.device;
        chosen_port = &p;
      }
      if (!input.nics.empty() || chosen == c.device) out.healthy_ports.push_back(id);
    }
  }
  if (!chosen)
    return make_error(fmt::format("{}: no healthy RDMA port: {} (need ACTIVE/LinkUp; check the "
                                  "cable and the subnet manager, or name another NIC)",
                                  where(input),
                                  [&] {
                                    std::string s;
                                    for (const auto& u : unhealthy)
                                      s += (s.empty() ? "" : "; ") + u;
                                    return s;
                                  }()),
                      2);
  for (const auto& u : unhealthy) out.notes.push_back("skipped " + u);
  out.nic = chosen->name;
  out.port = chosen_port->number;
  out.link_layer = chosen_port->link_layer;
  out.rate_gbps = chosen_port->rate_gbps;

  // 3. GID.
  auto gid = select_gid(*chosen, *chosen_port, policy);
  if (!gid) return make_error(where(input) + ": " + gid.error().message, 2);
  out.gid_index = gid->index;
  for (const auto& g : chosen_port->gids)
    if (g.index == gid->index) out.gid = g.gid;
  out.notes.push_back(gid->why);

  // 4. Registration method: dma-buf, then peermem, else host staging, always with the reason.
  std::string staging_reason;
  if (input.gpu < 0) {
    staging_reason = "rank has no GPU";
  } else {
    const auto& gpu = topo.gpus[input.gpu];
    const topology::Nic* nic = topo.nic_by_name(out.nic);
    std::optional<topology::Relation> rel;
    if (nic)
      rel = topology::relation_between(
          topo, {topology::DeviceRef::Kind::gpu, input.gpu},
          {topology::DeviceRef::Kind::nic, static_cast<int>(nic - topo.nics.data())});
    const GpuRdmaCaps* caps = caps_for(cuda, gpu);
    if (rel && static_cast<int>(rel->kind) > static_cast<int>(policy.gdr_max_relation)) {
      staging_reason = fmt::format("GPU {} and {} are {} apart (GPUDirect needs {} or closer)",
                                   input.gpu, out.nic, rel->to_string(),
                                   topology::Relation{policy.gdr_max_relation, 0}.to_string());
    } else if (!cuda.driver_loaded || cuda.status != "ok") {
      staging_reason = "CUDA driver not usable on this node: " + cuda.status;
    } else if (!caps) {
      staging_reason = fmt::format("the CUDA driver does not list GPU {} ({})", input.gpu,
                                   gpu.busid.to_string());
    } else if (!caps->gpudirect_rdma) {
      staging_reason = fmt::format("GPU {} reports no GPUDirect RDMA support", input.gpu);
    } else if (caps->dma_buf) {
      out.registration = RegistrationMethod::dma_buf;
      out.notes.push_back(fmt::format("GPU memory registered with dma-buf (GPU {} supports it{})",
                                      input.gpu,
                                      rel ? ", " + rel->to_string() + " to " + out.nic : ""));
    } else if (peermem) {
      out.registration = RegistrationMethod::peermem;
      out.notes.push_back(fmt::format(
          "GPU memory registered through nvidia_peermem (GPU {} has no dma-buf)", input.gpu));
    } else {
      staging_reason =
          fmt::format("GPU {} supports neither dma-buf nor is nvidia_peermem loaded", input.gpu);
    }
  }
  if (out.registration == RegistrationMethod::host_staging) {
    if (policy.require_gpudirect && input.gpu >= 0)
      return make_error(fmt::format("{}: GPUDirect RDMA required but impossible with {}:{}: {}",
                                    where(input), out.nic, out.port, staging_reason),
                        2);
    out.notes.push_back("host staging (GPU data copied through host memory): " + staging_reason);
  }

  // 5. Environment: UCX and NCCL see the same device, port and GID.
  const std::string dev_port = fmt::format("{}:{}", out.nic, out.port);
  out.env["UCX_NET_DEVICES"] = dev_port;
  // "rc" = rc_verbs/rc_mlx5 with ud as the auxiliary wireup transport; a bare rc_verbs cannot
  // wire up from worker addresses (rdma.md §1.5). sm/self for ranks on the same node.
  out.env["UCX_TLS"] = "rc,sm,self";
  std::string hca = "=";
  for (std::size_t i = 0; i < out.healthy_ports.size(); ++i)
    hca += (i ? "," : "") + out.healthy_ports[i];
  out.env["NCCL_IB_HCA"] = hca;
  if (chosen_port->roce()) {
    out.env["NCCL_IB_GID_INDEX"] = std::to_string(out.gid_index);
    out.env["UCX_IB_GID_INDEX"] = std::to_string(out.gid_index);
  }
  if (out.registration == RegistrationMethod::dma_buf) out.env["NCCL_DMABUF_ENABLE"] = "1";
  return out;
}

}  // namespace topolaunch::rdma
