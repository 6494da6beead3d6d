// Causal flash attention for attention.cuh (sm_90, head size 64), multi-head or grouped-query
// (NKV key/value heads, each read by NH/NKV query heads; its dK/dV summed over them in one block).
//
// Two implementations of the same contract live here:
//  - "simple": CUDA cores only, one thread per query (forward, dQ) or key (dK/dV) row, fp32
//    online softmax, tiles of the other operand in shared memory. Slow but easy to check; it is
//    the fallback when the tensor-core path is not trusted on a machine.
//  - "tensor_core": FA2-style tiles on mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix
//    from XOR-swizzled shared memory filled by cp.async (double buffered), scores pre-scaled by
//    log2(e)/sqrt(hs) so the softmax uses exp2, causal tiles above the diagonal never visited.
// The backward passes recompute the probabilities from the forward's lse. One kernel computes
// delta = rowsum(dy*y) into the workspace; then (both implementations) blocks walking key blocks
// compute dK, dV and blocks walking query blocks compute dQ, so every gradient element has exactly
// one writer: no atomics, deterministic, and the read-add-write of the bf16 dqkv implements the
// accumulate convention. (tensor_core_atomic, FA2's schedule with dQ atomics, is kept to compare.)
#include "attention.cuh"

#include <cmath>

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {

// Defaults from the H200 run of 2026-11-29 (tests/bench/kernels/results/gpu-h200-attention.json):
// every kind passed test_attention; forward ms at B=16/64, T=1024: w32 0.119/0.477, tensor_core
// 0.129/0.487, m64 0.127/0.539; backward: split 0.399/1.571, atomic 0.461/1.968.
constexpr AttentionKernel kDefaultForwardKernel = AttentionKernel::tensor_core_w32;
constexpr AttentionKernel kDefaultBackwardKernel = AttentionKernel::tensor_core;

namespace {

constexpr int kHeadSize = 64;
constexpr float kLn2 = 0.6931471805599453f;

// Shapes every kernel here can index with 32-bit tile counts and 64-bit element offsets.
bool shape_ok(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  return B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0 && C / NH == kHeadSize && NKV > 0 &&
         NH % NKV == 0 && B * NH <= 65535 && T <= (std::int64_t{1} << 20);
}

// The row stride of qkv: q (C channels), then k and v (NKV heads of 64 each).
__host__ __device__ __forceinline__ std::int64_t qkv_stride(std::int64_t C, std::int64_t NKV) {
  return C + 2 * NKV * kHeadSize;
}

// ---- simple: CUDA cores --------------------------------------------------------------------
constexpr int kSimpleFwdRows = 64;  // queries per block (one thread each) = keys per tile
constexpr int kSimpleBwdRows = 32;  // rows per block in the backward kernels (one warp)

// grid (ceil(T/64), B*NH), block 64. Each thread keeps its query (pre-scaled to log2 units) and
// output row in registers; the block streams K and V tiles through shared memory, read as
// broadcasts (every thread reads the same key at the same time).
__global__ void __launch_bounds__(kSimpleFwdRows)
    simple_forward_kernel(bf16* y, float* lse, const bf16* qkv, int T, int C, int NH, int NKV,
                          float scale_log2) {
  __shared__ float ks[kSimpleFwdRows][kHeadSize];
  __shared__ float vs[kSimpleFwdRows][kHeadSize];
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
  const int row0 = blockIdx.x * kSimpleFwdRows, t = row0 + threadIdx.x;
  const bool valid = t < T;
  const std::int64_t C3 = qkv_stride(C, NKV);
  const bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
  const bf16* kbase = qkv + static_cast<std::int64_t>(b) * T * C3 + C + kh * kHeadSize;
  const bf16* vbase = kbase + NKV * kHeadSize;
  float q[kHeadSize], o[kHeadSize];
#pragma unroll
  for (int i = 0; i < kHeadSize; ++i) {
    q[i] = valid ? __bfloat162float(base[t * C3 + i]) * scale_log2 : 0.f;
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int last_key = min(row0 + kSimpleFwdRows, T) - 1;
  for (int j0 = 0; j0 <= last_key; j0 += kSimpleFwdRows) {
    __syncthreads();
    for (int e = threadIdx.x; e < kSimpleFwdRows * kHeadSize; e += kSimpleFwdRows) {
      const int r = e / kHeadSize, c = e % kHeadSize, j = j0 + r;
      ks[r][c] = j < T ? __bfloat162float(kbase[j * C3 + c]) : 0.f;
      vs[r][c] = j < T ? __bfloat162float(vbase[j * C3 + c]) : 0.f;
    }
    __syncthreads();
    if (!valid) continue;
    const int jn = min(kSimpleFwdRows, t - j0 + 1);  // keys j0..t of this tile
    for (int j = 0; j < jn; ++j) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kHeadSize; ++i) s += q[i] * ks[j][i];
      if (s > m) {  // new running maximum: rescale what was summed so far
        const float corr = exp2f(m - s);
        l *= corr;
#pragma unroll
        for (int i = 0; i < kHeadSize; ++i) o[i] *= corr;
        m = s;
      }
      const float p = exp2f(s - m);
      l += p;
#pragma unroll
      for (int i = 0; i < kHeadSize; ++i) o[i] += p * vs[j][i];
    }
  }
  if (!valid) return;
  const float inv = 1.f / l;
  bf16* out = y + (static_cast<std::int64_t>(b) * T + t) * C + h * kHeadSize;
#pragma unroll
  for (int i = 0; i < kHeadSize; ++i) out[i] = __float2bfloat16(o[i] * inv);
  lse[static_cast<std::int64_t>(bh) * T + t] = (m + log2f(l)) * kLn2;
}

// delta[bh, t] = sum_i dy[b,t,h,i] * y[b,t,h,i]; one thread per (b, t, h) row.
__global__ void simple_delta_kernel(float* delta, const bf16* dy, const bf16* y, int B, int T,
                                    int C, int NH) {
  const std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<std::int64_t>(B) * T * NH) return;
  const int h = static_cast<int>(idx % NH);
  const std::int64_t bt = idx / NH;
  const int b = static_cast<int>(bt / T), t = static_cast<int>(bt % T);
  const std::int64_t off = bt * C + h * kHeadSize;
  float d = 0.f;
  for (int i = 0; i < kHeadSize; ++i)
    d += __bfloat162float(dy[off + i]) * __bfloat162float(y[off + i]);
  delta[(static_cast<std::int64_t>(b) * NH + h) * T + t] = d;
}

// grid (ceil(T/32), B*NKV), block 32: thread = key row j of key/value head kh. Its k and v rows
// sit in shared memory (padded rows: each thread reads its own row); the queries and dy of each
// query head of kh's group stream through shared memory as broadcasts, in head order; dk, dv
// accumulate in registers over the group.
__global__ void __launch_bounds__(kSimpleBwdRows)
    simple_dkdv_kernel(bf16* dqkv, const float* delta, const bf16* dy, const bf16* qkv,
                       const float* lse, int T, int C, int NH, int NKV, float scale) {
  constexpr int R = kSimpleBwdRows;
  __shared__ float ks[R][kHeadSize + 1], vs[R][kHeadSize + 1];
  __shared__ float qs[R][kHeadSize], dos[R][kHeadSize];
  __shared__ float lse_s[R], delta_s[R];
  const int bkh = blockIdx.y, b = bkh / NKV, kh = bkh % NKV, group = NH / NKV;
  const int key0 = blockIdx.x * R, j = key0 + threadIdx.x;
  const std::int64_t C3 = qkv_stride(C, NKV);
  const bf16* kbase = qkv + static_cast<std::int64_t>(b) * T * C3 + C + kh * kHeadSize;
  const bf16* vbase = kbase + NKV * kHeadSize;
  for (int e = threadIdx.x; e < R * kHeadSize; e += R) {
    const int r = e / kHeadSize, c = e % kHeadSize, jj = key0 + r;
    ks[r][c] = jj < T ? __bfloat162float(kbase[jj * C3 + c]) : 0.f;
    vs[r][c] = jj < T ? __bfloat162float(vbase[jj * C3 + c]) : 0.f;
  }
  float dk[kHeadSize], dv[kHeadSize];
#pragma unroll
  for (int i = 0; i < kHeadSize; ++i) dk[i] = dv[i] = 0.f;
  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    const int bh = b * NH + h;
    const bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
    const bf16* dyb = dy + static_cast<std::int64_t>(b) * T * C + h * kHeadSize;
    for (int i0 = key0; i0 < T; i0 += R) {
      __syncthreads();
      for (int e = threadIdx.x; e < R * kHeadSize; e += R) {
        const int r = e / kHeadSize, c = e % kHeadSize, i = i0 + r;
        qs[r][c] = i < T ? __bfloat162float(base[i * C3 + c]) : 0.f;
        dos[r][c] = i < T ? __bfloat162float(dyb[static_cast<std::int64_t>(i) * C + c]) : 0.f;
      }
      {
        const int i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < T ? lse[static_cast<std::int64_t>(bh) * T + i] : 0.f;
        delta_s[threadIdx.x] = i < T ? delta[static_cast<std::int64_t>(bh) * T + i] : 0.f;
      }
      __syncthreads();
      if (j >= T) continue;
      for (int r = 0; r < R; ++r) {
        const int i = i0 + r;
        if (i < j || i >= T) continue;
        float s = 0.f, dp = 0.f;
#pragma unroll
        for (int c = 0; c < kHeadSize; ++c) {
          s += qs[r][c] * ks[threadIdx.x][c];
          dp += dos[r][c] * vs[threadIdx.x][c];
        }
        const float p = expf(s * scale - lse_s[r]);
        const float ds = p * (dp - delta_s[r]) * scale;
#pragma unroll
        for (int c = 0; c < kHeadSize; ++c) {
          dv[c] += p * dos[r][c];
          dk[c] += ds * qs[r][c];
        }
      }
    }
  }
  if (j >= T) return;
  bf16* dkp = dqkv + (static_cast<std::int64_t>(b) * T + j) * C3 + C + kh * kHeadSize;
  bf16* dvp = dkp + NKV * kHeadSize;
#pragma unroll
  for (int c = 0; c < kHeadSize; ++c) {
    dkp[c] = __float2bfloat16(__bfloat162float(dkp[c]) + dk[c]);
    dvp[c] = __float2bfloat16(__bfloat162float(dvp[c]) + dv[c]);
  }
}

// grid (ceil(T/32), B*NH), block 32: thread = query row i; keys and values stream through
// shared memory as broadcasts; dq accumulates in registers.
__global__ void __launch_bounds__(kSimpleBwdRows)
    simple_dq_kernel(bf16* dqkv, const float* delta, const bf16* dy, const bf16* qkv,
                     const float* lse, int T, int C, int NH, int NKV, float scale) {
  constexpr int R = kSimpleBwdRows;
  __shared__ float qs[R][kHeadSize + 1], dos[R][kHeadSize + 1];
  __shared__ float ks[R][kHeadSize], vs[R][kHeadSize];
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
  const int row0 = blockIdx.x * R, i = row0 + threadIdx.x;
  const std::int64_t C3 = qkv_stride(C, NKV);
  const bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
  const bf16* kbase = qkv + static_cast<std::int64_t>(b) * T * C3 + C + kh * kHeadSize;
  const bf16* vbase = kbase + NKV * kHeadSize;
  const bf16* dyb = dy + static_cast<std::int64_t>(b) * T * C + h * kHeadSize;
  for (int e = threadIdx.x; e < R * kHeadSize; e += R) {
    const int r = e / kHeadSize, c = e % kHeadSize, ii = row0 + r;
    qs[r][c] = ii < T ? __bfloat162float(base[ii * C3 + c]) : 0.f;
    dos[r][c] = ii < T ? __bfloat162float(dyb[static_cast<std::int64_t>(ii) * C + c]) : 0.f;
  }
  const float l = i < T ? lse[static_cast<std::int64_t>(bh) * T + i] : 0.f;
  const float D = i < T ? delta[static_cast<std::int64_t>(bh) * T + i] : 0.f;
  float dq[kHeadSize];
#pragma unroll
  for (int c = 0; c < kHeadSize; ++c) dq[c] = 0.f;
  const int last_key = min(row0 + R, T) - 1;
  for (int j0 = 0; j0 <= last_key; j0 += R) {
    __syncthreads();
    for (int e = threadIdx.x; e < R * kHeadSize; e += R) {
      const int r = e / kHeadSize, c = e % kHeadSize, j = j0 + r;
      ks[r][c] = j < T ? __bfloat162float(kbase[j * C3 + c]) : 0.f;
      vs[r][c] = j < T ? __bfloat162float(vbase[j * C3 + c]) : 0.f;
    }
    __syncthreads();
    if (i >= T) continue;
    const int jn = min(R, i - j0 + 1);
    for (int r = 0; r < jn; ++r) {
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int c = 0; c < kHeadSize; ++c) {
        s += qs[threadIdx.x][c] * ks[r][c];
        dp += dos[threadIdx.x][c] * vs[r][c];
      }
      const float p = expf(s * scale - l);
      const float ds = p * (dp - D) * scale;
#pragma unroll
      for (int c = 0; c < kHeadSize; ++c) dq[c] += ds * ks[r][c];
    }
  }
  if (i >= T) return;
  bf16* dqp = dqkv + (static_cast<std::int64_t>(b) * T + i) * C3 + h * kHeadSize;
#pragma unroll
  for (int c = 0; c < kHeadSize; ++c) dqp[c] = __float2bfloat16(__bfloat162float(dqp[c]) + dq[c]);
}

cudaError_t simple_forward(bf16* y, float* lse, const bf16* qkv, std::int64_t B, std::int64_t T,
                           std::int64_t C, std::int64_t NH, std::int64_t NKV, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((T + kSimpleFwdRows - 1) / kSimpleFwdRows),
                  static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kHeadSize));
  simple_forward_kernel<<<grid, kSimpleFwdRows, 0, stream>>>(
      y, lse, qkv, static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH),
      static_cast<int>(NKV), scale_log2);
  return cudaGetLastError();
}

cudaError_t simple_backward(bf16* dqkv, float* delta, const bf16* dy, const bf16* qkv,
                            const bf16* y, const float* lse, std::int64_t B, std::int64_t T,
                            std::int64_t C, std::int64_t NH, std::int64_t NKV,
                            cudaStream_t stream) {
  const int Ti = static_cast<int>(T), Ci = static_cast<int>(C), NHi = static_cast<int>(NH),
            NKVi = static_cast<int>(NKV);
  const std::int64_t rows = B * T * NH;
  simple_delta_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(
      delta, dy, y, static_cast<int>(B), Ti, Ci, NHi);
  const float scale = 1.f / std::sqrt(static_cast<float>(kHeadSize));
  const unsigned blocks_t = static_cast<unsigned>((T + kSimpleBwdRows - 1) / kSimpleBwdRows);
  simple_dkdv_kernel<<<dim3(blocks_t, static_cast<unsigned>(B * NKV)), kSimpleBwdRows, 0, stream>>>(
      dqkv, delta, dy, qkv, lse, Ti, Ci, NHi, NKVi, scale);
  simple_dq_kernel<<<dim3(blocks_t, static_cast<unsigned>(B * NH)), kSimpleBwdRows, 0, stream>>>(
      dqkv, delta, dy, qkv, lse, Ti, Ci, NHi, NKVi, scale);
  return cudaGetLastError();
}

// ---- tensor_core: mma.sync m16n8k16 -------------------------------------------------------
// Tiles of 64 rows x 64 bf16 (128 bytes a row) in shared memory; 16-byte chunk c of row r is
// stored at chunk c ^ (r % 8), so the 8 rows an ldmatrix phase reads hit 8 different bank groups.
constexpr int kTile = 64;
constexpr int kTileElems = kTile * kHeadSize;
constexpr int kBwdWarps = 4;  // 16 rows each: 64-row blocks in both backward roles

// Byte offset of (row r, 16-byte chunk c) in a swizzled 64-column tile.
__device__ __forceinline__ std::uint32_t swz(int r, int c) {
  return static_cast<std::uint32_t>((r * kHeadSize + ((c ^ (r & 7)) << 3)) * 2);
}
// cp.async of 16 bytes, or (valid false: src-size 0) 16 zero bytes for rows past the end of the
// sequence.
__device__ __forceinline__ void cp_async16_zero_fill(std::uint32_t dst, const void* src,
                                                     bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col)
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies rows [r0, r0 + kRows) of a (T, 64) bf16 view with row stride ld (elements) into a
// swizzled tile; rows at or past T are zero-filled.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* g, std::int64_t ld, int r0,
                                          int T) {
  static_assert(kRows * 8 % kThreads == 0, "whole 16-byte chunks per thread");
  const std::uint32_t base = smem_u32(tile);
#pragma unroll
  for (int i = 0; i < kRows * 8 / kThreads; ++i) {
    const int e = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = e >> 3, c = e & 7, gr = r0 + r;
    const bool ok = gr < T;
    cp_async16_zero_fill(base + swz(r, c), g + static_cast<std::int64_t>(ok ? gr : 0) * ld + c * 8,
                         ok);
  }
}
// Copies n floats g[r0 .. r0+64) (4 bytes each, any alignment) into s; past T: zero.
__device__ __forceinline__ void load_row_stats(float* s, const float* g, int r0, int T) {
  const int i = threadIdx.x & (kTile - 1);
  const bool ok = r0 + i < T;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(s + i)),
               "l"(g + (ok ? r0 + i : 0)), "r"(ok ? 4 : 0)
               : "memory");
}
// The A operand (16 rows x 64 columns = 4 k-steps) of one warp from rows [row, row+16) of a tile.
__device__ __forceinline__ void load_a_frags(std::uint32_t (&f)[4][4], const bf16* tile, int row,
                                             int lane) {
  const std::uint32_t base = smem_u32(tile);
#pragma unroll
  for (int k = 0; k < 4; ++k)
    ldmatrix_x4(f[k], base + swz(row + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * k + (lane >> 4)));
}
// acc (16 x 64) = A (16 x 64, registers) * tile^T, tile = 64 rows x 64 columns (B non-transposed:
// the tile's rows are the output columns). Every row an ldmatrix lane addresses here has
// row % 8 == lane % 8, so the swizzle is a per-lane constant plus immediate row offsets.
__device__ __forceinline__ void mma_abt(float (&acc)[8][4], const std::uint32_t (&a)[4][4],
                                        const bf16* tile, int lane) {
  const int lr = lane & 7, hi = lane >> 3;
  const std::uint32_t base = smem_u32(tile) + lr * 128;
  const std::uint32_t off[2] = {static_cast<std::uint32_t>((hi ^ lr) << 4),
                                static_cast<std::uint32_t>(((4 + hi) ^ lr) << 4)};
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      std::uint32_t r[4];
      ldmatrix_x4(r, base + n * 1024 + off[k / 2]);  // == swz(n*8 + lr, 2k + hi)
      mma16816(acc[n], a[k], r[0], r[1]);
      mma16816(acc[n], a[k + 1], r[2], r[3]);
    }
  }
}
// acc (16 x 64) += P (16 x 64, fp32 accumulator layout, rounded to bf16) * tile (64 x 64: the
// tile's rows are the reduction index).
__device__ __forceinline__ void mma_pb(float (&acc)[8][4], const float (&p)[8][4], const bf16* tile,
                                       int lane) {
  const int lr = lane & 7, h = lane >> 4;
  const std::uint32_t base = smem_u32(tile) + (lr + ((lane >> 3) & 1) * 8) * 128;
  std::uint32_t off[4];
#pragma unroll
  for (int dn = 0; dn < 4; ++dn) off[dn] = static_cast<std::uint32_t>(((2 * dn + h) ^ lr) << 4);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const std::uint32_t a[4] = {pack_bf16x2(p[2 * j][0], p[2 * j][1]),
                                pack_bf16x2(p[2 * j][2], p[2 * j][3]),
                                pack_bf16x2(p[2 * j + 1][0], p[2 * j + 1][1]),
                                pack_bf16x2(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
    for (int dn = 0; dn < 4; ++dn) {
      std::uint32_t r[4];
      // == swz(16j + lr + 8 ((lane >> 3) & 1), 2 dn + h)
      ldmatrix_x4_trans(r, base + j * 2048 + off[dn]);
      mma16816(acc[2 * dn], a, r[0], r[1]);
      mma16816(acc[2 * dn + 1], a, r[2], r[3]);
    }
  }
}

// The same two products for kMT 16-row m-tiles per warp: each B fragment loaded from shared
// memory feeds kMT m-tiles (halves the shared-memory traffic per mma at kMT = 2).
template <int kMT>
__device__ __forceinline__ void mma_abt_mt(float (&acc)[kMT][8][4],
                                           const std::uint32_t (&a)[kMT][4][4], const bf16* tile,
                                           int lane) {
  const int lr = lane & 7, hi = lane >> 3;
  const std::uint32_t base = smem_u32(tile) + lr * 128;
  const std::uint32_t off[2] = {static_cast<std::uint32_t>((hi ^ lr) << 4),
                                static_cast<std::uint32_t>(((4 + hi) ^ lr) << 4)};
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
      acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      std::uint32_t r[4];
      ldmatrix_x4(r, base + n * 1024 + off[k / 2]);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma16816(acc[mt][n], a[mt][k], r[0], r[1]);
        mma16816(acc[mt][n], a[mt][k + 1], r[2], r[3]);
      }
    }
  }
}
template <int kMT>
__device__ __forceinline__ void mma_pb_mt(float (&acc)[kMT][8][4], const float (&p)[kMT][8][4],
                                          const bf16* tile, int lane) {
  const int lr = lane & 7, h = lane >> 4;
  const std::uint32_t base = smem_u32(tile) + (lr + ((lane >> 3) & 1) * 8) * 128;
  std::uint32_t off[4];
#pragma unroll
  for (int dn = 0; dn < 4; ++dn) off[dn] = static_cast<std::uint32_t>(((2 * dn + h) ^ lr) << 4);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    std::uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      a[mt][0] = pack_bf16x2(p[mt][2 * j][0], p[mt][2 * j][1]);
      a[mt][1] = pack_bf16x2(p[mt][2 * j][2], p[mt][2 * j][3]);
      a[mt][2] = pack_bf16x2(p[mt][2 * j + 1][0], p[mt][2 * j + 1][1]);
      a[mt][3] = pack_bf16x2(p[mt][2 * j + 1][2], p[mt][2 * j + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < 4; ++dn) {
      std::uint32_t r[4];
      ldmatrix_x4_trans(r, base + j * 2048 + off[dn]);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma16816(acc[mt][2 * dn], a[mt], r[0], r[1]);
        mma16816(acc[mt][2 * dn + 1], a[mt], r[2], r[3]);
      }
    }
  }
}

// Forward. grid (B*NH, ceil(T/kM)), block 32*kWarps; each warp owns kMT*16 consecutive query
// rows. Query blocks are visited last-first (blockIdx.y reversed): the longest causal rows start
// first. Shared memory: two stages of (K, V) tiles; the Q tile is staged in stage 1 before the
// loop. Scores are kept in log2 units (scale_log2 = log2(e)/sqrt(hs)).
template <int kWarps, int kMT, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    tc_forward_kernel(bf16* y, float* lse, const bf16* qkv, int T, int C, int NH, int NKV,
                      float scale_log2) {
  constexpr int kWarpRows = 16 * kMT, kM = kWarpRows * kWarps, kThreads = 32 * kWarps;
  static_assert(kM <= 2 * kTile, "the Q tile must fit in one (K, V) stage");
  __shared__ __align__(128) bf16 sm[2][2][kTileElems];
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const std::int64_t C3 = qkv_stride(C, NKV);
  const bf16* qg = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
  const bf16* kg = qkv + static_cast<std::int64_t>(b) * T * C3 + C + kh * kHeadSize;
  const bf16* vg = kg + NKV * kHeadSize;
  const int n_tiles = (min(q0 + kM, T) + kTile - 1) / kTile;

  load_tile<kM, kThreads>(&sm[1][0][0], qg, C3, q0, T);
  cp_async_commit();
  load_tile<kTile, kThreads>(&sm[0][0][0], kg, C3, 0, T);
  load_tile<kTile, kThreads>(&sm[0][1][0], vg, C3, 0, T);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  const int row_w = q0 + warp * kWarpRows;  // this warp's first row
  std::uint32_t qf[kMT][4][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    load_a_frags(qf[mt], &sm[1][0][0], warp * kWarpRows + 16 * mt, lane);
  __syncthreads();

  float o[kMT][8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  // this thread's rows: row_w + 16 mt + g + 8 i, statistics m, l indexed [mt][i]
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      const int s1 = (t + 1) & 1;
      load_tile<kTile, kThreads>(&sm[s1][0][0], kg, C3, (t + 1) * kTile, T);
      load_tile<kTile, kThreads>(&sm[s1][1][0], vg, C3, (t + 1) * kTile, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = t * kTile;
    if (k0 <= row_w + kWarpRows - 1) {  // else every key of the tile is in this warp's future
      float s[kMT][8][4];
      mma_abt_mt<kMT>(s, qf, &sm[t & 1][0][0], lane);
      const bool diag = k0 + kTile - 1 > row_w;  // some key of the tile is after some row
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r0 = row_w + 16 * mt + g;
        float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = s[mt][n][e] * scale_log2;
            if (diag && k0 + n * 8 + 2 * tig + (e & 1) > r0 + (e >> 1) * 8) v = -INFINITY;
            s[mt][n][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
          }
        }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
          // key 0 is in tile 0 for every row, so mx is finite from the first tile on
          corr[i] = exp2_approx(m[mt][i] - mx[i]);
          m[mt][i] = mx[i];
          l[mt][i] *= corr[i];
        }
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = exp2_approx(s[mt][n][e] - m[mt][e >> 1]);
            s[mt][n][e] = p;
            l[mt][e >> 1] += p;
            o[mt][n][e] *= corr[e >> 1];
          }
        }
      }
      mma_pb_mt<kMT>(o, s, &sm[t & 1][1][0], lane);
    }
    __syncthreads();
  }
  bf16* yb = y + static_cast<std::int64_t>(b) * T * C + h * kHeadSize;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 1);
      l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = row_w + 16 * mt + g + 8 * i;
      if (r >= T) continue;
      const float inv = 1.f / l[mt][i];
#pragma unroll
      for (int n = 0; n < 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(yb + static_cast<std::int64_t>(r) * C + n * 8 +
                                           2 * tig) =
            __floats2bfloat162_rn(o[mt][n][2 * i] * inv, o[mt][n][2 * i + 1] * inv);
      if (tig == 0)
        lse[static_cast<std::int64_t>(bh) * T + r] = (m[mt][i] + log2f(l[mt][i])) * kLn2;
    }
  }
}

// delta[bh, t] = sum_i dy[b,t,h,i] * y[b,t,h,i]: 8 threads (16 bytes each) per 64-wide row.
// (b, t, h) rows are contiguous in dy and y because C = NH * 64.
__global__ void tc_delta_kernel(float* delta, const bf16* dy, const bf16* y, std::int64_t rows,
                                int T, int NH) {
  const std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t row = idx >> 3;
  float d = 0.f;
  if (row < rows) {
    const uint4 a = *reinterpret_cast<const uint4*>(dy + idx * 8);
    const uint4 c = *reinterpret_cast<const uint4*>(y + idx * 8);
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* c2 = reinterpret_cast<const __nv_bfloat162*>(&c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 fa = __bfloat1622float2(a2[i]), fc = __bfloat1622float2(c2[i]);
      d += fa.x * fc.x + fa.y * fc.y;
    }
  }
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
  d += __shfl_xor_sync(0xffffffffu, d, 4);
  if (row < rows && (idx & 7) == 0) {
    const int h = static_cast<int>(row % NH);
    const std::int64_t bt = row / NH, b = bt / T, t = bt % T;
    delta[(b * NH + h) * T + t] = d;
  }
}

// Adds a warp's 16 x 64 fp32 accumulator (times scale) into bf16 rows [row, row+16) of a
// (T, 64) view with row stride ld; rows at or past T are skipped.
__device__ __forceinline__ void add_rows_bf16(bf16* g, std::int64_t ld, int row, int T,
                                              const float (&acc)[8][4], float scale, int lane) {
  const int g8 = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row + g8 + 8 * i;
    if (r >= T) continue;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      auto* p = reinterpret_cast<__nv_bfloat162*>(g + static_cast<std::int64_t>(r) * ld + n * 8 +
                                                  2 * tig);
      const float2 old = __bfloat1622float2(*p);
      *p = __floats2bfloat162_rn(old.x + acc[n][2 * i] * scale, old.y + acc[n][2 * i + 1] * scale);
    }
  }
}

struct BwdArgs {
  bf16* dqkv;
  const float* delta;
  const bf16* dy;
  const bf16* qkv;
  const float* lse;
  int T, C, NH, NKV;
  float scale_log2, scale;
};

// dK, dV of key block kb: K and V fragments in registers, (Q, dO, lse, delta) tiles of the
// queries at or after the block streamed through two stages; computes S^T and dP^T directly
// (keys as rows) so that P^T and dS^T are already the A operands of dV += P^T dO, dK += dS^T Q.
__device__ __forceinline__ void tc_dkdv(const BwdArgs& a, int bkh, int kb,
                                        bf16 (*sm)[2][kTileElems], float (*stat)[2][kTile]) {
  constexpr int kThreads = 32 * kBwdWarps;
  // bkh = (b, kh): the key/value head's gradients sum over the group's query heads in order.
  const int b = bkh / a.NKV, kh = bkh % a.NKV, group = a.NH / a.NKV, T = a.T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const std::int64_t C3 = qkv_stride(a.C, a.NKV);
  const bf16* kg = a.qkv + static_cast<std::int64_t>(b) * T * C3 + a.C + kh * kHeadSize;
  const bf16* vg = kg + a.NKV * kHeadSize;
  const bf16 *qg = nullptr, *dog = nullptr;
  const float *lseg = nullptr, *dlg = nullptr;
  auto select_head = [&](int h) {
    qg = a.qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
    dog = a.dy + static_cast<std::int64_t>(b) * T * a.C + h * kHeadSize;
    lseg = a.lse + (static_cast<std::int64_t>(b) * a.NH + h) * T;
    dlg = a.delta + (static_cast<std::int64_t>(b) * a.NH + h) * T;
  };
  const int key0 = kb * kTile, key_w = key0 + warp * 16;
  const int n_q = (T + kTile - 1) / kTile;

  select_head(kh * group);
  load_tile<kTile, kThreads>(&sm[1][0][0], kg, C3, key0, T);
  load_tile<kTile, kThreads>(&sm[1][1][0], vg, C3, key0, T);
  cp_async_commit();
  auto load_queries = [&](int stage, int tile) {
    const int i0 = tile * kTile;
    load_tile<kTile, kThreads>(&sm[stage][0][0], qg, C3, i0, T);
    load_tile<kTile, kThreads>(&sm[stage][1][0], dog, a.C, i0, T);
    load_row_stats(threadIdx.x < kTile ? &stat[stage][0][0] : &stat[stage][1][0],
                   threadIdx.x < kTile ? lseg : dlg, i0, T);
    cp_async_commit();
  };
  load_queries(0, kb);
  cp_async_wait<1>();
  __syncthreads();
  std::uint32_t kf[4][4], vf[4][4];
  load_a_frags(kf, &sm[1][0][0], warp * 16, lane);
  load_a_frags(vf, &sm[1][1][0], warp * 16, lane);
  __syncthreads();

  float dk[8][4], dv[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  const int kr0 = key_w + g;  // this thread's keys: kr0 and kr0 + 8
  for (int gi = 0; gi < group; ++gi) {
    if (gi > 0) {  // the next query head of the group: its first query tile into stage 0
      select_head(kh * group + gi);
      load_queries(0, kb);
    }
    for (int t = kb; t < n_q; ++t) {
      const int st = (t - kb) & 1;
      if (t + 1 < n_q) {
        load_queries(st ^ 1, t + 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const int i0 = t * kTile;
      if (i0 + kTile - 1 >= key_w) {  // else every query of the tile precedes this warp's keys
        float s[8][4], dp[8][4];
        mma_abt(s, kf, &sm[st][0][0], lane);
        mma_abt(dp, vf, &sm[st][1][0], lane);
        const bool diag = t == kb, tail = i0 + kTile > T;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qc = n * 8 + 2 * tig + (e & 1), q = i0 + qc;
            const float lse2 = stat[st][0][qc] * kLog2e, dl = stat[st][1][qc];
            float p = exp2_approx(s[n][e] * a.scale_log2 - lse2);
            if ((diag && q < kr0 + (e >> 1) * 8) || (tail && q >= T)) p = 0.f;
            s[n][e] = p;
            dp[n][e] = p * (dp[n][e] - dl);
          }
        }
        mma_pb(dv, s, &sm[st][1][0], lane);
        mma_pb(dk, dp, &sm[st][0][0], lane);
      }
      __syncthreads();
    }
  }
  add_rows_bf16(a.dqkv + static_cast<std::int64_t>(b) * T * C3 + a.C + kh * kHeadSize, C3, key_w, T,
                dk, a.scale, lane);
  add_rows_bf16(a.dqkv + static_cast<std::int64_t>(b) * T * C3 + a.C + (a.NKV + kh) * kHeadSize, C3,
                key_w, T, dv, 1.f, lane);
}

// dQ of query block qb: Q and dO fragments in registers, (K, V) tiles of the keys at or before the
// block streamed through two stages; dQ += dS K.
__device__ __forceinline__ void tc_dq(const BwdArgs& a, int bh, int qb, bf16 (*sm)[2][kTileElems]) {
  constexpr int kThreads = 32 * kBwdWarps;
  const int b = bh / a.NH, h = bh % a.NH, kh = h / (a.NH / a.NKV), T = a.T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const std::int64_t C3 = qkv_stride(a.C, a.NKV);
  const bf16* qg = a.qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
  const bf16* kg = a.qkv + static_cast<std::int64_t>(b) * T * C3 + a.C + kh * kHeadSize;
  const bf16* vg = kg + a.NKV * kHeadSize;
  const bf16* dog = a.dy + static_cast<std::int64_t>(b) * T * a.C + h * kHeadSize;
  const int q0 = qb * kTile, row_w = q0 + warp * 16, r0 = row_w + g;
  const int n_k = (min(q0 + kTile, T) + kTile - 1) / kTile;

  load_tile<kTile, kThreads>(&sm[1][0][0], qg, C3, q0, T);
  load_tile<kTile, kThreads>(&sm[1][1][0], dog, a.C, q0, T);
  cp_async_commit();
  load_tile<kTile, kThreads>(&sm[0][0][0], kg, C3, 0, T);
  load_tile<kTile, kThreads>(&sm[0][1][0], vg, C3, 0, T);
  cp_async_commit();
  float lse2[2], dl[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + 8 * i;
    lse2[i] = r < T ? a.lse[static_cast<std::int64_t>(bh) * T + r] * kLog2e : 0.f;
    dl[i] = r < T ? a.delta[static_cast<std::int64_t>(bh) * T + r] : 0.f;
  }
  cp_async_wait<1>();
  __syncthreads();
  std::uint32_t qf[4][4], dof[4][4];
  load_a_frags(qf, &sm[1][0][0], warp * 16, lane);
  load_a_frags(dof, &sm[1][1][0], warp * 16, lane);
  __syncthreads();

  float dq[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  for (int t = 0; t < n_k; ++t) {
    if (t + 1 < n_k) {
      const int s1 = (t + 1) & 1;
      load_tile<kTile, kThreads>(&sm[s1][0][0], kg, C3, (t + 1) * kTile, T);
      load_tile<kTile, kThreads>(&sm[s1][1][0], vg, C3, (t + 1) * kTile, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = t * kTile;
    if (k0 <= row_w + 15) {
      float s[8][4], dp[8][4];
      mma_abt(s, qf, &sm[t & 1][0][0], lane);
      mma_abt(dp, dof, &sm[t & 1][1][0], lane);
      const bool diag = k0 + kTile - 1 > row_w;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = exp2_approx(s[n][e] * a.scale_log2 - lse2[e >> 1]);
          if (diag && k0 + n * 8 + 2 * tig + (e & 1) > r0 + (e >> 1) * 8) p = 0.f;
          dp[n][e] = p * (dp[n][e] - dl[e >> 1]);
        }
      }
      mma_pb(dq, dp, &sm[t & 1][0][0], lane);
    }
    __syncthreads();
  }
  add_rows_bf16(a.dqkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize, C3, row_w, T, dq,
                a.scale, lane);
}

// One launch for both backward roles so that they fill each other's tails: grid (B*NH, 2*nb),
// even blockIdx.y = dK/dV of key block y/2 (block 0 has the most queries), odd = dQ of query
// block nb-1-y/2 (the last has the most keys): the heaviest blocks of both roles start first.
// With grouped-query attention the dK/dV role has B*NKV blocks (x < B*NKV), each summing its
// group's NH/NKV query heads; the others of that role have nothing to do.
__global__ void __launch_bounds__(kBwdWarps * 32, 3) tc_backward_kernel(BwdArgs a) {
  __shared__ __align__(128) bf16 sm[2][2][kTileElems];
  __shared__ __align__(16) float stat[2][2][kTile];
  const int nb = static_cast<int>(gridDim.y / 2), idx = static_cast<int>(blockIdx.y >> 1);
  if (blockIdx.y & 1)
    tc_dq(a, static_cast<int>(blockIdx.x), nb - 1 - idx, sm);
  else if (static_cast<int>(blockIdx.x) < static_cast<int>(gridDim.x) / a.NH * a.NKV)
    tc_dkdv(a, static_cast<int>(blockIdx.x), idx, sm, stat);
}

// FA2's backward schedule, for comparison: one block per key block computes dK and dV as in
// tc_dkdv and also dQ's share of the block, dS K, added into an fp32 (B*NH, T, 64) accumulator in
// the workspace with atomics; a last kernel adds the accumulator into dqkv. Five products per tile
// instead of the 4 + 3 of the split schedule, but atomics (whose order, hence dQ's last bits,
// varies from run to run) and B*T*C fp32 more workspace.
__global__ void __launch_bounds__(kBwdWarps * 32, 3)
    tc_backward_atomic_kernel(BwdArgs a, float* dq_acc) {
  constexpr int kThreads = 32 * kBwdWarps;
  __shared__ __align__(128) bf16 sm[2][2][kTileElems];  // stages of (Q, dO)
  __shared__ __align__(128) bf16 ks[kTileElems];        // this block's K: B operand of dS K
  __shared__ __align__(16) float stat[2][2][kTile];
  const int bh = static_cast<int>(blockIdx.x), kb = static_cast<int>(blockIdx.y);
  const int b = bh / a.NH, h = bh % a.NH, T = a.T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const std::int64_t C3 = 3 * static_cast<std::int64_t>(a.C);
  const bf16* qg = a.qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
  const bf16* dog = a.dy + static_cast<std::int64_t>(b) * T * a.C + h * kHeadSize;
  const float* lseg = a.lse + static_cast<std::int64_t>(bh) * T;
  const float* dlg = a.delta + static_cast<std::int64_t>(bh) * T;
  float* dqg = dq_acc + static_cast<std::int64_t>(bh) * T * kHeadSize;
  const int key0 = kb * kTile, key_w = key0 + warp * 16;
  const int n_q = (T + kTile - 1) / kTile;

  load_tile<kTile, kThreads>(ks, qg + a.C, C3, key0, T);
  load_tile<kTile, kThreads>(&sm[1][1][0], qg + 2 * a.C, C3, key0, T);
  cp_async_commit();
  auto load_queries = [&](int stage, int tile) {
    const int i0 = tile * kTile;
    load_tile<kTile, kThreads>(&sm[stage][0][0], qg, C3, i0, T);
    load_tile<kTile, kThreads>(&sm[stage][1][0], dog, a.C, i0, T);
    load_row_stats(threadIdx.x < kTile ? &stat[stage][0][0] : &stat[stage][1][0],
                   threadIdx.x < kTile ? lseg : dlg, i0, T);
    cp_async_commit();
  };
  load_queries(0, kb);
  cp_async_wait<1>();
  __syncthreads();
  std::uint32_t kf[4][4], vf[4][4];
  load_a_frags(kf, ks, warp * 16, lane);
  load_a_frags(vf, &sm[1][1][0], warp * 16, lane);
  __syncthreads();

  float dk[8][4], dv[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  const int kr0 = key_w + g;
  const std::uint32_t ks_base = smem_u32(ks);
  for (int t = kb; t < n_q; ++t) {
    const int st = (t - kb) & 1;
    if (t + 1 < n_q) {
      load_queries(st ^ 1, t + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int i0 = t * kTile;
    float s[8][4], dp[8][4];
    mma_abt(s, kf, &sm[st][0][0], lane);
    mma_abt(dp, vf, &sm[st][1][0], lane);
    const bool diag = t == kb, tail = i0 + kTile > T;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = n * 8 + 2 * tig + (e & 1), q = i0 + qc;
        const float lse2 = stat[st][0][qc] * kLog2e, dl = stat[st][1][qc];
        float p = exp2_approx(s[n][e] * a.scale_log2 - lse2);
        if ((diag && q < kr0 + (e >> 1) * 8) || (tail && q >= T)) p = 0.f;
        s[n][e] = p;
        dp[n][e] = p * (dp[n][e] - dl);
      }
    }
    mma_pb(dv, s, &sm[st][1][0], lane);
    mma_pb(dk, dp, &sm[st][0][0], lane);
    __syncthreads();  // every warp is done with this stage's dO: its slot takes dS^T
    {
      const std::uint32_t ds_base = smem_u32(&sm[st][1][0]);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const std::uint32_t v = pack_bf16x2(dp[n][2 * i], dp[n][2 * i + 1]);
          asm volatile(
              "st.shared.b32 [%0], %1;\n" ::"r"(ds_base + swz(warp * 16 + g + 8 * i, n) + 4 * tig),
              "r"(v)
              : "memory");
        }
    }
    __syncthreads();
    {
      // dQ rows warp*16.. of this query tile: A = dS (queries x keys) read transposed from the
      // dS^T tile, B = K (keys x d).
      const std::uint32_t ds_base = smem_u32(&sm[st][1][0]);
      float dq[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t af[4];
        ldmatrix_x4_trans(
            af, ds_base + swz(16 * j + (lane & 7) + 8 * (lane >> 4), warp * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int dn = 0; dn < 4; ++dn) {
          std::uint32_t r[4];
          ldmatrix_x4_trans(
              r, ks_base + swz(16 * j + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dn + (lane >> 4)));
          mma16816(dq[2 * dn], af, r[0], r[1]);
          mma16816(dq[2 * dn + 1], af, r[2], r[3]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q = i0 + warp * 16 + g + 8 * i;
        if (q >= T) continue;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          atomicAdd(reinterpret_cast<float2*>(dqg + static_cast<std::int64_t>(q) * kHeadSize +
                                              n * 8 + 2 * tig),
                    make_float2(dq[n][2 * i], dq[n][2 * i + 1]));
      }
    }
    __syncthreads();
  }
  add_rows_bf16(a.dqkv + static_cast<std::int64_t>(b) * T * C3 + a.C + h * kHeadSize, C3, key_w, T,
                dk, a.scale, lane);
  add_rows_bf16(a.dqkv + static_cast<std::int64_t>(b) * T * C3 + 2 * a.C + h * kHeadSize, C3, key_w,
                T, dv, 1.f, lane);
}

// dqkv[b, t, h*64 + d] += scale * dq_acc[b*NH + h, t, d]; 8 values per thread.
__global__ void tc_dq_add_kernel(bf16* dqkv, const float* dq_acc, std::int64_t chunks, int T, int C,
                                 int NH, float scale) {
  const std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= chunks) return;
  const std::int64_t row = idx >> 3;  // (bh, t)
  const int c = static_cast<int>(idx & 7);
  const std::int64_t bh = row / T, t = row % T, b = bh / NH, h = bh % NH;
  const float4 a0 = reinterpret_cast<const float4*>(dq_acc)[idx * 2];
  const float4 a1 = reinterpret_cast<const float4*>(dq_acc)[idx * 2 + 1];
  uint4* p = reinterpret_cast<uint4*>(dqkv + (b * T + t) * 3 * C + h * kHeadSize + c * 8);
  uint4 v = *p;
  __nv_bfloat162* v2 = reinterpret_cast<__nv_bfloat162*>(&v);
  const float add[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 old = __bfloat1622float2(v2[i]);
    v2[i] = __floats2bfloat162_rn(old.x + add[2 * i] * scale, old.y + add[2 * i + 1] * scale);
  }
  *p = v;
}

template <int kWarps, int kMT, int kMinBlocks>
cudaError_t tc_forward(bf16* y, float* lse, const bf16* qkv, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH, std::int64_t NKV, cudaStream_t stream) {
  constexpr int kM = 16 * kMT * kWarps;
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kM - 1) / kM));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kHeadSize));
  tc_forward_kernel<kWarps, kMT, kMinBlocks>
      <<<grid, kWarps * 32, 0, stream>>>(y, lse, qkv, static_cast<int>(T), static_cast<int>(C),
                                         static_cast<int>(NH), static_cast<int>(NKV), scale_log2);
  return cudaGetLastError();
}

cudaError_t tc_backward(bf16* dqkv, float* delta, const bf16* dy, const bf16* qkv, const bf16* y,
                        const float* lse, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH, std::int64_t NKV, cudaStream_t stream) {
  const std::int64_t rows = B * T * NH;
  tc_delta_kernel<<<static_cast<unsigned>((rows * 8 + 255) / 256), 256, 0, stream>>>(
      delta, dy, y, rows, static_cast<int>(T), static_cast<int>(NH));
  const float scale = 1.f / std::sqrt(static_cast<float>(kHeadSize));
  const BwdArgs args{dqkv,
                     delta,
                     dy,
                     qkv,
                     lse,
                     static_cast<int>(T),
                     static_cast<int>(C),
                     static_cast<int>(NH),
                     static_cast<int>(NKV),
                     scale * kLog2e,
                     scale};
  const dim3 grid(static_cast<unsigned>(B * NH),
                  static_cast<unsigned>(2 * ((T + kTile - 1) / kTile)));
  tc_backward_kernel<<<grid, kBwdWarps * 32, 0, stream>>>(args);
  return cudaGetLastError();
}

// The delta, dK/dV-with-atomic-dQ and dQ-add kernels; the workspace holds delta, then (256-byte
// aligned) the fp32 dQ accumulator.
std::size_t delta_bytes_aligned(std::int64_t B, std::int64_t T, std::int64_t NH) {
  return (static_cast<std::size_t>(B * NH * T) * sizeof(float) + 255) & ~std::size_t{255};
}
cudaError_t tc_backward_atomic(bf16* dqkv, void* workspace, const bf16* dy, const bf16* qkv,
                               const bf16* y, const float* lse, std::int64_t B, std::int64_t T,
                               std::int64_t C, std::int64_t NH, cudaStream_t stream) {
  float* delta = static_cast<float*>(workspace);
  float* dq_acc =
      reinterpret_cast<float*>(static_cast<char*>(workspace) + delta_bytes_aligned(B, T, NH));
  const std::int64_t rows = B * T * NH;
  cudaError_t e =
      cudaMemsetAsync(dq_acc, 0, static_cast<std::size_t>(rows) * kHeadSize * 4, stream);
  if (e != cudaSuccess) return e;
  tc_delta_kernel<<<static_cast<unsigned>((rows * 8 + 255) / 256), 256, 0, stream>>>(
      delta, dy, y, rows, static_cast<int>(T), static_cast<int>(NH));
  const float scale = 1.f / std::sqrt(static_cast<float>(kHeadSize));
  const BwdArgs args{dqkv,
                     delta,
                     dy,
                     qkv,
                     lse,
                     static_cast<int>(T),
                     static_cast<int>(C),
                     static_cast<int>(NH),
                     static_cast<int>(NH),
                     scale * kLog2e,
                     scale};
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kTile - 1) / kTile));
  tc_backward_atomic_kernel<<<grid, kBwdWarps * 32, 0, stream>>>(args, dq_acc);
  const std::int64_t chunks = rows * 8;
  tc_dq_add_kernel<<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(
      dqkv, dq_acc, chunks, static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH), scale);
  return cudaGetLastError();
}

}  // namespace

bool attention_supported(std::int64_t C, std::int64_t NH) {
  return C > 0 && NH > 0 && C % NH == 0 && C / NH == kHeadSize;
}

std::size_t attention_backward_workspace_bytes_with(AttentionKernel kind, std::int64_t B,
                                                    std::int64_t T, std::int64_t C,
                                                    std::int64_t NH) {
  if (kind == AttentionKernel::tensor_core_atomic)
    return delta_bytes_aligned(B, T, NH) +
           static_cast<std::size_t>(B * T * C) * sizeof(float);  // + the fp32 dQ accumulator
  return static_cast<std::size_t>(B * NH * T) * sizeof(float);
}

std::size_t attention_backward_workspace_bytes(std::int64_t B, std::int64_t T, std::int64_t C,
                                               std::int64_t NH) {
  return attention_backward_workspace_bytes_with(kDefaultBackwardKernel, B, T, C, NH);
}

cudaError_t attention_forward_with(AttentionKernel kind, bf16* y, float* lse, const bf16* qkv,
                                   std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                   cudaStream_t stream, std::int64_t NKV) {
  if (NKV <= 0) NKV = NH;
  if (!shape_ok(B, T, C, NH, NKV)) return cudaErrorInvalidValue;
  switch (kind) {
    case AttentionKernel::simple:
      return simple_forward(y, lse, qkv, B, T, C, NH, NKV, stream);
    case AttentionKernel::tensor_core:
    case AttentionKernel::tensor_core_m64:
    case AttentionKernel::tensor_core_w32:
    case AttentionKernel::tensor_core_atomic:
      if (!aligned16(y) || !aligned16(qkv))
        return simple_forward(y, lse, qkv, B, T, C, NH, NKV, stream);
      if (kind == AttentionKernel::tensor_core || kind == AttentionKernel::tensor_core_atomic)
        return tc_forward<8, 1, 2>(y, lse, qkv, B, T, C, NH, NKV, stream);
      if (kind == AttentionKernel::tensor_core_m64)
        return tc_forward<4, 1, 4>(y, lse, qkv, B, T, C, NH, NKV, stream);
      return tc_forward<4, 2, 2>(y, lse, qkv, B, T, C, NH, NKV, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t attention_backward_with(AttentionKernel kind, bf16* dqkv, void* workspace,
                                    const bf16* dy, const bf16* qkv, const bf16* y,
                                    const float* lse, std::int64_t B, std::int64_t T,
                                    std::int64_t C, std::int64_t NH, cudaStream_t stream,
                                    std::int64_t NKV) {
  if (NKV <= 0) NKV = NH;
  if (!shape_ok(B, T, C, NH, NKV)) return cudaErrorInvalidValue;
  float* delta = static_cast<float*>(workspace);
  switch (kind) {
    case AttentionKernel::simple:
      return simple_backward(dqkv, delta, dy, qkv, y, lse, B, T, C, NH, NKV, stream);
    case AttentionKernel::tensor_core:
    case AttentionKernel::tensor_core_m64:
    case AttentionKernel::tensor_core_w32:
      if (!aligned16(dqkv) || !aligned16(dy) || !aligned16(qkv) || !aligned16(y))
        return simple_backward(dqkv, delta, dy, qkv, y, lse, B, T, C, NH, NKV, stream);
      return tc_backward(dqkv, delta, dy, qkv, y, lse, B, T, C, NH, NKV, stream);
    case AttentionKernel::tensor_core_atomic:
      if (NKV != NH) return cudaErrorInvalidValue;  // kept for comparison, multi-head only
      if (!aligned16(dqkv) || !aligned16(dy) || !aligned16(qkv) || !aligned16(y) ||
          !aligned16(workspace))
        return simple_backward(dqkv, delta, dy, qkv, y, lse, B, T, C, NH, NKV, stream);
      return tc_backward_atomic(dqkv, workspace, dy, qkv, y, lse, B, T, C, NH, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t attention_forward(bf16* y, float* lse, const bf16* qkv, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t NH, cudaStream_t stream,
                              std::int64_t NKV) {
  return attention_forward_with(kDefaultForwardKernel, y, lse, qkv, B, T, C, NH, stream, NKV);
}

cudaError_t attention_backward(bf16* dqkv, void* workspace, const bf16* dy, const bf16* qkv,
                               const bf16* y, const float* lse, std::int64_t B, std::int64_t T,
                               std::int64_t C, std::int64_t NH, cudaStream_t stream,
                               std::int64_t NKV) {
  return attention_backward_with(kDefaultBackwardKernel, dqkv, workspace, dy, qkv, y, lse, B, T, C,
                                 NH, stream, NKV);
}

namespace {

constexpr int kCachedThreads = 128;
constexpr std::int64_t kCachedMaxRows = 8192;
constexpr std::int64_t kCachedMaxHeadSize = 256;

// grid NH, block kCachedThreads: scores of the t + 1 keys (threads over keys), the block's max and
// sum, then the output channels (threads over channels) as p . V.
__global__ void cached_forward_kernel(bf16* y, const bf16* q, const bf16* k_cache,
                                      const bf16* v_cache, int rows, int C, int hs, float scale) {
  extern __shared__ float scores[];
  __shared__ float reduce[kCachedThreads / 32];
  __shared__ float qh[kCachedMaxHeadSize];
  const int h = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) qh[i] = __bfloat162float(q[h * hs + i]);
  __syncthreads();
  float maxv = -INFINITY;
  for (int j = threadIdx.x; j < rows; j += blockDim.x) {
    const bf16* k = k_cache + static_cast<std::int64_t>(j) * C + h * hs;
    float dot = 0.f;
    for (int i = 0; i < hs; ++i) dot += qh[i] * __bfloat162float(k[i]);
    scores[j] = dot * scale;
    maxv = fmaxf(maxv, scores[j]);
  }
  maxv = warp_max(maxv);
  if (lane == 0) reduce[warp] = maxv;
  __syncthreads();
  maxv = reduce[0];
  for (int w = 1; w < kCachedThreads / 32; ++w) maxv = fmaxf(maxv, reduce[w]);
  __syncthreads();
  float sum = 0.f;
  for (int j = threadIdx.x; j < rows; j += blockDim.x) {
    scores[j] = __expf(scores[j] - maxv);
    sum += scores[j];
  }
  sum = warp_sum(sum);
  if (lane == 0) reduce[warp] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < kCachedThreads / 32; ++w) sum += reduce[w];
  const float inv = 1.f / sum;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float o = 0.f;
    for (int j = 0; j < rows; ++j)
      o += scores[j] * __bfloat162float(v_cache[static_cast<std::int64_t>(j) * C + h * hs + i]);
    y[h * hs + i] = __float2bfloat16(o * inv);
  }
}

}  // namespace

cudaError_t attention_cached_forward(bf16* y, const bf16* q, const bf16* k_cache,
                                     const bf16* v_cache, std::int64_t t, std::int64_t C,
                                     std::int64_t NH, cudaStream_t stream) {
  if (NH <= 0 || C <= 0 || C % NH != 0 || C / NH > kCachedMaxHeadSize || t < 0 ||
      t + 1 > kCachedMaxRows)
    return cudaErrorInvalidValue;
  const int hs = static_cast<int>(C / NH), rows = static_cast<int>(t + 1);
  cached_forward_kernel<<<static_cast<unsigned>(NH), kCachedThreads,
                          static_cast<std::size_t>(rows) * sizeof(float), stream>>>(
      y, q, k_cache, v_cache, rows, static_cast<int>(C), hs, 1.f / sqrtf(static_cast<float>(hs)));
  return cudaGetLastError();
}

}  // namespace topolaunch::kernels::cuda
