#include "topolaunch/rdma/verbs_qp.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cstring>

namespace topolaunch::rdma {

namespace {
constexpr std::size_t kQpInfoBytes = 4 + 4 + 2 + 1 + 1 + 16 + 1 + 1;
}

std::string serialize(const QpInfo& info) {
  std::string out(kQpInfoBytes, '\0');
  char* p = out.data();
  std::memcpy(p, &info.qp_number, 4);
  std::memcpy(p + 4, &info.psn, 4);
  std::memcpy(p + 8, &info.lid, 2);
  p[10] = static_cast<char>(info.port);
  p[11] = static_cast<char>(info.gid_index);
  std::memcpy(p + 12, info.gid.data(), 16);
  p[28] = static_cast<char>(info.mtu);
  p[29] = info.roce ? 1 : 0;
  return out;
}

Result<QpInfo> parse_qp_info(std::string_view payload, int peer, std::string_view key) {
  if (payload.size() != kQpInfoBytes)
    return make_error(fmt::format("corrupted QP info from rank {} (store key \"{}\"): {} bytes, "
                                  "expected {}",
                                  peer, key, payload.size(), kQpInfoBytes),
                      2);
  QpInfo info;
  const char* p = payload.data();
  std::memcpy(&info.qp_number, p, 4);
  std::memcpy(&info.psn, p + 4, 4);
  std::memcpy(&info.lid, p + 8, 2);
  info.port = static_cast<std::uint8_t>(p[10]);
  info.gid_index = static_cast<std::uint8_t>(p[11]);
  std::memcpy(info.gid.data(), p + 12, 16);
  info.mtu = static_cast<std::uint8_t>(p[28]);
  info.roce = p[29] != 0;
  if (info.mtu < IBV_MTU_256 || info.mtu > IBV_MTU_4096 || info.psn > 0xffffff ||
      info.qp_number > 0xffffff || info.port == 0)
    return make_error(
        fmt::format("corrupted QP info from rank {} (store key \"{}\"): qpn {} psn {} "
                    "port {} mtu {} out of range",
                    peer, key, info.qp_number, info.psn, info.port, info.mtu),
        2);
  return info;
}

QpTransition qp_reset_to_init(std::uint8_t port, unsigned access_flags) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port;
  t.attr.qp_access_flags = access_flags;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

QpTransition qp_init_to_rtr(const QpInfo& local, const QpInfo& remote, const QpTimeouts& to) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = static_cast<ibv_mtu>(std::min(local.mtu, remote.mtu));
  t.attr.dest_qp_num = remote.qp_number;
  t.attr.rq_psn = remote.psn;
  t.attr.max_dest_rd_atomic = to.max_rd_atomic;
  t.attr.min_rnr_timer = to.min_rnr_timer;
  t.attr.ah_attr.port_num = local.port;
  t.attr.ah_attr.sl = to.service_level;
  t.attr.ah_attr.dlid = remote.lid;
  // RoCE always routes with a GRH; InfiniBand needs one only across subnets, i.e. when the
  // peer has no LID in ours (lid 0).
  if (local.roce || remote.lid == 0) {
    t.attr.ah_attr.is_global = 1;
    std::memcpy(t.attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
    t.attr.ah_attr.grh.sgid_index = local.gid_index;
    t.attr.ah_attr.grh.hop_limit = to.hop_limit;
    t.attr.ah_attr.grh.traffic_class = to.traffic_class;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition qp_rtr_to_rts(const QpInfo& local, const QpTimeouts& to) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.timeout = to.timeout;
  t.attr.retry_cnt = to.retry_count;
  t.attr.rnr_retry = to.rnr_retry;
  t.attr.sq_psn = local.psn;
  t.attr.max_rd_atomic = to.max_rd_atomic;
  t.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

}  // namespace topolaunch::rdma
