// Gradient communication between data-parallel ranks of the CPU backend, behind a small interface
// so that the executor does not care how the sums are made: a single-rank no-op here; the worker's
// TCP ring and the RDMA module's UCX collectives in host_communicators.hpp (the worker floor).
//
// Segments: a buffer of n elements over W ranks is cut into W segments, segment s being
// [n*s/W, n*(s+1)/W) (equal when W divides n, as the planner's buckets make it). Rank r owns
// segment r: reduce_scatter_sum leaves the sum over ranks in it, all_gather sends it to every
// rank. all_reduce_sum is the two in turn, so a reduce-scatter's segment holds the same bits the
// all-reduce would have put there (the same additions in the same order): sharded data
// parallelism gets the losses of the unsharded run bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels {

// Segment s of `count` elements over `world` ranks: [segment_begin(s), segment_begin(s + 1)).
inline std::size_t segment_begin(std::size_t count, int world, int s) {
  return count * static_cast<std::size_t>(s) / static_cast<std::size_t>(world);
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over all ranks; every rank gets the identical result (same summation order).
  virtual Status all_reduce_sum(std::span<float> data) = 0;
  virtual Status all_reduce_sum(std::span<double> data) = 0;
  // In place: on return segment rank() holds the sum over ranks of that segment; the other
  // segments hold partial sums (unspecified).
  virtual Status reduce_scatter_sum(std::span<float> data) = 0;
  virtual Status reduce_scatter_sum(std::span<double> data) = 0;
  // In place: segment s of every rank's buffer becomes rank s's segment s.
  virtual Status all_gather(std::span<float> data) = 0;
  virtual Status all_gather(std::span<double> data) = 0;
  virtual Status barrier() = 0;
};

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status all_reduce_sum(std::span<float>) override { return ok_status(); }
  Status all_reduce_sum(std::span<double>) override { return ok_status(); }
  Status reduce_scatter_sum(std::span<float>) override { return ok_status(); }
  Status reduce_scatter_sum(std::span<double>) override { return ok_status(); }
  Status all_gather(std::span<float>) override { return ok_status(); }
  Status all_gather(std::span<double>) override { return ok_status(); }
  Status barrier() override { return ok_status(); }
};

}  // namespace topolaunch::kernels
