// Relations between two PCI devices exactly as `nvidia-smi topo -m` prints them (research
// topology.md §6 R-CLS-*), computed from the model alone so XML, live and JSON agree.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology {

// Ordered by closeness (R-CLS-6): X < NV# < PIX < PXB < PHB < NODE < SYS.
enum class RelationKind { X, NV, PIX, PXB, PHB, NODE, SYS };

struct Relation {
  RelationKind kind = RelationKind::SYS;
  int nvlinks = 0;  // when kind == NV

  std::string to_string() const;  // "X", "NV18", "PIX", ...
  static std::optional<Relation> parse(std::string_view text);
  // Closer first; between two NV relations, more links is closer.
  bool closer_than(const Relation& other) const;
  bool operator==(const Relation&) const = default;
};

struct DeviceRef {
  enum class Kind { gpu, nic } kind = Kind::gpu;
  int index = 0;  // into NodeTopology::gpus or ::nics
  bool operator==(const DeviceRef&) const = default;
};

// PCIe-only relation (like `nvidia-smi topo -mp`).
Relation pcie_relation(const NodeTopology& topo, DeviceRef a, DeviceRef b);
// With NVLink: GPU pairs with a known link count print NV# (R-CLS-5).
Relation relation_between(const NodeTopology& topo, DeviceRef a, DeviceRef b);

// NICs (indexes into topo.nics) sharing the best relation to GPU `gpu`, among NICs whose role is
// compute (or any role when include_all_roles). Sorted by NIC index. Empty when there is no NIC.
std::vector<int> closest_nics(const NodeTopology& topo, int gpu, bool include_all_roles = false);

// The full matrix over GPUs then NICs, keyed by "GPU<i>" / "NIC<k>" where k is the NIC's
// numeric suffix order (NIC<k> = topo.nics[k]).
struct RelationMatrix {
  std::vector<std::string> labels;
  std::vector<std::vector<Relation>> cells;  // cells[row][col]
};
RelationMatrix relation_matrix(const NodeTopology& topo, bool with_nvlink = true);

}  // namespace topolaunch::topology
