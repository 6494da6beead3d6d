#include <cstring>

#include "catch.hpp"
#include "topolaunch/rdma/verbs_qp.hpp"

using namespace topolaunch::rdma;

namespace {
QpInfo roce_side(std::uint32_t qpn, std::uint8_t last_gid_byte, ibv_mtu mtu) {
  QpInfo q;
  q.qp_number = qpn;
  q.psn = 0x123456 ^ qpn;
  q.port = 1;
  q.gid_index = 3;
  q.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last_gid_byte};
  q.mtu = mtu;
  q.roce = true;
  return q;
}
}  // namespace

TEST_CASE("QP info survives serialisation; out-of-range fields are errors naming the peer") {
  QpInfo q = roce_side(0x11, 5, IBV_MTU_4096);
  auto back = parse_qp_info(serialize(q), 2, "pf/qp/2/1");
  REQUIRE(back.ok());
  CHECK(*back == q);
  std::string bad = serialize(q);
  bad[28] = 9;  // no such MTU
  auto r = parse_qp_info(bad, 2, "pf/qp/2/1");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("rank 2") != std::string::npos);
  CHECK_FALSE(parse_qp_info("short", 2, "k").ok());
}

TEST_CASE("RESET->INIT sets state, pkey index, port and access flags, nothing else") {
  auto t = qp_reset_to_init(1, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  CHECK(t.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  CHECK(t.attr.qp_state == IBV_QPS_INIT);
  CHECK(t.attr.port_num == 1);
  CHECK(t.attr.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
}

TEST_CASE("INIT->RTR on RoCE: the peer's QPN and PSN, the smaller MTU, a GRH to the peer's GID") {
  QpInfo local = roce_side(0x11, 5, IBV_MTU_4096);
  QpInfo remote = roce_side(0x22, 6, IBV_MTU_1024);
  auto t = qp_init_to_rtr(local, remote);
  CHECK(t.mask == (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  CHECK(t.attr.qp_state == IBV_QPS_RTR);
  CHECK(t.attr.path_mtu == IBV_MTU_1024);
  CHECK(t.attr.dest_qp_num == 0x22);
  CHECK(t.attr.rq_psn == remote.psn);
  CHECK(t.attr.min_rnr_timer == 12);
  CHECK(t.attr.ah_attr.is_global == 1);
  CHECK(t.attr.ah_attr.grh.sgid_index == 3);
  CHECK(t.attr.ah_attr.grh.hop_limit == 255);
  CHECK(std::memcmp(t.attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16) == 0);
}

TEST_CASE("INIT->RTR on InfiniBand in one subnet routes by LID without a GRH") {
  QpInfo local, remote;
  local.lid = 0x1f;
  remote.lid = 0x20;
  remote.qp_number = 7;
  auto t = qp_init_to_rtr(local, remote);
  CHECK(t.attr.ah_attr.is_global == 0);
  CHECK(t.attr.ah_attr.dlid == 0x20);
  CHECK(t.attr.dest_qp_num == 7);
}

TEST_CASE("RTR->RTS: our PSN, a 67 ms ACK timeout with 7 retries so a dead path fails fast") {
  QpInfo local = roce_side(0x11, 5, IBV_MTU_4096);
  auto t = qp_rtr_to_rts(local);
  CHECK(t.mask == (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
  CHECK(t.attr.qp_state == IBV_QPS_RTS);
  CHECK(t.attr.sq_psn == local.psn);
  CHECK(t.attr.timeout == 14);
  CHECK(t.attr.retry_cnt == 7);
  CHECK(t.attr.rnr_retry == 7);
}
