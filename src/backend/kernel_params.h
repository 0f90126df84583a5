// Fills the fields that the CUDA kernels' parameter structs share (triton::AttentionParams,
// flashinfer::PagedParams, fa3::Fa3Params, the MLA decode params): the q / out / lse addresses
// and strides, the layer's K and V pool buffers, and the batch's page table. A struct that lacks a
// field (e.g. a per-head LSE stride) is simply not given it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"

namespace attnkit::detail {

// out [T, Hq, dv] and, when defined, lse [T, Hq] (fp32).
template <typename Params>
void set_out_params(Params& p, const TensorView& out, const TensorView& lse) {
  p.out = out.data;
  p.o_stride_token = out.stride(0);
  p.o_stride_head = out.stride(1);
  if (lse.defined()) {
    p.lse = lse.data_as<float>();
    p.lse_stride_token = lse.stride(0);
    if constexpr (requires { p.lse_stride_head; }) p.lse_stride_head = lse.stride(1);
  }
}

// q [T, Hq, d], out [T, Hq, dv] and, when defined, lse [T, Hq] (fp32).
template <typename Params>
void set_io_params(Params& p, const TensorView& q, const TensorView& out, const TensorView& lse) {
  p.q = q.data;
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  set_out_params(p, out, lse);
}

// The layer's K and V pool buffers [slots, Hkv, d].
template <typename Params>
void set_kv_pool_params(Params& p, const TensorView& kbuf, const TensorView& vbuf) {
  p.k_pool = kbuf.data;
  p.v_pool = vbuf.data;
  p.k_stride_row = kbuf.stride(0);
  p.k_stride_head = kbuf.stride(1);
  p.v_stride_row = vbuf.stride(0);
  p.v_stride_head = vbuf.stride(1);
}

// The new tokens' K and V inputs [T, Hkv, d], read directly instead of through the pool.
template <typename Params>
void set_new_key_params(Params& p, const TensorView& k, const TensorView& v) {
  p.k_new = k.data;
  p.v_new = v.data;
  p.kn_stride_token = k.stride(0);
  p.kn_stride_head = k.stride(1);
  p.vn_stride_token = v.stride(0);
  p.vn_stride_head = v.stride(1);
}

// req_to_token (read in place as the page table) and the batch's request rows.
template <typename Params>
void set_page_table_params(Params& p, const ForwardBatch& batch) {
  const TensorView table = batch.req_to_token_pool->table();
  p.req_to_token = table.data_as<const int32_t>();
  p.req_to_token_stride = table.stride(0);
  p.req_pool_indices = batch.req_pool_indices.data_as<const int32_t>();
}

// The layer's sliding window as the kernels take it (AttentionLayer::sliding_window): -1 for none;
// otherwise clipped to the page table's row width (the most keys a request can have) and to 2^30.
// validate_forward_inputs refuses windowed layers over requests of more than 2^30 - 2^16 keys, so
// the clip changes no visible key (a window of a request's length or more bounds nothing) and
// keeps the kernels' int32 position arithmetic (q_pos + window + 1, plus a key block) from
// overflowing for every window the API accepts, up to INT32_MAX: unclipped, such a window made
// the CUDA and CPU kernels' bidirectional (encoder-only) rows see no key, and fa3's wgmma kernel
// wait for key blocks it never loaded. E.g. window 2^31 - 1 with a 131072-wide table: 131072.
inline int kernel_sliding_window(int window, const ForwardBatch& batch) {
  if (window < 0) return -1;
  int64_t width = int64_t{1} << 30;
  if (batch.req_to_token_pool != nullptr) {
    width = std::min<int64_t>(width, batch.req_to_token_pool->table().shape[1]);
  }
  return static_cast<int>(std::min<int64_t>(window, width));
}

}  // namespace attnkit::detail
