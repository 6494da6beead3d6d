// The UCX transport of a topolaunch built where meson found no UCX headers (the configure summary
// says so): the preflight can still run over verbs, or be turned off.
#include "topolaunch/rdma/endpoint.hpp"

namespace topolaunch::rdma {

Result<std::unique_ptr<Transport>> open_ucx_transport(int, const UcxTransportOptions&) {
  return make_error(
      "rdma: this topolaunch was built without UCX (no UCX headers where it was built): use "
      "the verbs transport (--transport verbs) or set rdma.preflight = \"off\"",
      2);
}

}  // namespace topolaunch::rdma
