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
#include "cuda/common/dtype_convert.cuh"

namespace attnkit::mla {
namespace {

constexpr int kWarps = 4;

// Storage tag of fp4_e2m1 pools: two codes per byte (low nibble = even element), one fp8_e4m3
// block scale per kFp4GroupSize values in PrefixGatherParams::scales.
struct Fp4 {};

// bf16 / f16 through the shared conversions, fp8 (__nv_fp8_e4m3 / __nv_fp8_e5m2) by its own.
template <typename In>
__device__ __forceinline__ float load_in(const In* row, int e) {
  if constexpr (std::is_same_v<In, __nv_bfloat16> || std::is_same_v<In, __half>) {
    return cuda::to_float(row[e]);
  } else {
    return static_cast<float>(row[e]);
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
  const int pos = p.chunk_starts[lo] + (t - p.chunk_indptr[lo]);
  const int64_t slot =
      p.req_to_token[static_cast<int64_t>(p.req_pool_indices[lo]) * p.req_to_token_stride + pos];
  Out* dst = static_cast<Out*>(p.latent) + static_cast<int64_t>(t) * p.width;
  if constexpr (std::is_same_v<In, Fp4>) {
    // pool_stride_row counts logical values (two per byte).
    const uint8_t* src = static_cast<const uint8_t*>(p.pool) + slot * p.pool_stride_row / 2;
    const uint8_t* scales = p.scales + slot * p.scale_stride_row;
    constexpr int kNibbleBits = 4;
    constexpr uint32_t kNibbleMask = 0xfu;
    for (int e = lane; e < p.width; e += 32) {
      const uint32_t code =
          (static_cast<uint32_t>(src[e / 2]) >> (kNibbleBits * (e & 1))) & kNibbleMask;
      const float block = cuda::fp8_e4m3_to_float(scales[e / kFp4GroupSize]);
      dst[e] = cuda::from_float<Out>(cuda::fp4_e2m1_to_float(code) * block * p.k_scale);
    }
  } else {
    const In* src = static_cast<const In*>(p.pool) + slot * p.pool_stride_row;
    for (int e = lane; e < p.width; e += 32) {
      if constexpr (std::is_same_v<In, Out>) {
        dst[e] = src[e];
      } else {
        dst[e] = cuda::from_float<Out>(load_in(src, e) * p.k_scale);
      }
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
    case DType::kFP4E2M1:
      if (p.scales == nullptr || p.width % kFp4GroupSize != 0) {
        return Status::invalid_argument(
            "MLA chunked prefix cache: an fp4_e2m1 latent pool needs its block scales and a row "
            "width (" +
            std::to_string(p.width) + ") that is a multiple of " + std::to_string(kFp4GroupSize));
      }
      gather_kernel<Fp4, Out><<<grid, 32 * kWarps, 0, s>>>(p);
      return Status::ok();
    default:
      break;
  }
  return Status::unsupported(std::string("MLA chunked prefix cache: latent pool dtype ") +
                             dtype_name(pool_dtype) +
                             " is not supported (bf16, f16, fp8_e4m3, fp8_e5m2, fp4_e2m1)");
}

}  // namespace

Status gather_prefix_latent(const PrefixGatherParams& p, DType pool_dtype, DType act,
                            StreamHandle stream) {
  if (p.tokens == 0) return Status::ok();
  const cudaStream_t s = cuda::to_stream(stream);
  if (act != DType::kBF16 && act != DType::kF16) {
    return Status::unsupported(std::string("MLA chunked prefix cache: activation dtype ") +
                               dtype_name(act) + " is not supported (bf16, f16)");
  }
  ATTNKIT_RETURN_IF_ERROR(act == DType::kBF16 ? launch<__nv_bfloat16>(p, pool_dtype, s)
                                              : launch<__half>(p, pool_dtype, s));
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::mla
