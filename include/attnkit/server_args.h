// Server flags relevant to attention, with SGLang's spellings and defaults.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnkit/status.h"

namespace attnkit {

// The largest --speculative-num-steps / --speculative-eagle-topk / --speculative-num-draft-tokens
// taken (resolve refuses more): far past any draft tree a server verifies, and small enough that
// the counts built on them (num_steps + 1 draft tokens at topk 1) cannot overflow.
inline constexpr int kMaxSpeculativeValue = 1024;

struct ServerArgs {
  // --attention-backend / --prefill-attention-backend / --decode-attention-backend
  std::optional<std::string> attention_backend;
  std::optional<std::string> prefill_attention_backend;
  std::optional<std::string> decode_attention_backend;
  // --page-size (SGLang default 1; some backends force their own)
  std::optional<int> page_size;
  // --kv-cache-dtype: auto, bf16, fp16 (alias float16), fp8_e4m3, fp8_e5m2, fp4_e2m1
  std::string kv_cache_dtype = "auto";
  // --disable-cuda-graph
  bool disable_cuda_graph = false;
  // --chunked-prefill-size (-1 = off; SGLang picks per device otherwise)
  std::optional<int> chunked_prefill_size;
  // --speculative-algorithm (EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM) and its knobs
  std::optional<std::string> speculative_algorithm;
  // Each from 1 to kMaxSpeculativeValue.
  std::optional<int> speculative_num_steps;
  std::optional<int> speculative_eagle_topk;
  std::optional<int> speculative_num_draft_tokens;
  // --speculative-attention-mode: prefill (default) or decode
  std::string speculative_attention_mode = "prefill";
  // --linear-attn-backend (unset: triton, SGLang's default; given for a model without linear
  // attention: a warning) and per-phase overrides
  std::optional<std::string> linear_attn_backend;
  std::optional<std::string> linear_attn_decode_backend;
  std::optional<std::string> linear_attn_prefill_backend;
  // --enable-mixed-chunk, --disable-radix-cache
  bool enable_mixed_chunk = false;
  bool disable_radix_cache = false;
  // --tp-size
  int tp_size = 1;
  // --mem-fraction-static etc. are engine concerns and live elsewhere.

  bool speculative_enabled() const { return speculative_algorithm.has_value(); }
};

}  // namespace attnkit
