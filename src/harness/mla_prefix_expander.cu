// CUDA side of the case table's MLA prefix expander (see mla_prefix_expander.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
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

// grid: (n) block: (kThreads), dynamic shared memory: w floats when `staged` (rows of at most
// kMaxRowWidth values; wider ones are read from global memory). One token per CTA: its latent row
// is staged once, then its k row of every head ([H, dqk], contiguous) and its v row ([H, dv]) are
// written with consecutive threads on consecutive outputs (coalesced stores, and the mixed
// columns d + c, 3 d + c, 5 d + c of neighbouring threads fall in different shared-memory banks).
// The first form, a CTA of 128 threads per (token, head) with two `%` per output, took ~1 ms per
// 8192 tokens at 128 heads, 37-42% of a forward of the MLA prefix benchmarks. dqk >= 1 (it holds
// at least one nope column), dv >= 1 (the launcher's checks).
template <typename T, bool kStaged>
__global__ void __launch_bounds__(kThreads)
    expand_kernel(const T* latent, T* k, T* v, int w, int r, int dqk, int dv, int h_count) {
  extern __shared__ float xs[];
  const int64_t t = blockIdx.x;
  const T* row = latent + t * w;
  if constexpr (kStaged) {
    for (int c = threadIdx.x; c < w; c += blockDim.x) xs[c] = cuda::to_float(row[c]);
    __syncthreads();
  }
  const auto x = [&](int c) {
    if constexpr (kStaged) {
      return xs[c];
    } else {
      return cuda::to_float(row[c]);
    }
  };
  const bool pow2 = (r & (r - 1)) == 0;
  const int nope = dqk - (w - r);
  // Output f of the token's k row is (head f / dqk, column f % dqk); both advance by the stride
  // without a division.
  int h = threadIdx.x / dqk, d = threadIdx.x % dqk;
  T* kt = k + t * h_count * dqk;
  for (int f = threadIdx.x; f < h_count * dqk; f += blockDim.x) {
    kt[f] = cuda::from_float<T>(
        d < nope ? 0.5f * (x(mod_r(d + 37 * h, r, pow2)) - x(mod_r(3 * d + 11 * h + 5, r, pow2)))
                 : x(r + d - nope));
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
        0.5f * (x(mod_r(5 * d + 7 * h + 1, r, pow2)) + x(mod_r(d + 101 * h + 64, r, pow2))));
    d += blockDim.x;
    while (d >= dv) {
      d -= dv;
      ++h;
    }
  }
}

template <typename T>
void launch_expand(const TensorView& latent, const TensorView& k, const TensorView& v, int w, int r,
                   int dqk, int dv, int h, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(latent.size(0)));
  if (w <= kMaxRowWidth) {
    expand_kernel<T, true><<<grid, kThreads, static_cast<size_t>(w) * sizeof(float), s>>>(
        latent.data_as<const T>(), k.data_as<T>(), v.data_as<T>(), w, r, dqk, dv, h);
  } else {
    expand_kernel<T, false><<<grid, kThreads, 0, s>>>(latent.data_as<const T>(), k.data_as<T>(),
                                                      v.data_as<T>(), w, r, dqk, dv, h);
  }
}

}  // namespace

Status expand_mla_prefix_for_tests_cuda(const TensorView& latent, const TensorView& k,
                                        const TensorView& v, int kv_lora_rank,
                                        StreamHandle stream) {
  const int64_t n = latent.size(0);
  if (n == 0 || k.size(1) == 0) return Status::ok();
  // One token's outputs are indexed in int (heads x dims); the host side checked the shapes.
  const int64_t per_token = k.size(1) * std::max(k.size(2), v.size(2));
  if (v.size(2) < 1 || latent.size(1) > std::numeric_limits<int>::max() ||
      per_token > std::numeric_limits<int>::max() - kThreads) {
    return Status::unsupported("expand_mla_prefix_for_tests: latent " + latent.describe() + ", k " +
                               k.describe() + ", v " + v.describe() +
                               " (needs v rows of >= 1 value and < 2^31 outputs per token)");
  }
  const int w = static_cast<int>(latent.size(1));
  const int dqk = static_cast<int>(k.size(2)), dv = static_cast<int>(v.size(2));
  const int h = static_cast<int>(k.size(1));
  const cudaStream_t s = cuda::to_stream(stream);
  if (latent.dtype == DType::kBF16) {
    launch_expand<__nv_bfloat16>(latent, k, v, w, kv_lora_rank, dqk, dv, h, s);
  } else if (latent.dtype == DType::kF16) {
    launch_expand<__half>(latent, k, v, w, kv_lora_rank, dqk, dv, h, s);
  } else {
    return Status::unsupported(std::string("expand_mla_prefix_for_tests: dtype ") +
                               dtype_name(latent.dtype) + " (bf16, f16)");
  }
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::harness
