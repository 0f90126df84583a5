// resolve(): backend selection and validation in SGLang's rule order (DESIGN.md section 5).
//
// Order: flag values -> device defaults -> model-specific rules -> generic default -> per-backend
// fix-ups and device checks -> model features -> linear attention -> KV dtype (incl. KV4) ->
// page size -> speculative rules -> CUDA graphs. Every capability question is answered by the
// backends' descriptors; the rules here only decide which descriptor applies.
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/selection.h"
#include "core/str_cat.h"

namespace attnkit {
namespace {

// ---- SGLang constants that are rules about combinations, not backend capabilities ----

// Hopper defaults to fa3 only with CUDA >= 12.3 (is_hopper_with_cuda_12_3).
constexpr int kFa3DefaultMinCudaRuntime = 12030;
// ROCm MLA: aiter handles 16 or 128 KV heads per rank, other counts go to triton.
constexpr std::array<int, 2> kAiterMlaHeadCounts = {16, 128};
// GDN hybrids on SM100 need one of these full-attention backends (Qwen3-Next on Blackwell).
constexpr std::array<std::string_view, 4> kGdnSm100FullAttnBackends = {"triton", "trtllm_mha",
                                                                       "fa4", "flashinfer"};
// Models with attention sinks (gpt-oss) run on these backends only (SGLang's GptOss rule; our
// torch_native reference and intel_amx implement sinks too: without intel_amx the CPU's device
// default refused gpt-oss).
constexpr std::array<std::string_view, 7> kAttentionSinkBackends = {
    "triton", "trtllm_mha", "fa3", "fa4", "ascend", "torch_native", "intel_amx"};
// KV4 with an fa4 prefill backend: these decode backends are not compatible with fa4's fp4
// layout (SGLang: "Except for trtllm_mha being incompatible with FA4"; flashmla is absent from
// KV4_FA4_MLA_BACKEND_CHOICES).
constexpr std::array<std::string_view, 2> kKv4Fa4IncompatibleDecode = {"trtllm_mha", "flashmla"};
constexpr std::array<std::string_view, 5> kSpeculativeAlgorithms = {"EAGLE", "EAGLE3", "NEXTN",
                                                                    "STANDALONE", "NGRAM"};
// (num_steps, topk, num_draft_tokens) when none is given (SGLang auto_choose_speculative_params).
struct SpecParams {
  int num_steps;
  int topk;
  int num_draft_tokens;
};
constexpr SpecParams kSpecParamsChain = {3, 1, 4};  // DeepSeek, gpt-oss, STANDALONE
constexpr SpecParams kSpecParamsTree = {5, 4, 8};   // Llama and every other model
// NGRAM drafts from a match trie, not a draft model (no steps): topk is the trie's breadth
// (SGLang's --speculative-ngram-max-bfs-breadth, 10) and the draft tokens its match window
// (--speculative-ngram-max-match-window-size, 12).
constexpr SpecParams kSpecParamsNgram = {1, 10, 12};
constexpr int kSglangDefaultPageSize = 1;
constexpr int kCcMajorScale = 10;

template <typename Container>
bool contains(const Container& c, std::string_view v) {
  return std::find(c.begin(), c.end(), v) != c.end();
}

std::string sm(int cc) { return "sm" + std::to_string(cc); }

std::string cuda_version(int runtime) {
  constexpr int kMajor = 1000;
  constexpr int kMinor = 10;
  return std::to_string(runtime / kMajor) + "." + std::to_string((runtime % kMajor) / kMinor);
}

std::string device_label(const DeviceInfo& device) {
  std::string s = device.name + " [" + platform_name(device.platform);
  if (device.platform == Platform::kCUDA) {
    s += " " + sm(device.compute_capability);
    if (device.cuda_runtime_version > 0) s += ", CUDA " + cuda_version(device.cuda_runtime_version);
  }
  if (device.platform == Platform::kCPU) {
    s += device.has_amx_bf16 ? ", AMX-BF16" : (device.has_avx512 ? ", AVX-512" : "");
  }
  return s + "]";
}

std::string platforms_label(const std::vector<Platform>& platforms) {
  std::vector<std::string> v;
  for (Platform p : platforms) v.emplace_back(platform_name(p));
  return join(v, "/");
}

DType model_kv_dtype(const ModelAttentionConfig& model) { return model.dtype; }

DType storage_dtype(KVCacheDType kv, const ModelAttentionConfig& model) {
  switch (kv) {
    case KVCacheDType::kAuto:
      return model_kv_dtype(model);
    case KVCacheDType::kBF16:
      return DType::kBF16;
    case KVCacheDType::kFP16:
      return DType::kF16;
    case KVCacheDType::kFP8E4M3:
      return DType::kFP8E4M3;
    case KVCacheDType::kFP8E5M2:
      return DType::kFP8E5M2;
    case KVCacheDType::kFP4E2M1:
      return DType::kFP4E2M1;
  }
  return model_kv_dtype(model);
}

// Which flag (or rule) put a backend into a role; used to word errors and warnings.
struct RoleChoice {
  std::string backend;
  std::string origin;      // "--attention-backend", "generic default", ...
  bool from_flag = false;  // the user named it
  // A backend put in place of another (origin "fix-up of ..." / "fallback for ...", naming the one
  // it replaced): messages name it as "torch_native (fix-up of --attention-backend intel_amx)".
  bool replaced = false;
};

// "--attention-backend fa3", "the device default intel_amx",
// "torch_native (fix-up of --attention-backend intel_amx)".
std::string named(const RoleChoice& c) {
  if (c.replaced) return c.backend + " (" + c.origin + ")";
  return c.from_flag ? c.origin + " " + c.backend : "the " + c.origin + " " + c.backend;
}

// A candidate list in a message: "none" when it is empty (a message ended in ": ").
std::string or_none(const std::vector<std::string>& names) {
  return names.empty() ? std::string("none") : join(names);
}

class Resolver {
 public:
  Resolver(const ServerArgs& args, const ModelAttentionConfig& model, const DeviceInfo& device,
           const BackendRegistry& registry)
      : args_(args), model_(model), device_(device), reg_(registry) {}

  Result<Selection> run();

 private:
  // ---- steps, in rule order ----
  Status validate_flag_values();
  void device_defaults();
  Status model_specific_rules();
  void generic_default();
  Status compose_roles();
  Status per_backend_fixups();
  Status check_roles_on_device();
  Status check_head_dim();
  Status check_model_features();
  void model_feature_fallbacks();
  bool model_uses_window() const;
  // The first feature the model needs that backend `name` (row `r`) lacks (sliding window,
  // encoder attention, attention sinks); nullptr: none.
  const char* lacks_for_model(const FeatureRow& r, std::string_view name) const;
  // On a CPU without AMX-BF16 SGLang's fix-up runs torch_native for intel_amx, unless torch_native
  // lacks what the model needs and intel_amx has it (then intel_amx runs its AVX paths).
  bool amx_fixed_up() const;
  Status linear_attention();
  Status kv_cache_dtype();
  Status page_size();
  Status speculative_rules();
  void cuda_graphs();
  void mla_chunked_prefix_cache();

  // ---- helpers ----
  const BackendDescriptor& desc(const std::string& name) const { return *reg_.find(name); }
  const FeatureRow* row(const std::string& name) const { return desc(name).row(kind_); }
  bool any_backend_flag() const {
    return args_.attention_backend || args_.prefill_attention_backend ||
           args_.decode_attention_backend;
  }
  // Backends usable for this model kind, `role` and device, filtered by `pred` on the row.
  std::vector<std::string> candidates(BackendRole role,
                                      const std::function<bool(const FeatureRow&)>& pred) const;
  std::vector<std::string> candidates(BackendRole role) const {
    return candidates(role, [](const FeatureRow&) { return true; });
  }
  bool available(const std::string& name, BackendRole role) const;
  // The platform's universal backend (torch_native on CPUs, triton on GPUs) where it is built (or
  // the device is virtual), runs `role` on this device and its row passes `fits`; else nullptr.
  const char* universal_fallback(BackendRole role,
                                 const std::function<bool(const FeatureRow&)>& fits) const;
  const char* universal_name() const;  // torch_native on CPUs, triton on GPUs
  // A default choice moved to `fallback`, with the warning "`why`; using <fallback>".
  void fall_back(RoleChoice* c, const char* fallback, const std::string& why);
  // The roles (prefill, decode) with duplicates removed.
  std::vector<std::pair<BackendRole, const RoleChoice*>> roles() const;
  std::string who(const RoleChoice& c, BackendRole role) const;
  // who() for a change made to every role a backend serves: `shared` (one backend for both roles,
  // as it was before the change) names it without its role, so both roles' warnings are one line.
  std::string who_once(const RoleChoice& c, BackendRole role, bool shared) const;
  void reason(std::string line) { s_.reasons.push_back(std::move(line)); }
  void warn(std::string line) {
    if (!contains(s_.warnings, line)) s_.warnings.push_back(std::move(line));
  }
  void set_default(std::string backend, std::string origin, std::string why) {
    chosen_ = RoleChoice{std::move(backend), std::move(origin), false};
    reason("attention backend: " + chosen_->backend + " (" + chosen_->origin + ": " + why + ")");
  }

  const ServerArgs& args_;
  const ModelAttentionConfig& model_;
  const DeviceInfo& device_;
  const BackendRegistry& reg_;
  AttentionKind kind_ = AttentionKind::kMHA;
  Selection s_;
  KVCacheDType kv_ = KVCacheDType::kAuto;
  SpeculativeAttentionMode spec_mode_ = SpeculativeAttentionMode::kPrefill;
  std::optional<RoleChoice> chosen_;  // the --attention-backend value (flag or default)
  RoleChoice prefill_;
  RoleChoice decode_;
  std::optional<int> spec_topk_;  // as given; resolved in speculative_rules()
};

std::vector<std::string> Resolver::candidates(
    BackendRole role, const std::function<bool(const FeatureRow&)>& pred) const {
  std::vector<std::string> out;
  for (const BackendDescriptor& d : reg_.all()) {
    const FeatureRow* r = d.row(kind_);
    // intel_amx on a CPU without AMX is torch_native after the fix-up: not a choice to offer.
    if (d.name == "intel_amx" && amx_fixed_up()) continue;
    if (r != nullptr && pred(*r) && check_backend_on_device(d, device_, role).is_ok()) {
      out.push_back(d.name);
    }
  }
  return out;
}

bool Resolver::available(const std::string& name, BackendRole role) const {
  const BackendDescriptor* d = reg_.find(name);
  if (d == nullptr || d->row(kind_) == nullptr) return false;
  if (!check_backend_on_device(*d, device_, role).is_ok()) return false;
  // A virtual device plans as if every backend were installed (SGLang's is_*_available()).
  return device_.is_virtual || d->built;
}

const char* Resolver::universal_name() const {
  return device_.platform == Platform::kCPU ? "torch_native" : "triton";
}

const char* Resolver::universal_fallback(BackendRole role,
                                         const std::function<bool(const FeatureRow&)>& fits) const {
  const char* name = universal_name();
  const BackendDescriptor* d = reg_.find(name);
  const FeatureRow* r = d != nullptr ? d->row(kind_) : nullptr;
  // A virtual device plans as if every backend were installed (available()).
  if (r == nullptr || (!d->built && !device_.is_virtual) || !fits(*r) ||
      !check_backend_on_device(*d, device_, role).is_ok()) {
    return nullptr;
  }
  return name;
}

void Resolver::fall_back(RoleChoice* c, const char* fallback, const std::string& why) {
  warn(why + "; using " + fallback);
  c->origin = "fallback for " + named(*c);
  c->backend = fallback;
  c->replaced = true;
}

std::vector<std::pair<BackendRole, const RoleChoice*>> Resolver::roles() const {
  std::vector<std::pair<BackendRole, const RoleChoice*>> out = {{BackendRole::kPrefill, &prefill_}};
  out.emplace_back(BackendRole::kDecode, &decode_);
  return out;
}

std::string Resolver::who_once(const RoleChoice& c, BackendRole role, bool shared) const {
  return shared ? named(c) : who(c, role);
}

std::string Resolver::who(const RoleChoice& c, BackendRole role) const {
  const std::string role_name = prefill_.backend != decode_.backend
                                    ? std::string(" (") + backend_role_name(role) + " backend)"
                                    : "";
  return named(c) + role_name;
}

// ---- step 0: every flag value is valid on its own ----
Status Resolver::validate_flag_values() {
  // A hand-built ModelAttentionConfig (parse_model_config checks the config.json ones): 0 means
  // "not given" in these fields, a negative value is a caller's error.
  for (const auto& [field, value] : {std::pair{"num_layers", model_.num_layers},
                                     {"num_attention_heads", model_.num_attention_heads},
                                     {"num_key_value_heads", model_.num_key_value_heads},
                                     {"head_dim", model_.head_dim},
                                     {"v_head_dim", model_.v_head_dim}}) {
    if (value < 0) {
      return Status::invalid_argument(
          cat("the model's ", field, " ", value, " is negative; it must be >= 0 (0: not given)"));
    }
  }
  if (!model_.is_mla && model_.num_attention_heads > 0 && model_.num_key_value_heads > 0 &&
      model_.num_attention_heads % model_.num_key_value_heads != 0) {
    return Status::invalid_argument(
        cat("the model's num_key_value_heads ", model_.num_key_value_heads,
            " does not divide its num_attention_heads ", model_.num_attention_heads,
            " (each kv head serves a whole group of query heads)"));
  }
  const std::string valid_backends = join(reg_.names());
  const std::pair<const char*, const std::optional<std::string>*> backend_flags[] = {
      {"--attention-backend", &args_.attention_backend},
      {"--prefill-attention-backend", &args_.prefill_attention_backend},
      {"--decode-attention-backend", &args_.decode_attention_backend},
  };
  for (const auto& [flag, value] : backend_flags) {
    if (value->has_value() && reg_.find(**value) == nullptr) {
      return Status::invalid_argument(
          std::string(flag) + " \"" + **value +
          "\" is not a known attention backend; valid values: " + valid_backends);
    }
  }
  if (args_.page_size && *args_.page_size < 1) {
    return Status::invalid_argument("--page-size " + std::to_string(*args_.page_size) +
                                    " is invalid; it must be a positive integer");
  }
  if (args_.tp_size < 1) {
    return Status::invalid_argument("--tp-size " + std::to_string(args_.tp_size) +
                                    " is invalid; it must be a positive integer");
  }
  // Each rank holds num_attention_heads / tp_size query heads (KV heads are replicated when fewer).
  if (model_.num_attention_heads > 0 && model_.num_attention_heads % args_.tp_size != 0) {
    return Status::invalid_argument(cat("--tp-size ", args_.tp_size,
                                        " does not divide the model's ", model_.num_attention_heads,
                                        " attention heads (num_attention_heads)"));
  }
  ATTNKIT_ASSIGN_OR_RETURN(kv_, parse_kv_cache_dtype(args_.kv_cache_dtype));
  if (args_.chunked_prefill_size &&
      (*args_.chunked_prefill_size == 0 || *args_.chunked_prefill_size < -1)) {
    return Status::invalid_argument("--chunked-prefill-size " +
                                    std::to_string(*args_.chunked_prefill_size) +
                                    " is invalid; use -1 (off) or a positive token count");
  }
  // SGLang mixes decode rows into prefill batches only with chunked prefill on (its scheduler's
  // is_mixed_chunk = chunked_prefill_size set and enable_mixed_chunk); with it off the flag does
  // nothing, and the selection says so instead of reporting mixed batches.
  if (args_.enable_mixed_chunk && args_.chunked_prefill_size == -1) {
    s_.enable_mixed_chunk = false;
    warn(
        "--enable-mixed-chunk is ignored: chunked prefill is off (--chunked-prefill-size -1), and "
        "prefill and decode rows mix only in chunked-prefill batches");
  }
  ATTNKIT_ASSIGN_OR_RETURN(spec_mode_,
                           parse_speculative_attention_mode(args_.speculative_attention_mode));
  if (args_.speculative_algorithm &&
      !contains(kSpeculativeAlgorithms, *args_.speculative_algorithm)) {
    return Status::invalid_argument(
        "--speculative-algorithm \"" + *args_.speculative_algorithm +
        "\" is not valid; valid values: " + join(kSpeculativeAlgorithms));
  }
  const std::pair<const char*, const std::optional<int>*> spec_knobs[] = {
      {"--speculative-num-steps", &args_.speculative_num_steps},
      {"--speculative-eagle-topk", &args_.speculative_eagle_topk},
      {"--speculative-num-draft-tokens", &args_.speculative_num_draft_tokens},
  };
  for (const auto& [flag, value] : spec_knobs) {
    if (value->has_value() && (**value < 1 || **value > kMaxSpeculativeValue)) {
      return Status::invalid_argument(std::string(flag) + " " + std::to_string(**value) +
                                      " is invalid; it must be an integer from 1 to " +
                                      std::to_string(kMaxSpeculativeValue));
    }
    if (value->has_value() && !args_.speculative_enabled()) {
      warn(std::string(flag) +
           " is ignored: speculative decoding is off (no "
           "--speculative-algorithm)");
    }
  }
  if (spec_mode_ == SpeculativeAttentionMode::kDecode && !args_.speculative_enabled()) {
    warn(
        "--speculative-attention-mode decode is ignored: speculative decoding is off (no "
        "--speculative-algorithm)");
  }
  if (args_.attention_backend && args_.prefill_attention_backend &&
      args_.decode_attention_backend) {
    warn("--attention-backend " + *args_.attention_backend +
         " serves neither phase: --prefill-attention-backend and --decode-attention-backend name "
         "both phases' backends");
  }
  spec_topk_ = args_.speculative_eagle_topk;
  const std::string valid_linear = join(reg_.linear_names());
  const std::pair<const char*, std::optional<std::string>> linear_flags[] = {
      {"--linear-attn-backend", args_.linear_attn_backend},
      {"--linear-attn-prefill-backend", args_.linear_attn_prefill_backend},
      {"--linear-attn-decode-backend", args_.linear_attn_decode_backend},
  };
  for (const auto& [flag, value] : linear_flags) {
    if (value && reg_.find_linear(*value) == nullptr) {
      return Status::invalid_argument(
          std::string(flag) + " \"" + *value +
          "\" is not a known linear-attention backend; valid values: " + valid_linear);
    }
  }
  return Status::ok();
}

// ---- step 1: device defaults (SGLang _handle_device_specific_backends) ----
void Resolver::device_defaults() {
  if (args_.attention_backend) return;
  switch (device_.platform) {
    case Platform::kCPU:
      set_default("intel_amx", "device default", "CPU");
      break;
    case Platform::kNPU:
      set_default("ascend", "device default", "Ascend NPU");
      break;
    case Platform::kXPU:
      set_default("intel_xpu", "device default", "Intel XPU");
      break;
    case Platform::kCUDA:
    case Platform::kROCm:
      break;
  }
}

// ---- step 2: model-specific rules (SGLang _handle_model_specific_adjustments) ----
Status Resolver::model_specific_rules() {
  // Dual-chunk attention models (Qwen2.5-1M): dual_chunk_flash_attn, any other is an error.
  if (model_.has_dual_chunk_attention) {
    const std::pair<const char*, const std::optional<std::string>*> flags[] = {
        {"--attention-backend", &args_.attention_backend},
        {"--prefill-attention-backend", &args_.prefill_attention_backend},
        {"--decode-attention-backend", &args_.decode_attention_backend},
    };
    for (const auto& [flag, value] : flags) {
      if (value->has_value() && **value != "dual_chunk_flash_attn") {
        return Status::invalid_argument(
            std::string(flag) + " " + **value +
            ": the model's config has dual_chunk_attention_config, which needs "
            "dual_chunk_flash_attn; allowed: dual_chunk_flash_attn (or leave the flag unset)");
      }
    }
    if (!args_.attention_backend) {
      set_default("dual_chunk_flash_attn", "model rule", "config has dual_chunk_attention_config");
    }
    return Status::ok();
  }
  if (any_backend_flag()) return Status::ok();
  const bool cuda = device_.platform == Platform::kCUDA;
  if (model_.is_deepseek_v32()) {
    if (available("nsa", BackendRole::kDecode)) {
      set_default(
          "nsa", "model rule",
          "DeepSeek-V3.2 sparse attention (index_topk " + std::to_string(model_.index_topk) + ")");
    } else {
      reason("model rule: DeepSeek-V3.2 would use nsa, which does not run on " +
             device_label(device_) + "; using the generic default");
    }
    return Status::ok();
  }
  if (model_.is_mla && model_.is_deepseek_v3_family() && device_.is_sm100()) {
    set_default("trtllm_mla", "model rule", "DeepSeek V3/R1 on SM100");
    return Status::ok();
  }
  if (model_.has_attention_sinks && cuda) {
    if (device_.is_sm100()) {
      set_default("trtllm_mha", "model rule", "attention sinks (gpt-oss) on SM100");
    } else if (device_.is_hopper()) {
      set_default("fa3", "model rule", "attention sinks (gpt-oss) on SM90");
    } else {
      set_default("triton", "model rule", "attention sinks (gpt-oss) below SM90");
    }
    return Status::ok();
  }
  if (model_.has_linear_attention && device_.is_sm100()) {
    set_default("triton", "model rule", "GDN hybrid (Qwen3-Next) on SM100");
  }
  return Status::ok();
}

// ---- step 3: generic default (SGLang _handle_attention_backend_compatibility) ----
void Resolver::generic_default() {
  if (args_.attention_backend || chosen_) return;
  if (args_.prefill_attention_backend && args_.decode_attention_backend) return;
  const bool spec = args_.speculative_enabled();
  // is_no_spec_infer_or_topk_one: no spec, or topk not given, or topk 1 with page size 1.
  const bool no_spec_or_topk1 =
      !spec || !spec_topk_ || (*spec_topk_ == 1 && args_.page_size.value_or(1) == 1);
  const bool hopper_cuda_12_3 =
      device_.is_hopper() && device_.cuda_runtime_version >= kFa3DefaultMinCudaRuntime;
  if (kind_ == AttentionKind::kMHA) {
    if (hopper_cuda_12_3 && no_spec_or_topk1) {
      set_default("fa3", "generic default", "MHA on Hopper with CUDA >= 12.3");
    } else if (device_.is_sm100() &&
               (!spec || (spec_topk_ && *spec_topk_ == 1 && args_.page_size.value_or(1) == 1))) {
      // SGLang's is_no_spec_infer_or_topk_one, except that a topk not given does not count as 1
      // here: attnkit's automatic speculative parameters for most models have topk 4 (SGLang's
      // older (5, 4, 8)), which trtllm_mha cannot run, so such a batch goes to flashinfer.
      set_default("trtllm_mha", "generic default",
                  "MHA on SM100 without speculative decoding, or with topk 1 at page size 1");
    } else if (device_.platform == Platform::kROCm) {
      set_default("aiter", "generic default", "MHA on ROCm");
    } else if (available("flashinfer", BackendRole::kPrefill) &&
               available("flashinfer", BackendRole::kDecode) && !model_.has_attention_sinks) {
      set_default("flashinfer", "generic default", "MHA, flashinfer available");
    } else {
      set_default("triton", "generic default",
                  model_.has_attention_sinks ? "MHA with attention sinks"
                                             : "MHA, flashinfer not available on this device");
    }
    return;
  }
  if (hopper_cuda_12_3) {
    set_default("fa3", "generic default", "MLA on Hopper with CUDA >= 12.3");
  } else if (device_.is_sm100()) {
    set_default("flashinfer", "generic default", "MLA on SM100");
  } else if (device_.platform == Platform::kROCm) {
    const int heads = model_.num_key_value_heads / args_.tp_size;
    if (std::find(kAiterMlaHeadCounts.begin(), kAiterMlaHeadCounts.end(), heads) !=
        kAiterMlaHeadCounts.end()) {
      set_default("aiter", "generic default",
                  "MLA on ROCm with " + std::to_string(heads) + " heads per rank");
    } else {
      set_default(
          "triton", "generic default",
          "MLA on ROCm with " + std::to_string(heads) + " heads per rank (aiter needs 16 or 128)");
    }
  } else {
    set_default("triton", "generic default", "MLA");
  }
}

// ---- step 4: per-phase roles (DESIGN.md section 6) ----
Status Resolver::compose_roles() {
  if (args_.attention_backend) {
    chosen_ = RoleChoice{*args_.attention_backend, "--attention-backend", true};
  } else if (args_.prefill_attention_backend &&
             args_.prefill_attention_backend == args_.decode_attention_backend) {
    chosen_ = RoleChoice{*args_.prefill_attention_backend,
                         "--prefill-attention-backend/--decode-attention-backend", true};
  }
  if (args_.prefill_attention_backend) {
    prefill_ = RoleChoice{*args_.prefill_attention_backend, "--prefill-attention-backend", true};
  } else if (chosen_) {
    prefill_ = *chosen_;
  }
  if (args_.decode_attention_backend) {
    decode_ = RoleChoice{*args_.decode_attention_backend, "--decode-attention-backend", true};
  } else if (chosen_) {
    decode_ = *chosen_;
  }
  if (prefill_.backend.empty() || decode_.backend.empty()) {
    return Status::internal("resolve: no backend chosen for a phase");
  }
  return Status::ok();
}

// ---- step 5: documented automatic fix-ups, then the device check of every role ----
Status Resolver::per_backend_fixups() {
  // One fix-up changes a backend in every role it serves; the warning names it once.
  auto fix = [&](const std::string& from, const std::string& to, const std::string& why) {
    const bool shared = prefill_.backend == decode_.backend;
    for (auto [role, c] :
         {std::pair{BackendRole::kPrefill, &prefill_}, std::pair{BackendRole::kDecode, &decode_}}) {
      if (c->backend != from) continue;
      warn(who_once(*c, role, shared) + " -> " + to + ": " + why);
      c->origin = "fix-up of " + named(*c);
      c->backend = to;
      c->replaced = true;
    }
  };
  if (device_.platform == Platform::kCPU && !device_.has_amx_bf16) {
    // SGLang's fix-up, unless torch_native lacks what the model needs and intel_amx has it: then
    // intel_amx stays and runs its AVX-512 / AVX2 paths (DESIGN.md section 4), rather than the
    // fix-up turning a model intel_amx serves into an error (gpt-oss's window on a CPU without
    // AMX was refused).
    if (!amx_fixed_up()) {
      const char* lacks = lacks_for_model(*row("torch_native"), "torch_native");
      const bool shared = prefill_.backend == decode_.backend;
      for (auto [role, c] : roles()) {
        if (c->backend != "intel_amx") continue;
        warn(who_once(*c, role, shared) +
             " runs its AVX-512 / AVX2 paths: this CPU has no AMX-BF16, and SGLang's fix-up "
             "torch_native lacks " +
             lacks + ", which the model uses");
      }
    } else {
      fix("intel_amx", "torch_native", "this CPU has no AMX-BF16 (SGLang's intel_amx fallback)");
    }
  }
  if (kv_ == KVCacheDType::kFP8E5M2) {
    fix("fa3", "triton", "fa3 stores fp8 KV only as fp8_e4m3 and --kv-cache-dtype is fp8_e5m2");
  }
  if (prefill_.backend == "dual_chunk_flash_attn" || decode_.backend == "dual_chunk_flash_attn") {
    s_.enable_mixed_chunk = false;
    s_.disable_radix_cache = true;
    const std::string line =
        "dual_chunk_flash_attn: mixed chunked prefill off and radix cache disabled";
    if (args_.enable_mixed_chunk || !args_.disable_radix_cache) {
      warn(line);
    } else {
      reason(line);
    }
  }
  return Status::ok();
}

Status Resolver::check_roles_on_device() {
  for (auto [role, c] :
       {std::pair{BackendRole::kPrefill, &prefill_}, std::pair{BackendRole::kDecode, &decode_}}) {
    const BackendDescriptor& d = desc(c->backend);
    const std::string kind_name = attention_kind_name(kind_);
    if (d.row(kind_) == nullptr) {
      const std::vector<std::string> ok = candidates(role);
      return Status::unsupported(who(*c, role) + " does not support " + kind_name + " models (" +
                                 model_.model_type + "); " + kind_name + " backends for " +
                                 device_label(device_) + ": " + (ok.empty() ? "none" : join(ok)));
    }
    const Status on_device = check_backend_on_device(d, device_, role);
    if (!on_device.is_ok()) {
      if (c->backend == "trtllm_mha" && role == BackendRole::kPrefill &&
          check_backend_on_device(d, device_, BackendRole::kDecode).is_ok()) {
        return Status::unsupported(who(*c, role) + " cannot run prefill on " +
                                   device_label(device_) + ": " + on_device.message() +
                                   "; use it as --decode-attention-backend trtllm_mha with another "
                                   "--prefill-attention-backend (" +
                                   or_none(candidates(BackendRole::kPrefill)) + ")");
      }
      const std::vector<std::string> ok = candidates(role);
      return Status::unsupported(who(*c, role) + " cannot run on " + device_label(device_) + ": " +
                                 on_device.message() + "; " + kind_name + " " +
                                 backend_role_name(role) +
                                 " backends for this device: " + (ok.empty() ? "none" : join(ok)));
    }
    if (!d.built) {
      if (device_.is_virtual) {
        warn(c->backend + " is not built in this binary (" + d.not_built_reason +
             "); the plan is valid for a build that has it");
        continue;
      }
      if (c->from_flag) {
        std::vector<std::string> built;
        for (const std::string& n : candidates(role)) {
          if (desc(n).built) built.push_back(n);
        }
        return Status::not_built(
            who(*c, role) + " is not built in this binary (" + d.not_built_reason + "); built " +
            kind_name + " backends for this device: " + (built.empty() ? "none" : join(built)));
      }
      // A default on a real device falls back to the universal backend of the platform.
      const char* fallback = universal_fallback(role, [](const FeatureRow&) { return true; });
      if (fallback == nullptr) {
        return Status::not_built(who(*c, role) + " is not built in this binary (" +
                                 d.not_built_reason + ") and no built " + kind_name +
                                 " backend runs on " + device_label(device_));
      }
      fall_back(c, fallback,
                who(*c, role) + " is not built in this binary (" + d.not_built_reason + ")");
    }
  }
  return Status::ok();
}

// An MHA backend's kernels exist for the head dims compiled into this binary (FeatureRow::
// head_dims; empty: any): a backend the user named without the model's head dim is an error here,
// not at backend creation; a default one falls back to the platform's universal backend, as a
// default that is not built does (step 5).
Status Resolver::check_head_dim() {
  if (kind_ != AttentionKind::kMHA || model_.head_dim < 1) return Status::ok();
  const int dim = model_.head_dim;
  const auto has_dim = [dim](const FeatureRow& r) {
    return r.head_dims.empty() ||
           std::find(r.head_dims.begin(), r.head_dims.end(), dim) != r.head_dims.end();
  };
  // A default serving both roles is named once (who_once): after the prefill role falls back,
  // the roles differ and who() would add a role to the second, otherwise identical, warning.
  const bool shared = prefill_.backend == decode_.backend;
  for (auto [role, c] :
       {std::pair{BackendRole::kPrefill, &prefill_}, std::pair{BackendRole::kDecode, &decode_}}) {
    const FeatureRow* r = row(c->backend);
    if (r == nullptr || has_dim(*r)) continue;
    const std::vector<int>& buildable = r->buildable_head_dims;
    const bool some_build_has_it =
        std::find(buildable.begin(), buildable.end(), dim) != buildable.end();
    const std::string lacks =
        who_once(*c, role, shared) + " has no kernels for head_dim " + std::to_string(dim);
    std::string missing = lacks + " in this binary (compiled: " + join(r->head_dims, ",") +
                          "; ATTNKIT_HEAD_DIMS at build time)";
    if (device_.is_virtual) {
      if (some_build_has_it) {
        warn(missing + "; the plan is valid for a build that has it");
        continue;
      }
      // A head dim no build of the backend has: refused (or fallen back from) as on this device.
      missing = lacks + " in any build (" +
                (buildable.empty() ? "its head dims: " + join(r->head_dims, ",")
                                   : "ATTNKIT_HEAD_DIMS takes " + join(buildable, ",")) +
                ")";
    }
    if (!c->from_flag) {
      if (const char* fallback = universal_fallback(role, has_dim)) {
        fall_back(c, fallback, missing);
        continue;
      }
    }
    const std::vector<std::string> ok = candidates(role, has_dim);
    return Status::unsupported(missing + "; backends with it for " + device_label(device_) + ": " +
                               (ok.empty() ? "none" : join(ok)));
  }
  return Status::ok();
}

// Whether some layer of the model uses a sliding window.
bool Resolver::model_uses_window() const {
  if (model_.sliding_window <= 0) return false;
  if (model_.layer_kinds.empty()) return true;
  return std::any_of(model_.layer_kinds.begin(), model_.layer_kinds.end(),
                     [](LayerKind k) { return k == LayerKind::kSlidingAttention; });
}

bool Resolver::amx_fixed_up() const {
  if (device_.platform != Platform::kCPU || device_.has_amx_bf16) return false;
  const FeatureRow* fallback = row("torch_native");
  const FeatureRow* amx = row("intel_amx");
  const char* lacks = fallback != nullptr ? lacks_for_model(*fallback, "torch_native") : nullptr;
  return lacks == nullptr || amx == nullptr || lacks_for_model(*amx, "intel_amx") != nullptr;
}

const char* Resolver::lacks_for_model(const FeatureRow& r, std::string_view name) const {
  if (!r.sliding_window && model_uses_window()) return "sliding-window attention";
  if (model_.is_encoder_decoder && !r.multimodal) return "non-causal encoder attention";
  if (model_.has_attention_sinks && !contains(kAttentionSinkBackends, name)) {
    return "attention sinks";
  }
  return nullptr;
}

// ---- after the roles are composed: defaults without what the model needs ----
void Resolver::model_feature_fallbacks() {
  // A default backend without what the model needs falls back to the platform's universal
  // backend where that one has it (as a default that is not built or lacks the head dim does,
  // step 5: Whisper on SM80 / SM100, whose defaults flashinfer / trtllm_mha have no encoder
  // attention, was refused); a backend the user named is an error.
  const bool shared = prefill_.backend == decode_.backend;
  for (auto [role, c] :
       {std::pair{BackendRole::kPrefill, &prefill_}, std::pair{BackendRole::kDecode, &decode_}}) {
    const FeatureRow* r = row(c->backend);
    // A model rule's backend is what the model needs (dual_chunk_flash_attn for a dual-chunk
    // config, where any other is an error): it is checked, not replaced.
    if (r == nullptr || c->from_flag || c->origin == "model rule") continue;
    const char* lacks = lacks_for_model(*r, c->backend);
    if (lacks == nullptr) continue;
    const char* universal = universal_fallback(
        role, [&](const FeatureRow& x) { return lacks_for_model(x, universal_name()) == nullptr; });
    if (universal != nullptr && c->backend != universal) {
      fall_back(c, universal,
                who_once(*c, role, shared) + " lacks " + lacks + ", which the model uses");
    }
  }
}

// ---- step 6: what the model needs from every backend it runs on ----
Status Resolver::check_model_features() {
  const bool uses_window = model_uses_window();
  for (auto [role, c] : roles()) {
    const FeatureRow* r = row(c->backend);
    if (uses_window && !r->sliding_window) {
      return Status::unsupported(
          who(*c, role) +
          " does not support sliding-window attention, which the model uses "
          "(sliding_window " +
          std::to_string(model_.sliding_window) + "); backends with sliding window for " +
          device_label(device_) + ": " +
          or_none(candidates(role, [](const FeatureRow& x) { return x.sliding_window; })));
    }
    if (model_.is_encoder_decoder && !r->multimodal) {
      return Status::unsupported(
          who(*c, role) +
          " does not support non-causal encoder attention, which the "
          "encoder-decoder model needs; backends with it for " +
          device_label(device_) + ": " +
          or_none(candidates(role, [](const FeatureRow& x) { return x.multimodal; })));
    }
    if (model_.has_attention_sinks && !contains(kAttentionSinkBackends, c->backend)) {
      return Status::unsupported(who(*c, role) +
                                 " does not support attention sinks, which the model uses; "
                                 "allowed: " +
                                 join(kAttentionSinkBackends));
    }
    if (c->backend == "nsa" && !model_.is_deepseek_v32()) {
      return Status::invalid_argument(
          who(*c, role) + " needs a DeepSeek-V3.2 model (config index_topk > 0); this model (" +
          model_.model_type + ") has no sparse-attention indexer");
    }
  }
  if (model_.is_multimodal) {
    for (auto [role, c] : roles()) {
      if (!row(c->backend)->multimodal) {
        warn(c->backend +
             " has no multimodal (vision encoder) attention; the vision tower needs "
             "its own backend");
        break;
      }
    }
  }
  if (model_.is_deepseek_v32() && prefill_.backend != "nsa") {
    warn("DeepSeek-V3.2 runs with dense MLA on " + prefill_.backend +
         " (nsa is its sparse-attention backend)");
  }
  return Status::ok();
}

// ---- step 7: GDN linear attention ----
// SGLang's --linear-attn-backend default.
constexpr const char* kDefaultLinearAttnBackend = "triton";

Status Resolver::linear_attention() {
  if (!model_.has_linear_attention) {
    if (args_.linear_attn_backend) {
      warn("--linear-attn-backend is ignored: the model has no linear-attention layers");
    }
    if (args_.linear_attn_prefill_backend || args_.linear_attn_decode_backend) {
      warn(
          "--linear-attn-prefill-backend/--linear-attn-decode-backend are ignored: the model has "
          "no linear-attention layers");
    }
    return Status::ok();
  }
  if (model_.is_mla) {
    return Status::unsupported("model " + model_.model_type +
                               " combines GDN linear attention with MLA, which is not supported "
                               "(GDN hybrids need MHA full-attention layers)");
  }
  if (device_.is_sm100()) {
    for (auto [role, c] : roles()) {
      if (!contains(kGdnSm100FullAttnBackends, c->backend)) {
        return Status::unsupported(who(*c, role) +
                                   " cannot serve the full-attention layers of a GDN hybrid on "
                                   "SM100; allowed: " +
                                   join(kGdnSm100FullAttnBackends));
      }
    }
  }
  LinearAttnSelection la;
  const std::string base = args_.linear_attn_backend.value_or(kDefaultLinearAttnBackend);
  la.prefill_backend = args_.linear_attn_prefill_backend.value_or(base);
  la.decode_backend = args_.linear_attn_decode_backend.value_or(base);
  const std::string prefill_flag =
      args_.linear_attn_prefill_backend ? "--linear-attn-prefill-backend" : "--linear-attn-backend";
  const std::string decode_flag =
      args_.linear_attn_decode_backend ? "--linear-attn-decode-backend" : "--linear-attn-backend";
  auto names_with = [&](const std::function<bool(const LinearAttnDescriptor&)>& pred) {
    std::vector<std::string> out;
    for (const LinearAttnDescriptor& d : reg_.linear_all()) {
      if (pred(d) && check_linear_backend_on_device(d, device_).is_ok()) out.push_back(d.name);
    }
    return out.empty() ? std::string("none") : join(out);
  };
  const LinearAttnDescriptor& p = *reg_.find_linear(la.prefill_backend);
  const LinearAttnDescriptor& d = *reg_.find_linear(la.decode_backend);
  if (!p.extend) {
    return Status::unsupported(prefill_flag + " " + p.name +
                               ": this GDN backend has no extend (prefill) kernel; prefill "
                               "backends: " +
                               names_with([](const LinearAttnDescriptor& x) { return x.extend; }));
  }
  if (!d.decode) {
    return Status::unsupported(decode_flag + " " + d.name +
                               ": this GDN backend has no decode kernel; decode backends: " +
                               names_with([](const LinearAttnDescriptor& x) { return x.decode; }));
  }
  for (const auto& [flag, ld] : {std::pair{prefill_flag, &p}, std::pair{decode_flag, &d}}) {
    const Status on = check_linear_backend_on_device(*ld, device_);
    if (!on.is_ok()) {
      return Status::unsupported(flag + " " + ld->name + " cannot run on " + device_label(device_) +
                                 ": " + on.message() + "; GDN backends for this device: " +
                                 names_with([](const LinearAttnDescriptor&) { return true; }));
    }
    if (!ld->built) {
      if (device_.is_virtual) {
        warn("linear-attention backend " + ld->name + " is not built in this binary (" +
             ld->not_built_reason + ")");
      } else {
        return Status::not_built(flag + " " + ld->name + " is not built in this binary (" +
                                 ld->not_built_reason + ")");
      }
    }
  }
  if (args_.speculative_enabled()) {
    const bool on_decode = spec_mode_ == SpeculativeAttentionMode::kDecode;
    const LinearAttnDescriptor& v = on_decode ? d : p;
    if (!v.target_verify) {
      return Status::unsupported(
          (on_decode ? decode_flag : prefill_flag) + " " + v.name +
          " has no target_verify kernel, which speculative decoding needs with "
          "--speculative-attention-mode " +
          speculative_attention_mode_name(spec_mode_) + "; GDN backends with verify: " +
          names_with([](const LinearAttnDescriptor& x) { return x.target_verify; }));
    }
  }
  reason("linear attention (GDN): prefill " + la.prefill_backend + " (" + prefill_flag +
         "), decode " + la.decode_backend + " (" + decode_flag + ")");
  s_.linear_attn = la;
  return Status::ok();
}

// ---- step 8: KV-cache dtype, including SGLang's KV4 rules ----
Status Resolver::kv_cache_dtype() {
  // DeepSeek-V3.2 on nsa: fp8_e4m3 by default on SM100+, the model dtype before
  // (SGLang _set_default_nsa_kv_cache_dtype).
  if (kv_ == KVCacheDType::kAuto && decode_.backend == "nsa" && device_.compute_capability >= 100) {
    kv_ = KVCacheDType::kFP8E4M3;
    reason("kv cache dtype: auto -> fp8_e4m3 (nsa default on SM100+)");
  }
  const bool fp8 = kv_ == KVCacheDType::kFP8E4M3 || kv_ == KVCacheDType::kFP8E5M2;
  const std::string flag = std::string("--kv-cache-dtype ") + kv_cache_dtype_name(kv_);
  if (kv_ == KVCacheDType::kFP4E2M1) {
    // KV4: the combinations SGLang allows. With an fa4 prefill the decode side carries KV4 and
    // must be a different, compatible backend.
    if (decode_.backend == "fa4") {
      return Status::unsupported(
          flag + " with " + who(decode_, BackendRole::kDecode) +
          ": fa4 runs KV4 only as the prefill backend; set --decode-attention-backend to one of " +
          or_none(candidates(BackendRole::kDecode, [](const FeatureRow& x) { return x.fp4_kv; })));
    }
    if (prefill_.backend == "fa4" && contains(kKv4Fa4IncompatibleDecode, decode_.backend)) {
      std::vector<std::string> ok;
      for (const std::string& n :
           candidates(BackendRole::kDecode, [](const FeatureRow& x) { return x.fp4_kv; })) {
        if (n != "fa4" && !contains(kKv4Fa4IncompatibleDecode, n)) ok.push_back(n);
      }
      return Status::unsupported(flag + ": KV4 with prefill backend fa4 is not compatible with " +
                                 who(decode_, BackendRole::kDecode) +
                                 "; allowed decode backends: " + join(ok));
    }
  }
  for (auto [role, c] : roles()) {
    const FeatureRow* r = row(c->backend);
    const char* kind_name = attention_kind_name(kind_);
    if (fp8 && !r->fp8_kv) {
      return Status::unsupported(
          flag + " is not supported by " + who(*c, role) + " (" + kind_name +
          "); backends with fp8 KV: " +
          or_none(candidates(role, [](const FeatureRow& x) { return x.fp8_kv; })));
    }
    if (kv_ == KVCacheDType::kFP8E5M2 && r->fp8_e4m3_only) {
      return Status::unsupported(flag + " is not supported by " + who(*c, role) + " (" + kind_name +
                                 "): fp8 KV only as fp8_e4m3; allowed: auto, bf16, "
                                 "fp16, fp8_e4m3" +
                                 (r->fp4_kv ? ", fp4_e2m1" : ""));
    }
    if (kv_ == KVCacheDType::kFP4E2M1 && !r->fp4_kv) {
      return Status::unsupported(
          flag + " (KV4) is not supported by " + who(*c, role) + " (" + kind_name +
          "); KV4 backends: " +
          or_none(candidates(role, [](const FeatureRow& x) { return x.fp4_kv; })));
    }
  }
  if (kv_ == KVCacheDType::kFP4E2M1 && s_.is_hybrid() && prefill_.backend != "fa4") {
    warn("KV4 with prefill " + prefill_.backend + " and decode " + decode_.backend +
         ": both read the same fp4 pool; SGLang has tested few mixed KV4 pairs");
  }
  s_.kv_cache_dtype = kv_;
  s_.kv_dtype = storage_dtype(kv_, model_);
  reason(std::string("kv cache dtype: ") + kv_cache_dtype_name(kv_) + " (" +
         dtype_name(s_.kv_dtype) + " storage)");
  return Status::ok();
}

// ---- step 9: page size ----
Status Resolver::page_size() {
  // Fixed native page sizes of the backends in use must intersect; a given page size outside the
  // intersection is forced to its largest member (flashmla 64, cutlass_mla 128, trtllm_mla 64,
  // trtllm_mha 64, fa4 128, nsa 64, ascend 128, intel_xpu 128), except fa4 MHA off SM100.
  std::vector<int> allowed;
  std::vector<std::string> fixed_by;
  bool constrained = false;
  for (auto [role, c] : roles()) {
    const FeatureRow* r = row(c->backend);
    if (r->pages.kind != PageRule::Kind::kFixed) continue;
    if (std::find(fixed_by.begin(), fixed_by.end(), c->backend) != fixed_by.end()) continue;
    fixed_by.push_back(c->backend);
    if (!constrained) {
      allowed = r->pages.sizes;
      constrained = true;
      continue;
    }
    std::vector<int> both;
    for (int p : allowed) {
      if (r->pages.allows(p)) both.push_back(p);
    }
    if (both.empty()) {
      return Status::unsupported("prefill backend " + prefill_.backend + " needs page_size in {" +
                                 join(row(prefill_.backend)->pages.sizes, ",") +
                                 "} but decode backend " + decode_.backend + " needs {" +
                                 join(row(decode_.backend)->pages.sizes, ",") +
                                 "}; hybrid backends share one KV pool and one page size");
    }
    allowed = both;
  }
  const std::optional<int> given = args_.page_size;
  if (!constrained) {
    s_.page_size = given.value_or(kSglangDefaultPageSize);
    reason("page size: " + std::to_string(s_.page_size) +
           (given ? " (--page-size)" : " (default)"));
  } else {
    const std::string by = join(fixed_by, " and ");
    const int forced = *std::max_element(allowed.begin(), allowed.end());
    if (given && std::find(allowed.begin(), allowed.end(), *given) != allowed.end()) {
      s_.page_size = *given;
      reason("page size: " + std::to_string(*given) + " (--page-size; " + by + " accept " +
             join(allowed, ",") + ")");
    } else if (given) {
      const bool fa4_mha =
          kind_ == AttentionKind::kMHA && (prefill_.backend == "fa4" || decode_.backend == "fa4");
      if (fa4_mha && !device_.is_sm100()) {
        return Status::unsupported("--page-size " + std::to_string(*given) +
                                   " is not supported by fa4 on " + device_label(device_) +
                                   ": MHA needs page_size " + join(allowed, ","));
      }
      s_.page_size = forced;
      warn("--page-size " + std::to_string(*given) + " -> " + std::to_string(forced) + ": " + by +
           " support only page_size " + join(allowed, ","));
      reason("page size: " + std::to_string(forced) + " (forced by " + by + ")");
    } else {
      s_.page_size = forced;
      reason("page size: " + std::to_string(forced) + " (required by " + by + ")");
    }
  }
  if (args_.chunked_prefill_size && *args_.chunked_prefill_size > 0 &&
      *args_.chunked_prefill_size % s_.page_size != 0) {
    // The next multiple up, or the one below where that passes INT_MAX (the flag's range).
    const int64_t page = s_.page_size;
    int64_t use = (*args_.chunked_prefill_size / page + 1) * page;
    if (use > std::numeric_limits<int>::max()) use -= page;
    return Status::invalid_argument(
        "--chunked-prefill-size " + std::to_string(*args_.chunked_prefill_size) +
        " must be a multiple of the page size " + std::to_string(s_.page_size) + " (use " +
        std::to_string(use) + ")");
  }
  s_.chunked_prefill_size = args_.chunked_prefill_size;
  return Status::ok();
}

// ---- step 10: speculative decoding ----
Status Resolver::speculative_rules() {
  s_.speculative_attention_mode = spec_mode_;
  if (!args_.speculative_enabled()) return Status::ok();
  SpeculativeSelection sp;
  const std::string& given_algorithm = *args_.speculative_algorithm;  // as the user typed it
  sp.algorithm = given_algorithm;
  if (sp.algorithm == "NEXTN") {
    sp.algorithm = "EAGLE";
    reason("speculative algorithm: NEXTN is EAGLE with the model's own MTP layers");
  }
  const bool ngram = sp.algorithm == "NGRAM";
  // SGLang's NGRAM worker runs on CUDA devices only (ROCm's torch device is "cuda" too).
  if (ngram && device_.platform != Platform::kCUDA && device_.platform != Platform::kROCm) {
    return Status::unsupported(
        "--speculative-algorithm NGRAM runs on CUDA / ROCm GPUs only (SGLang's NGRAM worker); this "
        "device is " +
        device_label(device_) + "; on it use EAGLE, EAGLE3, NEXTN or STANDALONE");
  }
  // Every algorithm turns mixed chunked prefill off (SGLang: the draft and verify passes do not
  // run in mixed prefill / decode batches).
  if (s_.enable_mixed_chunk) {
    s_.enable_mixed_chunk = false;
    warn("--enable-mixed-chunk is ignored: speculative decoding (--speculative-algorithm " +
         given_algorithm + ") runs no mixed chunked-prefill batches (as in SGLang)");
  }
  // A model whose config needs dual_chunk_flash_attn has no other backend to offer.
  if (model_.has_dual_chunk_attention) {
    for (auto [role, c] : roles()) {
      if (!row(c->backend)->spec_topk1) {
        return Status::unsupported(
            "--speculative-algorithm " + given_algorithm +
            " is not supported for this model: its config has dual_chunk_attention_config, which "
            "needs " +
            who(*c, role) + ", and " + c->backend + " has no speculative decoding");
      }
    }
  }
  for (auto [role, c] : roles()) {
    if (c->backend == "flex_attention") {
      return Status::unsupported(
          "--speculative-algorithm " + given_algorithm + " is not supported with " + who(*c, role) +
          ": flex_attention rejects speculative decoding; spec-capable " +
          attention_kind_name(kind_) + " backends: " +
          or_none(candidates(role, [](const FeatureRow& x) { return x.spec_topk1; })));
    }
  }
  const std::string arch = model_.architectures.empty() ? "" : model_.architectures.front();
  const bool chain_model = sp.algorithm == "STANDALONE" || arch == "DeepseekV3ForCausalLM" ||
                           arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV32ForCausalLM" ||
                           arch == "GptOssForCausalLM";
  const SpecParams auto_params = ngram         ? kSpecParamsNgram
                                 : chain_model ? kSpecParamsChain
                                               : kSpecParamsTree;
  const bool any_given = args_.speculative_num_steps || args_.speculative_eagle_topk ||
                         args_.speculative_num_draft_tokens;
  sp.num_steps = args_.speculative_num_steps.value_or(auto_params.num_steps);
  sp.topk = args_.speculative_eagle_topk.value_or(auto_params.topk);
  sp.num_draft_tokens = args_.speculative_num_draft_tokens.value_or(auto_params.num_draft_tokens);
  if (!any_given) {
    reason("speculative params: steps " + std::to_string(sp.num_steps) + ", topk " +
           std::to_string(sp.topk) + ", draft tokens " + std::to_string(sp.num_draft_tokens) +
           " (auto for " +
           (ngram          ? std::string("NGRAM")
            : arch.empty() ? std::string("this model")
                           : arch) +
           ")");
  }
  // A value the user did not give is the model's automatic one: messages say so.
  auto given = [](const std::optional<int>& flag) {
    return flag ? std::string() : std::string(" (automatic)");
  };
  // A topk-1 chain of num_steps draft steps verifies the root and its num_steps tokens; NGRAM's
  // draft tokens are its match window, whatever the breadth.
  if (!ngram && sp.topk == 1 && sp.num_draft_tokens != sp.num_steps + 1) {
    if (args_.speculative_num_draft_tokens) {
      warn("--speculative-num-draft-tokens " + std::to_string(sp.num_draft_tokens) + " -> " +
           std::to_string(sp.num_steps + 1) + ": with topk 1 it must be num_steps + 1");
    }
    sp.num_draft_tokens = sp.num_steps + 1;
  }
  // A tree drafts topk tokens at its first step and keeps topk of topk^2 children at each later
  // one; the verified draft tokens are the root and the best of those candidates (SGLang's
  // organize_draft_results takes its top-k of the candidates' scores, which fails past them).
  // NGRAM builds no such tree: its topk is the match trie's breadth and its draft tokens the
  // match window, so the bound does not apply to it.
  if (sp.topk > 1 && !ngram) {
    const int64_t topk = sp.topk;
    const int64_t capacity = 1 + topk + (sp.num_steps - int64_t{1}) * topk * topk;
    if (sp.num_draft_tokens > capacity) {
      const std::string tree =
          cat("the draft tree of --speculative-eagle-topk ", sp.topk,
              given(args_.speculative_eagle_topk), " over --speculative-num-steps ", sp.num_steps,
              given(args_.speculative_num_steps),
              " holds at most 1 + topk + (steps - 1) * topk^2 = ", capacity, " tokens");
      if (args_.speculative_num_draft_tokens) {
        return Status::invalid_argument(cat("--speculative-num-draft-tokens ", sp.num_draft_tokens,
                                            " is invalid: ", tree,
                                            " (the root and its candidates)"));
      }
      warn(cat("speculative draft tokens ", sp.num_draft_tokens, " -> ", capacity, ": ", tree));
      sp.num_draft_tokens = static_cast<int>(capacity);
    }
  }
  sp.attention_mode = spec_mode_;
  sp.verify_backend =
      spec_mode_ == SpeculativeAttentionMode::kDecode ? decode_.backend : prefill_.backend;
  // The decode backend runs draft decode; the verify backend runs TARGET_VERIFY/DRAFT_EXTEND.
  const bool tree = sp.topk > 1;
  const std::string topk_flag =
      "--speculative-eagle-topk " + std::to_string(sp.topk) + given(args_.speculative_eagle_topk);
  std::vector<std::pair<BackendRole, const RoleChoice*>> spec_roles = {
      {BackendRole::kDecode, &decode_}};
  if (spec_mode_ == SpeculativeAttentionMode::kPrefill && prefill_.backend != decode_.backend) {
    spec_roles.emplace_back(BackendRole::kPrefill, &prefill_);
  }
  for (auto [role, c] : spec_roles) {
    const FeatureRow* r = row(c->backend);
    const bool ok = tree ? r->spec_topk_gt1 : r->spec_topk1;
    if (!ok) {
      const std::string chain_ok =
          tree && r->spec_topk1 ? "; " + c->backend + " runs --speculative-eagle-topk 1" : "";
      return Status::unsupported("--speculative-algorithm " + given_algorithm + " with " +
                                 topk_flag + " is not supported by " + who(*c, role) + "; " +
                                 attention_kind_name(kind_) + " backends with spec topk" +
                                 (tree ? ">1" : "=1") + ": " +
                                 or_none(candidates(role,
                                                    [tree](const FeatureRow& x) {
                                                      return tree ? x.spec_topk_gt1 : x.spec_topk1;
                                                    })) +
                                 chain_ok);
    }
    // Before the general page rule, whose list of paged backends NGRAM would then refuse.
    if (ngram && tree && s_.page_size > 1 && c->backend != "flashinfer") {
      return Status::unsupported(
          "--speculative-algorithm NGRAM with " + topk_flag + " and page size " +
          std::to_string(s_.page_size) + " is not supported by " + who(*c, role) +
          ": NGRAM's trees (topk > 1) with page_size > 1 run on flashinfer only (as in SGLang); "
          "use --attention-backend flashinfer, --page-size 1 or --speculative-eagle-topk 1 "
          "(NGRAM's breadth)");
    }
    if (tree && s_.page_size > 1 && r->topk_gt1_needs_page1) {
      const std::vector<std::string> paged = candidates(role, [](const FeatureRow& x) {
        return x.spec_topk_gt1 && !x.topk_gt1_needs_page1 &&
               x.pages.kind != PageRule::Kind::kTokenOnly;
      });
      return Status::unsupported(
          topk_flag + " with page size " + std::to_string(s_.page_size) + " is not supported by " +
          who(*c, role) + " (topk > 1 only with page_size 1); with page_size > 1 use " +
          (paged.empty() ? std::string("none") : join(paged)) + ", or --page-size 1");
    }
  }
  reason("speculative: " + sp.algorithm + " steps " + std::to_string(sp.num_steps) + ", topk " +
         std::to_string(sp.topk) + ", draft tokens " + std::to_string(sp.num_draft_tokens) +
         "; verify/draft-extend on " + sp.verify_backend + " (--speculative-attention-mode " +
         speculative_attention_mode_name(spec_mode_) + ")");
  s_.speculative = sp;
  return Status::ok();
}

// ---- step 11: CUDA graphs ----
void Resolver::cuda_graphs() {
  s_.cuda_graph = false;
  if (device_.platform != Platform::kCUDA && device_.platform != Platform::kROCm) {
    reason(std::string("cuda graph: off (no CUDA graphs on ") + platform_name(device_.platform) +
           ")");
    return;
  }
  if (args_.disable_cuda_graph) {
    reason("cuda graph: off (--disable-cuda-graph)");
    return;
  }
  std::vector<const RoleChoice*> captured = {&decode_};
  const bool prefill_captured = s_.is_hybrid() && args_.speculative_enabled() &&
                                spec_mode_ == SpeculativeAttentionMode::kPrefill;
  if (prefill_captured) captured.push_back(&prefill_);
  for (const RoleChoice* c : captured) {
    if (!desc(c->backend).cuda_graph) {
      warn("CUDA graphs disabled: " + c->backend + " has no CUDA-graph support");
      reason("cuda graph: off (" + c->backend + " runs eagerly)");
      return;
    }
  }
  s_.cuda_graph = true;
  std::string line = "cuda graph: on (decode backend " + decode_.backend + " captured";
  if (s_.is_hybrid()) {
    line += prefill_captured
                ? "; prefill backend " + prefill_.backend + " captured too: spec verify runs on it"
                : "; prefill backend " + prefill_.backend + " runs eagerly";
  }
  reason(line + ")");
}

void Resolver::mla_chunked_prefix_cache() {
  if (kind_ != AttentionKind::kMLA) return;
  s_.mla_chunked_prefix_cache = row(prefill_.backend)->chunked_prefix_cache;
  reason(std::string("MLA chunked prefix cache: ") + (s_.mla_chunked_prefix_cache ? "on" : "off") +
         " (" + prefill_.backend + ")");
}

Result<Selection> Resolver::run() {
  kind_ = model_.is_mla ? AttentionKind::kMLA : AttentionKind::kMHA;
  s_.device_name = device_label(device_);
  s_.model_summary = model_.summary();
  s_.kind = kind_;
  s_.enable_mixed_chunk = args_.enable_mixed_chunk;
  s_.disable_radix_cache = args_.disable_radix_cache;
  reason("device: " + device_label(device_) + "; model: " + attention_kind_name(kind_) + " (" +
         (model_.model_type.empty() ? std::string("unknown") : model_.model_type) + ")");
  ATTNKIT_RETURN_IF_ERROR(validate_flag_values());
  device_defaults();
  ATTNKIT_RETURN_IF_ERROR(model_specific_rules());
  generic_default();
  ATTNKIT_RETURN_IF_ERROR(compose_roles());
  model_feature_fallbacks();
  ATTNKIT_RETURN_IF_ERROR(per_backend_fixups());
  ATTNKIT_RETURN_IF_ERROR(check_roles_on_device());
  ATTNKIT_RETURN_IF_ERROR(check_head_dim());
  s_.prefill_backend = prefill_.backend;
  s_.decode_backend = decode_.backend;
  if (s_.is_hybrid()) {
    reason("hybrid: prefill " + prefill_.backend + " (" + prefill_.origin + "), decode " +
           decode_.backend + " (" + decode_.origin + ")");
  } else if (chosen_ && chosen_->from_flag) {
    reason("attention backend: " + prefill_.backend + " (" + prefill_.origin + ")");
  }
  ATTNKIT_RETURN_IF_ERROR(check_model_features());
  ATTNKIT_RETURN_IF_ERROR(linear_attention());
  ATTNKIT_RETURN_IF_ERROR(kv_cache_dtype());
  ATTNKIT_RETURN_IF_ERROR(page_size());
  ATTNKIT_RETURN_IF_ERROR(speculative_rules());
  cuda_graphs();
  mla_chunked_prefix_cache();
  return std::move(s_);
}

}  // namespace

const char* backend_role_name(BackendRole role) {
  return role == BackendRole::kPrefill ? "prefill" : "decode";
}

Status check_backend_on_device(const BackendDescriptor& d, const DeviceInfo& device,
                               BackendRole role) {
  if (!d.runs_on(device.platform)) {
    return Status::unsupported(d.name + " runs on " + platforms_label(d.platforms) + ", not on " +
                               platform_name(device.platform));
  }
  if (role == BackendRole::kDecode && !d.decode_role) {
    return Status::unsupported(d.name + " cannot serve as the decode backend");
  }
  if (role == BackendRole::kPrefill && !d.prefill_role) {
    return Status::unsupported(d.name + " cannot serve as the prefill backend");
  }
  if (device.platform != Platform::kCUDA) return Status::ok();
  int lo = d.min_compute_capability;
  int hi = d.max_compute_capability;
  if (role == BackendRole::kPrefill) {
    if (d.prefill_min_compute_capability > 0) lo = d.prefill_min_compute_capability;
    if (d.prefill_max_compute_capability > 0) hi = d.prefill_max_compute_capability;
  }
  const int cc = device.compute_capability;
  if (cc < lo || (hi > 0 && cc > hi)) {
    // Ranges end at a family's last minor version (109 = SM10x); print the family.
    const std::string range =
        hi > 0 ? (hi / kCcMajorScale == lo / kCcMajorScale && hi % kCcMajorScale == 9
                      ? sm(lo) + " family (" + sm(lo) + "-" + sm(hi) + ")"
                      : sm(lo) + "-" + sm(hi))
               : sm(lo) + "+";
    return Status::unsupported(d.name + (role == BackendRole::kPrefill ? " (prefill)" : "") +
                               " needs CUDA " + range + ", device is " + sm(cc));
  }
  return Status::ok();
}

Status check_linear_backend_on_device(const LinearAttnDescriptor& d, const DeviceInfo& device) {
  if (!d.runs_on(device.platform)) {
    return Status::unsupported(d.name + " runs on " + platforms_label(d.platforms) + ", not on " +
                               platform_name(device.platform));
  }
  if (device.platform == Platform::kCUDA && device.compute_capability < d.min_compute_capability) {
    return Status::unsupported(d.name + " needs CUDA " + sm(d.min_compute_capability) +
                               "+, device is " + sm(device.compute_capability));
  }
  return Status::ok();
}

Result<Selection> resolve(const ServerArgs& args, const ModelAttentionConfig& model,
                          const DeviceInfo& device, const BackendRegistry& registry) {
  return Resolver(args, model, device, registry).run();
}

Result<Selection> resolve(const ServerArgs& args, const ModelAttentionConfig& model,
                          const DeviceInfo& device) {
  return resolve(args, model, device, builtin_registry());
}

}  // namespace attnkit
