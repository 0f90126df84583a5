// Attention-relevant facts about a model, parsed from a Hugging Face config.json.
//
// Covered families: Llama, Mistral, Qwen2/2.5/3 (+ VL, + 1M dual-chunk), Qwen3-Next (GDN hybrid),
// Gemma-2/3, DeepSeek-V2/V3/R1 (MLA) and V3.2 (MLA + NSA indexer), gpt-oss (sinks), Whisper
// (encoder-decoder) and vision-language models that nest the language model under "text_config"
// (Gemma-3, Llama-3.2-Vision, LLaVA-style).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/status.h"

namespace attnkit {

enum class LayerKind { kFullAttention, kSlidingAttention, kLinearAttention };

// "full_attention", "sliding_attention", "linear_attention" (the Hugging Face layer_types names).
const char* layer_kind_name(LayerKind kind);

struct ModelAttentionConfig {
  std::string model_type;  // config.json "model_type" ("llama", "deepseek_v3", "gemma3", ...)
  // text_config "model_type" when the file nests one ("gemma3_text"), else model_type.
  std::string text_model_type;
  std::vector<std::string> architectures;  // config.json "architectures"
  int num_layers = 0;                      // decoder layers (Whisper: decoder_layers)
  int hidden_size = 0;
  int num_attention_heads = 0;
  // As written in config.json (defaults to num_attention_heads). MLA models keep the logical value
  // (DeepSeek-V3: 128); their KV pool nevertheless holds one latent head.
  int num_key_value_heads = 0;
  int head_dim = 0;  // qk head dim (MHA); MLA: qk_nope_head_dim + qk_rope_head_dim
  int v_head_dim = 0;
  DType dtype = DType::kBF16;       // torch_dtype (or "dtype"); bf16 when absent
  int max_position_embeddings = 0;  // 0 = not given
  // RoPE: rope_theta and the rope_scaling block ("" type = none). Only the parts that change the
  // attention kernels' inputs are kept (the YaRN mscale changes the MLA softmax scale).
  double rope_theta = 0.0;
  std::string rope_scaling_type;  // "llama3", "yarn", "linear", "mrope", ...
  double rope_scaling_factor = 0.0;
  double rope_mscale_all_dim = 0.0;  // DeepSeek YaRN; 0 = absent
  // Sliding window as written in config.json (Hugging Face meaning: a query sees itself and the
  // sliding_window - 1 tokens before it). -1 = no layer uses a window. layer_kinds says which
  // layers use it; attention_window_left() converts it to AttentionLayer::sliding_window.
  int sliding_window = -1;
  std::vector<LayerKind> layer_kinds;  // size num_layers
  float attn_logit_softcapping = 0.f;  // Gemma-2: cap * tanh(x / cap); 0 = off
  float final_logit_softcapping = 0.f;
  float query_pre_attn_scalar = 0.f;  // Gemma: scaling = query_pre_attn_scalar^-0.5 when set
  bool has_attention_sinks = false;   // gpt-oss style per-head sink logits
  // MLA (DeepSeek-V2/V3)
  bool is_mla = false;
  int kv_lora_rank = 0;
  int q_lora_rank = 0;  // 0 = queries are not low-rank (DeepSeek-V2-Lite)
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  // DeepSeek-V3.2 sparse attention (NSA) lightning indexer; index_topk 0 = none
  int index_topk = 0;
  int index_head_dim = 0;
  int index_n_heads = 0;
  // Linear attention (Qwen3-Next GDN hybrids)
  bool has_linear_attention = false;
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;
  // Dual-chunk attention (Qwen2.5-1M): dual_chunk_attention_config
  bool has_dual_chunk_attention = false;
  int dual_chunk_size = 0;
  int dual_chunk_local_size = 0;
  int dual_chunk_original_max_position_embeddings = 0;  // 0 = not given
  // Encoder-decoder (Whisper). Every decoder layer runs causal self-attention and then
  // cross-attention over the encoder output; the encoder runs bidirectional self-attention.
  bool is_encoder_decoder = false;
  int encoder_layers = 0;
  int encoder_attention_heads = 0;
  int encoder_head_dim = 0;
  int encoder_max_position_embeddings = 0;  // Whisper: max_source_positions (1500 audio frames)
  // Multimodal: a vision tower (vision_config) with bidirectional attention. The vision numbers are
  // 0 where the vision_config does not state them.
  bool is_multimodal = false;
  int vision_num_layers = 0;
  int vision_num_attention_heads = 0;
  int vision_head_dim = 0;
  // Decoder layers whose attention is cross-attention to the image tokens instead of
  // self-attention (Llama-3.2-Vision "cross_attention_layers"); sorted, each < num_layers.
  std::vector<int> cross_attention_layers;

  bool is_deepseek_v3_family() const;  // DeepSeek V3 / R1 architectures (not V3.2)
  bool is_deepseek_v32() const { return is_mla && index_topk > 0; }
  // 1/sqrt(head_dim); Gemma: query_pre_attn_scalar^-0.5; MLA with YaRN: times mscale^2 where
  // mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (DeepSeek-V3: 192^-0.5 * 1.3689^2 = 0.1352).
  float default_scaling() const;
  // The AttentionLayer::sliding_window value for sliding layers (q_pos - k_pos <= window):
  // sliding_window - 1, or -1 when the model has no window (Mistral 4096 -> 4095).
  int attention_window_left() const { return sliding_window > 0 ? sliding_window - 1 : -1; }
  // MLA latent KV row width: kv_lora_rank + qk_rope_head_dim (DeepSeek: 512 + 64 = 576); 0 if not
  // MLA.
  int mla_kv_cache_dim() const { return is_mla ? kv_lora_rank + qk_rope_head_dim : 0; }
  int num_layers_of_kind(LayerKind kind) const;
  bool is_cross_attention_layer(int layer_id) const;
  std::string summary() const;  // one line for `attnkit select`
};

// Parse config.json text / a file. Errors name the key, the value and what is expected
// ("config.json: num_attention_heads must be a positive integer, got \"abc\""). Malformed JSON
// reports the parser's line, column and byte offset.
Result<ModelAttentionConfig> parse_model_config(std::string_view json_text);
// `path` is a config.json file or a model directory containing one. Messages start with the path.
Result<ModelAttentionConfig> load_model_config(const std::string& path);

}  // namespace attnkit
