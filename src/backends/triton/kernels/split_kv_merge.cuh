// Second pass of split-KV decode: merges the per-split partial outputs (normalised) and their
// log2-domain LSEs into the final output, applying sinks and v_scale. Requests that used a single
// split were finished by the attention kernel and are skipped here.
#pragma once

#include <cuda_runtime.h>

#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/attention_variant.cuh"
#include "backends/triton/kernels/split_plan.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::triton {

inline constexpr int kMergeThreads = 128;

// Merges columns [e, e + 8) of q head h of decode token `token` from its num_splits partials
// (read with ld.global.cg: they may come from other CTAs of the same launch) and writes out/lse.
// The split loops are unrolled so that several partials are in flight per thread (a batch-1
// merge is latency-bound, not bandwidth-bound).
template <int kDv, DType kQ>
__device__ __forceinline__ void merge_split_columns(const AttentionParams& p, int token, int h,
                                                    int e, int num_splits) {
  using QT = typename cuda::ActivationType<kQ>::type;
  using cuda::kVecElems;
  const int64_t split_stride = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  const int64_t th = static_cast<int64_t>(token) * p.num_q_heads + h;
  float m = cuda::kNoKeyMax;
#pragma unroll 8
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, __ldcg(p.partial_lse + s * split_stride + th));
  float d = 0.f;
  float o[kVecElems] = {};
#pragma unroll 4
  for (int s = 0; s < num_splits; ++s) {
    const float lse = __ldcg(p.partial_lse + s * split_stride + th);
    // A split whose keys were all invisible has lse -inf: weight exactly 0.
    const float w = lse == -INFINITY ? 0.f : exp2f(lse - m);
    const float4* src =
        reinterpret_cast<const float4*>(p.partial_out + (s * split_stride + th) * kDv + e);
    const float4 a = __ldcg(src), b = __ldcg(src + 1);
    d += w;
    o[0] += w * a.x, o[1] += w * a.y, o[2] += w * a.z, o[3] += w * a.w;
    o[4] += w * b.x, o[5] += w * b.y, o[6] += w * b.z, o[7] += w * b.w;
  }
  const Finalized f = finalize(p, h, m, d);
#pragma unroll
  for (int x = 0; x < kVecElems; ++x) o[x] *= f.inv;
  cuda::store8(static_cast<QT*>(p.out) + token * p.o_stride_token + h * p.o_stride_head + e, o);
  if (e == 0 && p.lse != nullptr) p.lse[token * p.lse_stride_token + h] = f.lse;
}

// grid: (T, ceil(Hq * kDv / 8 / kMergeThreads)) block: (kMergeThreads); decode only (token t is
// request t). One thread merges 8 columns of one head. The SIMT decode's second pass (the
// tensor-core decode merges inside its last split CTA).
template <int kDv, DType kQ>
__global__ void __launch_bounds__(kMergeThreads)
    split_kv_merge_kernel(const __grid_constant__ AttentionParams p) {
  using cuda::kVecElems;
  constexpr int kVecs = kDv / kVecElems;
  const int token = blockIdx.x;
  const int idx = blockIdx.y * kMergeThreads + threadIdx.x;
  if (idx >= p.num_q_heads * kVecs) return;
  const int num_prefix = p.kv_indptr[token + 1] - p.kv_indptr[token];
  const AttentionVariant<false> var = AttentionVariant<false>::make(p, token, num_prefix, 0, 0);
  const int n = max(0, var.hi - var.lo);
  const int num_splits = split_count(n, p.max_splits, forward_min_chunk(p));
  if (num_splits == 1) return;
  merge_split_columns<kDv, kQ>(p, token, idx / kVecs, (idx % kVecs) * kVecElems, num_splits);
}

template <int kDv, DType kQ>
void launch_split_kv_merge(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kVecs = kDv / cuda::kVecElems;
  const dim3 grid(p.num_tokens, (p.num_q_heads * kVecs + kMergeThreads - 1) / kMergeThreads);
  split_kv_merge_kernel<kDv, kQ><<<grid, kMergeThreads, 0, stream>>>(p);
}

}  // namespace attnkit::triton
