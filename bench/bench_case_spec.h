// The shared harness's CaseSpec for a benchmark point: what `attnkit bench` prepares and times
// (bench_runner.cpp), header-only so that tests/unit can check what reaches the forward.
#pragma once

#include <cstddef>

#include "bench_formulas.h"
#include "harness/case_runner.h"

namespace attnkit::bench {

// Uniform lengths (or kv_lens / prefix_lens / new_lens), an extend's mode (kMixed), shuffled pages
// unless the point says otherwise, seed 0; an extend point's window, soft-cap and sinks; a decode
// point's verify drafts (s_q > 1, topk); MLA decode's absorbed shape.
inline harness::CaseSpec to_case_spec(const BenchCase& c) {
  const bool extend = c.kind == BenchKind::kExtend;
  // Decode: kv_len - 1 cached tokens plus the new one.
  const int prefix = extend ? c.prefix_len : c.kv_len - 1;
  const int new_len = extend ? c.new_tokens : 1;
  harness::CaseSpec spec = harness::make_uniform_case(
      c.name, extend ? ForwardMode::kExtend : ForwardMode::kDecode, c.batch, prefix, new_len,
      c.q_heads, c.kv_heads, c.head_dim, c.page_size, c.dtype, c.kv_dtype);
  spec.v_head_dim = c.v_head_dim;
  spec.shared_prefix = c.shared_prefix;
  spec.shuffle_pages = c.shuffle_pages;
  if (extend && !c.causal) spec.type = AttentionType::kEncoderOnly;
  spec.fp8_q = extend && c.fp8_q;
  if (extend) {
    spec.sliding_window = c.sliding_window;
    spec.logit_cap = c.logit_cap;
    spec.sinks = c.sinks;
  }
  if (!extend && c.s_q > 1) {  // verify: the drafts are the last s_q of kv_len keys
    spec.mode = ForwardMode::kTargetVerify;
    spec.prefix_lens.assign(static_cast<size_t>(c.batch), c.kv_len - c.s_q);
    spec.new_lens.clear();
    spec.spec_draft_tokens = c.s_q;
    spec.spec_topk = c.topk;
  }
  if (extend && c.mla_prefill) {  // the non-absorbed layer over its new tokens' k / v
    spec.mla = true;
    spec.num_kv_heads = c.q_heads;
    spec.kv_lora_rank = c.kv_lora_rank;
    spec.qk_rope_head_dim = c.qk_rope_head_dim;
    spec.mla_prefix_chunk = c.mla_prefix_chunk;
  }
  if (c.kind == BenchKind::kMlaDecode) {
    spec.mla = true;
    spec.num_kv_heads = 1;
    spec.kv_lora_rank = c.kv_lora_rank;
    spec.qk_rope_head_dim = c.qk_rope_head_dim;
    spec.head_dim = c.kv_lora_rank + c.qk_rope_head_dim;
    spec.v_head_dim = c.kv_lora_rank;
  }
  if (extend && !c.prefix_lens.empty()) {  // uneven batch: each request's own cached prefix
    spec.prefix_lens.assign(c.prefix_lens.begin(), c.prefix_lens.end());
    spec.new_lens.assign(c.prefix_lens.size(), c.new_tokens);
  }
  if (extend && !c.new_lens.empty()) {  // uneven batch: each request's own new tokens
    spec.prefix_lens.resize(c.new_lens.size(), c.prefix_len);
    spec.new_lens.assign(c.new_lens.begin(), c.new_lens.end());
  }
  if (extend && c.mixed) spec.mode = ForwardMode::kMixed;
  if (!c.kv_lens.empty()) {  // uneven batch: each request's own length, same new-token rule
    const int fresh = c.s_q;
    spec.prefix_lens.resize(c.kv_lens.size());
    for (size_t r = 0; r < c.kv_lens.size(); ++r) spec.prefix_lens[r] = c.kv_lens[r] - fresh;
    if (!spec.new_lens.empty()) spec.new_lens.assign(c.kv_lens.size(), fresh);
  }
  return spec;
}

}  // namespace attnkit::bench
