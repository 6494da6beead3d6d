// Data-parallel gradient sums over the RDMA module's UCX host collectives (ring all-reduce,
// reduce-scatter, all-gather), with
// the endpoints wired up through the launcher's KV store (TOPOLAUNCH_STORE_ADDR, PMIx or PMI2).
#include <vector>

#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/kernels/host_communicators.hpp"
#include "topolaunch/rdma/collectives.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::kernels {

namespace {

// A collective that fails once the ranks are wired up means a peer died or stopped answering:
// the worker exits with the contract's status for that, not the transport's own number.
Status as_peer_failure(Status s) {
  if (s) return s;
  return make_error(s.error().message, jobspec::exit_status::kPeerFailed);
}

class UcxHostCommunicator final : public Communicator {
 public:
  explicit UcxHostCommunicator(rdma::HostCommunicator comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  Status all_reduce_sum(std::span<float> d) override {
    return as_peer_failure(comm_.allreduce_sum(d.data(), d.size()));
  }
  // The host collectives sum floats; the per-step statistics (mean loss, stop flag) are the only
  // doubles and fp32 is enough for them.
  Status all_reduce_sum(std::span<double> d) override {
    std::vector<float> f(d.begin(), d.end());
    if (auto s = comm_.allreduce_sum(f.data(), f.size()); !s) return as_peer_failure(s);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(f[i]);
    return ok_status();
  }
  Status reduce_scatter_sum(std::span<float> d) override {
    return as_peer_failure(comm_.reduce_scatter_sum(d.data(), d.size()));
  }
  // fp32 as the all-reduce of doubles (only the fp64 gradient checks run doubles, on one rank).
  Status reduce_scatter_sum(std::span<double> d) override {
    std::vector<float> f(d.begin(), d.end());
    if (auto s = comm_.reduce_scatter_sum(f.data(), f.size()); !s) return as_peer_failure(s);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(f[i]);
    return ok_status();
  }
  Status all_gather(std::span<float> d) override {
    return as_peer_failure(comm_.allgather(d.data(), d.size(), sizeof(float)));
  }
  Status all_gather(std::span<double> d) override {
    return as_peer_failure(comm_.allgather(d.data(), d.size(), sizeof(double)));
  }
  Status barrier() override { return as_peer_failure(comm_.barrier()); }

 private:
  rdma::HostCommunicator comm_;
};

}  // namespace

bool have_ucx_communicator() { return true; }

Result<std::unique_ptr<Communicator>> connect_ucx_from_env() {
  auto store = wireup::connect_from_env(topolaunch::current_environment());
  if (!store) return store.error();
  rdma::CommunicatorOptions options;
  options.name = "kernels-dp";
  auto comm = rdma::HostCommunicator::create(**store, options);
  if (!comm) return comm.error();
  return std::unique_ptr<Communicator>(new UcxHostCommunicator(std::move(*comm)));
}

}  // namespace topolaunch::kernels
