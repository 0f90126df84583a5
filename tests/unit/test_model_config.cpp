// ModelAttentionConfig parsing: one test per shipped Hugging Face config.json
// (tests/data/configs/), then the rules that only show on edited configs, then every error path.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "attnkit/model_config.h"
#include "core/json_text.h"

namespace attnkit {

void PrintTo(LayerKind kind, std::ostream* os) { *os << layer_kind_name(kind); }

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr LayerKind kFull = LayerKind::kFullAttention;
constexpr LayerKind kSliding = LayerKind::kSlidingAttention;
constexpr LayerKind kLinear = LayerKind::kLinearAttention;
// float holds ~7 significant digits; scales are compared relative to their size.
constexpr double kScaleRelTol = 1e-6;

std::string config_path(const std::string& name) {
  return std::string(ATTNKIT_TEST_DATA_DIR) + "/configs/" + name + ".json";
}

Result<ModelAttentionConfig> load(const std::string& name) {
  return load_model_config(config_path(name));
}

std::vector<LayerKind> pattern(int n, const std::function<LayerKind(int)>& kind_of) {
  std::vector<LayerKind> kinds;
  for (int i = 0; i < n; ++i) kinds.push_back(kind_of(i));
  return kinds;
}

void expect_scale(const ModelAttentionConfig& c, double expected) {
  EXPECT_NEAR(c.default_scaling(), expected, expected * kScaleRelTol);
}

// A minimal Llama-style config with `fields` appended (fields start with ", ").
std::string llama_json(const std::string& fields) {
  return R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], )"
         R"("hidden_size": 4096, "num_hidden_layers": 4)" +
         fields + "}";
}

// Parses `json`, expects failure, returns the message (empty string on unexpected success).
std::string parse_error(const std::string& json) {
  auto r = parse_model_config(json);
  EXPECT_FALSE(r.is_ok()) << "expected an error for: " << json;
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

// ---------------------------------------------------------------- shipped configs

// Error messages quote JSON values cut to 80 bytes, never inside a UTF-8 sequence.
TEST(JsonText, ExcerptsCutAtCharacterBoundaries) {
  EXPECT_EQ(utf8_prefix("short", 80), "short");
  EXPECT_EQ(utf8_prefix("abcdef", 4), "abcd...");
  // "\u00e9" is 2 bytes (C3 A9), "\u20ac" 3 (E2 82 AC): a cut after byte 4 / 5 of "ab" + 2 x
  // e-acute would split the second one / a euro sign.
  EXPECT_EQ(utf8_prefix("ab\xC3\xA9\xC3\xA9z", 5), "ab\xC3\xA9...");
  EXPECT_EQ(utf8_prefix("a\xE2\x82\xAC\xE2\x82\xACz", 5), "a\xE2\x82\xAC...");
  EXPECT_EQ(utf8_prefix("a\xE2\x82\xAC\xE2\x82\xACz", 4), "a\xE2\x82\xAC...");
  // A string of 3-byte characters: every cut lands on a boundary.
  std::string euros;
  for (int i = 0; i < 40; ++i) euros += "\xE2\x82\xAC";
  const std::string cut = utf8_prefix(euros, 80);
  EXPECT_EQ(cut.size(), 78u + 3u);
  EXPECT_EQ(cut.substr(78), "...");
}

TEST(ModelConfigFiles, Llama31_8B) {
  auto r = load("llama-3.1-8b-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"LlamaForCausalLM"});
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling_type, "llama3");
  EXPECT_EQ(c.rope_scaling_factor, 8.0);
  EXPECT_EQ(c.sliding_window, -1);
  EXPECT_EQ(c.attention_window_left(), -1);
  EXPECT_EQ(c.layer_kinds, std::vector<LayerKind>(32, kFull));
  EXPECT_FALSE(c.is_mla || c.has_linear_attention || c.has_dual_chunk_attention ||
               c.is_encoder_decoder || c.is_multimodal || c.has_attention_sinks);
  EXPECT_EQ(c.attn_logit_softcapping, 0.f);
  EXPECT_FALSE(c.is_deepseek_v3_family());
  expect_scale(c, 1.0 / std::sqrt(128.0));
  EXPECT_THAT(c.summary(), HasSubstr("GQA 32q/8kv heads (group 4), head_dim 128"));
  EXPECT_EQ(c.summary().find('\n'), std::string::npos);
}

TEST(ModelConfigFiles, Llama31_70B) {
  auto r = load("llama-3.1-70b-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.num_layers, 80);
  EXPECT_EQ(c.hidden_size, 8192);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.layer_kinds.size(), 80u);
  EXPECT_EQ(c.num_layers_of_kind(kFull), 80);
}

TEST(ModelConfigFiles, Qwen2_7B) {
  auto r = load("qwen2-7b-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);  // 3584 / 28
  // sliding_window 131072 is written but use_sliding_window is false: no layer slides.
  EXPECT_EQ(c.sliding_window, -1);
  EXPECT_EQ(c.num_layers_of_kind(kSliding), 0);
}

TEST(ModelConfigFiles, Qwen25_7B) {
  auto r = load("qwen2.5-7b-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.num_layers, 28);
  EXPECT_EQ(c.hidden_size, 3584);
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.sliding_window, -1);
  EXPECT_EQ(c.layer_kinds, std::vector<LayerKind>(28, kFull));
  EXPECT_FALSE(c.has_dual_chunk_attention);
}

TEST(ModelConfigFiles, Qwen3_0_6B_ExplicitHeadDim) {
  auto r = load("qwen3-0.6b");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // explicit; hidden_size / heads would be 64
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.sliding_window, -1);     // "sliding_window": null
  EXPECT_EQ(c.rope_scaling_type, "");  // "rope_scaling": null
  expect_scale(c, 1.0 / std::sqrt(128.0));
}

TEST(ModelConfigFiles, Qwen3_8B) {
  auto r = load("qwen3-8b");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.num_layers, 36);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 40960);
}

TEST(ModelConfigFiles, Mistral7B_AllLayersSlide) {
  auto r = load("mistral-7b-v0.1");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.attention_window_left(), 4095);  // sees itself + 4095 earlier tokens
  EXPECT_EQ(c.layer_kinds, std::vector<LayerKind>(32, kSliding));
  EXPECT_THAT(c.summary(), HasSubstr("sliding_window 4096 on 32/32 layers"));
}

TEST(ModelConfigFiles, Gemma2_9B_EvenLayersSlide) {
  auto r = load("gemma-2-9b-it");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "gemma2");
  EXPECT_EQ(c.num_layers, 42);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 256);  // explicit; 3584 / 16 = 224
  EXPECT_EQ(c.dtype, DType::kF32);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_kinds, pattern(42, [](int i) { return i % 2 == 0 ? kSliding : kFull; }));
  EXPECT_EQ(c.attn_logit_softcapping, 50.f);
  EXPECT_EQ(c.final_logit_softcapping, 30.f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.f);
  expect_scale(c, 1.0 / 16.0);
  EXPECT_THAT(c.summary(), HasSubstr("softcap 50"));
}

TEST(ModelConfigFiles, Gemma2_27B_QueryPreAttnScalarDiffersFromHeadDim) {
  auto r = load("gemma-2-27b-it");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.num_layers, 46);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.query_pre_attn_scalar, 144.f);
  expect_scale(c, 1.0 / 12.0);  // 144^-0.5, not 128^-0.5
  EXPECT_EQ(c.layer_kinds, pattern(46, [](int i) { return i % 2 == 0 ? kSliding : kFull; }));
  EXPECT_EQ(c.attn_logit_softcapping, 50.f);
}

TEST(ModelConfigFiles, Gemma3_1B_PatternOfSix) {
  auto r = load("gemma-3-1b-it");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.num_layers, 26);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.attn_logit_softcapping, 0.f);  // null
  EXPECT_EQ(c.layer_kinds, pattern(26, [](int i) { return (i + 1) % 6 == 0 ? kFull : kSliding; }));
  EXPECT_EQ(c.num_layers_of_kind(kFull), 4);  // layers 5, 11, 17, 23
  EXPECT_FALSE(c.is_multimodal);
  EXPECT_THAT(c.summary(), HasSubstr("MQA 4q/1kv heads"));
}

TEST(ModelConfigFiles, Gemma3_27B_NestedTextConfigWithClassDefaults) {
  auto r = load("gemma-3-27b-it");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(c.text_model_type, "gemma3_text");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"Gemma3ForConditionalGeneration"});
  EXPECT_EQ(c.num_layers, 62);
  EXPECT_EQ(c.hidden_size, 5376);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.query_pre_attn_scalar, 168.f);
  expect_scale(c, 1.0 / std::sqrt(168.0));
  EXPECT_EQ(c.sliding_window, 1024);
  // sliding_window_pattern, max_position_embeddings and rope_theta are Gemma3TextConfig defaults.
  EXPECT_EQ(c.layer_kinds, pattern(62, [](int i) { return (i + 1) % 6 == 0 ? kFull : kSliding; }));
  EXPECT_EQ(c.num_layers_of_kind(kFull), 10);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_scaling_type, "linear");
  EXPECT_EQ(c.rope_scaling_factor, 8.0);
  EXPECT_TRUE(c.is_multimodal);
  EXPECT_EQ(c.vision_num_layers, 27);
  EXPECT_EQ(c.vision_num_attention_heads, 16);
  EXPECT_EQ(c.vision_head_dim, 72);  // SigLIP 1152 / 16
}

TEST(ModelConfigFiles, DeepSeekV2Lite_MlaWithoutQLora) {
  auto r = load("deepseek-v2-lite");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "deepseek_v2");
  EXPECT_TRUE(c.is_mla);
  EXPECT_EQ(c.num_layers, 27);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.q_lora_rank, 0);  // null
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.mla_kv_cache_dim(), 576);
  EXPECT_EQ(c.index_topk, 0);
  EXPECT_FALSE(c.is_deepseek_v3_family());
  EXPECT_FALSE(c.is_deepseek_v32());
  // YaRN mscale_all_dim 0.707, factor 40: 192^-0.5 * (0.1 * 0.707 * ln 40 + 1)^2 = 0.11472.
  EXPECT_NEAR(c.default_scaling(), 0.11472, 1e-5);
}

void expect_deepseek_v3_attention(const ModelAttentionConfig& c) {
  EXPECT_TRUE(c.is_mla);
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.mla_kv_cache_dim(), 576);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.rope_scaling_type, "yarn");
  EXPECT_EQ(c.rope_scaling_factor, 40.0);
  EXPECT_EQ(c.rope_mscale_all_dim, 1.0);
  // 192^-0.5 * (0.1 * ln 40 + 1)^2 = 0.0721688 * 1.873854 = 0.135234
  EXPECT_NEAR(c.default_scaling(), 0.135234, 1e-5);
  EXPECT_EQ(c.layer_kinds, std::vector<LayerKind>(61, kFull));
}

TEST(ModelConfigFiles, DeepSeekV3) {
  auto r = load("deepseek-v3");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_deepseek_v3_attention(*r);
  EXPECT_TRUE(r->is_deepseek_v3_family());
  EXPECT_FALSE(r->is_deepseek_v32());
  EXPECT_EQ(r->index_topk, 0);
  EXPECT_THAT(r->summary(), HasSubstr("MLA 128 heads, kv_lora_rank 512, qk 128+64, v 128"));
}

TEST(ModelConfigFiles, DeepSeekR1SameArchitectureAsV3) {
  auto r = load("deepseek-r1");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_deepseek_v3_attention(*r);
  EXPECT_TRUE(r->is_deepseek_v3_family());
}

TEST(ModelConfigFiles, DeepSeekV32Exp_SparseIndexer) {
  auto r = load("deepseek-v3.2-exp");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  expect_deepseek_v3_attention(c);
  EXPECT_EQ(c.model_type, "deepseek_v32");
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_TRUE(c.is_deepseek_v32());
  EXPECT_FALSE(c.is_deepseek_v3_family());
  EXPECT_THAT(c.summary(), HasSubstr("NSA index_topk 2048"));
}

TEST(ModelConfigFiles, Qwen3Next_GdnEveryFourthLayerFull) {
  auto r = load("qwen3-next-80b-a3b-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "qwen3_next");
  EXPECT_EQ(c.num_layers, 48);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 256);  // explicit; 2048 / 16 = 128
  EXPECT_TRUE(c.has_linear_attention);
  EXPECT_EQ(c.layer_kinds, pattern(48, [](int i) { return (i + 1) % 4 == 0 ? kFull : kLinear; }));
  EXPECT_EQ(c.num_layers_of_kind(kLinear), 36);
  EXPECT_EQ(c.num_layers_of_kind(kFull), 12);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.sliding_window, -1);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_THAT(c.summary(), HasSubstr("GDN linear attention on 36/48 layers"));
}

TEST(ModelConfigFiles, Qwen25_1M_DualChunk) {
  auto r = load("qwen2.5-7b-instruct-1m");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_TRUE(c.has_dual_chunk_attention);
  EXPECT_EQ(c.dual_chunk_size, 262144);
  EXPECT_EQ(c.dual_chunk_local_size, 8192);
  EXPECT_EQ(c.dual_chunk_original_max_position_embeddings, 32768);
  EXPECT_EQ(c.max_position_embeddings, 1010000);
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.sliding_window, -1);
  EXPECT_THAT(c.summary(), HasSubstr("dual-chunk 262144/8192"));
}

TEST(ModelConfigFiles, WhisperLargeV3_EncoderDecoder) {
  auto r = load("whisper-large-v3");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "whisper");
  EXPECT_TRUE(c.is_encoder_decoder);
  EXPECT_FALSE(c.is_multimodal);
  EXPECT_EQ(c.hidden_size, 1280);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 20);
  EXPECT_EQ(c.num_key_value_heads, 20);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.encoder_layers, 32);
  EXPECT_EQ(c.encoder_attention_heads, 20);
  EXPECT_EQ(c.encoder_head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 448);
  EXPECT_EQ(c.encoder_max_position_embeddings, 1500);
  EXPECT_EQ(c.dtype, DType::kF16);
  EXPECT_EQ(c.layer_kinds, std::vector<LayerKind>(32, kFull));
  EXPECT_THAT(c.summary(), HasSubstr("encoder-decoder (encoder 32 layers x 20 heads)"));
}

TEST(ModelConfigFiles, Qwen2VL_VisionConfigWithTopLevelText) {
  auto r = load("qwen2-vl-7b-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "qwen2_vl");
  EXPECT_TRUE(c.is_multimodal);
  EXPECT_EQ(c.num_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_scaling_type, "mrope");
  EXPECT_EQ(c.vision_num_layers, 32);
  EXPECT_EQ(c.vision_num_attention_heads, 16);
  EXPECT_EQ(c.vision_head_dim, 80);  // embed_dim 1280 / 16, not the merger's hidden_size 3584
  EXPECT_EQ(c.sliding_window, -1);
}

TEST(ModelConfigFiles, Llama32Vision_TextConfigNestingAndCrossLayers) {
  auto r = load("llama-3.2-11b-vision-instruct");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "mllama");
  EXPECT_EQ(c.text_model_type, "mllama_text_model");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"MllamaForConditionalGeneration"});
  EXPECT_TRUE(c.is_multimodal);
  EXPECT_FALSE(c.is_encoder_decoder);  // text_config's "is_encoder_decoder": false is not read
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.cross_attention_layers, (std::vector<int>{3, 8, 13, 18, 23, 28, 33, 38}));
  EXPECT_TRUE(c.is_cross_attention_layer(8));
  EXPECT_FALSE(c.is_cross_attention_layer(9));
  EXPECT_EQ(c.vision_num_layers, 32);
  EXPECT_EQ(c.vision_num_attention_heads, 16);
  EXPECT_EQ(c.vision_head_dim, 80);
  EXPECT_EQ(c.layer_kinds.size(), 40u);
}

TEST(ModelConfigFiles, GptOss20B_SinksAndAlternatingWindow) {
  auto r = load("gpt-oss-20b");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelAttentionConfig& c = *r;
  EXPECT_EQ(c.model_type, "gpt_oss");
  EXPECT_TRUE(c.has_attention_sinks);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.hidden_size, 2880);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);  // explicit; 2880 / 64 = 45
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.attention_window_left(), 127);
  EXPECT_EQ(c.layer_kinds, pattern(24, [](int i) { return i % 2 == 0 ? kSliding : kFull; }));
  EXPECT_FALSE(c.is_mla);
  expect_scale(c, 1.0 / 8.0);  // yarn without mscale_all_dim leaves the MHA scale alone
  EXPECT_THAT(c.summary(), HasSubstr("attention sinks"));
}

TEST(ModelConfigFiles, EveryShippedConfigParsesAndFillsEveryLayer) {
  int count = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(ATTNKIT_TEST_DATA_DIR) + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    auto r = load_model_config(entry.path().string());
    ASSERT_TRUE(r.is_ok()) << entry.path() << ": " << r.status().to_string();
    EXPECT_EQ(r->layer_kinds.size(), static_cast<size_t>(r->num_layers)) << entry.path();
    EXPECT_GT(r->head_dim, 0) << entry.path();
    EXPECT_GT(r->default_scaling(), 0.f) << entry.path();
    EXPECT_EQ(r->sliding_window > 0, r->num_layers_of_kind(kSliding) > 0) << entry.path();
  }
  EXPECT_GE(count, 21);
}

// ---------------------------------------------------------------- rules on edited configs

TEST(ModelConfigRules, KvHeadsDefaultToQueryHeads) {
  auto r = parse_model_config(llama_json(R"(, "num_attention_heads": 32)"));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->num_key_value_heads, 32);
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_THAT(r->summary(), HasSubstr("MHA 32q/32kv"));
}

TEST(ModelConfigRules, QwenUseSlidingWindowSlidesLayersFromMaxWindowLayers) {
  auto r = parse_model_config(
      R"({"model_type": "qwen2", "hidden_size": 1024, "num_hidden_layers": 6,
          "num_attention_heads": 8, "num_key_value_heads": 2, "use_sliding_window": true,
          "sliding_window": 4096, "max_window_layers": 4})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->layer_kinds,
            (std::vector<LayerKind>{kFull, kFull, kFull, kFull, kSliding, kSliding}));
  EXPECT_EQ(r->sliding_window, 4096);
}

TEST(ModelConfigRules, ExplicitLayerTypesWinOverFamilyPattern) {
  // Newer transformers write layer_types for Gemma-3; it must override sliding_window_pattern.
  auto r = parse_model_config(
      R"({"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
          "sliding_window": 512, "sliding_window_pattern": 6,
          "layer_types": ["full_attention", "sliding_attention", "full_attention"]})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->layer_kinds, (std::vector<LayerKind>{kFull, kSliding, kFull}));
}

TEST(ModelConfigRules, NewerDtypeKeyAndMlaHeadDimKeyIgnored) {
  auto r = parse_model_config(
      R"({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
          "hidden_size": 7168, "num_hidden_layers": 2, "num_attention_heads": 128,
          "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
          "v_head_dim": 128, "head_dim": 64, "dtype": "float16"})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->head_dim, 192);
  EXPECT_EQ(r->dtype, DType::kF16);
  expect_scale(*r, 1.0 / std::sqrt(192.0));  // no rope_scaling: no YaRN mscale
}

TEST(ModelConfigRules, LoadAcceptsModelDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "attnkit_test_model_config_dir";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << llama_json(R"(, "num_attention_heads": 32, "num_key_value_heads": 8)");
  }
  auto r = load_model_config(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->num_key_value_heads, 8);
}

// ---------------------------------------------------------------- errors

TEST(ModelConfigErrors, MalformedJsonReportsPosition) {
  const std::string msg = parse_error(
      "{\"model_type\": \"llama\",\n"
      "  \"hidden_size\": 4096,\n"
      "  \"num_attention_heads\": 32 oops\n"
      "}");
  // Line 3 is `  "num_attention_heads": 32 oops`; the parser stops at the 'o' (column 29).
  EXPECT_THAT(msg, StartsWith("config.json: malformed JSON at line 3, column 29 (byte 76): "));
  EXPECT_THAT(msg, HasSubstr("'32 o'")) << "the parser's last-read text should be quoted";
}

TEST(ModelConfigErrors, TruncatedJsonReportsEnd) {
  const std::string text = "{\"model_type\": \"llama\", \"hidden_size\": 40";
  const std::string msg = parse_error(text);
  EXPECT_THAT(msg, HasSubstr("line 1, column " + std::to_string(text.size() + 1)));
}

TEST(ModelConfigErrors, EmptyTextIsMalformed) {
  EXPECT_THAT(parse_error(""), HasSubstr("malformed JSON at line 1, column 1 (byte 1)"));
}

TEST(ModelConfigErrors, TopLevelMustBeObject) {
  EXPECT_THAT(parse_error("[1, 2]"), HasSubstr("top level must be a JSON object, got array"));
}

TEST(ModelConfigErrors, MissingRequiredKey) {
  const std::string msg = parse_error(llama_json(R"(, "num_key_value_heads": 8)"));
  EXPECT_THAT(msg, HasSubstr("required key \"num_attention_heads\" is missing"));
  EXPECT_THAT(msg, HasSubstr("positive integer"));
  EXPECT_THAT(parse_error(R"({"hidden_size": 4096})"),
              HasSubstr("required key \"model_type\" is missing"));
}

TEST(ModelConfigErrors, WrongTypeNamesKeyAndValue) {
  EXPECT_EQ(parse_error(llama_json(R"(, "num_attention_heads": "abc")")),
            "config.json: num_attention_heads must be a positive integer, got \"abc\"");
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32.5)")),
              HasSubstr("num_attention_heads must be a positive integer, got 32.5"));
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "rope_theta": "big")")),
              HasSubstr("rope_theta must be a number >= 0 within float range, got \"big\""));
  // Finite as a double but not as the float the attention parameters are: inf / 0 before.
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "rope_theta": 1e300)")),
              HasSubstr("rope_theta must be a number >= 0 within float range, got 1e+300"));
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "torch_dtype": "int8")")),
              HasSubstr("torch_dtype must be one of \"bfloat16\", \"float16\", \"float32\", "
                        "got \"int8\""));
  EXPECT_THAT(parse_error(R"({"model_type": "llama", "architectures": "x", "hidden_size": 4096,
      "num_hidden_layers": 4, "num_attention_heads": 32})"),
              HasSubstr("architectures must be a list of strings, got \"x\""));
}

// A review helper's findings (2026-11-30): values that were read silently as something else.
TEST(ModelConfigErrors, ValuesThatWereReadAsSomethingElseAreRefused) {
  // A positive soft-cap / scalar the float cast turns into 0 read as "off" / the default scale.
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32,
                                        "attn_logit_softcapping": 1e-50)")),
              HasSubstr("attn_logit_softcapping must be 0 or a number of at least the smallest "
                        "float (it rounds to 0), got 1e-50"));
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32,
                                        "query_pre_attn_scalar": 1e-50)")),
              HasSubstr("query_pre_attn_scalar must be 0 or a number of at least the smallest"));
  // A nested model_type of the wrong type was ignored (the top-level type was used).
  EXPECT_THAT(parse_error(R"({"model_type": "llava", "text_config": {"model_type": 5,
      "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32}})"),
              HasSubstr("config.json: text_config.model_type must be a string, got 5"));
  // A repeated cross-attention layer was counted once per entry.
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32,
                                        "cross_attention_layers": [3, 1, 3])")),
              HasSubstr("cross_attention_layers lists layer 3 more than once"));
  // Both dtype keys, disagreeing: torch_dtype had won without a word.
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "torch_dtype": "float32",
                                        "dtype": "bfloat16")")),
              HasSubstr("torch_dtype \"float32\" and dtype \"bfloat16\" disagree"));
  auto agree = parse_model_config(llama_json(R"(, "num_attention_heads": 32,
                                                "torch_dtype": "float16", "dtype": "half")"));
  ASSERT_TRUE(agree.is_ok()) << agree.status().to_string();
  EXPECT_EQ(agree->dtype, DType::kF16);
}

TEST(ModelConfigErrors, WrongTypeInsideTextConfigNamesNestedKey) {
  const std::string msg = parse_error(
      R"({"model_type": "llava", "text_config": {"hidden_size": 4096, "num_hidden_layers": 2,
          "num_attention_heads": [32]}})");
  EXPECT_THAT(msg,
              HasSubstr("text_config.num_attention_heads must be a positive integer, got [32]"));
  EXPECT_THAT(parse_error(R"({"model_type": "llava", "text_config": 7})"),
              HasSubstr("text_config must be a JSON object, got 7"));
}

TEST(ModelConfigErrors, NonPositiveHeadCounts) {
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 0)")),
              HasSubstr("num_attention_heads must be a positive integer, got 0"));
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "num_key_value_heads": -8)")),
              HasSubstr("num_key_value_heads must be a positive integer, got -8"));
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "head_dim": 0)")),
              HasSubstr("head_dim must be a positive integer, got 0"));
}

TEST(ModelConfigErrors, CountsPastIntSayWhereTheRangeEnds) {
  for (auto [big, shown] : {std::pair{"1099511627776", "1099511627776"},
                            {"2147483648", "2147483648"},
                            {"4.0e12", "4000000000000.0"}}) {
    EXPECT_THAT(parse_error(llama_json(std::string(R"(, "num_attention_heads": )") + big)),
                HasSubstr(std::string("num_attention_heads must be a positive integer of at most "
                                      "2147483647, got ") +
                          shown))
        << big;
  }
  // INT_MAX itself parses (the head checks after it refuse it for other reasons, not the range).
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 2147483647)")),
              Not(HasSubstr("at most 2147483647")));
}

TEST(ModelConfigErrors, KvHeadsMustDivideQueryHeads) {
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "num_key_value_heads": 5)")),
              StartsWith("config.json: num_key_value_heads 5 does not divide "
                         "num_attention_heads 32"));
}

TEST(ModelConfigErrors, HiddenSizeNotDivisibleWithoutHeadDim) {
  const std::string msg = parse_error(llama_json(R"(, "num_attention_heads": 48)"));
  EXPECT_THAT(msg, HasSubstr("hidden_size 4096 is not divisible by num_attention_heads 48"));
  EXPECT_THAT(msg, HasSubstr("head_dim is not given"));
  auto with_head_dim =
      parse_model_config(llama_json(R"(, "num_attention_heads": 48, "head_dim": 96)"));
  ASSERT_TRUE(with_head_dim.is_ok()) << with_head_dim.status().to_string();
  EXPECT_EQ(with_head_dim->head_dim, 96);
}

TEST(ModelConfigErrors, DualChunkConfigShape) {
  const std::string heads = R"(, "num_attention_heads": 32)";
  EXPECT_THAT(parse_error(llama_json(heads + R"(, "dual_chunk_attention_config": 262144)")),
              HasSubstr("dual_chunk_attention_config must be a JSON object, got 262144"));
  EXPECT_THAT(
      parse_error(llama_json(heads + R"(, "dual_chunk_attention_config": {"chunk_size": 1024,
          "local_size": 128, "chunk_len": 896})")),
      HasSubstr("dual_chunk_attention_config.chunk_len is not a dual-chunk attention setting "
                "(value 896"));
  EXPECT_THAT(
      parse_error(llama_json(heads + R"(, "dual_chunk_attention_config": {"chunk_size": 1024})")),
      HasSubstr("required key \"dual_chunk_attention_config.local_size\" is missing"));
  EXPECT_THAT(parse_error(llama_json(heads + R"(, "dual_chunk_attention_config":
          {"chunk_size": 1024, "local_size": "8k"})")),
              HasSubstr("dual_chunk_attention_config.local_size must be a positive integer, "
                        "got \"8k\""));
  EXPECT_THAT(parse_error(llama_json(heads + R"(, "dual_chunk_attention_config":
          {"chunk_size": 1024, "local_size": 4096})")),
              HasSubstr("dual_chunk_attention_config.local_size 4096 must be smaller than "
                        "chunk_size 1024"));
}

TEST(ModelConfigErrors, LayerTypesShapeAndNames) {
  const std::string heads = R"(, "num_attention_heads": 32, "sliding_window": 128)";
  EXPECT_THAT(parse_error(llama_json(heads + R"(, "layer_types": ["full_attention"])")),
              HasSubstr("layer_types must be a list of 4 names"));
  EXPECT_THAT(parse_error(llama_json(heads + R"(, "layer_types": ["full_attention",
          "full_attention", "chunked_attention", "full_attention"])")),
              HasSubstr("layer_types [2] is \"chunked_attention\""));
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "layer_types":
          ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])")),
              HasSubstr("required key \"sliding_window\" is missing"));
}

TEST(ModelConfigErrors, MlaAndIndexerKeys) {
  const std::string mla = R"(, "num_attention_heads": 32, "kv_lora_rank": 512,
      "qk_nope_head_dim": 128, "v_head_dim": 128)";
  EXPECT_THAT(parse_error(llama_json(mla)),
              HasSubstr("required key \"qk_rope_head_dim\" is missing"));
  EXPECT_THAT(parse_error(llama_json(mla + R"(, "qk_rope_head_dim": 64, "index_topk": 2048)")),
              HasSubstr("required key \"index_head_dim\" is missing"));
  EXPECT_THAT(parse_error(llama_json(mla + R"(, "qk_rope_head_dim": 64, "index_topk": -1)")),
              HasSubstr("index_topk must be a positive integer, got -1"));
  // The qk head (nope + rope) overflowed int32 (head dim 2147483647 + 64, scale 0).
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "kv_lora_rank": 512,
      "qk_nope_head_dim": 2147483647, "v_head_dim": 128, "qk_rope_head_dim": 64)")),
              HasSubstr("qk_nope_head_dim must be a positive integer whose sum with "
                        "qk_rope_head_dim 64 fits int32"));
}

TEST(ModelConfigErrors, LinearAttentionHeads) {
  const std::string msg = parse_error(llama_json(
      R"(, "num_attention_heads": 32, "full_attention_interval": 2, "linear_num_key_heads": 16,
          "linear_num_value_heads": 24, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
          "linear_conv_kernel_dim": 4)"));
  EXPECT_THAT(msg, HasSubstr("linear_num_key_heads 16 does not divide linear_num_value_heads 24"));
  EXPECT_THAT(
      parse_error(llama_json(R"(, "num_attention_heads": 32, "full_attention_interval": 2)")),
      HasSubstr("required key \"linear_num_key_heads\" is missing"));
}

TEST(ModelConfigErrors, EncoderDecoderHeadsMustDivideDModel) {
  EXPECT_THAT(parse_error(R"({"model_type": "whisper", "is_encoder_decoder": true,
      "d_model": 1280, "decoder_layers": 4, "decoder_attention_heads": 20, "encoder_layers": 4,
      "encoder_attention_heads": 24})"),
              HasSubstr("d_model 1280 is not divisible by encoder_attention_heads 24"));
  EXPECT_THAT(parse_error(R"({"model_type": "whisper", "is_encoder_decoder": true,
      "d_model": 1280, "decoder_layers": 4, "decoder_attention_heads": 20})"),
              HasSubstr("required key \"encoder_layers\" is missing"));
}

// A wrong file is refused by name before it costs the process its stack or memory: nesting past
// kMaxJsonNesting (a 100000-deep array crashed the error message that quoted it, and a deep
// text_config was copied recursively), a layer count no model has (one plan entry per layer:
// 2^31 - 1 took 8 GB), and a file far larger than any config.json (a weights file).
TEST(ModelConfigErrors, DeepNestingHugeLayerCountsAndHugeFilesAreRefused) {
  const auto nested = [](int depth) {
    return std::string(static_cast<size_t>(depth), '[') +
           std::string(static_cast<size_t>(depth), ']');
  };
  EXPECT_THAT(parse_error(llama_json(R"(, "num_attention_heads": 32, "x": )" + nested(100000))),
              HasSubstr("nested more than 64 levels deep at line 1"));
  EXPECT_THAT(
      parse_error(R"({"model_type": "llava", "text_config": {"model_type": "llama", "x": )" +
                  nested(70) + "}}"),
      HasSubstr("nested more than 64 levels deep"));
  // Brackets inside strings do not count; 64 levels are accepted.
  auto shallow = parse_model_config(
      llama_json(R"(, "num_attention_heads": 32, "name": "[[[[[[", "x": )" + nested(63)));
  EXPECT_TRUE(shallow.is_ok()) << shallow.status().to_string();
  EXPECT_THAT(parse_error(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
      "num_hidden_layers": 2147483647})"),
              HasSubstr("num_hidden_layers 2147483647 is more layers than a model has (at most "
                        "65536)"));
  EXPECT_THAT(parse_error(R"({"model_type": "whisper", "is_encoder_decoder": true,
      "d_model": 1280, "decoder_layers": 4, "decoder_attention_heads": 20, "encoder_layers": 70000,
      "encoder_attention_heads": 20})"),
              HasSubstr("encoder_layers 70000 is more layers than a model has"));
  // A key twice keeps the last value, as Python's json does for the engines that load the file.
  auto twice =
      parse_model_config(llama_json(R"(, "num_attention_heads": 32, "num_attention_heads": 8)"));
  ASSERT_TRUE(twice.is_ok()) << twice.status().to_string();
  EXPECT_EQ(twice->num_attention_heads, 8);
  auto ok = parse_model_config(R"({"model_type": "llama", "hidden_size": 4096,
      "num_attention_heads": 32, "num_hidden_layers": 65536})");
  EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();

  const auto big = std::filesystem::temp_directory_path() / "attnkit_test_huge_config.json";
  { std::ofstream out(big); }
  std::filesystem::resize_file(big, (uintmax_t{16} << 20) + 1);  // sparse: no 16 MiB written
  auto r = load_model_config(big.string());
  std::filesystem::remove(big);
  ASSERT_FALSE(r.is_ok());
  EXPECT_THAT(
      r.status().message(),
      HasSubstr("is 16777217 bytes; a config.json is at most 16 MiB (is it a weights file?)"));
}

TEST(ModelConfigErrors, MissingFileNamesPath) {
  const std::string path = std::string(ATTNKIT_TEST_DATA_DIR) + "/configs/no-such-model.json";
  auto r = load_model_config(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("\"" + path + "\" does not exist"));
}

TEST(ModelConfigErrors, LoadErrorsStartWithThePath) {
  const auto file = std::filesystem::temp_directory_path() / "attnkit_test_bad_config.json";
  {
    std::ofstream out(file);
    out << llama_json(R"(, "num_attention_heads": 32, "num_key_value_heads": 5)");
  }
  auto r = load_model_config(file.string());
  std::filesystem::remove(file);
  ASSERT_FALSE(r.is_ok());
  EXPECT_THAT(r.status().message(),
              StartsWith(file.string() + ": num_key_value_heads 5 does not divide"));
}

}  // namespace
}  // namespace attnkit
