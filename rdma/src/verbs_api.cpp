#include "verbs_api.hpp"

#include <cstring>

#include "topolaunch/common/shared_library.hpp"

namespace topolaunch::rdma::detail {

Result<VerbsApi> load_verbs_api() {
  auto lib = SharedLibrary::open("TOPOLAUNCH_IBVERBS_LIBRARY", "libibverbs.so.1");
  if (!lib) return lib.error();
  VerbsApi api{};
  for (const Status& st : {
           lib->load(api.get_device_list, "ibv_get_device_list"),
           lib->load(api.free_device_list, "ibv_free_device_list"),
           lib->load(api.get_device_name, "ibv_get_device_name"),
           lib->load(api.open_device, "ibv_open_device"),
           lib->load(api.close_device, "ibv_close_device"),
           lib->load(api.query_port, "ibv_query_port"),
           lib->load(api.query_gid, "ibv_query_gid"),
           lib->load(api.port_state_str, "ibv_port_state_str"),
           lib->load(api.alloc_pd, "ibv_alloc_pd"),
           lib->load(api.dealloc_pd, "ibv_dealloc_pd"),
           lib->load(api.create_cq, "ibv_create_cq"),
           lib->load(api.destroy_cq, "ibv_destroy_cq"),
           lib->load(api.create_qp, "ibv_create_qp"),
           lib->load(api.modify_qp, "ibv_modify_qp"),
           lib->load(api.destroy_qp, "ibv_destroy_qp"),
           lib->load(api.reg_mr, "ibv_reg_mr"),
           lib->load(api.dereg_mr, "ibv_dereg_mr"),
           lib->load(api.wc_status_str, "ibv_wc_status_str"),
       })
    if (!st) return st.error();
  // Optional: without it GPU memory is registered through nvidia_peermem only.
  api.reg_dmabuf_mr = reinterpret_cast<decltype(api.reg_dmabuf_mr)>(lib->find("ibv_reg_dmabuf_mr"));
  return api;
}

const Result<VerbsApi>& verbs_api() {
  static const Result<VerbsApi> loaded = load_verbs_api();
  return loaded;
}

int verbs_query_port(const VerbsApi& verbs, ibv_context* context, std::uint8_t port,
                     ibv_port_attr* attr) {
  if (verbs_context* extended = verbs_get_ctx_op(context, query_port))
    return extended->query_port(context, port, attr, sizeof *attr);
  std::memset(attr, 0, sizeof *attr);
  return verbs.query_port(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

}  // namespace topolaunch::rdma::detail
