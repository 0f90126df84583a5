// CUDA side of the case table's MLA prefix expander (see mla_prefix_expander.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dtype_convert.cuh"
#include "harness/mla_prefix_expander.h"

namespace attnkit::harness {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // outputs per 16-byte store
// The latent row is staged in shared memory as f32 (the default 48 KB of dynamic shared memory).
constexpr int kMaxRowWidth = 48 * 1024 / static_cast<int>(sizeof(float));

// a = (a + step) mod r for a < r (step <= 5 here; a loop, as r may be smaller than step).
__device__ __forceinline__ int advance(int a, int step, int r) {
  a += step;
  while (a >= r) a -= r;
  return a;
}

// grid: (n) block: (kThreads), dynamic shared memory: w floats. One token per CTA: its latent row
// is staged once, then every head's k and v rows are written in runs of kVec outputs (16-byte
// stores where the rows allow), the mixed columns advanced per output instead of a division per
// output (the first form, a CTA per (token, head) with two `%` per output, was bound by the
// divisions: ~1 ms per 8192 tokens at 128 heads, 40% of a forward of the MLA prefix benchmarks).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    expand_kernel(const T* latent, T* k, T* v, int w, int r, int dqk, int dv, int h_count) {
  extern __shared__ float xs[];
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < w; c += blockDim.x) xs[c] = cuda::to_float(latent[t * w + c]);
  __syncthreads();
  const int nope = dqk - (w - r);
  const int k_runs = (dqk + kVec - 1) / kVec, v_runs = (dv + kVec - 1) / kVec;
  const int per_head = k_runs + v_runs;
  // 16-byte stores where every run of a row starts 16-byte aligned.
  const bool k_vec = dqk % kVec == 0 && (reinterpret_cast<uintptr_t>(k) & 15) == 0;
  const bool v_vec = dv % kVec == 0 && (reinterpret_cast<uintptr_t>(v) & 15) == 0;
  for (int i = threadIdx.x; i < h_count * per_head; i += blockDim.x) {
    const int h = i / per_head;
    const int run = i - h * per_head;
    const bool is_k = run < k_runs;
    const int d0 = (is_k ? run : run - k_runs) * kVec;
    const int len = min(kVec, (is_k ? dqk : dv) - d0);
    T out[kVec];
    if (is_k) {
      int a = (d0 + 37 * h) % r, b = (3 * d0 + 11 * h + 5) % r;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int d = d0 + e;
        out[e] =
            cuda::from_float<T>(d < nope ? 0.5f * (xs[a] - xs[b]) : xs[r + min(d, dqk - 1) - nope]);
        a = advance(a, 1, r);
        b = advance(b, 3, r);
      }
    } else {
      int a = (5 * d0 + 7 * h + 1) % r, b = (d0 + 101 * h + 64) % r;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        out[e] = cuda::from_float<T>(0.5f * (xs[a] + xs[b]));
        a = advance(a, 5, r);
        b = advance(b, 1, r);
      }
    }
    T* dst = is_k ? k + (t * h_count + h) * dqk + d0 : v + (t * h_count + h) * dv + d0;
    if (len == kVec && (is_k ? k_vec : v_vec)) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
    } else {
      for (int e = 0; e < len; ++e) dst[e] = out[e];
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
