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

// 32 x 32 tiles through shared memory, block (32, 8): reads along x's rows, writes along out's.
template <__nv_fp8_interpretation_t Kind>
__global__ void fp8_cast_transpose_kernel(std::uint8_t* out, const bf16* x, std::int64_t rows,
                                          std::int64_t cols, Fp8Scaling* s, const float* step,
                                          float fp8_max) {
  __shared__ float tile[kWarp][kWarp + 1];
  int cur = 0;
  const float scale = begin_cast(s, step, fp8_max, &cur, blockIdx.x == 0 && blockIdx.y == 0);
  const std::int64_t r0 = blockIdx.y * static_cast<std::int64_t>(kWarp);
  const std::int64_t c0 = blockIdx.x * static_cast<std::int64_t>(kWarp);
  float amax = 0;
  for (int dy = threadIdx.y; dy < kWarp; dy += 8) {
    const std::int64_t r = r0 + dy, c = c0 + threadIdx.x;
    const float v = r < rows && c < cols ? __bfloat162float(x[r * cols + c]) : 0.0f;
    tile[dy][threadIdx.x] = v;
    amax = fmaxf(amax, fabsf(v));
  }
  __syncthreads();
  for (int dx = threadIdx.y; dx < kWarp; dx += 8) {
    const std::int64_t c = c0 + dx, r = r0 + threadIdx.x;
    if (c < cols && r < rows) out[c * rows + r] = to_fp8<Kind>(tile[threadIdx.x][dx] * scale);
  }
  // block_max indexes threads linearly
  const int t = threadIdx.y * kWarp + threadIdx.x;
  __shared__ float part[8];
  amax = warp_max(amax);
  if (t % kWarp == 0) part[t / kWarp] = amax;
  __syncthreads();
  if (t == 0) {
    float m = 0;
    for (int w = 0; w < 8; ++w) m = fmaxf(m, part[w]);
    fold_amax(&s->amax[cur], m);
  }
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

void fp8_cast_transpose(void* out, const bf16* x, std::int64_t rows, std::int64_t cols,
                        Fp8Format format, Fp8Scaling* scaling, const float* step,
                        cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(blocks_for(cols, kWarp), blocks_for(rows, kWarp)), block(kWarp, 8);
  const float m = fp8_format_max(format);
  auto* o = static_cast<std::uint8_t*>(out);
  if (format == Fp8Format::e4m3)
    fp8_cast_transpose_kernel<__NV_E4M3>
        <<<grid, block, 0, stream>>>(o, x, rows, cols, scaling, step, m);
  else
    fp8_cast_transpose_kernel<__NV_E5M2>
        <<<grid, block, 0, stream>>>(o, x, rows, cols, scaling, step, m);
}

void fp8_calibrate(const bf16* x, std::int64_t n, Fp8Scaling* scaling, const float* step,
                   cudaStream_t stream) {
  if (n <= 0) return;
  fp8_amax_kernel<<<cast_blocks(n), kThreads, 0, stream>>>(x, n, scaling, step);
}

}  // namespace topolaunch::kernels::cuda
