// RC queue-pair wiring as pure data: what each side publishes (QpInfo, carried in a versioned
// blob) and the ibv_modify_qp attributes + mask of each transition (rdma.md §2.3, the same
// fields NCCL sets). Pure so the masks are unit-tested without hardware.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"

namespace topolaunch::rdma {

struct QpInfo {
  std::uint32_t qp_number = 0;
  std::uint32_t psn = 0;  // 24 bits
  std::uint16_t lid = 0;  // InfiniBand; 0 on RoCE
  std::uint8_t port = 1;
  std::uint8_t gid_index = 0;
  std::array<std::uint8_t, 16> gid{};
  std::uint8_t mtu = IBV_MTU_1024;  // enum ibv_mtu of the active port
  bool roce = false;                // Ethernet link layer: always route with a GRH

  bool operator==(const QpInfo&) const = default;
};

std::string serialize(const QpInfo& info);
// `peer` and `key` name the source in errors (the payload comes out of decode_blob already).
Result<QpInfo> parse_qp_info(std::string_view payload, int peer, std::string_view key);

struct QpTimeouts {
  // Local ACK timeout 4.096 us * 2^timeout: 14 = 67 ms, so a dead path fails well under a
  // second with 7 retries (NCCL's default 20 = 4.3 s per try, rdma.md §0.7).
  std::uint8_t timeout = 14;
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry = 7;  // 7 = retry forever on receiver-not-ready
  std::uint8_t min_rnr_timer = 12;
  std::uint8_t max_rd_atomic = 1;
  std::uint8_t hop_limit = 255;
  std::uint8_t traffic_class = 0;
  std::uint8_t service_level = 0;
};

struct QpTransition {
  ibv_qp_attr attr{};
  int mask = 0;
};

QpTransition qp_reset_to_init(std::uint8_t port, unsigned access_flags);
QpTransition qp_init_to_rtr(const QpInfo& local, const QpInfo& remote, const QpTimeouts& t = {});
QpTransition qp_rtr_to_rts(const QpInfo& local, const QpTimeouts& t = {});

}  // namespace topolaunch::rdma
