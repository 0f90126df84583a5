// Feature hooks of the triton kernels: which keys a query sees (causal, bidirectional, sliding
// window, verify tree mask), how a dot product becomes a log2-domain logit (scale with k_scale
// folded in, soft-cap), and how the final state becomes the output (sinks, v_scale, LSE).
//
// kExtend = false is the decode variant: one query per request at the last position, all pool
// keys visible except those left of the window, no mask.
#pragma once

#include <cuda_runtime.h>

#include "backends/triton/kernels/attention_params.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::triton {

template <bool kExtend>
struct AttentionVariant {
  int lo = 0;                         // first visible key
  int hi = 0;                         // one past the last visible key
  const uint8_t* mask_row = nullptr;  // [num_prefix + num_new] verify mask row, or nullptr
  float scale_log2 = 0.f;             // sm_scale * log2(e)
  float sm_scale = 0.f;
  float cap = 0.f;

  // Query qi of request b with num_prefix pool keys and num_new new keys.
  __device__ __forceinline__ static AttentionVariant make(const AttentionParams& p, int b,
                                                          int num_prefix, int num_new, int qi) {
    AttentionVariant v;
    v.sm_scale = p.sm_scale;
    v.scale_log2 = p.sm_scale * cuda::kLog2e;
    v.cap = p.logit_cap;
    const int total = num_prefix + num_new;
    v.hi = total;
    if constexpr (!kExtend) {
      const int q_pos = num_prefix - 1;
      if (p.causal && p.sliding_window >= 0) v.lo = max(0, q_pos - p.sliding_window);
    } else {
      const int q_pos = num_prefix + qi;
      if (p.custom_mask != nullptr) {
        v.mask_row = p.custom_mask + p.mask_indptr[b] + static_cast<int64_t>(qi) * total;
      } else if (p.causal) {
        v.hi = min(total, q_pos + 1);
      }
      if (p.sliding_window >= 0) {
        v.lo = max(0, q_pos - p.sliding_window);
        if (!p.causal) v.hi = min(v.hi, q_pos + p.sliding_window + 1);
      }
    }
    return v;
  }

  __device__ __forceinline__ bool key_visible(int j) const {
    if constexpr (kExtend) {
      if (mask_row != nullptr && mask_row[j] == 0) return false;
    }
    return true;
  }

  // Log2-domain logit of a raw q.k dot product (k dequantised without k_scale).
  __device__ __forceinline__ float logit(float dot) const {
    if (cap > 0.f) return cap * tanhf(dot * sm_scale / cap) * cuda::kLog2e;
    return dot * scale_log2;
  }
};

// Final output of one (token, q head) from its merged state: m (log2 max), d (denominator
// relative to m) and o (sum of p * v relative to m, 8 values starting at element e).
struct Finalized {
  float inv;  // multiply o by this (includes v_scale and the sink's share of the denominator)
  float lse;  // natural log
};
__device__ __forceinline__ Finalized finalize(const AttentionParams& p, int q_head, float m,
                                              float d) {
  const bool has_sink = p.sinks != nullptr;
  const float sink_log2 = has_sink ? p.sinks[q_head] * cuda::kLog2e : 0.f;
  if (d == 0.f) {  // no visible key
    return {0.f, has_sink ? p.sinks[q_head] : -INFINITY};
  }
  float denom = d;
  if (has_sink) denom += exp2f(sink_log2 - m);
  return {p.v_scale / denom, (m + log2f(denom)) * cuda::kLn2};
}

}  // namespace attnkit::triton
