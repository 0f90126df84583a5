// Cascade merge kernel of the flashinfer backend: one thread merges 8 columns of one (token, head)
// over the token's shared-prefix partials (pass 1) and its own suffix partials (pass 2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "backends/flashinfer/kernels/cascade_kernels.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::flashinfer {
namespace {

constexpr int kThreads = 128;
constexpr int kVec = 8;

__device__ __forceinline__ void accumulate(const CascadeMergeParams& p, int64_t row, int col,
                                           float mx, float (&acc)[kVec], float* dsum) {
  const float w = exp2f(p.partial_lse[row] - mx);
  if (w == 0.f) return;
  *dsum += w;
  const float4* src = reinterpret_cast<const float4*>(p.partial_out + row * p.head_dim + col);
#pragma unroll
  for (int i = 0; i < kVec / 4; ++i) {
    const float4 v = src[i];
    acc[4 * i] += w * v.x;
    acc[4 * i + 1] += w * v.y;
    acc[4 * i + 2] += w * v.z;
    acc[4 * i + 3] += w * v.w;
  }
}

// grid: (tokens, ceil(Hq / heads per CTA)) block: kThreads
template <typename QT>
__global__ void __launch_bounds__(kThreads) cascade_merge_kernel(const CascadeMergeParams p) {
  const int threads_per_head = p.head_dim / kVec;
  const int heads_per_cta = kThreads / threads_per_head;
  const int head = blockIdx.y * heads_per_cta + static_cast<int>(threadIdx.x) / threads_per_head;
  const int token = blockIdx.x;
  if (token >= p.tokens || head >= p.num_q_heads ||
      static_cast<int>(threadIdx.x) >= heads_per_cta * threads_per_head) {
    return;
  }
  const int col = (static_cast<int>(threadIdx.x) % threads_per_head) * kVec;
  RequestPlan none{};
  const RequestPlan* plan_reqs =
      p.suffix_plan != nullptr
          ? reinterpret_cast<const RequestPlan*>(p.suffix_plan + kPlanHeaderWords)
          : nullptr;
  int request = 0;
  if (plan_reqs != nullptr && p.token_request != nullptr) {
    request = p.token_request[token];
  } else if (plan_reqs != nullptr) {
    // The last request whose tokens start at or before this one (q_start is non-decreasing).
    int lo = 0, hi = p.bs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (plan_reqs[mid].q_start <= token) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    request = lo;
  }
  const RequestPlan& req = plan_reqs != nullptr ? plan_reqs[request] : none;
  const int offset = token - req.q_start;
  // A token outside its request's rows (tokens not laid out in request order): nothing of it.
  if (plan_reqs != nullptr && (offset < 0 || offset >= req.q_len)) return;
  const int suffix_rows = p.suffix_plan != nullptr ? req.reserved[0] : 0;
  // Nothing to merge: a request the split plan left whole (its kernel wrote out / lse itself).
  if (p.prefix_chunks == 0 && suffix_rows == 0) return;
  const auto prefix_row = [&](int c) {
    return (static_cast<int64_t>(c) * p.tokens + token) * p.num_q_heads + head;
  };
  const auto suffix_row = [&](int s) {
    return (static_cast<int64_t>(req.partial_base) + static_cast<int64_t>(s) * req.q_len + offset) *
               p.num_q_heads +
           head;
  };
  float mx = -INFINITY;
  for (int c = 0; c < p.prefix_chunks; ++c)
    mx = cuda::fmax_keep_nan(mx, p.partial_lse[prefix_row(c)]);
  for (int s = 0; s < suffix_rows; ++s) mx = cuda::fmax_keep_nan(mx, p.partial_lse[suffix_row(s)]);
  const float sink = p.sinks != nullptr ? p.sinks[head] * cuda::kLog2e : -INFINITY;
  mx = fmaxf(mx, sink);
  float acc[kVec] = {};
  float dsum = 0.f;
  if (mx != -INFINITY) {
    for (int c = 0; c < p.prefix_chunks; ++c) accumulate(p, prefix_row(c), col, mx, acc, &dsum);
    for (int s = 0; s < suffix_rows; ++s) accumulate(p, suffix_row(s), col, mx, acc, &dsum);
    if (p.sinks != nullptr) dsum += exp2f(sink - mx);
  }
  if (p.merged_partial_out != nullptr) {
    const int64_t row = static_cast<int64_t>(token) * p.num_q_heads + head;
    const float inv = cuda::row_inv(dsum);
    float4* dst = reinterpret_cast<float4*>(p.merged_partial_out + row * p.head_dim + col);
#pragma unroll
    for (int i = 0; i < kVec / 4; ++i) {
      dst[i] = make_float4(acc[4 * i] * inv, acc[4 * i + 1] * inv, acc[4 * i + 2] * inv,
                           acc[4 * i + 3] * inv);
    }
    if (col == 0) p.merged_partial_lse[row] = cuda::row_log2_lse(mx, dsum);
    return;
  }
  const float inv = cuda::row_inv(dsum, p.v_scale);
  QT* dst = static_cast<QT*>(p.out) + token * p.o_stride_token + head * p.o_stride_head + col;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if constexpr (std::is_same_v<QT, __half>) {
      dst[i] = __float2half_rn(acc[i] * inv);
    } else {
      dst[i] = __float2bfloat16_rn(acc[i] * inv);
    }
  }
  if (col == 0 && p.lse != nullptr) {
    p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = cuda::row_ln_lse(mx, dsum);
  }
}

}  // namespace

Status cascade_merge(const CascadeMergeParams& p, DType q_dtype, StreamHandle stream) {
  if (p.head_dim % kVec != 0 || p.head_dim / kVec > kThreads) {
    return Status::unsupported("flashinfer cascade: head_dim " + std::to_string(p.head_dim) +
                               " must be a multiple of 8 and at most 1024");
  }
  if (p.tokens == 0) return Status::ok();
  const int heads_per_cta = kThreads / (p.head_dim / kVec);
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.num_q_heads + heads_per_cta - 1) / heads_per_cta));
  switch (q_dtype) {
    case DType::kBF16:
      cascade_merge_kernel<__nv_bfloat16><<<grid, kThreads, 0, cuda::to_stream(stream)>>>(p);
      break;
    case DType::kF16:
      cascade_merge_kernel<__half><<<grid, kThreads, 0, cuda::to_stream(stream)>>>(p);
      break;
    default:
      return Status::unsupported(std::string("flashinfer cascade: q dtype ") + dtype_name(q_dtype) +
                                 " (bf16, f16)");
  }
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::flashinfer
