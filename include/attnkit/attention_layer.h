// Per-layer description handed to every backend call.
#pragma once

#include <functional>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

enum class AttentionType {
  kDecoder,      // causal over the sequence
  kEncoderOnly,  // bidirectional (encoders, vision towers: the "multimodal" column); extend,
                 // mixed and decode batches only (target_verify / draft_extend refuse it)
};

// MLA chunked prefix cache (DESIGN.md section 4): how a non-absorbed MLA prefill layer (e.g. qk
// 192 / v 128) reads its cached prefix. The pool holds the prefix only as latent rows
// [kv_lora_rank | qk_rope_head_dim]; the backend gathers at most `chunk_tokens` of them (over the
// whole batch) at a time, `expand` decompresses them into per-head keys/values (the model's
// kv_b_proj + the shared rope part), the new tokens attend each chunk without a mask and the
// partial results are merged by LSE with the new tokens' causal self-attention. No temporary is
// proportional to the whole prefix.
struct MlaPrefixDecompressor {
  // >= 1: prefix tokens (all requests together) decompressed per chunk; the backend plans the
  // chunks once per forward for BackendContext::mla_prefix_chunk_tokens, which must equal it.
  int chunk_tokens = 0;
  // latent [n, kv_lora_rank + qk_rope_head_dim] in q's dtype (fp8 pools dequantised with
  // k_scale) -> k [n, num_q_heads, qk_head_dim], v [n, num_q_heads, v_head_dim] in q's dtype,
  // all contiguous on the backend's device, enqueued on `stream` (host tensors for CPU backends).
  std::function<Status(const TensorView& latent, const TensorView& k, const TensorView& v,
                       StreamHandle stream)>
      expand;
};

struct AttentionLayer {
  int layer_id = 0;
  int num_q_heads = 0;    // per tensor-parallel rank
  int num_kv_heads = 0;   // per rank; MLA: 1
  int qk_head_dim = 0;    // MLA absorbed: kv_lora_rank + qk_rope_head_dim (576)
  int v_head_dim = 0;     // MLA absorbed: kv_lora_rank (512)
  float scaling = 0.f;    // softmax scale, usually 1 / sqrt(qk_head_dim)
  float logit_cap = 0.f;  // soft-cap: cap * tanh(x / cap); 0 = off
  // -1 = off. Key k is visible from query q when q_pos - k_pos <= sliding_window and k_pos <=
  // q_pos (causal attention: the query sees itself plus `sliding_window` earlier tokens), or,
  // without the causal mask (encoder-only layers), when |q_pos - k_pos| <= sliding_window.
  int sliding_window = -1;
  bool is_cross_attention = false;  // keys = the request's encoder tokens (see ForwardBatch)
  AttentionType type = AttentionType::kDecoder;
  // Optional per-q-head logit (f32 [num_q_heads]) that joins the softmax denominator only
  // (gpt-oss style attention sinks). Empty = off. Each is finite, or -inf for no sink on that
  // head; +inf / NaN are refused (validate_forward_inputs reads host sinks, not device ones).
  TensorView sinks;
  // fp8 KV: stored value = x / scale; k_scale folds into the softmax scale, v_scale into the
  // output.
  float k_scale = 1.f;
  float v_scale = 1.f;
  // fp8_e4m3 q (stored value = x / q_scale, one scale for the layer's whole q): folded into the
  // softmax scale. Only backends that take e4m3 q read it (fa3's SM90 FP8 prefill: an
  // fp8_e4m3 pool, head dim 128; out, k and v stay in the context's q_dtype); every other
  // backend refuses an e4m3 q. A bf16 / f16 / f32 q does not use it, but it must still be finite
  // and > 0 (as k_scale must be over a pool that is not quantised).
  float q_scale = 1.f;
  // MLA: the pool row is [kv_lora_rank | qk_rope_head_dim]; V is its first kv_lora_rank columns.
  bool is_mla = false;
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  // MLA non-absorbed layers only: when set, the new tokens also attend their cached prefix
  // (extend_prefix_lens) through the chunked prefix cache above; needs a backend whose MLA row has
  // "chunked prefix cache". nullptr: the new tokens attend only each other (an extend or
  // draft-extend batch; decode, mixed and target_verify batches refuse a non-absorbed layer, whose
  // cached history only the absorbed layer reads).
  const MlaPrefixDecompressor* mla_prefix = nullptr;

  int gqa_group() const { return num_kv_heads > 0 ? num_q_heads / num_kv_heads : 0; }
};

}  // namespace attnkit
