// GPU metadata kernels shared by the CUDA backends: token-index flattening, page tables and the
// draft multi-step index generator (speculative decoding with topk > 1).
//
// All of them are asynchronous on `stream`, read lengths from device memory (so they can run in a
// CUDA-graph replay without a host sync) and write into caller-owned buffers. Pointers are device
// pointers; every shape is stated beside the parameter.
#pragma once

#include <cstdint>

#include "attnkit/forward_batch.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::cuda {

// Token-level indices: request b covers req_to_token[req_pool_indices[b], s_b : s_b + len[b]]
// with s_b = start[b] + start_plus[b]. Writes kv_indptr [bs + 1] (exclusive prefix sum of len)
// and kv_indices [kv_indptr[bs]] (slots, back to back). The caller sizes kv_indices for the
// largest total it can produce (e.g. bs * max_context_len). With start = the cached prefix and
// len = the new tokens this is an extend's new-token slots in token order (out_cache_loc as
// req_to_token holds it).
struct TokenIndexArgs {
  const int32_t* req_to_token = nullptr;      // [max_reqs + 1, req_to_token_stride]
  int64_t req_to_token_stride = 0;            // max_context_len
  const int32_t* req_pool_indices = nullptr;  // [bs]
  const int32_t* start = nullptr;             // [bs] first column; nullptr = 0
  const int32_t* start_plus = nullptr;        // [bs] added to start (encoder + prefix); nullptr = 0
  const int32_t* len = nullptr;  // [bs] columns per request; nullptr: len_value for every request
  int32_t len_value = 0;
  int bs = 0;
  int32_t* kv_indptr = nullptr;   // [bs + 1] out; nullptr: not written
  int32_t* kv_indices = nullptr;  // [capacity] out
};
Status build_token_indices(const TokenIndexArgs& args, StreamHandle stream);

// The new tokens' slots of an extend / verify batch, in token order (the slots out_cache_loc
// names, read from the host-checked req_to_token instead): request b's are the columns
// [encoder_b + prefix_b, + new_b) of its row (verify without the extend arrays: [seq_len_b,
// seq_len_b + N)). Writes out [batch.num_tokens]; build_token_indices on the batch's device arrays.
Status build_new_token_slots(const ForwardBatch& batch, int32_t* out, StreamHandle stream);

// Page table of natively paged backends: page_table[b, p] = req_to_token[row_b, p * page_size] /
// page_size for p < ceil(seq_lens[b] / page_size); the rest of the row is 0 (the reserved page).
struct PageTableArgs {
  const int32_t* req_to_token = nullptr;  // [max_reqs + 1, req_to_token_stride]
  int64_t req_to_token_stride = 0;
  const int32_t* req_pool_indices = nullptr;  // [bs]
  const int32_t* seq_lens = nullptr;          // [bs]
  int bs = 0;
  int page_size = 1;
  int max_pages = 0;              // columns of page_table
  int32_t* page_table = nullptr;  // [bs, max_pages] out
};
Status build_page_table(const PageTableArgs& args, StreamHandle stream);

// Draft decode with topk > 1 runs bs * topk rows for each of num_steps steps. Row (b, j) at step
// s attends to the committed tokens req_to_token[row_b, 0:seq_lens[b]] followed by its branch's
// draft tokens out_cache_loc[b, j, 0..s] (s + 1 of them). For every step s this writes
// kv_indptr[s] ([bs * topk + 1]) and kv_indices[s] (rows back to back; capacity per step
// `indices_stride`).
struct DraftIndexArgs {
  const int32_t* req_to_token = nullptr;  // [max_reqs + 1, req_to_token_stride]
  int64_t req_to_token_stride = 0;
  const int32_t* req_pool_indices = nullptr;  // [bs]
  const int32_t* seq_lens = nullptr;          // [bs] committed tokens
  const int64_t* out_cache_loc = nullptr;     // [bs, topk, num_steps] draft slots
  int bs = 0;
  int topk = 1;
  int num_steps = 1;
  int32_t* kv_indptr = nullptr;   // [num_steps, bs * topk + 1] out
  int32_t* kv_indices = nullptr;  // [num_steps, indices_stride] out
  int64_t indices_stride = 0;
};
Status build_draft_decode_indices(const DraftIndexArgs& args, StreamHandle stream);

}  // namespace attnkit::cuda
