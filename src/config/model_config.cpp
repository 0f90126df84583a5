// Hugging Face config.json -> ModelAttentionConfig.
//
// The rules follow what transformers' config classes do with the same file (defaults, derived
// layer_types), so that attnkit and the model code agree on every layer:
//   * language-model keys are read from "text_config" when the file nests one (multimodal
//     wrappers), falling back to the top level; "architectures", "model_type", "vision_config" and
//     the dtype live at the top level;
//   * JSON null means "not set", exactly as Python's None does in the config classes;
//   * layer kinds come from an explicit "layer_types" list when present, else from the family's
//     rule (Gemma-2 alternation, Gemma-3 pattern, Qwen max_window_layers, Qwen3-Next
//     full_attention_interval, everything else: all layers share the window when one is set).
#include "attnkit/model_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/json_text.h"

namespace attnkit {
namespace {

using Json = nlohmann::json;

// transformers' Qwen2Config / Qwen3Config default for max_window_layers.
constexpr int kQwenDefaultMaxWindowLayers = 28;
// Gemma-2 alternates sliding (even layers) and full (odd layers) attention.
constexpr int kGemma2SlidingPeriod = 2;
// gpt-oss configs without layer_types alternate the same way.
constexpr int kGptOssSlidingPeriod = 2;
// DeepSeek YaRN: mscale = kYarnMscaleSlope * mscale_all_dim * ln(factor) + 1.
constexpr double kYarnMscaleSlope = 0.1;
// The most layers a config may declare (num_hidden_layers, decoder_layers, encoder_layers, a
// vision tower's depth): the plan keeps one entry per layer, and the largest published models
// have a few hundred, so a larger count is a wrong file, not a model.
constexpr int kMaxLayers = 65536;
// A config.json is a few KB; the largest accepted is that of the bench case files.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

// Gemma3TextConfig's class defaults. The published Gemma-3 checkpoints (gemma-3-4b/12b/27b-it)
// write only the keys that differ from these, so the defaults are part of the format.
Json gemma3_text_defaults() {
  return Json{{"hidden_size", 2304},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 4096},
              {"sliding_window_pattern", 6},
              {"max_position_embeddings", 131072},
              {"rope_theta", 1000000.0}};
}

// dual_chunk_attention_config keys understood by the dual-chunk implementations (vLLM / SGLang).
constexpr const char* kDualChunkKnownKeys[] = {
    "chunk_size",
    "local_size",
    "original_max_position_embeddings",
    "sparse_attention_config",
    "sparse_attention_enabled",
    "sparse_attention_threshold",
    "sparse_attention_last_q",
};

bool contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

enum class IntRule { kPositive, kNonNegative };

const char* describe(IntRule rule) {
  return rule == IntRule::kPositive ? "a positive integer" : "a non-negative integer";
}

// Typed access to one JSON object with messages that name the source file and the full key path.
// A key missing from the object is looked up in `fallback` (the top level, for text_config).
class Reader {
 public:
  Reader(const Json& object, std::string source, std::string prefix, const Reader* fallback)
      : object_(object),
        source_(std::move(source)),
        prefix_(std::move(prefix)),
        fallback_(fallback) {}

  const std::string& source() const { return source_; }
  std::string key_name(std::string_view key) const { return prefix_ + std::string(key); }

  // The value of `key` (null counts as absent) and the reader that holds it; {nullptr, this} when
  // absent everywhere.
  std::pair<const Json*, const Reader*> find(std::string_view key) const {
    auto it = object_.find(key);
    if (it != object_.end() && !it->is_null()) return {&*it, this};
    if (fallback_ != nullptr) {
      auto found = fallback_->find(key);
      if (found.first != nullptr) return found;
    }
    return {nullptr, this};
  }
  bool has(std::string_view key) const { return find(key).first != nullptr; }

  Status error(std::string_view key, const std::string& what) const {
    return Status::invalid_argument(source_ + ": " + key_name(key) + " " + what);
  }
  Status type_error(std::string_view key, const Json& value, std::string_view expected) const {
    return error(key, "must be " + std::string(expected) + ", got " + json_excerpt(value));
  }
  Status missing(std::string_view key, std::string_view expected) const {
    return Status::invalid_argument(source_ + ": required key \"" + key_name(key) +
                                    "\" is missing (expected " + std::string(expected) + ")");
  }

  Status get_int(std::string_view key, IntRule rule, std::optional<int>* out) const {
    auto [value, owner] = find(key);
    out->reset();
    if (value == nullptr) return Status::ok();
    int64_t parsed = 0;
    bool ok = false;
    bool too_large = false;  // an integer past int's range: say where the range ends
    if (value->is_number_integer()) {
      if (value->is_number_unsigned()) {
        const uint64_t u = value->get<uint64_t>();
        ok = u <= static_cast<uint64_t>(INT_MAX);
        too_large = !ok;
        parsed = static_cast<int64_t>(u);
      } else {
        parsed = value->get<int64_t>();
        ok = true;
      }
    } else if (value->is_number_float()) {
      // 4096.0 is an integer written by a float-happy tool; 4096.5 is not.
      const double d = value->get<double>();
      ok = std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= INT_MAX;
      too_large = std::isfinite(d) && std::floor(d) == d && d > INT_MAX;
      parsed = ok ? static_cast<int64_t>(d) : 0;
    }
    too_large = too_large || parsed > INT_MAX;
    ok = ok && !too_large && parsed >= (rule == IntRule::kPositive ? 1 : 0);
    if (too_large) {
      return owner->type_error(key, *value, std::string(describe(rule)) + " of at most 2147483647");
    }
    if (!ok) return owner->type_error(key, *value, describe(rule));
    *out = static_cast<int>(parsed);
    return Status::ok();
  }

  Status require_int(std::string_view key, IntRule rule, int* out) const {
    std::optional<int> value;
    ATTNKIT_RETURN_IF_ERROR(get_int(key, rule, &value));
    if (!value) return missing(key, describe(rule));
    *out = *value;
    return Status::ok();
  }

  // A layer count: a positive integer of at most kMaxLayers.
  Status require_layers(std::string_view key, int* out) const {
    ATTNKIT_RETURN_IF_ERROR(require_int(key, IntRule::kPositive, out));
    return check_layers(key, *out);
  }
  Status check_layers(std::string_view key, int layers) const {
    if (layers <= kMaxLayers) return Status::ok();
    return find(key).second->error(key, std::to_string(layers) +
                                            " is more layers than a model has (at most " +
                                            std::to_string(kMaxLayers) + ")");
  }

  // A finite number >= min_value.
  Status get_number(std::string_view key, double min_value, std::optional<double>* out) const {
    auto [value, owner] = find(key);
    out->reset();
    if (value == nullptr) return Status::ok();
    // Within float range: the attention parameters are floats (1e300 became inf or 0).
    if (!value->is_number() || !std::isfinite(value->get<double>()) ||
        value->get<double>() < min_value ||
        std::fabs(value->get<double>()) > std::numeric_limits<float>::max()) {
      std::ostringstream expected;
      expected << "a number >= " << min_value << " within float range";
      return owner->type_error(key, *value, expected.str());
    }
    // A value the float cast turns into 0 would read as "off" (a soft-cap) or as unset.
    if (value->get<double>() != 0.0 && static_cast<float>(value->get<double>()) == 0.0f) {
      return owner->type_error(key, *value,
                               "0 or a number of at least the smallest float (it rounds to 0)");
    }
    *out = value->get<double>();
    return Status::ok();
  }

  Status get_string(std::string_view key, std::optional<std::string>* out) const {
    auto [value, owner] = find(key);
    out->reset();
    if (value == nullptr) return Status::ok();
    if (!value->is_string()) return owner->type_error(key, *value, "a string");
    *out = value->get<std::string>();
    return Status::ok();
  }

  Status get_bool(std::string_view key, std::optional<bool>* out) const {
    auto [value, owner] = find(key);
    out->reset();
    if (value == nullptr) return Status::ok();
    if (!value->is_boolean()) return owner->type_error(key, *value, "true or false");
    *out = value->get<bool>();
    return Status::ok();
  }

  // An object-valued key; nullptr when absent or null.
  Status get_object(std::string_view key, const Json** out) const {
    auto [value, owner] = find(key);
    *out = nullptr;
    if (value == nullptr) return Status::ok();
    if (!value->is_object()) return owner->type_error(key, *value, "a JSON object");
    *out = value;
    return Status::ok();
  }

 private:
  const Json& object_;
  std::string source_;
  std::string prefix_;
  const Reader* fallback_;
};

// The parser's own description without its "[json.exception...] parse error at ...: " prefix.
std::string parser_reason(const std::string& what) {
  const size_t at = what.find("column ");
  if (at != std::string::npos) {
    const size_t colon = what.find(": ", at);
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  return what;
}

Status parse_dtype_name(const Reader& reader, std::string_view key, const std::string& name,
                        DType* out) {
  if (name == "bfloat16") {
    *out = DType::kBF16;
  } else if (name == "float16" || name == "half" || name == "fp16") {
    *out = DType::kF16;
  } else if (name == "float32" || name == "float" || name == "fp32") {
    *out = DType::kF32;
  } else {
    return reader.type_error(key, Json(name), "one of \"bfloat16\", \"float16\", \"float32\"");
  }
  return Status::ok();
}

Status parse_architectures(const Reader& root, const Json& object, ModelAttentionConfig* cfg) {
  auto it = object.find("architectures");
  if (it == object.end() || it->is_null()) return Status::ok();
  if (!it->is_array()) return root.type_error("architectures", *it, "a list of strings");
  for (const Json& name : *it) {
    if (!name.is_string()) return root.type_error("architectures", *it, "a list of strings");
    cfg->architectures.push_back(name.get<std::string>());
  }
  return Status::ok();
}

Status parse_dtype(const Reader& root, const Reader& text, ModelAttentionConfig* cfg) {
  // transformers >= 4.56 writes "dtype"; older files "torch_dtype"; nested files may carry it only
  // inside text_config (text reads fall back to the top level, so text covers every case).
  for (const char* key : {"torch_dtype", "dtype"}) {
    for (const Reader* reader : {&root, &text}) {
      std::optional<std::string> name;
      ATTNKIT_RETURN_IF_ERROR(reader->get_string(key, &name));
      if (!name) continue;
      const Reader& owner = *reader->find(key).second;
      ATTNKIT_RETURN_IF_ERROR(parse_dtype_name(owner, key, *name, &cfg->dtype));
      // Both keys beside each other (a file converted between transformers versions) must agree.
      std::optional<std::string> other_name;
      const char* other = std::string_view(key) == "torch_dtype" ? "dtype" : "torch_dtype";
      ATTNKIT_RETURN_IF_ERROR(owner.get_string(other, &other_name));
      DType other_dtype = cfg->dtype;
      if (other_name && owner.find(other).second == &owner) {
        ATTNKIT_RETURN_IF_ERROR(parse_dtype_name(owner, other, *other_name, &other_dtype));
        if (other_dtype != cfg->dtype) {
          return owner.error(key, "\"" + *name + "\" and " + owner.key_name(other) + " \"" +
                                      *other_name + "\" disagree (one dtype is expected)");
        }
      }
      return Status::ok();
    }
  }
  return Status::ok();
}

Status parse_rope(const Reader& text, ModelAttentionConfig* cfg) {
  std::optional<double> theta;
  ATTNKIT_RETURN_IF_ERROR(text.get_number("rope_theta", 0.0, &theta));
  cfg->rope_theta = theta.value_or(0.0);
  const Json* scaling = nullptr;
  ATTNKIT_RETURN_IF_ERROR(text.get_object("rope_scaling", &scaling));
  if (scaling == nullptr) return Status::ok();
  const Reader rope(*scaling, text.source(),
                    text.find("rope_scaling").second->key_name("") + "rope_scaling.", nullptr);
  std::optional<std::string> type;
  ATTNKIT_RETURN_IF_ERROR(rope.get_string("rope_type", &type));
  if (!type) ATTNKIT_RETURN_IF_ERROR(rope.get_string("type", &type));
  cfg->rope_scaling_type = type.value_or("");
  std::optional<double> factor;
  ATTNKIT_RETURN_IF_ERROR(rope.get_number("factor", 0.0, &factor));
  cfg->rope_scaling_factor = factor.value_or(0.0);
  std::optional<double> mscale_all_dim;
  ATTNKIT_RETURN_IF_ERROR(rope.get_number("mscale_all_dim", 0.0, &mscale_all_dim));
  cfg->rope_mscale_all_dim = mscale_all_dim.value_or(0.0);
  return Status::ok();
}

// Whisper-style encoder-decoder: d_model, {encoder,decoder}_{layers,attention_heads}.
Status parse_encoder_decoder(const Reader& root, ModelAttentionConfig* cfg) {
  cfg->is_encoder_decoder = true;
  ATTNKIT_RETURN_IF_ERROR(root.require_int("d_model", IntRule::kPositive, &cfg->hidden_size));
  ATTNKIT_RETURN_IF_ERROR(root.require_layers("decoder_layers", &cfg->num_layers));
  ATTNKIT_RETURN_IF_ERROR(
      root.require_int("decoder_attention_heads", IntRule::kPositive, &cfg->num_attention_heads));
  ATTNKIT_RETURN_IF_ERROR(root.require_layers("encoder_layers", &cfg->encoder_layers));
  ATTNKIT_RETURN_IF_ERROR(root.require_int("encoder_attention_heads", IntRule::kPositive,
                                           &cfg->encoder_attention_heads));
  for (auto [heads_key, heads] :
       {std::pair{"decoder_attention_heads", cfg->num_attention_heads},
        std::pair{"encoder_attention_heads", cfg->encoder_attention_heads}}) {
    if (cfg->hidden_size % heads != 0) {
      return Status::invalid_argument(root.source() + ": d_model " +
                                      std::to_string(cfg->hidden_size) + " is not divisible by " +
                                      heads_key + " " + std::to_string(heads));
    }
  }
  cfg->num_key_value_heads = cfg->num_attention_heads;
  cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
  cfg->v_head_dim = cfg->head_dim;
  cfg->encoder_head_dim = cfg->hidden_size / cfg->encoder_attention_heads;
  std::optional<int> value;
  ATTNKIT_RETURN_IF_ERROR(root.get_int("max_target_positions", IntRule::kPositive, &value));
  cfg->max_position_embeddings = value.value_or(0);
  ATTNKIT_RETURN_IF_ERROR(root.get_int("max_source_positions", IntRule::kPositive, &value));
  cfg->encoder_max_position_embeddings = value.value_or(0);
  return Status::ok();
}

Status parse_mla(const Reader& text, ModelAttentionConfig* cfg) {
  cfg->is_mla = true;
  ATTNKIT_RETURN_IF_ERROR(text.require_int("kv_lora_rank", IntRule::kPositive, &cfg->kv_lora_rank));
  ATTNKIT_RETURN_IF_ERROR(
      text.require_int("qk_nope_head_dim", IntRule::kPositive, &cfg->qk_nope_head_dim));
  ATTNKIT_RETURN_IF_ERROR(
      text.require_int("qk_rope_head_dim", IntRule::kPositive, &cfg->qk_rope_head_dim));
  ATTNKIT_RETURN_IF_ERROR(text.require_int("v_head_dim", IntRule::kPositive, &cfg->v_head_dim));
  std::optional<int> q_lora_rank;  // null in DeepSeek-V2-Lite: queries are projected directly
  ATTNKIT_RETURN_IF_ERROR(text.get_int("q_lora_rank", IntRule::kPositive, &q_lora_rank));
  cfg->q_lora_rank = q_lora_rank.value_or(0);
  // A "head_dim" key in MLA configs (newer transformers set it to qk_rope_head_dim) is not the
  // attention head size; the qk head is the nope and rope parts together.
  if (int64_t{cfg->qk_nope_head_dim} + cfg->qk_rope_head_dim > std::numeric_limits<int>::max()) {
    return text.type_error("qk_nope_head_dim", Json(cfg->qk_nope_head_dim),
                           "a positive integer whose sum with qk_rope_head_dim " +
                               std::to_string(cfg->qk_rope_head_dim) + " fits int32");
  }
  cfg->head_dim = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim;

  std::optional<int> index_topk;
  ATTNKIT_RETURN_IF_ERROR(text.get_int("index_topk", IntRule::kPositive, &index_topk));
  if (index_topk) {
    cfg->index_topk = *index_topk;
    ATTNKIT_RETURN_IF_ERROR(
        text.require_int("index_head_dim", IntRule::kPositive, &cfg->index_head_dim));
    ATTNKIT_RETURN_IF_ERROR(
        text.require_int("index_n_heads", IntRule::kPositive, &cfg->index_n_heads));
  }
  return Status::ok();
}

Status parse_decoder_heads(const Reader& text, ModelAttentionConfig* cfg) {
  ATTNKIT_RETURN_IF_ERROR(text.require_int("hidden_size", IntRule::kPositive, &cfg->hidden_size));
  ATTNKIT_RETURN_IF_ERROR(text.require_layers("num_hidden_layers", &cfg->num_layers));
  ATTNKIT_RETURN_IF_ERROR(
      text.require_int("num_attention_heads", IntRule::kPositive, &cfg->num_attention_heads));
  std::optional<int> kv_heads;
  ATTNKIT_RETURN_IF_ERROR(text.get_int("num_key_value_heads", IntRule::kPositive, &kv_heads));
  cfg->num_key_value_heads = kv_heads.value_or(cfg->num_attention_heads);
  if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
    return Status::invalid_argument(
        text.source() + ": " + text.find("num_key_value_heads").second->key_name("") +
        "num_key_value_heads " + std::to_string(cfg->num_key_value_heads) +
        " does not divide num_attention_heads " + std::to_string(cfg->num_attention_heads) +
        " (each KV head must serve a whole group of query heads)");
  }
  if (text.has("kv_lora_rank")) return parse_mla(text, cfg);

  std::optional<int> head_dim;
  ATTNKIT_RETURN_IF_ERROR(text.get_int("head_dim", IntRule::kPositive, &head_dim));
  if (!head_dim) {
    if (cfg->hidden_size % cfg->num_attention_heads != 0) {
      return Status::invalid_argument(
          text.source() + ": hidden_size " + std::to_string(cfg->hidden_size) +
          " is not divisible by num_attention_heads " + std::to_string(cfg->num_attention_heads) +
          " and head_dim is not given (expected head_dim, or hidden_size a multiple of the heads)");
    }
    head_dim = cfg->hidden_size / cfg->num_attention_heads;
  }
  cfg->head_dim = *head_dim;
  cfg->v_head_dim = *head_dim;
  return Status::ok();
}

bool is_gemma3(const ModelAttentionConfig& cfg) {
  return cfg.text_model_type == "gemma3_text" || cfg.text_model_type == "gemma3";
}

// Explicit layer_types list.
Status parse_layer_types(const Reader& text, ModelAttentionConfig* cfg) {
  auto [value, owner] = text.find("layer_types");
  const std::string expected = "a list of " + std::to_string(cfg->num_layers) +
                               " names from \"full_attention\", \"sliding_attention\", "
                               "\"linear_attention\"";
  if (!value->is_array() || value->size() != static_cast<size_t>(cfg->num_layers)) {
    return owner->type_error("layer_types", *value, expected);
  }
  for (size_t i = 0; i < value->size(); ++i) {
    const Json& name = (*value)[i];
    LayerKind kind = LayerKind::kFullAttention;
    if (name == "full_attention") {
      kind = LayerKind::kFullAttention;
    } else if (name == "sliding_attention") {
      kind = LayerKind::kSlidingAttention;
    } else if (name == "linear_attention") {
      kind = LayerKind::kLinearAttention;
    } else {
      return owner->error("layer_types", "[" + std::to_string(i) + "] is " + json_excerpt(name) +
                                             " (expected \"full_attention\", "
                                             "\"sliding_attention\" or \"linear_attention\")");
    }
    cfg->layer_kinds.push_back(kind);
  }
  return Status::ok();
}

// Layer kinds from the family's rule when the file has no layer_types.
Status derive_layer_kinds(const Reader& text, std::optional<int> window,
                          ModelAttentionConfig* cfg) {
  const int n = cfg->num_layers;
  cfg->layer_kinds.assign(n, LayerKind::kFullAttention);

  std::optional<int> full_interval;  // Qwen3-Next: every interval-th layer is full attention
  ATTNKIT_RETURN_IF_ERROR(
      text.get_int("full_attention_interval", IntRule::kPositive, &full_interval));
  if (full_interval) {
    for (int i = 0; i < n; ++i) {
      if ((i + 1) % *full_interval != 0) cfg->layer_kinds[i] = LayerKind::kLinearAttention;
    }
    return Status::ok();
  }

  std::optional<bool> use_sliding_window;  // Qwen2/2.5/3 and their VL variants
  ATTNKIT_RETURN_IF_ERROR(text.get_bool("use_sliding_window", &use_sliding_window));
  if (use_sliding_window) {
    if (!*use_sliding_window || !window) return Status::ok();
    std::optional<int> max_window_layers;
    ATTNKIT_RETURN_IF_ERROR(
        text.get_int("max_window_layers", IntRule::kNonNegative, &max_window_layers));
    for (int i = max_window_layers.value_or(kQwenDefaultMaxWindowLayers); i < n; ++i) {
      cfg->layer_kinds[i] = LayerKind::kSlidingAttention;
    }
    return Status::ok();
  }
  if (!window) return Status::ok();

  int period = 0;  // sliding unless (i + 1) % period == 0; 0 = every layer slides
  if (cfg->text_model_type == "gemma2") {
    period = kGemma2SlidingPeriod;
  } else if (cfg->text_model_type == "gpt_oss") {
    period = kGptOssSlidingPeriod;
  } else if (is_gemma3(*cfg)) {
    ATTNKIT_RETURN_IF_ERROR(
        text.require_int("sliding_window_pattern", IntRule::kPositive, &period));
  }
  for (int i = 0; i < n; ++i) {
    if (period == 0 || (i + 1) % period != 0) cfg->layer_kinds[i] = LayerKind::kSlidingAttention;
  }
  return Status::ok();
}

Status parse_layers(const Reader& text, ModelAttentionConfig* cfg) {
  std::optional<int> window;
  ATTNKIT_RETURN_IF_ERROR(text.get_int("sliding_window", IntRule::kPositive, &window));
  if (cfg->is_encoder_decoder) {
    cfg->layer_kinds.assign(cfg->num_layers, LayerKind::kFullAttention);
  } else if (text.has("layer_types")) {
    ATTNKIT_RETURN_IF_ERROR(parse_layer_types(text, cfg));
  } else {
    ATTNKIT_RETURN_IF_ERROR(derive_layer_kinds(text, window, cfg));
  }

  if (cfg->num_layers_of_kind(LayerKind::kSlidingAttention) > 0) {
    if (!window) {
      return text.missing("sliding_window",
                          "a positive integer, since some layers use sliding_attention");
    }
    cfg->sliding_window = *window;
  }

  cfg->has_linear_attention = cfg->num_layers_of_kind(LayerKind::kLinearAttention) > 0;
  if (cfg->has_linear_attention) {
    if (cfg->is_mla) {
      return text.error("layer_types", "mixes linear_attention layers with MLA (kv_lora_rank " +
                                           std::to_string(cfg->kv_lora_rank) +
                                           "); GDN hybrids need standard attention layers");
    }
    const std::pair<const char*, int*> keys[] = {
        {"linear_num_key_heads", &cfg->linear_num_key_heads},
        {"linear_num_value_heads", &cfg->linear_num_value_heads},
        {"linear_key_head_dim", &cfg->linear_key_head_dim},
        {"linear_value_head_dim", &cfg->linear_value_head_dim},
        {"linear_conv_kernel_dim", &cfg->linear_conv_kernel_dim},
    };
    for (const auto& [key, out] : keys) {
      ATTNKIT_RETURN_IF_ERROR(text.require_int(key, IntRule::kPositive, out));
    }
    if (cfg->linear_num_value_heads % cfg->linear_num_key_heads != 0) {
      return Status::invalid_argument(
          text.source() + ": linear_num_key_heads " + std::to_string(cfg->linear_num_key_heads) +
          " does not divide linear_num_value_heads " + std::to_string(cfg->linear_num_value_heads));
    }
  }
  return Status::ok();
}

Status parse_gemma_style(const Reader& text, ModelAttentionConfig* cfg) {
  std::optional<double> value;
  ATTNKIT_RETURN_IF_ERROR(text.get_number("attn_logit_softcapping", 0.0, &value));
  cfg->attn_logit_softcapping = static_cast<float>(value.value_or(0.0));
  ATTNKIT_RETURN_IF_ERROR(text.get_number("final_logit_softcapping", 0.0, &value));
  cfg->final_logit_softcapping = static_cast<float>(value.value_or(0.0));
  ATTNKIT_RETURN_IF_ERROR(text.get_number("query_pre_attn_scalar", 0.0, &value));
  if (value && *value == 0.0) {
    return text.type_error("query_pre_attn_scalar", Json(*value), "a positive number");
  }
  cfg->query_pre_attn_scalar = static_cast<float>(value.value_or(0.0));
  return Status::ok();
}

Status parse_dual_chunk(const Reader& text, ModelAttentionConfig* cfg) {
  const Json* dca = nullptr;
  ATTNKIT_RETURN_IF_ERROR(text.get_object("dual_chunk_attention_config", &dca));
  if (dca == nullptr) return Status::ok();
  const std::string prefix =
      text.find("dual_chunk_attention_config").second->key_name("dual_chunk_attention_config.");
  const Reader reader(*dca, text.source(), prefix, nullptr);
  for (const auto& item : dca->items()) {
    const auto& known = kDualChunkKnownKeys;
    if (std::find_if(std::begin(known), std::end(known),
                     [&](const char* k) { return item.key() == k; }) == std::end(known)) {
      return reader.error(item.key(), "is not a dual-chunk attention setting (value " +
                                          json_excerpt(item.value()) +
                                          "; expected keys chunk_size, local_size, "
                                          "original_max_position_embeddings, sparse_attention_*)");
    }
  }
  cfg->has_dual_chunk_attention = true;
  ATTNKIT_RETURN_IF_ERROR(
      reader.require_int("chunk_size", IntRule::kPositive, &cfg->dual_chunk_size));
  ATTNKIT_RETURN_IF_ERROR(
      reader.require_int("local_size", IntRule::kPositive, &cfg->dual_chunk_local_size));
  if (cfg->dual_chunk_local_size >= cfg->dual_chunk_size) {
    return reader.error("local_size", std::to_string(cfg->dual_chunk_local_size) +
                                          " must be smaller than chunk_size " +
                                          std::to_string(cfg->dual_chunk_size));
  }
  std::optional<int> original;
  ATTNKIT_RETURN_IF_ERROR(
      reader.get_int("original_max_position_embeddings", IntRule::kPositive, &original));
  cfg->dual_chunk_original_max_position_embeddings = original.value_or(0);
  return Status::ok();
}

// Vision tower sizes. Key spellings: Qwen2-VL depth/embed_dim/num_heads, Qwen2.5-VL
// depth/hidden_size/num_heads, CLIP/SigLIP num_hidden_layers/hidden_size/num_attention_heads,
// Mllama num_hidden_layers/hidden_size/attention_heads.
Status parse_vision(const Reader& root, ModelAttentionConfig* cfg) {
  const Json* vision = nullptr;
  ATTNKIT_RETURN_IF_ERROR(root.get_object("vision_config", &vision));
  if (vision == nullptr) return Status::ok();
  cfg->is_multimodal = true;
  const Reader reader(*vision, root.source(), "vision_config.", nullptr);
  auto first_int = [&](std::initializer_list<const char*> keys, int* out,
                       const char** found_key) -> Status {
    for (const char* key : keys) {
      std::optional<int> value;
      ATTNKIT_RETURN_IF_ERROR(reader.get_int(key, IntRule::kPositive, &value));
      if (value) {
        *out = *value;
        *found_key = key;
        return Status::ok();
      }
    }
    return Status::ok();
  };
  const char* layers_key = nullptr;
  const char* heads_key = nullptr;
  const char* width_key = nullptr;
  int width = 0;
  ATTNKIT_RETURN_IF_ERROR(
      first_int({"depth", "num_hidden_layers"}, &cfg->vision_num_layers, &layers_key));
  if (layers_key != nullptr) {
    ATTNKIT_RETURN_IF_ERROR(reader.check_layers(layers_key, cfg->vision_num_layers));
  }
  ATTNKIT_RETURN_IF_ERROR(first_int({"num_heads", "num_attention_heads", "attention_heads"},
                                    &cfg->vision_num_attention_heads, &heads_key));
  ATTNKIT_RETURN_IF_ERROR(first_int({"embed_dim", "hidden_size"}, &width, &width_key));
  if (width > 0 && cfg->vision_num_attention_heads > 0) {
    if (width % cfg->vision_num_attention_heads != 0) {
      return reader.error(width_key, std::to_string(width) + " is not divisible by " +
                                         reader.key_name(heads_key) + " " +
                                         std::to_string(cfg->vision_num_attention_heads));
    }
    cfg->vision_head_dim = width / cfg->vision_num_attention_heads;
  }
  return Status::ok();
}

Status parse_cross_attention_layers(const Reader& text, ModelAttentionConfig* cfg) {
  auto [value, owner] = text.find("cross_attention_layers");
  if (value == nullptr) return Status::ok();
  const std::string expected =
      "a list of layer indices in [0, " + std::to_string(cfg->num_layers) + ")";
  if (!value->is_array()) return owner->type_error("cross_attention_layers", *value, expected);
  for (const Json& index : *value) {
    if (!index.is_number_integer() || index.get<int64_t>() < 0 ||
        index.get<int64_t>() >= cfg->num_layers) {
      return owner->type_error("cross_attention_layers", *value, expected);
    }
    cfg->cross_attention_layers.push_back(index.get<int>());
  }
  std::sort(cfg->cross_attention_layers.begin(), cfg->cross_attention_layers.end());
  const auto repeated =
      std::adjacent_find(cfg->cross_attention_layers.begin(), cfg->cross_attention_layers.end());
  if (repeated != cfg->cross_attention_layers.end()) {
    return owner->error("cross_attention_layers",
                        "lists layer " + std::to_string(*repeated) + " more than once");
  }
  return Status::ok();
}

Status parse_max_positions(const Reader& text, ModelAttentionConfig* cfg) {
  std::optional<int> value;
  ATTNKIT_RETURN_IF_ERROR(text.get_int("max_position_embeddings", IntRule::kPositive, &value));
  cfg->max_position_embeddings = value.value_or(0);
  return Status::ok();
}

Result<ModelAttentionConfig> parse_with_source(std::string_view json_text,
                                               const std::string& source) {
  ATTNKIT_RETURN_IF_ERROR(
      check_json_nesting(json_text, source, "a config.json nests a few levels"));
  // A key given twice keeps its last value, as Python's json (transformers, SGLang) does: published
  // config.json files are hand-edited, and refusing them would refuse what the engine loads.
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::parse_error& e) {
    return Status::invalid_argument(source + ": malformed JSON at " +
                                    describe_position(json_text, e.byte) + ": " +
                                    parser_reason(e.what()));
  } catch (const Json::exception& e) {  // out_of_range: a number past double's range
    return Status::invalid_argument(source +
                                    ": malformed JSON: " + without_json_exception_tag(e.what()));
  }
  if (!root.is_object()) {
    return Status::invalid_argument(source + ": the top level must be a JSON object, got " +
                                    std::string(root.type_name()));
  }

  ModelAttentionConfig cfg;
  const Reader top(root, source, "", nullptr);
  std::optional<std::string> model_type;
  ATTNKIT_RETURN_IF_ERROR(top.get_string("model_type", &model_type));
  if (!model_type) return top.missing("model_type", "a string such as \"llama\"");
  cfg.model_type = *model_type;
  ATTNKIT_RETURN_IF_ERROR(parse_architectures(top, root, &cfg));

  const Json* nested = nullptr;
  ATTNKIT_RETURN_IF_ERROR(top.get_object("text_config", &nested));
  cfg.text_model_type = cfg.model_type;
  if (nested != nullptr) {
    auto it = nested->find("model_type");
    if (it != nested->end() && !it->is_string()) {
      return Status::invalid_argument(source + ": text_config.model_type must be a string, got " +
                                      json_excerpt(*it));
    }
    if (it != nested->end()) {
      cfg.text_model_type = it->get<std::string>();
    } else if (cfg.model_type == "gemma3") {
      cfg.text_model_type = "gemma3_text";
    }
  }
  const Json& text_source = nested != nullptr ? *nested : root;
  Json with_defaults;
  if (is_gemma3(cfg)) {
    with_defaults = text_source;
    const Json defaults = gemma3_text_defaults();
    for (const auto& item : defaults.items()) {
      auto it = with_defaults.find(item.key());
      if (it == with_defaults.end() || it->is_null()) with_defaults[item.key()] = item.value();
    }
  }
  const Json& text_json = is_gemma3(cfg) ? with_defaults : text_source;
  const Reader text = nested != nullptr ? Reader(text_json, source, "text_config.", &top)
                                        : Reader(text_json, source, "", nullptr);

  ATTNKIT_RETURN_IF_ERROR(parse_dtype(top, text, &cfg));
  std::optional<bool> encoder_decoder;
  ATTNKIT_RETURN_IF_ERROR(top.get_bool("is_encoder_decoder", &encoder_decoder));
  if (encoder_decoder.value_or(false)) {
    ATTNKIT_RETURN_IF_ERROR(parse_encoder_decoder(top, &cfg));
  } else {
    ATTNKIT_RETURN_IF_ERROR(parse_decoder_heads(text, &cfg));
    ATTNKIT_RETURN_IF_ERROR(parse_max_positions(text, &cfg));
  }
  ATTNKIT_RETURN_IF_ERROR(parse_rope(text, &cfg));
  ATTNKIT_RETURN_IF_ERROR(parse_gemma_style(text, &cfg));
  ATTNKIT_RETURN_IF_ERROR(parse_layers(text, &cfg));
  ATTNKIT_RETURN_IF_ERROR(parse_dual_chunk(text, &cfg));
  ATTNKIT_RETURN_IF_ERROR(parse_cross_attention_layers(text, &cfg));
  ATTNKIT_RETURN_IF_ERROR(parse_vision(top, &cfg));
  // gpt-oss learns one sink logit per head; the config has no key for it, the architecture implies
  // it.
  cfg.has_attention_sinks =
      cfg.text_model_type == "gpt_oss" || contains(cfg.architectures, "GptOssForCausalLM");
  return cfg;
}

}  // namespace

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention:
      return "full_attention";
    case LayerKind::kSlidingAttention:
      return "sliding_attention";
    case LayerKind::kLinearAttention:
      return "linear_attention";
  }
  return "unknown_layer_kind";
}

bool ModelAttentionConfig::is_deepseek_v3_family() const {
  return contains(architectures, "DeepseekV3ForCausalLM") && index_topk == 0;
}

float ModelAttentionConfig::default_scaling() const {
  if (query_pre_attn_scalar > 0.f)
    return static_cast<float>(1.0 / std::sqrt(query_pre_attn_scalar));
  if (head_dim <= 0) return 0.f;
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (is_mla && rope_scaling_factor > 1.0 && rope_mscale_all_dim > 0.0) {
    const double mscale =
        kYarnMscaleSlope * rope_mscale_all_dim * std::log(rope_scaling_factor) + 1.0;
    scale *= mscale * mscale;
  }
  return static_cast<float>(scale);
}

int ModelAttentionConfig::num_layers_of_kind(LayerKind kind) const {
  return static_cast<int>(std::count(layer_kinds.begin(), layer_kinds.end(), kind));
}

bool ModelAttentionConfig::is_cross_attention_layer(int layer_id) const {
  return std::binary_search(cross_attention_layers.begin(), cross_attention_layers.end(), layer_id);
}

std::string ModelAttentionConfig::summary() const {
  std::ostringstream out;
  out << model_type;
  if (!architectures.empty()) out << " (" << architectures.front() << ")";
  out << ": " << num_layers << " layers, ";
  if (is_mla) {
    out << "MLA " << num_attention_heads << " heads, kv_lora_rank " << kv_lora_rank << ", qk "
        << qk_nope_head_dim << "+" << qk_rope_head_dim << ", v " << v_head_dim;
    if (q_lora_rank > 0) out << ", q_lora_rank " << q_lora_rank;
  } else {
    const int group = num_key_value_heads > 0 ? num_attention_heads / num_key_value_heads : 0;
    const char* kind = num_key_value_heads == num_attention_heads ? "MHA"
                       : num_key_value_heads == 1                 ? "MQA"
                                                                  : "GQA";
    out << kind << " " << num_attention_heads << "q/" << num_key_value_heads << "kv heads";
    if (group > 1 && num_key_value_heads > 1) out << " (group " << group << ")";
    out << ", head_dim " << head_dim;
  }
  out << ", scale " << default_scaling() << ", " << dtype_name(dtype);
  if (max_position_embeddings > 0) out << ", max_pos " << max_position_embeddings;
  if (sliding_window > 0) {
    out << ", sliding_window " << sliding_window << " on "
        << num_layers_of_kind(LayerKind::kSlidingAttention) << "/" << num_layers << " layers";
  }
  if (attn_logit_softcapping > 0.f) out << ", softcap " << attn_logit_softcapping;
  if (has_attention_sinks) out << ", attention sinks";
  if (index_topk > 0) {
    out << ", NSA index_topk " << index_topk << " (" << index_n_heads << " x " << index_head_dim
        << ")";
  }
  if (has_linear_attention) {
    out << ", GDN linear attention on " << num_layers_of_kind(LayerKind::kLinearAttention) << "/"
        << num_layers << " layers (" << linear_num_key_heads << "k/" << linear_num_value_heads
        << "v heads, " << linear_key_head_dim << "/" << linear_value_head_dim << ")";
  }
  if (has_dual_chunk_attention) {
    out << ", dual-chunk " << dual_chunk_size << "/" << dual_chunk_local_size;
  }
  if (is_encoder_decoder) {
    out << ", encoder-decoder (encoder " << encoder_layers << " layers x "
        << encoder_attention_heads << " heads)";
  }
  if (is_multimodal) {
    out << ", multimodal";
    if (vision_num_layers > 0) {
      out << " (vision " << vision_num_layers << " layers x " << vision_num_attention_heads
          << " heads)";
    }
  }
  if (!cross_attention_layers.empty()) {
    out << ", " << cross_attention_layers.size() << " cross-attention layers";
  }
  return out.str();
}

Result<ModelAttentionConfig> parse_model_config(std::string_view json_text) {
  return parse_with_source(json_text, "config.json");
}

Result<ModelAttentionConfig> load_model_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file(path);
  if (fs::is_directory(file, ec)) file /= "config.json";
  if (!fs::is_regular_file(file, ec)) {
    return Status::not_found("model config \"" + file.string() +
                             "\" does not exist or is not a regular file (expected a "
                             "config.json file or a model directory containing one)");
  }
  const std::uintmax_t bytes = fs::file_size(file, ec);
  if (!ec && bytes > static_cast<std::uintmax_t>(kMaxConfigBytes)) {
    return Status::invalid_argument("model config \"" + file.string() + "\" is " +
                                    std::to_string(bytes) + " bytes; a config.json is at most " +
                                    std::to_string(kMaxConfigBytes >> 20) +
                                    " MiB (is it a weights file?)");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return Status::not_found("model config \"" + file.string() + "\" cannot be opened for reading");
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return parse_with_source(contents.str(), file.string());
}

}  // namespace attnkit
