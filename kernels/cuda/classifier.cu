// Softmax + cross-entropy of classifier.cuh; the CUDA twin of kernels/cpu/classifier.hpp. Each row
// of logits is read once: staged through shared memory by a persistent grid
// (crossentropy_staged_kernel), or held in registers by a block per row.
#include "classifier.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

constexpr int kClassifierThreads = 1024;

// Block-wide online softmax statistics of one row: max and sum of exp(v - max).
__device__ void row_softmax_stats(const bf16* row, std::int64_t V, float& max_out, float& sum_out) {
  __shared__ float smax[kClassifierThreads / kWarp], ssum[kClassifierThreads / kWarp];
  float m = -INFINITY, s = 0;
  for (std::int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = __bfloat162float(row[i]);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  // combine (m, s) pairs across the warp, then across warps
  const float wm = warp_max(m);
  s = (m == -INFINITY) ? 0.0f : s * __expf(m - wm);
  s = warp_sum(s);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    smax[warp] = wm;
    ssum[warp] = s;
  }
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  float bm = -INFINITY;
  for (int k = 0; k < warps; ++k) bm = fmaxf(bm, smax[k]);
  float bs = 0;
  for (int k = 0; k < warps; ++k)
    bs += (smax[k] == -INFINITY) ? 0.0f : ssum[k] * __expf(smax[k] - bm);
  max_out = bm;
  sum_out = bs;
  __syncthreads();  // smax/ssum may be reused by the caller's next row
}

// Cross-entropy over one row per block, any Vp and alignment: the statistics in one pass over the
// row, the gradient in a second.
template <bool kForward, bool kBackward>
__global__ void crossentropy_kernel(float* losses, bf16* dlogits, const bf16* logits,
                                    const std::int32_t* targets, const float* scale, std::int64_t V,
                                    std::int64_t Vp) {
  const std::int64_t n = blockIdx.x;
  const bf16* row = logits + n * Vp;
  float m, s;
  row_softmax_stats(row, V, m, s);
  const std::int32_t target = targets[n];
  if (kForward && threadIdx.x == 0) losses[n] = m + logf(s) - __bfloat162float(row[target]);
  if constexpr (kBackward) {
    // every thread has read the row (the stats call ends with a barrier), so writing in place
    // is safe
    const float inv = 1.0f / s, sc = *scale;
    bf16* drow = dlogits + n * Vp;
    for (std::int64_t i = threadIdx.x; i < Vp; i += blockDim.x) {
      float g = 0;
      if (i < V)
        g = (__expf(__bfloat162float(row[i]) - m) * inv - (i == target ? 1.0f : 0.0f)) * sc;
      drow[i] = __float2bfloat16(g);
    }
  }
}

// Cross-entropy over one row per block of 1024 threads: the row is read once with 16-byte
// loads into registers (kPacks packs per thread), the (max, sum of exp) pairs are combined in
// one block reduction, and dlogits are written from the registers: one read and one write of
// the logits. The target's logit is read before the block's barrier, so in-place is safe.
constexpr int kClassifierVecThreads = 1024;
template <bool kForward, bool kBackward, int kPacks>
__global__ void __launch_bounds__(kClassifierVecThreads)
    crossentropy_vec_kernel(float* losses, bf16* dlogits, const bf16* logits,
                            const std::int32_t* targets, const float* scale, std::int64_t V,
                            std::int64_t Vp) {
  __shared__ float smax[kClassifierVecThreads / kWarp], ssum[kClassifierVecThreads / kWarp];
  const std::int64_t n = blockIdx.x;
  const bf16* row = logits + n * Vp;
  const int packs = static_cast<int>(Vp / 8);
  const std::int32_t target = targets[n];
  float target_logit = 0;
  if (kForward && threadIdx.x == 0) target_logit = __bfloat162float(row[target]);
  Pack8 v[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * kClassifierVecThreads;
    if (p < packs) v[k] = load8_stream(row + static_cast<std::int64_t>(p) * 8);
  }
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * kClassifierVecThreads;
    if (p < packs)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (p * 8 + j < V) m = fmaxf(m, __bfloat162float(v[k].v[j]));
  }
  float s = 0;
  if (m != -INFINITY) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * kClassifierVecThreads;
      if (p < packs)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (p * 8 + j < V) s += __expf(__bfloat162float(v[k].v[j]) - m);
    }
  }
  // (m, s) pairs: across the warp, then every warp combines all warps' pairs (one barrier)
  const float wm = warp_max(m);
  s = warp_sum(m == -INFINITY ? 0.0f : s * __expf(m - wm));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    smax[warp] = wm;
    ssum[warp] = s;
  }
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  const float pm = lane < warps ? smax[lane] : -INFINITY;
  const float bm = warp_max(pm);
  const float bs = warp_sum(lane < warps && pm != -INFINITY ? ssum[lane] * __expf(pm - bm) : 0.0f);
  if (kForward && threadIdx.x == 0) losses[n] = bm + logf(bs) - target_logit;
  if constexpr (kBackward) {
    const float inv = 1.0f / bs, sc = *scale;
    bf16* drow = dlogits + n * Vp;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * kClassifierVecThreads;
      if (p < packs) {
        Pack8 out;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int i = p * 8 + j;
          float g = 0;
          if (i < V)
            g = (__expf(__bfloat162float(v[k].v[j]) - bm) * inv - (i == target ? 1.0f : 0.0f)) * sc;
          out.v[j] = __float2bfloat16(g);
        }
        store8(drow + static_cast<std::int64_t>(p) * 8, out);
      }
    }
  }
}

// Cross-entropy with the rows staged through shared memory: a persistent grid of one block per
// multiprocessor walks its rows (blockIdx.x, + gridDim.x, ...); cp.async copies the next two rows
// into two shared-memory stages while the block computes the current one from registers, so
// that a multiprocessor always has up to two rows (~200 KB at Vp = 50304) of loads in flight
// while it does the exponentials and writes dlogits. (The row-per-block kernel above has its
// loads, its reduction and its writes one after the other, with nothing in flight between.)
// Each thread copies and reads only its own packs (p = threadIdx.x + k * kThreads), so a
// thread's cp.async.wait_group is all it needs before reading; a stage is refilled only after
// the block's reduction barrier, by which every thread has read it. Padding columns (>= V) are
// set to -inf in registers: they drop out of the max and the sum, and exp2(-inf) = 0 gives them
// a zero gradient. kHalfExp keeps exp(x - thread max) as fp16 in place of the logits (one
// exponential per element instead of two; the gradient then carries fp16 rounding as well).
constexpr std::uint32_t kNegInfBf16x2 = 0xFF80FF80u;

__device__ __forceinline__ float bf16_lo(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t w) {
  return __uint_as_float(w & 0xFFFF0000u);
}

template <bool kForward, bool kBackward, int kThreads, int kPacks, bool kHalfExp>
__global__ void __launch_bounds__(kThreads, 1)
    crossentropy_staged_kernel(float* losses, bf16* dlogits, const bf16* logits,
                               const std::int32_t* targets, const float* scale, std::int64_t N,
                               int V, int packs) {
  constexpr int kWarps = kThreads / kWarp;
  static_assert(kWarps <= kWarp, "the block reduction reads one (max, sum) pair per lane");
  extern __shared__ int4 stage[];  // 2 stages of `packs` 16-byte packs
  __shared__ float smax[2][kWarps], ssum[2][kWarps];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const std::int64_t Vp = static_cast<std::int64_t>(packs) * 8;
  const std::int64_t stride = gridDim.x;
  const float sc = kBackward ? *scale : 0.0f;
  // copies row r (if any) into stage `buf`; always commits a group, so that "all but the newest
  // group" is always the row about to be computed
  auto issue = [&](std::int64_t r, int buf) {
    if (r < N) {
      const int4* src = reinterpret_cast<const int4*>(logits + r * Vp);
      int4* dst = stage + buf * packs;
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int p = tid + k * kThreads;
        if (p < packs) cp_async16(dst + p, src + p);
      }
    }
    cp_async_commit();
  };
  std::int64_t r = blockIdx.x;
  issue(r, 0);
  issue(r + stride, 1);
  std::int32_t target = r < N ? targets[r] : 0;
  for (int it = 0; r < N; ++it, r += stride) {
    const int buf = it & 1;
    const std::int64_t next = r + stride;
    const std::int32_t next_target = next < N ? targets[next] : 0;
    cp_async_wait<1>();  // this row's stage (the next row's group may still be in flight)
    std::uint32_t w[kPacks][4];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = tid + k * kThreads;
      if (p < packs) {
        const int4 q = stage[buf * packs + p];
        w[k][0] = static_cast<std::uint32_t>(q.x), w[k][1] = static_cast<std::uint32_t>(q.y);
        w[k][2] = static_cast<std::uint32_t>(q.z), w[k][3] = static_cast<std::uint32_t>(q.w);
        if ((p + 1) * 8 > V) {  // the pack holding column V: padding to -inf
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (p * 8 + 2 * c >= V) w[k][c] = (w[k][c] & 0xFFFF0000u) | 0xFF80u;
            if (p * 8 + 2 * c + 1 >= V) w[k][c] = (w[k][c] & 0xFFFFu) | 0xFF800000u;
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) w[k][c] = kNegInfBf16x2;
      }
    }
    // the thread's max (packed bf16 max: exact) and the target's logit (from its owner)
    __nv_bfloat162 m2;
    {
      const std::uint32_t ninf = kNegInfBf16x2;
      memcpy(&m2, &ninf, sizeof m2);
    }
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        __nv_bfloat162 b;
        memcpy(&b, &w[k][c], sizeof b);
        m2 = __hmax2(m2, b);
      }
    const float mt = fmaxf(__low2float(m2), __high2float(m2));
    const bool valid_target = target >= 0 && target < V;
    const int target_pack = valid_target ? target / 8 : -1, target_lane = target % 8;
    float target_logit = 0;
    bool owner = false;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (tid + k * kThreads == target_pack) {
        owner = true;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (2 * c == target_lane) target_logit = bf16_lo(w[k][c]);
          if (2 * c + 1 == target_lane) target_logit = bf16_hi(w[k][c]);
        }
      }
    // sum of exp(x - mt) (mt = -inf: every value is -inf, exp2(-inf) = 0 with mtl = 0)
    const float mtl = mt == -INFINITY ? 0.0f : mt * kLog2e;
    float s = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float e0 = exp2_approx(fmaf(bf16_lo(w[k][c]), kLog2e, -mtl));
        const float e1 = exp2_approx(fmaf(bf16_hi(w[k][c]), kLog2e, -mtl));
        s += e0 + e1;
        if constexpr (kHalfExp) {
          const __half2 h = __floats2half2_rn(e0, e1);
          memcpy(&w[k][c], &h, sizeof h);
        }
      }
    // (max, sum) pairs across the warp, then every warp combines all warps' pairs
    const float wm = warp_max(mt);
    const float ws = warp_sum(mt == -INFINITY ? 0.0f : s * exp2_approx((mt - wm) * kLog2e));
    if (lane == 0) {
      smax[buf][warp] = wm;
      ssum[buf][warp] = ws;
    }
    __syncthreads();
    // every thread has read its packs of this stage: refill it with the row after next
    issue(r + 2 * stride, buf);
    const float pm = lane < kWarps ? smax[buf][lane] : -INFINITY;
    const float bm = warp_max(pm);
    const float bs = warp_sum(lane < kWarps && pm != -INFINITY
                                  ? ssum[buf][lane] * exp2_approx((pm - bm) * kLog2e)
                                  : 0.0f);
    if constexpr (kForward) {
      if (owner) losses[r] = bm + logf(bs) - target_logit;
      if (!valid_target && tid == 0) losses[r] = NAN;  // a target outside [0, V)
    }
    if constexpr (kBackward) {
      int4* dst = reinterpret_cast<int4*>(dlogits + r * Vp);
      const float k_exp = sc / bs, bml = bm * kLog2e;
      const float k_half = mt == -INFINITY ? 0.0f : exp2_approx((mt - bm) * kLog2e) * (sc / bs);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int p = tid + k * kThreads;
        if (p < packs) {
          float g[8];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if constexpr (kHalfExp) {
              __half2 h;
              memcpy(&h, &w[k][c], sizeof h);
              const float2 e = __half22float2(h);
              g[2 * c] = e.x * k_half;
              g[2 * c + 1] = e.y * k_half;
            } else {
              g[2 * c] = exp2_approx(fmaf(bf16_lo(w[k][c]), kLog2e, -bml)) * k_exp;
              g[2 * c + 1] = exp2_approx(fmaf(bf16_hi(w[k][c]), kLog2e, -bml)) * k_exp;
            }
          }
          if (p == target_pack) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
              if (j == target_lane) g[j] -= sc;
          }
          int4 out;
          out.x = static_cast<int>(pack_bf16x2(g[0], g[1]));
          out.y = static_cast<int>(pack_bf16x2(g[2], g[3]));
          out.z = static_cast<int>(pack_bf16x2(g[4], g[5]));
          out.w = static_cast<int>(pack_bf16x2(g[6], g[7]));
          __stcs(dst + p, out);
        }
      }
    }
    target = next_target;
  }
  cp_async_wait_all();
}

// The row-per-block classifier: the vectorised kernel (one read of each row into registers) when
// Vp is whole 16-byte packs, the rows are aligned and a row fits in 7 packs per thread
// (Vp <= 57344); else the two-pass kernel.
template <bool kForward, bool kBackward>
void crossentropy_row_per_block(float* losses, bf16* dlogits, const bf16* logits,
                                const std::int32_t* targets, const float* scale, std::int64_t N,
                                std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  const std::int64_t packs = Vp / 8;
  const std::int64_t per_thread = (packs + kClassifierVecThreads - 1) / kClassifierVecThreads;
  const bool vec =
      Vp % 8 == 0 && aligned16(logits) && (!kBackward || aligned16(dlogits)) && per_thread <= 7;
  const unsigned grid = static_cast<unsigned>(N);
  if (vec && per_thread <= 1)
    crossentropy_vec_kernel<kForward, kBackward, 1><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else if (vec && per_thread <= 2)
    crossentropy_vec_kernel<kForward, kBackward, 2><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else if (vec && per_thread <= 4)
    crossentropy_vec_kernel<kForward, kBackward, 4><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else if (vec)
    crossentropy_vec_kernel<kForward, kBackward, 7><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else
    crossentropy_kernel<kForward, kBackward>
        <<<grid, kClassifierThreads, 0, stream>>>(losses, dlogits, logits, targets, scale, V, Vp);
}

// The staged kernel when the row fits (kPacks * kThreads packs, two stages of it in the opt-in
// shared memory of a block) and everything is 16-byte aligned; false (nothing launched) if not.
template <bool kForward, bool kBackward, int kThreads, int kPacks, bool kHalfExp>
bool crossentropy_staged(float* losses, bf16* dlogits, const bf16* logits,
                         const std::int32_t* targets, const float* scale, std::int64_t N,
                         std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  const std::int64_t packs = Vp / 8;
  if (Vp % 8 != 0 || !aligned16(logits) || (kBackward && !aligned16(dlogits)) ||
      packs > static_cast<std::int64_t>(kThreads) * kPacks)
    return false;
  const std::size_t stage_bytes = 2 * static_cast<std::size_t>(packs) * 16;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    return false;
  constexpr std::size_t kStaticBytes = 2 * 2 * (kThreads / kWarp) * sizeof(float);
  if (stage_bytes + kStaticBytes > static_cast<std::size_t>(optin)) return false;
  auto* kernel = crossentropy_staged_kernel<kForward, kBackward, kThreads, kPacks, kHalfExp>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(stage_bytes)) != cudaSuccess) {
    (void)cudaGetLastError();  // not fatal: the row-per-block kernel runs instead
    return false;
  }
  const unsigned grid =
      static_cast<unsigned>(std::min<std::int64_t>(N, multiprocessors()));  // one block per SM
  kernel<<<grid, kThreads, stage_bytes, stream>>>(losses, dlogits, logits, targets, scale, N,
                                                  static_cast<int>(V), static_cast<int>(packs));
  return true;
}

template <bool kForward, bool kBackward>
ClassifierKernel crossentropy_dispatch(ClassifierKernel kernel, float* losses, bf16* dlogits,
                                       const bf16* logits, const std::int32_t* targets,
                                       const float* scale, std::int64_t N, std::int64_t V,
                                       std::int64_t Vp, cudaStream_t stream) {
  if (N <= 0) return kernel;
  if (kernel == ClassifierKernel::automatic) kernel = ClassifierKernel::staged_1024;
  bool launched = false;
  switch (kernel) {
    case ClassifierKernel::staged_1024:
      launched = crossentropy_staged<kForward, kBackward, 1024, 7, false>(
          losses, dlogits, logits, targets, scale, N, V, Vp, stream);
      break;
    case ClassifierKernel::staged_512:
      launched = crossentropy_staged<kForward, kBackward, 512, 13, false>(
          losses, dlogits, logits, targets, scale, N, V, Vp, stream);
      break;
    case ClassifierKernel::staged_1024_half_exp:
      launched = crossentropy_staged<kForward, kBackward, 1024, 7, true>(
          losses, dlogits, logits, targets, scale, N, V, Vp, stream);
      break;
    default:
      break;
  }
  if (launched) return kernel;
  crossentropy_row_per_block<kForward, kBackward>(losses, dlogits, logits, targets, scale, N, V, Vp,
                                                  stream);
  return ClassifierKernel::row_per_block;
}
}  // namespace

const char* classifier_kernel_name(ClassifierKernel kernel) {
  switch (kernel) {
    case ClassifierKernel::automatic:
      return "automatic";
    case ClassifierKernel::row_per_block:
      return "row_per_block";
    case ClassifierKernel::staged_1024:
      return "staged_1024";
    case ClassifierKernel::staged_512:
      return "staged_512";
    case ClassifierKernel::staged_1024_half_exp:
      return "staged_1024_half_exp";
  }
  return "?";
}

ClassifierKernel crossentropy_with(ClassifierKernel kernel, float* losses, bf16* dlogits,
                                   const bf16* logits, const std::int32_t* targets,
                                   const float* scale, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, cudaStream_t stream) {
  if (losses != nullptr && dlogits != nullptr)
    return crossentropy_dispatch<true, true>(kernel, losses, dlogits, logits, targets, scale, N, V,
                                             Vp, stream);
  if (losses != nullptr)
    return crossentropy_dispatch<true, false>(kernel, losses, dlogits, logits, targets, scale, N, V,
                                              Vp, stream);
  if (dlogits != nullptr)
    return crossentropy_dispatch<false, true>(kernel, losses, dlogits, logits, targets, scale, N, V,
                                              Vp, stream);
  return kernel;
}

void crossentropy_forward(float* losses, const bf16* logits, const std::int32_t* targets,
                          std::int64_t N, std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  crossentropy_with(ClassifierKernel::automatic, losses, nullptr, logits, targets, nullptr, N, V,
                    Vp, stream);
}
void crossentropy_backward(bf16* dlogits, const bf16* logits, const std::int32_t* targets,
                           const float* scale, std::int64_t N, std::int64_t V, std::int64_t Vp,
                           cudaStream_t stream) {
  crossentropy_with(ClassifierKernel::automatic, nullptr, dlogits, logits, targets, scale, N, V, Vp,
                    stream);
}
void crossentropy_forward_backward(float* losses, bf16* dlogits, const bf16* logits,
                                   const std::int32_t* targets, const float* scale, std::int64_t N,
                                   std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  crossentropy_with(ClassifierKernel::automatic, losses, dlogits, logits, targets, scale, N, V, Vp,
                    stream);
}

}  // namespace topolaunch::kernels::cuda
