// GELU (tanh approximation) of gelu.cuh; the CUDA twin of kernels/cpu/gelu.hpp.
#include "gelu.cuh"

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__device__ __forceinline__ float gelu(float v) {
  const float u = kGeluScale * (v + 0.044715f * v * v * v);
  return 0.5f * v * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float v) {
  const float u = kGeluScale * (v + 0.044715f * v * v * v);
  const float th = tanhf(u);
  const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
}

__global__ void gelu_forward_kernel(bf16* y, const bf16* x, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(gelu(__bfloat162float(x[i])));
}
__global__ void gelu_backward_kernel(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    dx[i] = __float2bfloat16(__bfloat162float(dx[i]) +
                             __bfloat162float(dy[i]) * gelu_grad(__bfloat162float(x[i])));
}

// dx = dy * gelu'(x), overwriting dx (see gelu_backward_overwrite): 16-byte packs, and one
// element per thread where n % 8 != 0 or a pointer is unaligned.
__global__ void gelu_backward_overwrite_vec_kernel(Pack8* dx, const Pack8* dy, const Pack8* x,
                                                   std::int64_t n8) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n8) return;
  const Pack8 xi = x[i], di = dy[i];
  Pack8 out;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    out.v[k] = __float2bfloat16(__bfloat162float(di.v[k]) * gelu_grad(__bfloat162float(xi.v[k])));
  dx[i] = out;
}
__global__ void gelu_backward_overwrite_kernel(bf16* dx, const bf16* dy, const bf16* x,
                                               std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dx[i] = __float2bfloat16(__bfloat162float(dy[i]) * gelu_grad(__bfloat162float(x[i])));
}

// GELU (tanh form) through the logistic function: 0.5 (1 + tanh(u)) = sigmoid(2u), so that
// gelu(v) = v sigmoid(2u) and gelu'(v) = s + 2 v s (1 - s) du with s = sigmoid(2u). One __expf
// and one fast division instead of tanhf, and accurate in the tails too (1 + tanh(u) would
// cancel for v << 0). u is clamped at -40, where s is ~1e-35 already: __expf cannot overflow.
__device__ __forceinline__ float gelu_sigmoid(float v) {
  const float u = fmaxf(kGeluScale * (v + 0.044715f * v * v * v), -40.0f);
  return __fdividef(1.0f, 1.0f + __expf(-2.0f * u));
}
__device__ __forceinline__ float gelu_fast(float v) { return v * gelu_sigmoid(v); }
__device__ __forceinline__ float gelu_grad_fast(float v) {
  const float s = gelu_sigmoid(v);
  const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  return s + 2.0f * v * s * (1.0f - s) * du;
}

}  // namespace

void gelu_forward(bf16* y, const bf16* x, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(y) && aligned16(x)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 in = load8_stream(x + i * 8);
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k) out.v[k] = __float2bfloat16(gelu_fast(__bfloat162float(in.v[k])));
      store8(y + i * 8, out);
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
}
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 xi = load8_stream(x + i * 8);
      const Pack8 di = load8_stream(dy + i * 8);
      Pack8 acc = load8(dx + i * 8);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc.v[k] =
            __float2bfloat16(__bfloat162float(acc.v[k]) +
                             __bfloat162float(di.v[k]) * gelu_grad_fast(__bfloat162float(xi.v[k])));
      store8(dx + i * 8, acc);
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dx, dy, x, n);
}

void gelu_backward_overwrite(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n,
                             cudaStream_t stream) {
  if (n % 8 == 0 && aligned16_all({dx, dy, x})) {
    const std::int64_t n8 = n / 8;
    gelu_backward_overwrite_vec_kernel<<<static_cast<unsigned>((n8 + 255) / 256), 256, 0, stream>>>(
        reinterpret_cast<Pack8*>(dx), reinterpret_cast<const Pack8*>(dy),
        reinterpret_cast<const Pack8*>(x), n8);
  } else {
    gelu_backward_overwrite_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        dx, dy, x, n);
  }
}

}  // namespace topolaunch::kernels::cuda
