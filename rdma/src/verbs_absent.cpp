// The verbs transport of a topolaunch built where meson found no libibverbs (the configure
// summary says so).
#include "topolaunch/rdma/endpoint.hpp"

namespace topolaunch::rdma {

Result<std::unique_ptr<Transport>> open_verbs_transport(int, const VerbsTransportOptions&) {
  return make_error(
      "rdma: this topolaunch was built without ibverbs (no libibverbs headers where it was "
      "built): use the UCX transport (--transport ucx) or set rdma.preflight = \"off\"",
      2);
}

}  // namespace topolaunch::rdma
