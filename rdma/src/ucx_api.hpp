// UCX, dlopened on first use (private header): the entry points rdma calls, as ucp.h declares
// them. Nothing here links libucp, so a process that never opens a UCX worker does not load it.
#pragma once

#include <ucp/api/ucp.h>

#include "topolaunch/common/result.hpp"

namespace topolaunch::rdma::detail {

struct UcxApi {
  // libucp.so.0
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_modify) config_modify;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_init_version) init_version;  // ucp_init is an inline wrapper of it in ucp.h
  decltype(&::ucp_cleanup) cleanup;
  decltype(&::ucp_context_query) context_query;
  decltype(&::ucp_worker_create) worker_create;
  decltype(&::ucp_worker_destroy) worker_destroy;
  decltype(&::ucp_worker_get_address) worker_get_address;
  decltype(&::ucp_worker_release_address) worker_release_address;
  decltype(&::ucp_worker_progress) worker_progress;
  decltype(&::ucp_ep_create) ep_create;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx;
  decltype(&::ucp_ep_flush_nbx) ep_flush_nbx;
  decltype(&::ucp_ep_print_info) ep_print_info;
  decltype(&::ucp_ep_rkey_unpack) ep_rkey_unpack;
  decltype(&::ucp_mem_map) mem_map;
  decltype(&::ucp_mem_unmap) mem_unmap;
  decltype(&::ucp_mem_query) mem_query;
  decltype(&::ucp_rkey_pack) rkey_pack;
  decltype(&::ucp_rkey_buffer_release) rkey_buffer_release;
  decltype(&::ucp_rkey_destroy) rkey_destroy;
  decltype(&::ucp_put_nbx) put_nbx;
  decltype(&::ucp_tag_send_nbx) tag_send_nbx;
  decltype(&::ucp_tag_recv_nbx) tag_recv_nbx;
  decltype(&::ucp_request_check_status) request_check_status;
  decltype(&::ucp_request_cancel) request_cancel;
  decltype(&::ucp_request_free) request_free;
  // libucs.so.0
  decltype(&::ucs_status_string) status_string;
};

// Opens libucp.so.0 and libucs.so.0 ($TOPOLAUNCH_UCP_LIBRARY, $TOPOLAUNCH_UCS_LIBRARY override
// the names) and finds every entry point; an error names the library and says why. Loads anew
// on each call (tests); everything else uses ucx_api().
Result<UcxApi> load_ucx_api();

// The first load_ucx_api()'s result, kept for the life of the process (thread-safe).
const Result<UcxApi>& ucx_api();

}  // namespace topolaunch::rdma::detail
