// The residual add of residual.cuh; the CUDA twin of kernels/cpu/residual.hpp.
#include "residual.cuh"

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

// y = a + b, one element per thread (the 16-byte path is residual_forward's elementwise8_kernel).
__global__ void residual_forward_kernel(bf16* y, const bf16* a, const bf16* b, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// da += dy, db += dy, one element per thread (also when da == db: both branches add).
__global__ void residual_backward_kernel(bf16* da, bf16* db, const bf16* dy, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float d = __bfloat162float(dy[i]);
    da[i] = __float2bfloat16(__bfloat162float(da[i]) + d);
    db[i] = __float2bfloat16(__bfloat162float(db[i]) + d);
  }
}

// The same with 16-byte packs (da != db, checked by the host).
__global__ void residual_backward_vec_kernel(bf16* da, bf16* db, const bf16* dy, std::int64_t n8) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n8) return;
  const Pack8 d = load8_stream(dy + i * 8);
  Pack8 a = load8(da + i * 8), b = load8(db + i * 8);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float f = __bfloat162float(d.v[j]);
    a.v[j] = __float2bfloat16(__bfloat162float(a.v[j]) + f);
    b.v[j] = __float2bfloat16(__bfloat162float(b.v[j]) + f);
  }
  store8(da + i * 8, a);
  store8(db + i * 8, b);
}

}  // namespace

void residual_forward(bf16* y, const bf16* a, const bf16* b, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(y) && aligned16(a) && aligned16(b)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 ai = load8(a + i * 8);
      const Pack8 bi = load8(b + i * 8);
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        out.v[k] = __float2bfloat16(__bfloat162float(ai.v[k]) + __bfloat162float(bi.v[k]));
      store8(y + i * 8, out);
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  residual_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, a, b, n);
}
void residual_backward(bf16* da, bf16* db, const bf16* dy, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && da != db && aligned16_all({da, db, dy})) {
    residual_backward_vec_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(da, db, dy, n / 8);
    return;
  }
  residual_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(da, db, dy, n);
}

}  // namespace topolaunch::kernels::cuda
