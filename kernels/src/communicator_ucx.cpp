// Data-parallel gradient sums over the RDMA module's UCX host collectives (ring all-reduce), with
// the endpoints wired up through the launcher's KV store (TOPOLAUNCH_STORE_ADDR, PMIx or PMI2).
#include <vector>

#include "topolaunch/kernels/communicator.hpp"
#include "topolaunch/rdma/collectives.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::kernels {

namespace {

class UcxHostCommunicator final : public Communicator {
 public:
  explicit UcxHostCommunicator(rdma::HostCommunicator comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  Status all_reduce_sum(std::span<float> d) override {
    return comm_.allreduce_sum(d.data(), d.size());
  }
  // The host collectives sum floats; the per-step statistics (mean loss, stop flag) are the only
  // doubles and fp32 is enough for them.
  Status all_reduce_sum(std::span<double> d) override {
    std::vector<float> f(d.begin(), d.end());
    if (auto s = comm_.allreduce_sum(f.data(), f.size()); !s) return s;
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(f[i]);
    return ok_status();
  }
  Status barrier() override { return comm_.barrier(); }

 private:
  rdma::HostCommunicator comm_;
};

}  // namespace

bool have_ucx_communicator() { return true; }

Result<std::unique_ptr<Communicator>> connect_ucx_from_env() {
  auto store = wireup::connect_from_env(wireup::current_environment());
  if (!store) return store.error();
  rdma::CommunicatorOptions options;
  options.name = "kernels-dp";
  auto comm = rdma::HostCommunicator::create(**store, options);
  if (!comm) return comm.error();
  return std::unique_ptr<Communicator>(new UcxHostCommunicator(std::move(*comm)));
}

}  // namespace topolaunch::kernels
