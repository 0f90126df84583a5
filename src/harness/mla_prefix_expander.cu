// CUDA side of the case table's MLA prefix expander (see mla_prefix_expander.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dtype_convert.cuh"
#include "harness/mla_prefix_expander.h"

namespace attnkit::harness {
namespace {

// grid: (n, H) block: (128)
template <typename T>
__global__ void expand_kernel(const T* latent, T* k, T* v, int w, int r, int dqk, int dv,
                              int h_count) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const T* x = latent + t * w;
  const int nope = dqk - (w - r);
  for (int d = threadIdx.x; d < dqk; d += blockDim.x) {
    const float val = d < nope ? 0.5f * (cuda::to_float(x[(d + 37 * h) % r]) -
                                         cuda::to_float(x[(3 * d + 11 * h + 5) % r]))
                               : cuda::to_float(x[r + d - nope]);
    k[(t * h_count + h) * dqk + d] = cuda::from_float<T>(val);
  }
  for (int d = threadIdx.x; d < dv; d += blockDim.x) {
    const float val = 0.5f * (cuda::to_float(x[(5 * d + 7 * h + 1) % r]) +
                              cuda::to_float(x[(d + 101 * h + 64) % r]));
    v[(t * h_count + h) * dv + d] = cuda::from_float<T>(val);
  }
}

}  // namespace

Status expand_mla_prefix_for_tests_cuda(const TensorView& latent, const TensorView& k,
                                        const TensorView& v, int kv_lora_rank,
                                        StreamHandle stream) {
  const int64_t n = latent.size(0);
  if (n == 0) return Status::ok();
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(k.size(1)));
  const int w = static_cast<int>(latent.size(1));
  const int dqk = static_cast<int>(k.size(2)), dv = static_cast<int>(v.size(2));
  const int h = static_cast<int>(k.size(1));
  const cudaStream_t s = cuda::to_stream(stream);
  if (latent.dtype == DType::kBF16) {
    expand_kernel<__nv_bfloat16>
        <<<grid, 128, 0, s>>>(latent.data_as<const __nv_bfloat16>(), k.data_as<__nv_bfloat16>(),
                              v.data_as<__nv_bfloat16>(), w, kv_lora_rank, dqk, dv, h);
  } else if (latent.dtype == DType::kF16) {
    expand_kernel<__half><<<grid, 128, 0, s>>>(latent.data_as<const __half>(), k.data_as<__half>(),
                                               v.data_as<__half>(), w, kv_lora_rank, dqk, dv, h);
  } else {
    return Status::unsupported(std::string("expand_mla_prefix_for_tests: dtype ") +
                               dtype_name(latent.dtype) + " (bf16, f16)");
  }
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::harness
