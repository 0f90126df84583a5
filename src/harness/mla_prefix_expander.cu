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

constexpr int kThreads = 256;
// The latent row is staged in shared memory as f32 (the default 48 KB of dynamic shared memory).
constexpr int kMaxRowWidth = 48 * 1024 / static_cast<int>(sizeof(float));

// c mod r for c >= 0: a mask where r is a power of two (every case file's kv_lora_rank), else a
// division.
__device__ __forceinline__ int mod_r(int c, int r, bool pow2) { return pow2 ? c & (r - 1) : c % r; }

// grid: (n) block: (kThreads), dynamic shared memory: w floats. One token per CTA: its latent row
// is staged once, then its k row of every head ([H, dqk], contiguous) and its v row ([H, dv]) are
// written with consecutive threads on consecutive outputs (coalesced stores, and the mixed
// columns d + c, 3 d + c, 5 d + c of neighbouring threads fall in different shared-memory banks).
// The first form, a CTA of 128 threads per (token, head) with two `%` per output, took ~1 ms per
// 8192 tokens at 128 heads, 37-42% of a forward of the MLA prefix benchmarks.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    expand_kernel(const T* latent, T* k, T* v, int w, int r, int dqk, int dv, int h_count) {
  extern __shared__ float xs[];
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < w; c += blockDim.x) xs[c] = cuda::to_float(latent[t * w + c]);
  __syncthreads();
  const bool pow2 = (r & (r - 1)) == 0;
  const int nope = dqk - (w - r);
  // Output f of the token's k row is (head f / dqk, column f % dqk); both advance by the stride
  // without a division.
  int h = threadIdx.x / dqk, d = threadIdx.x % dqk;
  T* kt = k + t * h_count * dqk;
  for (int f = threadIdx.x; f < h_count * dqk; f += blockDim.x) {
    kt[f] = cuda::from_float<T>(
        d < nope ? 0.5f * (xs[mod_r(d + 37 * h, r, pow2)] - xs[mod_r(3 * d + 11 * h + 5, r, pow2)])
                 : xs[r + d - nope]);
    d += blockDim.x;
    while (d >= dqk) {
      d -= dqk;
      ++h;
    }
  }
  h = threadIdx.x / dv;
  d = threadIdx.x % dv;
  T* vt = v + t * h_count * dv;
  for (int f = threadIdx.x; f < h_count * dv; f += blockDim.x) {
    vt[f] = cuda::from_float<T>(
        0.5f * (xs[mod_r(5 * d + 7 * h + 1, r, pow2)] + xs[mod_r(d + 101 * h + 64, r, pow2)]));
    d += blockDim.x;
    while (d >= dv) {
      d -= dv;
      ++h;
    }
  }
}

}  // namespace

Status expand_mla_prefix_for_tests_cuda(const TensorView& latent, const TensorView& k,
                                        const TensorView& v, int kv_lora_rank,
                                        StreamHandle stream) {
  const int64_t n = latent.size(0);
  if (n == 0) return Status::ok();
  const dim3 grid(static_cast<unsigned>(n));
  const int w = static_cast<int>(latent.size(1));
  if (w > kMaxRowWidth) {
    return Status::unsupported("expand_mla_prefix_for_tests: latent rows of " + std::to_string(w) +
                               " values (at most " + std::to_string(kMaxRowWidth) + ")");
  }
  const size_t smem = static_cast<size_t>(w) * sizeof(float);
  const int dqk = static_cast<int>(k.size(2)), dv = static_cast<int>(v.size(2));
  const int h = static_cast<int>(k.size(1));
  const cudaStream_t s = cuda::to_stream(stream);
  if (latent.dtype == DType::kBF16) {
    expand_kernel<__nv_bfloat16><<<grid, kThreads, smem, s>>>(
        latent.data_as<const __nv_bfloat16>(), k.data_as<__nv_bfloat16>(),
        v.data_as<__nv_bfloat16>(), w, kv_lora_rank, dqk, dv, h);
  } else if (latent.dtype == DType::kF16) {
    expand_kernel<__half><<<grid, kThreads, smem, s>>>(latent.data_as<const __half>(),
                                                       k.data_as<__half>(), v.data_as<__half>(), w,
                                                       kv_lora_rank, dqk, dv, h);
  } else {
    return Status::unsupported(std::string("expand_mla_prefix_for_tests: dtype ") +
                               dtype_name(latent.dtype) + " (bf16, f16)");
  }
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::harness
