// widen_e4m3_q_rows (q_widen.h): one CTA per row range (fa3_backend.cpp passes one token each),
// 16 e4m3 bytes in and 16 bf16 out per thread step.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "backends/fa3/kernels/q_widen.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dtype_convert.cuh"

namespace attnkit::fa3 {
namespace {

constexpr int kWidenThreads = 256;
constexpr int kChunk = 16;  // e4m3 bytes per step (one 16-byte load)

__global__ void __launch_bounds__(kWidenThreads)
    widen_e4m3_rows_kernel(const uint8_t* q, int64_t token_stride, int64_t head_stride, int heads,
                           int d, const int32_t* ranges, __nv_bfloat16* out) {
  const int64_t first = ranges[2 * blockIdx.x];
  const int64_t count = ranges[2 * blockIdx.x + 1];
  const int chunks = d / kChunk;
  const int64_t n = count * heads * chunks;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int c = static_cast<int>(i % chunks);
    const int64_t th = i / chunks;
    const int h = static_cast<int>(th % heads);
    const int64_t t = first + th / heads;
    const uint4 raw =
        *reinterpret_cast<const uint4*>(q + t * token_stride + h * head_stride + c * kChunk);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    __align__(16) __nv_bfloat16 wide[kChunk];
#pragma unroll
    for (int b = 0; b < kChunk; ++b) {
      const auto bits = static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4)));
      wide[b] = __float2bfloat16_rn(cuda::fp8_e4m3_to_float(bits));
    }
    uint4* dst = reinterpret_cast<uint4*>(out + (t * heads + h) * d + c * kChunk);
    dst[0] = reinterpret_cast<const uint4*>(wide)[0];
    dst[1] = reinterpret_cast<const uint4*>(wide)[1];
  }
}

}  // namespace

Status widen_e4m3_q_rows(const TensorView& q, const int32_t* ranges, int num_ranges, void* out,
                         StreamHandle stream) {
  if (num_ranges <= 0) return Status::ok();
  if (q.dtype != DType::kFP8E4M3 || q.ndim != 3 || q.stride(2) != 1 || q.size(2) % kChunk != 0 ||
      reinterpret_cast<std::uintptr_t>(q.data) % 16 != 0 || q.stride(0) % 16 != 0 ||
      q.stride(1) % 16 != 0) {
    return Status::internal(
        "fa3: widen_e4m3_q_rows needs an fp8_e4m3 q [tokens, heads, d] with d " +
        std::string("% 16 == 0, innermost stride 1 and 16-byte rows; got ") + q.describe());
  }
  widen_e4m3_rows_kernel<<<num_ranges, kWidenThreads, 0, cuda::to_stream(stream)>>>(
      static_cast<const uint8_t*>(q.data), q.stride(0), q.stride(1), static_cast<int>(q.size(1)),
      static_cast<int>(q.size(2)), ranges, static_cast<__nv_bfloat16*>(out));
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::fa3
