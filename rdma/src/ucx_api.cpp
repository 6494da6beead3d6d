#include "ucx_api.hpp"

#include "topolaunch/common/shared_library.hpp"

namespace topolaunch::rdma::detail {

Result<UcxApi> load_ucx_api() {
  auto ucp = SharedLibrary::open("TOPOLAUNCH_UCP_LIBRARY", "libucp.so.0");
  if (!ucp) return ucp.error();
  // libucp needs libucs, so this finds the copy libucp loaded unless the variable says otherwise.
  auto ucs = SharedLibrary::open("TOPOLAUNCH_UCS_LIBRARY", "libucs.so.0");
  if (!ucs) return ucs.error();
  UcxApi api{};
  for (const Status& st : {
           ucp->load(api.config_read, "ucp_config_read"),
           ucp->load(api.config_modify, "ucp_config_modify"),
           ucp->load(api.config_release, "ucp_config_release"),
           ucp->load(api.init_version, "ucp_init_version"),
           ucp->load(api.cleanup, "ucp_cleanup"),
           ucp->load(api.context_query, "ucp_context_query"),
           ucp->load(api.worker_create, "ucp_worker_create"),
           ucp->load(api.worker_destroy, "ucp_worker_destroy"),
           ucp->load(api.worker_get_address, "ucp_worker_get_address"),
           ucp->load(api.worker_release_address, "ucp_worker_release_address"),
           ucp->load(api.worker_progress, "ucp_worker_progress"),
           ucp->load(api.ep_create, "ucp_ep_create"),
           ucp->load(api.ep_close_nbx, "ucp_ep_close_nbx"),
           ucp->load(api.ep_flush_nbx, "ucp_ep_flush_nbx"),
           ucp->load(api.ep_print_info, "ucp_ep_print_info"),
           ucp->load(api.ep_rkey_unpack, "ucp_ep_rkey_unpack"),
           ucp->load(api.mem_map, "ucp_mem_map"),
           ucp->load(api.mem_unmap, "ucp_mem_unmap"),
           ucp->load(api.mem_query, "ucp_mem_query"),
           ucp->load(api.rkey_pack, "ucp_rkey_pack"),
           ucp->load(api.rkey_buffer_release, "ucp_rkey_buffer_release"),
           ucp->load(api.rkey_destroy, "ucp_rkey_destroy"),
           ucp->load(api.put_nbx, "ucp_put_nbx"),
           ucp->load(api.tag_send_nbx, "ucp_tag_send_nbx"),
           ucp->load(api.tag_recv_nbx, "ucp_tag_recv_nbx"),
           ucp->load(api.request_check_status, "ucp_request_check_status"),
           ucp->load(api.request_cancel, "ucp_request_cancel"),
           ucp->load(api.request_free, "ucp_request_free"),
           ucs->load(api.status_string, "ucs_status_string"),
       })
    if (!st) return st.error();
  return api;
}

const Result<UcxApi>& ucx_api() {
  static const Result<UcxApi> loaded = load_ucx_api();
  return loaded;
}

}  // namespace topolaunch::rdma::detail
