// Online softmax state (running max + running denominator) and the merge of partial states.
//
// Logits are kept in the log2 domain: a kernel multiplies the softmax scale by kLog2e once, so
// every exponential is a single exp2f. The natural-log LSE of a state is (m + log2(d)) / kLog2e.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "core/math_constants.h"

namespace attnkit::cuda {

using attnkit::kLn2;
using attnkit::kLog2e;
// Running max of a state that has seen no key. Finite so that exp2(m_old - m_new) never sees
// (-inf) - (-inf); any real logit is far above it.
inline constexpr float kNoKeyMax = -1e30f;

// Whether a row's softmax denominator (a sum of exponentials: 0 for a row that saw no key) belongs
// to a row with keys. NaN counts (a NaN score, e.g. from a NaN K element): the row's output and
// lse stay NaN, as in the reference, instead of reading as an empty row (0 and -inf) that a merge
// by lse would drop.
__host__ __device__ __forceinline__ bool row_has_keys(float denom) { return !(denom <= 0.f); }

// What normalises a row's accumulators: scale / denom, or 0 for a row without keys (its output is
// then 0); NaN for a NaN denominator (row_has_keys).
__host__ __device__ __forceinline__ float row_inv(float denom, float scale = 1.f) {
  return row_has_keys(denom) ? scale / denom : 0.f;
}

// A row's log-sum-exp from its running maximum m (log2 domain) and denominator: in log2 units
// (m + log2(denom), what the split / cascade merges read) or natural-log units (the lse output);
// -inf for a row without keys, NaN for a NaN denominator.
__host__ __device__ __forceinline__ float row_log2_lse(float m, float denom) {
  return row_has_keys(denom) ? m + log2f(denom) : -INFINITY;
}
__host__ __device__ __forceinline__ float row_ln_lse(float m, float denom) {
  return row_has_keys(denom) ? (m + log2f(denom)) * kLn2 : -INFINITY;
}

// The larger of two lses (or maxima) where a NaN wins (fmaxf returns the other operand): a merge
// whose partials include a NaN row is NaN.
__host__ __device__ __forceinline__ float fmax_keep_nan(float a, float b) {
  return a != a || b != b ? a + b : fmaxf(a, b);
}

// Soft-capped log2-domain logit of a raw q.k dot product: cap * tanh(dot * scale / cap) *
// log2(e), with tanh(t) = 1 - 2 / (e^(2t) + 1): one exp2 and one fast division instead of tanhf's
// longer sequence (keeps the SM80 prefill mainloops within their registers); absolute error
// ~1e-7, saturates to +-1. The clamp is a compare and select, not fminf, so that a NaN dot (a NaN
// K element) stays NaN and poisons its row as in the reference (fminf returned 64: the cap).
// (Device code only: host translation units include this header for the state structs.)
#if defined(__CUDACC__)
__device__ __forceinline__ float soft_capped_log2_logit(float dot, float scale, float cap) {
  const float t = dot * scale / cap;
  const float a = 2.f * kLog2e * t;
  const float e = exp2f(a > 64.f ? 64.f : a);
  return cap * (1.f - __fdividef(2.f, e + 1.f)) * kLog2e;
}
#endif

struct SoftmaxState {
  float m = kNoKeyMax;  // running max of log2-domain logits
  float d = 0.f;        // sum of exp2(logit - m)

  // Raises the running max to include `new_max`; returns the factor to rescale accumulators by.
  __device__ __forceinline__ float rescale_to(float new_max) {
    const float m_new = fmaxf(m, new_max);
    const float factor = exp2f(m - m_new);
    d *= factor;
    m = m_new;
    return factor;
  }
  // Adds one logit already below/at m (after rescale_to); returns its weight.
  __device__ __forceinline__ float add(float logit) {
    const float p = exp2f(logit - m);
    d += p;
    return p;
  }
  __device__ __forceinline__ bool empty() const { return d == 0.f; }
  // Natural-log LSE; -inf when no key was seen.
  __device__ __forceinline__ float lse() const { return row_ln_lse(m, d); }
};

// Merges state b into a: returns (scale_a, scale_b) for the accumulators so that
// acc = acc_a * scale_a + acc_b * scale_b is relative to the merged max.
struct MergeFactors {
  float a, b;
};
__device__ __forceinline__ MergeFactors merge_states(SoftmaxState& a, const SoftmaxState& b) {
  const float m = fmaxf(a.m, b.m);
  const MergeFactors f{exp2f(a.m - m), exp2f(b.m - m)};
  a.d = a.d * f.a + b.d * f.b;
  a.m = m;
  return f;
}

}  // namespace attnkit::cuda
