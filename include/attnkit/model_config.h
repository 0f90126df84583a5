// Attention-relevant facts about a model, parsed from a Hugging Face config.json.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/status.h"

namespace attnkit {

enum class LayerKind { kFullAttention, kSlidingAttention, kLinearAttention };

struct ModelAttentionConfig {
  std::string model_type;                  // config.json "model_type" ("llama", "deepseek_v3", ...)
  std::vector<std::string> architectures;  // config.json "architectures"
  int num_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;       // qk head dim (MHA); MLA: qk_nope_head_dim + qk_rope_head_dim
  int v_head_dim = 0;
  DType dtype = DType::kBF16;  // torch_dtype
  int max_position_embeddings = 0;
  // Sliding window (Mistral, Gemma-2/3): -1 = none. layer_kinds says which layers use it.
  int sliding_window = -1;
  std::vector<LayerKind> layer_kinds;  // size num_layers
  float attn_logit_softcapping = 0.f;  // Gemma-2
  float final_logit_softcapping = 0.f;
  float query_pre_attn_scalar = 0.f;   // Gemma: scaling = query_pre_attn_scalar^-0.5 when set
  bool has_attention_sinks = false;    // gpt-oss style
  // MLA (DeepSeek-V2/V3)
  bool is_mla = false;
  int kv_lora_rank = 0;
  int q_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int index_topk = 0;  // DeepSeek-V3.2 sparse attention (NSA); 0 = none
  // Linear attention (Qwen3-Next GDN hybrids)
  bool has_linear_attention = false;
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;
  // Dual-chunk attention (Qwen2.5-1M)
  bool has_dual_chunk_attention = false;
  int dual_chunk_size = 0;
  int dual_chunk_local_size = 0;
  // Encoder-decoder (Whisper) and multimodal (vision tower with bidirectional attention)
  bool is_encoder_decoder = false;
  bool is_multimodal = false;
  int encoder_layers = 0;
  int encoder_attention_heads = 0;

  bool is_deepseek_v3_family() const;  // DeepSeek V3 / R1 architectures
  bool is_deepseek_v32() const { return is_mla && index_topk > 0; }
  float default_scaling() const;
  std::string summary() const;  // one line for `attnkit select`
};

// Parse config.json text / a file. Errors name the key and the expected type
// ("config.json: num_attention_heads must be a positive integer, got \"abc\"").
Result<ModelAttentionConfig> parse_model_config(std::string_view json_text);
Result<ModelAttentionConfig> load_model_config(const std::string& path);

}  // namespace attnkit
