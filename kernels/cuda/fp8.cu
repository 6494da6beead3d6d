// The FP8 casts of fp8.cuh (delayed per-tensor scaling from an amax history).
#include "fp8.cuh"

#include <cuda_fp8.h>

#include <cfloat>

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int slot_of(const float* step, int offset) {
  const long long s = static_cast<long long>(*step) + offset;
  return static_cast<int>(((s % kFp8History) + kFp8History) % kFp8History);
}

// fp8 max / the max of the history's slots other than cur and next; 1 while they hold nothing.
__device__ __forceinline__ float delayed_scale(const Fp8Scaling* s, int cur, int next,
                                               float fp8_max) {
  float m = 0;
#pragma unroll
  for (int i = 0; i < kFp8History; ++i)
    if (i != cur && i != next) m = fmaxf(m, s->amax[i]);
  if (!(m > 0)) return 1.0f;
  const float scale = fp8_max / m;
  return scale < FLT_MAX ? scale : 1.0f;
}

// Folds a block's max |x| into slot (non-negative floats order like their bit patterns).
__device__ __forceinline__ void fold_amax(float* slot, float block_amax) {
  if (block_amax > 0 && block_amax <= FLT_MAX)
    atomicMax(reinterpret_cast<int*>(slot), __float_as_int(block_amax));
}

// Max over the block (any block size that is a multiple of 32, at most 1024); valid in thread 0.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  v = warp_max(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x * blockDim.y + kWarp - 1) / kWarp;
  v = threadIdx.x < warps ? part[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_max(v);
  return v;
}

template <__nv_fp8_interpretation_t Kind>
__device__ __forceinline__ std::uint16_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, Kind);
}
template <__nv_fp8_interpretation_t Kind>
__device__ __forceinline__ std::uint8_t to_fp8(float a) {
  return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, Kind);
}

// The head of every cast: the scale for this step, and (block 0) scale_inv and the next slot.
__device__ __forceinline__ float begin_cast(Fp8Scaling* s, const float* step, float fp8_max,
                                            int* cur_out, bool first_block) {
  const int cur = slot_of(step, 0), next = slot_of(step, 1);
  const float scale = delayed_scale(s, cur, next, fp8_max);
  if (first_block && threadIdx.x == 0 && threadIdx.y == 0) {
    s->scale_inv = 1.0f / scale;
    s->amax[next] = 0.0f;
  }
  *cur_out = cur;
  return scale;
}

// 16 elements per thread per iteration (two 16-byte loads, one 16-byte store), grid-stride.
template <__nv_fp8_interpretation_t Kind>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_vec_kernel(uint4* out, const Pack8* x, std::int64_t n16, Fp8Scaling* s,
                        const float* step, float fp8_max) {
  int cur = 0;
  const float scale = begin_cast(s, step, fp8_max, &cur, blockIdx.x == 0);
  float amax = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x; i < n16;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const Pack8 a = x[2 * i], b = x[2 * i + 1];
    float v[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = __bfloat162float(a.v[j]);
      v[8 + j] = __bfloat162float(b.v[j]);
    }
    std::uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[4 * q]), fabsf(v[4 * q + 1])),
                               fmaxf(fabsf(v[4 * q + 2]), fabsf(v[4 * q + 3]))));
      const std::uint32_t lo = to_fp8x2<Kind>(v[4 * q] * scale, v[4 * q + 1] * scale);
      const std::uint32_t hi = to_fp8x2<Kind>(v[4 * q + 2] * scale, v[4 * q + 3] * scale);
      w[q] = lo | (hi << 16);
    }
    out[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  amax = block_max(amax);
  if (threadIdx.x == 0) fold_amax(&s->amax[cur], amax);
}

template <__nv_fp8_interpretation_t Kind>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_kernel(std::uint8_t* out, const bf16* x, std::int64_t n, Fp8Scaling* s,
                    const float* step, float fp8_max) {
  int cur = 0;
  const float scale = begin_cast(s, step, fp8_max, &cur, blockIdx.x == 0);
  float amax = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const float v = __bfloat162float(x[i]);
    amax = fmaxf(amax, fabsf(v));
    out[i] = to_fp8<Kind>(v * scale);
  }
  amax = block_max(amax);
  if (threadIdx.x == 0) fold_amax(&s->amax[cur], amax);
}

// 64 x 64 tiles, 256 threads: a row of the tile is 16 threads of 4 bf16 (8-byte loads), so a
// pass covers 16 rows, and each thread has its 4 rows' loads in flight before it writes (out and
// x are distinct: __restrict__ lets the loads run ahead of the byte stores). out gets 4 bytes per
// thread and row; the tile goes through shared memory to out_t, 4 rows' bytes per 4-byte store.
// Vec: cols % 4 == 0, rows % 4 == 0 and the pointers aligned (else one element at a time).
// Both: out written too (fp8_cast_dual); else out_t alone (fp8_cast_transpose).
constexpr int kDualTile = 64;
constexpr int kDualRowsPerPass = kThreads / (kDualTile / 4);  // 16
constexpr int kDualPasses = kDualTile / kDualRowsPerPass;     // 4
template <__nv_fp8_interpretation_t Kind, bool Vec, bool Both>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_dual_kernel(std::uint8_t* __restrict__ out, std::uint8_t* __restrict__ out_t,
                         const bf16* __restrict__ x, std::int64_t rows, std::int64_t cols,
                         Fp8Scaling* s, const float* step, float fp8_max) {
  __shared__ float tile[kDualTile][kDualTile + 1];
  int cur = 0;
  const float scale = begin_cast(s, step, fp8_max, &cur, blockIdx.x == 0 && blockIdx.y == 0);
  const std::int64_t r0 = blockIdx.y * static_cast<std::int64_t>(kDualTile);
  const std::int64_t c0 = blockIdx.x * static_cast<std::int64_t>(kDualTile);
  const int lane4 = threadIdx.x % (kDualTile / 4), first_row = threadIdx.x / (kDualTile / 4);
  const std::int64_t c = c0 + 4 * lane4;
  float v[kDualPasses][4];
#pragma unroll
  for (int p = 0; p < kDualPasses; ++p) {
    const std::int64_t r = r0 + first_row + p * kDualRowsPerPass;
    if (Vec && r < rows && c < cols) {
      const uint2 raw = *reinterpret_cast<const uint2*>(x + r * cols + c);
      const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
      const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
      v[p][0] = __low2float(lo);
      v[p][1] = __high2float(lo);
      v[p][2] = __low2float(hi);
      v[p][3] = __high2float(hi);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[p][j] = !Vec && r < rows && c + j < cols ? __bfloat162float(x[r * cols + c + j]) : 0.0f;
    }
  }
  float amax = 0;
#pragma unroll
  for (int p = 0; p < kDualPasses; ++p) {
    const int tr = first_row + p * kDualRowsPerPass;
    const std::int64_t r = r0 + tr;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      tile[tr][4 * lane4 + j] = v[p][j];
      amax = fmaxf(amax, fabsf(v[p][j]));
    }
    if (!Both || r >= rows) continue;
    if (Vec) {
      if (c < cols) {
        const std::uint32_t lo = to_fp8x2<Kind>(v[p][0] * scale, v[p][1] * scale);
        const std::uint32_t hi = to_fp8x2<Kind>(v[p][2] * scale, v[p][3] * scale);
        *reinterpret_cast<std::uint32_t*>(out + r * cols + c) = lo | (hi << 16);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (c + j < cols) out[r * cols + c + j] = to_fp8<Kind>(v[p][j] * scale);
    }
  }
  __syncthreads();
  // out_t's row c0 + oc is x's column: 64 bytes (rows r0..r0+63) per tile, 16 threads of 4
#pragma unroll
  for (int p = 0; p < kDualPasses; ++p) {
    const int oc = first_row + p * kDualRowsPerPass;
    const std::int64_t col = c0 + oc, r = r0 + 4 * lane4;
    if (col >= cols) continue;
    if (Vec) {
      if (r < rows) {
        const std::uint32_t lo =
            to_fp8x2<Kind>(tile[4 * lane4][oc] * scale, tile[4 * lane4 + 1][oc] * scale);
        const std::uint32_t hi =
            to_fp8x2<Kind>(tile[4 * lane4 + 2][oc] * scale, tile[4 * lane4 + 3][oc] * scale);
        *reinterpret_cast<std::uint32_t*>(out_t + col * rows + r) = lo | (hi << 16);
      }
    } else {
      for (int i = 0; i < 4 && r + i < rows; ++i)
        out_t[col * rows + r + i] = to_fp8<Kind>(tile[4 * lane4 + i][oc] * scale);
    }
  }
  amax = block_max(amax);  // a one-dimensional block
  if (threadIdx.x == 0) fold_amax(&s->amax[cur], amax);
}

__global__ void __launch_bounds__(kThreads)
    fp8_amax_kernel(const bf16* x, std::int64_t n, Fp8Scaling* s, const float* step) {
  float amax = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads)
    amax = fmaxf(amax, fabsf(__bfloat162float(x[i])));
  amax = block_max(amax);
  if (threadIdx.x == 0) fold_amax(&s->amax[slot_of(step, -1)], amax);
}

// Enough blocks to fill the device a few times over, each folding its amax once.
unsigned cast_blocks(std::int64_t work) {
  const unsigned cap = static_cast<unsigned>(8 * multiprocessors());
  const unsigned want = blocks_for(work, kThreads);
  return want < cap ? want : cap;
}

template <__nv_fp8_interpretation_t Kind>
void cast_as(void* out, const bf16* x, std::int64_t n, Fp8Scaling* s, const float* step,
             float fp8_max, cudaStream_t stream) {
  if (n % 16 == 0 && aligned16_all({out, x})) {
    const std::int64_t n16 = n / 16;
    fp8_cast_vec_kernel<Kind><<<cast_blocks(n16), kThreads, 0, stream>>>(
        static_cast<uint4*>(out), reinterpret_cast<const Pack8*>(x), n16, s, step, fp8_max);
    return;
  }
  fp8_cast_kernel<Kind><<<cast_blocks(n), kThreads, 0, stream>>>(static_cast<std::uint8_t*>(out), x,
                                                                 n, s, step, fp8_max);
}

}  // namespace

const char* fp8_format_name(Fp8Format format) {
  return format == Fp8Format::e4m3 ? "E4M3" : "E5M2";
}
float fp8_format_max(Fp8Format format) { return format == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

void fp8_cast(void* out, const bf16* x, std::int64_t n, Fp8Format format, Fp8Scaling* scaling,
              const float* step, cudaStream_t stream) {
  if (n <= 0) return;
  const float m = fp8_format_max(format);
  if (format == Fp8Format::e4m3)
    cast_as<__NV_E4M3>(out, x, n, scaling, step, m, stream);
  else
    cast_as<__NV_E5M2>(out, x, n, scaling, step, m, stream);
}

namespace {

void cast_tiles(void* out, void* out_t, const bf16* x, std::int64_t rows, std::int64_t cols,
                Fp8Format format, Fp8Scaling* scaling, const float* step, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(blocks_for(cols, kDualTile), blocks_for(rows, kDualTile));
  const float m = fp8_format_max(format);
  auto* o = static_cast<std::uint8_t*>(out);
  auto* ot = static_cast<std::uint8_t*>(out_t);
  const bool vec = cols % 4 == 0 && rows % 4 == 0 && reinterpret_cast<std::uintptr_t>(x) % 8 == 0 &&
                   reinterpret_cast<std::uintptr_t>(out) % 4 == 0 &&
                   reinterpret_cast<std::uintptr_t>(out_t) % 4 == 0;
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(o, ot, x, rows, cols, scaling, step, m);
  };
  const bool both = out != nullptr;
  if (format == Fp8Format::e4m3) {
    if (vec)
      both ? launch(fp8_cast_dual_kernel<__NV_E4M3, true, true>)
           : launch(fp8_cast_dual_kernel<__NV_E4M3, true, false>);
    else
      both ? launch(fp8_cast_dual_kernel<__NV_E4M3, false, true>)
           : launch(fp8_cast_dual_kernel<__NV_E4M3, false, false>);
  } else {
    if (vec)
      both ? launch(fp8_cast_dual_kernel<__NV_E5M2, true, true>)
           : launch(fp8_cast_dual_kernel<__NV_E5M2, true, false>);
    else
      both ? launch(fp8_cast_dual_kernel<__NV_E5M2, false, true>)
           : launch(fp8_cast_dual_kernel<__NV_E5M2, false, false>);
  }
}

}  // namespace

void fp8_cast_transpose(void* out, const bf16* x, std::int64_t rows, std::int64_t cols,
                        Fp8Format format, Fp8Scaling* scaling, const float* step,
                        cudaStream_t stream) {
  cast_tiles(nullptr, out, x, rows, cols, format, scaling, step, stream);
}

void fp8_cast_dual(void* out, void* out_t, const bf16* x, std::int64_t rows, std::int64_t cols,
                   Fp8Format format, Fp8Scaling* scaling, const float* step, cudaStream_t stream) {
  cast_tiles(out, out_t, x, rows, cols, format, scaling, step, stream);
}

void fp8_calibrate(const bf16* x, std::int64_t n, Fp8Scaling* scaling, const float* step,
                   cudaStream_t stream) {
  if (n <= 0) return;
  fp8_amax_kernel<<<cast_blocks(n), kThreads, 0, stream>>>(x, n, scaling, step);
}

}  // namespace topolaunch::kernels::cuda
