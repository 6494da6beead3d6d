// libibverbs, dlopened on first use (private header): the entry points the verbs transport
// calls, as infiniband/verbs.h declares them. ibv_post_send and ibv_poll_cq are inline calls
// through the device context's ops and need no symbol.
#pragma once

#include <infiniband/verbs.h>
#include <cstdint>

#include "topolaunch/common/result.hpp"

namespace topolaunch::rdma::detail {

struct VerbsApi {
  decltype(&::ibv_get_device_list) get_device_list;  // the exported one, not the header's macro
  decltype(&::ibv_free_device_list) free_device_list;
  decltype(&::ibv_get_device_name) get_device_name;
  decltype(&::ibv_open_device) open_device;
  decltype(&::ibv_close_device) close_device;
  decltype(&::ibv_query_port) query_port;  // the 1.1 ABI; call verbs_query_port() instead
  decltype(&::ibv_query_gid) query_gid;
  decltype(&::ibv_port_state_str) port_state_str;
  decltype(&::ibv_alloc_pd) alloc_pd;
  decltype(&::ibv_dealloc_pd) dealloc_pd;
  decltype(&::ibv_create_cq) create_cq;
  decltype(&::ibv_destroy_cq) destroy_cq;
  decltype(&::ibv_create_qp) create_qp;
  decltype(&::ibv_modify_qp) modify_qp;
  decltype(&::ibv_destroy_qp) destroy_qp;
  // The exported ibv_reg_mr: what the header's macro calls for constant access flags without
  // IBV_ACCESS_OPTIONAL_RANGE, the only ones we pass.
  decltype(&::ibv_reg_mr) reg_mr;
  decltype(&::ibv_reg_dmabuf_mr) reg_dmabuf_mr;  // nullptr before rdma-core 34 (2021)
  decltype(&::ibv_dereg_mr) dereg_mr;
  decltype(&::ibv_wc_status_str) wc_status_str;
};

// Opens libibverbs.so.1 ($TOPOLAUNCH_IBVERBS_LIBRARY overrides the name) and finds every entry
// point; an error names the library and says why. Loads anew on each call (tests); everything
// else uses verbs_api().
Result<VerbsApi> load_verbs_api();

// The first load_verbs_api()'s result, kept for the life of the process (thread-safe).
const Result<VerbsApi>& verbs_api();

// What the header's ibv_query_port macro does: the provider's extended query when it has one,
// else the exported 1.1 call, which fills the older, shorter attribute struct.
int verbs_query_port(const VerbsApi& verbs, ibv_context* context, std::uint8_t port,
                     ibv_port_attr* attr);

}  // namespace topolaunch::rdma::detail
