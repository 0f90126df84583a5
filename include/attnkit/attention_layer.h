// Per-layer description handed to every backend call.
#pragma once

#include "attnkit/tensor.h"

namespace attnkit {

enum class AttentionType {
  kDecoder,      // causal over the sequence
  kEncoderOnly,  // bidirectional (encoders, vision towers: the "multimodal" column)
};

struct AttentionLayer {
  int layer_id = 0;
  int num_q_heads = 0;    // per tensor-parallel rank
  int num_kv_heads = 0;   // per rank; MLA: 1
  int qk_head_dim = 0;    // MLA absorbed: kv_lora_rank + qk_rope_head_dim (576)
  int v_head_dim = 0;     // MLA absorbed: kv_lora_rank (512)
  float scaling = 0.f;    // softmax scale, usually 1 / sqrt(qk_head_dim)
  float logit_cap = 0.f;  // soft-cap: cap * tanh(x / cap); 0 = off
  // -1 = off. Key k is visible from query q when q_pos - k_pos <= sliding_window (and k_pos <=
  // q_pos for causal attention): the query sees itself plus `sliding_window` earlier tokens.
  int sliding_window = -1;
  bool is_cross_attention = false;  // keys = the request's encoder tokens (see ForwardBatch)
  AttentionType type = AttentionType::kDecoder;
  // Optional per-q-head logit (f32 [num_q_heads]) that joins the softmax denominator only
  // (gpt-oss style attention sinks). Empty = off.
  TensorView sinks;
  // fp8 KV: stored value = x / scale; k_scale folds into the softmax scale, v_scale into the
  // output.
  float k_scale = 1.f;
  float v_scale = 1.f;
  // MLA: the pool row is [kv_lora_rank | qk_rope_head_dim]; V is its first kv_lora_rank columns.
  bool is_mla = false;
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;

  int gqa_group() const { return num_kv_heads > 0 ? num_q_heads / num_kv_heads : 0; }
};

}  // namespace attnkit
