// Built without UCX (-Drdma=disabled): the TCP ring is the only multi-process communicator.
#include "topolaunch/kernels/host_communicators.hpp"

namespace topolaunch::kernels {

bool have_ucx_communicator() { return false; }

Result<std::unique_ptr<Communicator>> connect_ucx_from_env() {
  return make_error(
      "TOPOLAUNCH_KERNELS_COMM=ucx: this build has no UCX (reconfigure with -Drdma=enabled)");
}

}  // namespace topolaunch::kernels
