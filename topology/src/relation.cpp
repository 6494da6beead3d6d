#include "topolaunch/topology/relation.hpp"

#include <algorithm>
#include <charconv>

namespace topolaunch::topology {

namespace {

struct DeviceView {
  const PciAddress* busid;
  const PciPath* path;
  int numa;
};

DeviceView view(const NodeTopology& topo, DeviceRef ref) {
  if (ref.kind == DeviceRef::Kind::gpu) {
    const Gpu& gpu = topo.gpus.at(static_cast<std::size_t>(ref.index));
    return {&gpu.busid, &gpu.path, gpu.numa};
  }
  const Nic& nic = topo.nics.at(static_cast<std::size_t>(ref.index));
  return {&nic.busid, &nic.path, nic.numa};
}

int rank(RelationKind kind) { return static_cast<int>(kind); }

}  // namespace

std::string Relation::to_string() const {
  switch (kind) {
    case RelationKind::X:
      return "X";
    case RelationKind::NV:
      return "NV" + std::to_string(nvlinks);
    case RelationKind::PIX:
      return "PIX";
    case RelationKind::PXB:
      return "PXB";
    case RelationKind::PHB:
      return "PHB";
    case RelationKind::NODE:
      return "NODE";
    case RelationKind::SYS:
      return "SYS";
  }
  return "SYS";
}

std::optional<Relation> Relation::parse(std::string_view text) {
  if (text == "X") return Relation{RelationKind::X, 0};
  if (text == "PIX") return Relation{RelationKind::PIX, 0};
  if (text == "PXB") return Relation{RelationKind::PXB, 0};
  if (text == "PHB") return Relation{RelationKind::PHB, 0};
  if (text == "NODE") return Relation{RelationKind::NODE, 0};
  if (text == "SYS") return Relation{RelationKind::SYS, 0};
  if (text.starts_with("NV") && text.size() > 2) {
    int links = 0;
    auto digits = text.substr(2);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), links);
    if (ec == std::errc() && end == digits.data() + digits.size() && links > 0) {
      return Relation{RelationKind::NV, links};
    }
  }
  return std::nullopt;
}

bool Relation::closer_than(const Relation& other) const {
  if (kind != other.kind) {
    return rank(kind) < rank(other.kind);
  }
  return kind == RelationKind::NV && nvlinks > other.nvlinks;
}

// R-CLS-1..4, from the PCI paths and NUMA nodes stored in the model.
Relation pcie_relation(const NodeTopology& topo, DeviceRef a, DeviceRef b) {
  const DeviceView va = view(topo, a);
  const DeviceView vb = view(topo, b);
  if (a == b || *va.busid == *vb.busid) {
    return {RelationKind::X, 0};
  }
  const PciPath& pa = *va.path;
  const PciPath& pb = *vb.path;
  if (pa.host_bridge.empty() || pa.host_bridge != pb.host_bridge) {
    const bool same_numa = va.numa >= 0 && va.numa == vb.numa;
    return {same_numa ? RelationKind::NODE : RelationKind::SYS, 0};
  }
  // Lowest common ancestor below the host bridge = end of the common prefix of bridges.
  std::size_t common = 0;
  while (common < pa.bridges.size() && common < pb.bridges.size() &&
         pa.bridges[common] == pb.bridges[common]) {
    ++common;
  }
  if (common == 0) {
    return {RelationKind::PHB, 0};
  }
  // Bridges strictly between each device and the common bridge.
  const std::size_t below_a = pa.bridges.size() - common;
  const std::size_t below_b = pb.bridges.size() - common;
  return {below_a <= 1 && below_b <= 1 ? RelationKind::PIX : RelationKind::PXB, 0};
}

Relation relation_between(const NodeTopology& topo, DeviceRef a, DeviceRef b) {
  if (a.kind == DeviceRef::Kind::gpu && b.kind == DeviceRef::Kind::gpu && a.index != b.index) {
    const auto i = static_cast<std::size_t>(a.index);
    const auto j = static_cast<std::size_t>(b.index);
    if (i < topo.nvlinks.size() && j < topo.nvlinks[i].size() && topo.nvlinks[i][j] > 0) {
      return {RelationKind::NV, topo.nvlinks[i][j]};
    }
  }
  return pcie_relation(topo, a, b);
}

std::vector<int> closest_nics(const NodeTopology& topo, int gpu, bool include_all_roles) {
  std::vector<int> best;
  Relation best_relation{RelationKind::SYS, 0};
  const DeviceRef gpu_ref{DeviceRef::Kind::gpu, gpu};
  for (std::size_t k = 0; k < topo.nics.size(); ++k) {
    if (!include_all_roles && topo.nics[k].role != NicRole::compute) {
      continue;
    }
    const int index = static_cast<int>(k);
    const Relation r = pcie_relation(topo, gpu_ref, {DeviceRef::Kind::nic, index});
    if (best.empty() || r.closer_than(best_relation)) {
      best = {index};
      best_relation = r;
    } else if (r == best_relation) {
      best.push_back(index);
    }
  }
  return best;
}

RelationMatrix relation_matrix(const NodeTopology& topo, bool with_nvlink) {
  RelationMatrix matrix;
  std::vector<DeviceRef> refs;
  for (std::size_t i = 0; i < topo.gpus.size(); ++i) {
    matrix.labels.push_back("GPU" + std::to_string(i));
    refs.push_back({DeviceRef::Kind::gpu, static_cast<int>(i)});
  }
  for (std::size_t k = 0; k < topo.nics.size(); ++k) {
    matrix.labels.push_back("NIC" + std::to_string(k));
    refs.push_back({DeviceRef::Kind::nic, static_cast<int>(k)});
  }
  for (const DeviceRef& row : refs) {
    std::vector<Relation> cells;
    cells.reserve(refs.size());
    for (const DeviceRef& col : refs) {
      cells.push_back(with_nvlink ? relation_between(topo, row, col)
                                  : pcie_relation(topo, row, col));
    }
    matrix.cells.push_back(std::move(cells));
  }
  return matrix;
}

}  // namespace topolaunch::topology
