// Gather kernel of the MLA chunked prefix cache: one warp per chunk token finds its request,
// reads the token's pool slot from req_to_token and copies the latent row, dequantised and
// rounded to the activation dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "backends/mla/kernels/mla_prefix_gather.h"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::mla {
namespace {

constexpr int kWarps = 4;

template <typename In>
__device__ __forceinline__ float load_in(const In* row, int e) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    return __bfloat162float(row[e]);
  } else if constexpr (std::is_same_v<In, __half>) {
    return __half2float(row[e]);
  } else {
    return static_cast<float>(row[e]);  // __nv_fp8_e4m3 / __nv_fp8_e5m2
  }
}

template <typename Out>
__device__ __forceinline__ Out store_out(float x) {
  if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// grid: (ceil(tokens / kWarps)) block: (32 * kWarps)
template <typename In, typename Out>
__global__ void __launch_bounds__(32 * kWarps) gather_kernel(const PrefixGatherParams p) {
  const int t = blockIdx.x * kWarps + static_cast<int>(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= p.tokens) return;
  int lo = 0, hi = p.bs - 1;
  while (lo < hi) {  // last request whose first chunk token <= t
    const int mid = (lo + hi + 1) / 2;
    if (p.chunk_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int pos = p.chunk_start + (t - p.chunk_indptr[lo]);
  const int64_t slot =
      p.req_to_token[static_cast<int64_t>(p.req_pool_indices[lo]) * p.req_to_token_stride + pos];
  const In* src = static_cast<const In*>(p.pool) + slot * p.pool_stride_row;
  Out* dst = static_cast<Out*>(p.latent) + static_cast<int64_t>(t) * p.width;
  constexpr bool kExact = std::is_same_v<In, Out>;
  for (int e = lane; e < p.width; e += 32) {
    if constexpr (kExact) {
      dst[e] = src[e];
    } else {
      dst[e] = store_out<Out>(load_in(src, e) * p.k_scale);
    }
  }
}

template <typename Out>
Status launch(const PrefixGatherParams& p, DType pool_dtype, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((p.tokens + kWarps - 1) / kWarps));
  switch (pool_dtype) {
    case DType::kBF16:
      gather_kernel<__nv_bfloat16, Out><<<grid, 32 * kWarps, 0, s>>>(p);
      return Status::ok();
    case DType::kF16:
      gather_kernel<__half, Out><<<grid, 32 * kWarps, 0, s>>>(p);
      return Status::ok();
    case DType::kFP8E4M3:
      gather_kernel<__nv_fp8_e4m3, Out><<<grid, 32 * kWarps, 0, s>>>(p);
      return Status::ok();
    case DType::kFP8E5M2:
      gather_kernel<__nv_fp8_e5m2, Out><<<grid, 32 * kWarps, 0, s>>>(p);
      return Status::ok();
    default:
      break;
  }
  return Status::unsupported(std::string("MLA chunked prefix cache: latent pool dtype ") +
                             dtype_name(pool_dtype) +
                             " is not supported (bf16, f16, fp8_e4m3, fp8_e5m2)");
}

}  // namespace

Status gather_prefix_latent(const PrefixGatherParams& p, DType pool_dtype, DType act,
                            StreamHandle stream) {
  if (p.tokens == 0) return Status::ok();
  const cudaStream_t s = cuda::to_stream(stream);
  Status st = Status::ok();
  if (act == DType::kBF16) {
    st = launch<__nv_bfloat16>(p, pool_dtype, s);
  } else if (act == DType::kF16) {
    st = launch<__half>(p, pool_dtype, s);
  } else {
    return Status::unsupported(std::string("MLA chunked prefix cache: activation dtype ") +
                               dtype_name(act) + " is not supported (bf16, f16)");
  }
  ATTNKIT_RETURN_IF_ERROR(st);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::mla
