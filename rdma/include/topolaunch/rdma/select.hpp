// Per-rank NIC, port, GID and memory-registration choice, and the environment that tells UCX
// and NCCL the same thing. Pure functions of the inventory, the topology and the policy.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/rdma/probe.hpp"
#include "topolaunch/topology/model.hpp"
#include "topolaunch/topology/relation.hpp"

namespace topolaunch::rdma {

enum class RegistrationMethod { dma_buf, peermem, host_staging };
std::string to_string(RegistrationMethod method);

enum class AddressFamily { ipv4, ipv6 };

struct SelectionPolicy {
  std::optional<int> gid_index;  // NCCL_IB_GID_INDEX given by the user: used as is
  AddressFamily address_family = AddressFamily::ipv4;  // NCCL_IB_ADDR_FAMILY
  int roce_version = 2;                                // NCCL_IB_ROCE_VERSION_NUM
  // GPUDirect RDMA only when the GPU-NIC relation is at most this far (NCCL_NET_GDR_LEVEL
  // default PXB).
  topology::RelationKind gdr_max_relation = topology::RelationKind::PXB;
  bool require_gpudirect = false;  // host staging becomes an error instead of a note
};

// The GID NCCL would use (connect.cc ncclIbGetGidIndex): InfiniBand -> 0; RoCE -> the policy's
// index if given, else the first index >= 1 whose address family matches, that is not
// link-local and whose type is RoCE v<roce_version>; a type the kernel would not tell us
// (unknown) counts as a match, as NCCL tolerates EINVAL there. `why` explains the choice.
struct GidChoice {
  int index = 0;
  std::string why;
};
Result<GidChoice> select_gid(const RdmaDevice& device, const PortInfo& port,
                             const SelectionPolicy& policy);

struct RankRdmaChoice {
  int gpu = -1;     // topology GPU index, -1 = rank without a GPU
  std::string nic;  // "mlx5_0"
  int port = 1;
  std::string link_layer;
  double rate_gbps = 0;
  int gid_index = 0;
  std::string gid;  // the chosen GID's value
  RegistrationMethod registration = RegistrationMethod::host_staging;
  std::vector<std::string> notes;          // why: NIC choice, GID rule, registration method
  std::vector<std::string> healthy_ports;  // "mlx5_0:1" for every healthy port of the rank's NICs
  std::map<std::string, std::string> env;  // UCX_NET_DEVICES, UCX_TLS, NCCL_IB_HCA, ...
};

struct RankSelectionInput {
  int rank = 0;
  int gpu = -1;                   // GPU index in topo (bus order), -1 = none
  std::vector<std::string> nics;  // from the rank map / config; empty = closest compute NICs
  std::string node;               // for messages
};

// Errors (exit code 2): a named NIC that does not exist on the node, a rank whose NICs have no
// healthy port (naming NIC, port and state), GPUDirect required but impossible.
Result<RankRdmaChoice> select_for_rank(const RankSelectionInput& input,
                                       const std::vector<RdmaDevice>& devices,
                                       const CudaProbe& cuda, bool peermem,
                                       const topology::NodeTopology& topo,
                                       const SelectionPolicy& policy = {});

}  // namespace topolaunch::rdma
