// What one forward pass asks of the attention layer.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"

namespace attnkit {

enum class ForwardMode {
  kExtend,        // prefill, possibly after a cached prefix
  kDecode,        // one new token per request
  kMixed,         // chunked prefill + decode in one batch (decode rows are extends of 1 token)
  kIdle,          // no work on this rank
  kTargetVerify,  // speculative decoding: verify N draft tokens per request
  kDraftExtend,   // speculative decoding: extend the draft model
};

const char* forward_mode_name(ForwardMode mode);
inline bool is_extend(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kTargetVerify ||
         m == ForwardMode::kDraftExtend;
}
inline bool is_decode(ForwardMode m) { return m == ForwardMode::kDecode; }

// Speculative-decoding inputs (TARGET_VERIFY / DRAFT_EXTEND / draft decode).
struct SpecInfo {
  int draft_token_num = 0;  // N draft tokens per request in TARGET_VERIFY
  int topk = 1;  // 1 = chain (plain causal over drafts works); > 1 = tree, needs the mask
  int num_steps = 0;
  // uint8 flat buffer; request r's block is row-major [N, prefix_r + N] starting at
  // mask_indptr[r]: prefix columns all 1, draft columns hold the tree ancestry (including self).
  // The prefix columns are a contract, not a mask: kernels may read only the draft columns (the
  // flashinfer / fa3 verify does), so a 0 there is not honoured everywhere.
  TensorView custom_mask;
  TensorView mask_indptr;                 // int64 [bs + 1]
  std::vector<int64_t> mask_indptr_host;  // host copy
};

// Tensors live on the backend's device (host memory for CPU backends). Host copies of the length
// arrays sit beside them so planning never needs a device->host copy; where given, a host copy
// must hold exactly the values of its tensor (validate() cannot check the device side). Backends
// plan from either: e.g. the MLA decode engine schedules on the device from seq_lens but decides
// on the host from seq_lens_host whether any request is split, so stale host lengths would leave
// a split request uncombined (silently wrong output).
struct ForwardBatch {
  ForwardMode mode = ForwardMode::kExtend;
  int batch_size = 0;
  int num_tokens = 0;  // T: total new tokens (decode: batch_size; verify: bs * N)

  TensorView req_pool_indices;  // int32 [bs]: row of each request in req_to_token
  TensorView seq_lens;          // int32 [bs]: total length incl. new tokens (verify: prefix only)
  // int64 [T]: pool slots of the new tokens, where save_kv writes their k / v. The attention
  // kernels read every key, new tokens included, through req_to_token, so before
  // init_forward_metadata (and before a graph replay's refresh) each request's row must already
  // hold these slots after its prefix (columns [encoder + prefix, + new); verify: the drafts at
  // [seq_len, seq_len + N)), as SGLang's scheduler writes them. req_to_token is checked against
  // the KV pool there; out_cache_loc is checked against those columns by validate() where it is in
  // host memory (CPU pools), and by set_kv against the pool (a bad slot is not written).
  TensorView out_cache_loc;
  TensorView positions;  // int64 [T]
  // Extend only.
  TensorView extend_prefix_lens;  // int32 [bs]
  TensorView extend_seq_lens;     // int32 [bs]: new tokens per request
  TensorView extend_start_loc;    // int32 [bs]: offset of request r's first new token in [0, T)
  // Encoder-decoder: request r's row of req_to_token starts with encoder_lens[r] encoder tokens;
  // self-attention covers the tokens after them, cross-attention the encoder tokens.
  TensorView encoder_lens;  // int32 [bs]; empty = no encoder

  std::vector<int32_t> req_pool_indices_host;
  std::vector<int32_t> seq_lens_host;
  std::vector<int32_t> extend_prefix_lens_host;
  std::vector<int32_t> extend_seq_lens_host;
  std::vector<int32_t> extend_start_loc_host;
  std::vector<int32_t> encoder_lens_host;
  int64_t seq_lens_sum = 0;

  ReqToTokenPool* req_to_token_pool = nullptr;
  KVPool* kv_pool = nullptr;
  bool has_spec = false;
  SpecInfo spec;
  StreamHandle stream = nullptr;

  // Validates internal consistency (sizes, sums, lengths vs pool capacity); names the field.
  Status validate() const;
};

}  // namespace attnkit
