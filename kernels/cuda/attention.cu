// Causal flash attention for attention.cuh (sm_90, head size 64).
//
// Two implementations of the same contract live here:
//  - "simple": CUDA cores only, one thread per query (forward, dQ) or key (dK/dV) row, fp32
//    online softmax, tiles of the other operand in shared memory. Slow but easy to check; it is
//    the fallback when the tensor-core path is not trusted on a machine.
//  - "tensor_core": FA2-style tiles on mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix
//    from XOR-swizzled shared memory filled by cp.async (double buffered), scores pre-scaled by
//    log2(e)/sqrt(hs) so the softmax uses exp2, causal tiles above the diagonal never visited.
// Both backward passes recompute the probabilities from the forward's lse: one kernel computes
// delta = rowsum(dy*y) into the workspace, one walks key blocks (dK, dV), one walks query blocks
// (dQ), so every gradient element has exactly one writer: no atomics, deterministic, and the
// read-add-write of the bf16 dqkv implements the accumulate convention.
#include "attention.cuh"

#include <cmath>

namespace topolaunch::kernels::cuda {

// Which implementation attention_forward/attention_backward use; the test and the benchmark call
// both through the *_with entry points below.
enum class AttentionKernel { simple, tensor_core };
constexpr AttentionKernel kDefaultAttentionKernel = AttentionKernel::simple;

cudaError_t attention_forward_with(AttentionKernel kind, __nv_bfloat16* y, float* lse,
                                   const __nv_bfloat16* qkv, std::int64_t B, std::int64_t T,
                                   std::int64_t C, std::int64_t NH, cudaStream_t stream);
cudaError_t attention_backward_with(AttentionKernel kind, __nv_bfloat16* dqkv, void* workspace,
                                    const __nv_bfloat16* dy, const __nv_bfloat16* qkv,
                                    const __nv_bfloat16* y, const float* lse, std::int64_t B,
                                    std::int64_t T, std::int64_t C, std::int64_t NH,
                                    cudaStream_t stream);

namespace {

using bf16 = __nv_bfloat16;
constexpr int kHeadSize = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shapes every kernel here can index with 32-bit tile counts and 64-bit element offsets.
bool shape_ok(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  return B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0 && C / NH == kHeadSize &&
         B * NH <= 65535 && T <= (std::int64_t{1} << 30);
}

// ---- simple: CUDA cores --------------------------------------------------------------------
constexpr int kSimpleFwdRows = 64;  // queries per block (one thread each) = keys per tile
constexpr int kSimpleBwdRows = 32;  // rows per block in the backward kernels (one warp)

// grid (ceil(T/64), B*NH), block 64. Each thread keeps its query (pre-scaled to log2 units) and
// output row in registers; the block streams K and V tiles through shared memory, read as
// broadcasts (every thread reads the same key at the same time).
__global__ void __launch_bounds__(kSimpleFwdRows)
    simple_forward_kernel(bf16* y, float* lse, const bf16* qkv, int T, int C, int NH,
                          float scale_log2) {
  __shared__ float ks[kSimpleFwdRows][kHeadSize];
  __shared__ float vs[kSimpleFwdRows][kHeadSize];
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int row0 = blockIdx.x * kSimpleFwdRows, t = row0 + threadIdx.x;
  const bool valid = t < T;
  const std::int64_t C3 = 3 * static_cast<std::int64_t>(C);
  const bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
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
      ks[r][c] = j < T ? __bfloat162float(base[j * C3 + C + c]) : 0.f;
      vs[r][c] = j < T ? __bfloat162float(base[j * C3 + 2 * C + c]) : 0.f;
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

// grid (ceil(T/32), B*NH), block 32: thread = key row j. Its k and v rows sit in shared memory
// (padded rows: each thread reads its own row), queries and dy stream through shared memory as
// broadcasts; dk, dv accumulate in registers.
__global__ void __launch_bounds__(kSimpleBwdRows)
    simple_dkdv_kernel(bf16* dqkv, const float* delta, const bf16* dy, const bf16* qkv,
                       const float* lse, int T, int C, int NH, float scale) {
  constexpr int R = kSimpleBwdRows;
  __shared__ float ks[R][kHeadSize + 1], vs[R][kHeadSize + 1];
  __shared__ float qs[R][kHeadSize], dos[R][kHeadSize];
  __shared__ float lse_s[R], delta_s[R];
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int key0 = blockIdx.x * R, j = key0 + threadIdx.x;
  const std::int64_t C3 = 3 * static_cast<std::int64_t>(C);
  const bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
  const bf16* dyb = dy + static_cast<std::int64_t>(b) * T * C + h * kHeadSize;
  for (int e = threadIdx.x; e < R * kHeadSize; e += R) {
    const int r = e / kHeadSize, c = e % kHeadSize, jj = key0 + r;
    ks[r][c] = jj < T ? __bfloat162float(base[jj * C3 + C + c]) : 0.f;
    vs[r][c] = jj < T ? __bfloat162float(base[jj * C3 + 2 * C + c]) : 0.f;
  }
  float dk[kHeadSize], dv[kHeadSize];
#pragma unroll
  for (int i = 0; i < kHeadSize; ++i) dk[i] = dv[i] = 0.f;
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
  if (j >= T) return;
  bf16* dkp = dqkv + (static_cast<std::int64_t>(b) * T + j) * C3 + C + h * kHeadSize;
  bf16* dvp = dkp + C;
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
                     const float* lse, int T, int C, int NH, float scale) {
  constexpr int R = kSimpleBwdRows;
  __shared__ float qs[R][kHeadSize + 1], dos[R][kHeadSize + 1];
  __shared__ float ks[R][kHeadSize], vs[R][kHeadSize];
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int row0 = blockIdx.x * R, i = row0 + threadIdx.x;
  const std::int64_t C3 = 3 * static_cast<std::int64_t>(C);
  const bf16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * kHeadSize;
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
      ks[r][c] = j < T ? __bfloat162float(base[j * C3 + C + c]) : 0.f;
      vs[r][c] = j < T ? __bfloat162float(base[j * C3 + 2 * C + c]) : 0.f;
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
                           std::int64_t C, std::int64_t NH, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((T + kSimpleFwdRows - 1) / kSimpleFwdRows),
                  static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kHeadSize));
  simple_forward_kernel<<<grid, kSimpleFwdRows, 0, stream>>>(
      y, lse, qkv, static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH), scale_log2);
  return cudaGetLastError();
}

cudaError_t simple_backward(bf16* dqkv, float* delta, const bf16* dy, const bf16* qkv,
                            const bf16* y, const float* lse, std::int64_t B, std::int64_t T,
                            std::int64_t C, std::int64_t NH, cudaStream_t stream) {
  const int Ti = static_cast<int>(T), Ci = static_cast<int>(C), NHi = static_cast<int>(NH);
  const std::int64_t rows = B * T * NH;
  simple_delta_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(
      delta, dy, y, static_cast<int>(B), Ti, Ci, NHi);
  const float scale = 1.f / std::sqrt(static_cast<float>(kHeadSize));
  const dim3 grid(static_cast<unsigned>((T + kSimpleBwdRows - 1) / kSimpleBwdRows),
                  static_cast<unsigned>(B * NH));
  simple_dkdv_kernel<<<grid, kSimpleBwdRows, 0, stream>>>(dqkv, delta, dy, qkv, lse, Ti, Ci, NHi,
                                                          scale);
  simple_dq_kernel<<<grid, kSimpleBwdRows, 0, stream>>>(dqkv, delta, dy, qkv, lse, Ti, Ci, NHi,
                                                        scale);
  return cudaGetLastError();
}

}  // namespace

bool attention_supported(std::int64_t C, std::int64_t NH) {
  return C > 0 && NH > 0 && C % NH == 0 && C / NH == kHeadSize;
}

std::size_t attention_backward_workspace_bytes(std::int64_t B, std::int64_t T, std::int64_t C,
                                               std::int64_t NH) {
  (void)C;
  return static_cast<std::size_t>(B * NH * T) * sizeof(float);
}

cudaError_t attention_forward_with(AttentionKernel kind, bf16* y, float* lse, const bf16* qkv,
                                   std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                   cudaStream_t stream) {
  if (!shape_ok(B, T, C, NH)) return cudaErrorInvalidValue;
  switch (kind) {
    case AttentionKernel::simple:
      return simple_forward(y, lse, qkv, B, T, C, NH, stream);
    case AttentionKernel::tensor_core:
      return cudaErrorNotSupported;
  }
  return cudaErrorInvalidValue;
}

cudaError_t attention_backward_with(AttentionKernel kind, bf16* dqkv, void* workspace,
                                    const bf16* dy, const bf16* qkv, const bf16* y,
                                    const float* lse, std::int64_t B, std::int64_t T,
                                    std::int64_t C, std::int64_t NH, cudaStream_t stream) {
  if (!shape_ok(B, T, C, NH)) return cudaErrorInvalidValue;
  float* delta = static_cast<float*>(workspace);
  switch (kind) {
    case AttentionKernel::simple:
      return simple_backward(dqkv, delta, dy, qkv, y, lse, B, T, C, NH, stream);
    case AttentionKernel::tensor_core:
      return cudaErrorNotSupported;
  }
  return cudaErrorInvalidValue;
}

cudaError_t attention_forward(bf16* y, float* lse, const bf16* qkv, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t NH, cudaStream_t stream) {
  return attention_forward_with(kDefaultAttentionKernel, y, lse, qkv, B, T, C, NH, stream);
}

cudaError_t attention_backward(bf16* dqkv, void* workspace, const bf16* dy, const bf16* qkv,
                               const bf16* y, const float* lse, std::int64_t B, std::int64_t T,
                               std::int64_t C, std::int64_t NH, cudaStream_t stream) {
  return attention_backward_with(kDefaultAttentionKernel, dqkv, workspace, dy, qkv, y, lse, B, T, C,
                                 NH, stream);
}

}  // namespace topolaunch::kernels::cuda
