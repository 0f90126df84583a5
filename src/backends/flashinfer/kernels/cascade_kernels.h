// The cascade merge of the flashinfer backend (see backends/flashinfer/cascade.h): host-facing
// entry point, no CUDA types.
#pragma once

#include <cstdint>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/flashinfer/kernels/paged_params.h"

namespace attnkit::flashinfer {

struct CascadeMergeParams {
  // Pass-2 plan (header + [bs] RequestPlan): q_start, q_len, partial_base and, in reserved[0], the
  // request's number of suffix partials. nullptr: no suffix partials (token_request unused).
  const int32_t* suffix_plan = nullptr;
  // [tokens] request of each token; nullptr: found in the plan by q_start (binary search; tokens
  // in request order). A token whose request has no partials (reserved[0] 0, no prefix chunks)
  // is left as it is: a split plan's whole requests write out / lse in the attention kernel.
  const int32_t* token_request = nullptr;
  int bs = 0;
  int tokens = 0;
  int prefix_chunks = 0;  // pass-1 partial rows of token t: c * tokens + t, c < prefix_chunks
  const float* partial_out = nullptr;  // [rows, Hq, D] normalised partial outputs
  const float* partial_lse = nullptr;  // [rows, Hq] log2-domain LSE
  void* out = nullptr;                 // [T, Hq, D] q dtype
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;  // [T, Hq] natural log; nullptr = not requested
  int64_t lse_stride_token = 0, lse_stride_head = 0;
  // Optional f32 result instead of out/lse: [tokens, Hq, D] normalised and [tokens, Hq] log2 LSE
  // (no sink, no v_scale), the layout of one partial row set, so merges can be chained (the MLA
  // chunked prefix cache merges chunk by chunk). It must not overlap the rows read.
  float* merged_partial_out = nullptr;
  float* merged_partial_lse = nullptr;
  const float* sinks = nullptr;  // [Hq]; nullptr = off
  float v_scale = 1.f;
  int num_q_heads = 0;
  int head_dim = 0;  // multiple of 8
};

// The merge's output side from a layer's launch parameters: out / lse and their strides, the
// sinks, v_scale, the q heads and the head dim (the partials and the plan are the caller's).
inline CascadeMergeParams merge_output_params(const PagedParams& p, int head_dim) {
  CascadeMergeParams m;
  m.out = p.out;
  m.o_stride_token = p.o_stride_token;
  m.o_stride_head = p.o_stride_head;
  m.lse = p.lse;
  m.lse_stride_token = p.lse_stride_token;
  m.lse_stride_head = p.lse_stride_head;
  m.sinks = p.sinks;
  m.v_scale = p.v_scale;
  m.num_q_heads = p.num_q_heads;
  m.head_dim = head_dim;
  return m;
}

// out[t] = the LSE-weighted merge of every partial of token t (+ sink, x v_scale).
Status cascade_merge(const CascadeMergeParams& p, DType q_dtype, StreamHandle stream);

}  // namespace attnkit::flashinfer
