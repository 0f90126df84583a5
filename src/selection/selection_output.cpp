// Selection rendering (text / JSON) and turning a Selection into runnable backends.
#include <nlohmann/json.hpp>
#include <sstream>

#include "attnkit/kv_cache.h"
#include "attnkit/selection.h"
#include "core/str_cat.h"

namespace attnkit {
namespace {

constexpr int kLabelWidth = 22;

void line(std::ostringstream& os, const char* label, const std::string& value) {
  std::string l = std::string(label) + ":";
  l.resize(kLabelWidth, ' ');
  os << l << value << "\n";
}

std::string kv_label(const Selection& s) {
  return std::string(kv_cache_dtype_name(s.kv_cache_dtype)) + " (" + dtype_name(s.kv_dtype) +
         " storage)";
}

std::string spec_label(const Selection& s) {
  if (!s.speculative) return "off";
  const SpeculativeSelection& sp = *s.speculative;
  return sp.algorithm + ", steps " + std::to_string(sp.num_steps) + ", topk " +
         std::to_string(sp.topk) + ", draft tokens " + std::to_string(sp.num_draft_tokens) +
         ", attention mode " + speculative_attention_mode_name(sp.attention_mode) + " (verify on " +
         sp.verify_backend + ")";
}

}  // namespace

std::string Selection::to_text() const {
  std::ostringstream os;
  line(os, "device", device_name);
  if (!model_summary.empty()) line(os, "model", model_summary);
  line(os, "attention kind", attention_kind_name(kind));
  line(os, "prefill backend", prefill_backend);
  line(os, "decode backend", decode_backend);
  line(os, "hybrid", is_hybrid() ? "yes" : "no");
  line(os, "page size", std::to_string(page_size));
  line(os, "kv cache dtype", kv_label(*this));
  line(os, "cuda graph", cuda_graph ? "on" : "off");
  line(os, "speculative", spec_label(*this));
  if (linear_attn) {
    line(os, "linear attention",
         "prefill " + linear_attn->prefill_backend + ", decode " + linear_attn->decode_backend);
  }
  if (kind == AttentionKind::kMLA) {
    line(os, "chunked prefix cache", mla_chunked_prefix_cache ? "on" : "off");
  }
  line(os, "chunked prefill",
       chunked_prefill_size ? std::to_string(*chunked_prefill_size) : "default");
  if (disable_radix_cache) line(os, "radix cache", "disabled");
  os << "reasons:\n";
  for (const std::string& r : reasons) os << "  - " << r << "\n";
  if (!warnings.empty()) {
    os << "warnings:\n";
    for (const std::string& w : warnings) os << "  - " << w << "\n";
  }
  return os.str();
}

std::string Selection::to_json() const {
  nlohmann::ordered_json j;
  j["device"] = device_name;
  j["model"] = model_summary;
  j["attention_kind"] = attention_kind_name(kind);
  j["prefill_backend"] = prefill_backend;
  j["decode_backend"] = decode_backend;
  j["hybrid"] = is_hybrid();
  j["page_size"] = page_size;
  j["kv_cache_dtype"] = kv_cache_dtype_name(kv_cache_dtype);
  j["kv_storage_dtype"] = dtype_name(kv_dtype);
  j["cuda_graph"] = cuda_graph;
  j["speculative_attention_mode"] = speculative_attention_mode_name(speculative_attention_mode);
  if (speculative) {
    j["speculative"] = {{"algorithm", speculative->algorithm},
                        {"num_steps", speculative->num_steps},
                        {"topk", speculative->topk},
                        {"num_draft_tokens", speculative->num_draft_tokens},
                        {"verify_backend", speculative->verify_backend}};
  } else {
    j["speculative"] = nullptr;
  }
  if (linear_attn) {
    j["linear_attn"] = {{"prefill_backend", linear_attn->prefill_backend},
                        {"decode_backend", linear_attn->decode_backend}};
  } else {
    j["linear_attn"] = nullptr;
  }
  j["mla_chunked_prefix_cache"] = mla_chunked_prefix_cache;
  j["chunked_prefill_size"] =
      chunked_prefill_size ? nlohmann::ordered_json(*chunked_prefill_size) : nullptr;
  j["enable_mixed_chunk"] = enable_mixed_chunk;
  j["disable_radix_cache"] = disable_radix_cache;
  j["reasons"] = reasons;
  j["warnings"] = warnings;
  return j.dump(2);
}

Result<std::unique_ptr<AttentionBackend>> create_selected_backend(const Selection& selection,
                                                                  const BackendContext& ctx,
                                                                  const BackendRegistry& registry) {
  if (ctx.page_size != selection.page_size) {
    return Status::invalid_argument(
        "create_selected_backend: ctx.page_size " + std::to_string(ctx.page_size) +
        " differs from the selection's page size " + std::to_string(selection.page_size));
  }
  if (ctx.is_mla != (selection.kind == AttentionKind::kMLA)) {
    return Status::invalid_argument(std::string("create_selected_backend: ctx.is_mla is ") +
                                    (ctx.is_mla ? "true" : "false") + " but the selection is " +
                                    attention_kind_name(selection.kind));
  }
  // A quantised pool under a selection made for another dtype (or the other way round): the
  // selection's backends were checked for the dtype it names, not for the pool's. Full-precision
  // pools (bf16 / f16 / f32) stand in for one another, as every backend row treats them alike.
  if (ctx.kv_pool != nullptr && ctx.kv_pool->dtype() != selection.kv_dtype &&
      (dtype_is_quantized(ctx.kv_pool->dtype()) || dtype_is_quantized(selection.kv_dtype))) {
    return Status::invalid_argument(
        cat("create_selected_backend: ctx.kv_pool stores ", dtype_name(ctx.kv_pool->dtype()),
            " but the selection's KV cache dtype is ", dtype_name(selection.kv_dtype),
            " (--kv-cache-dtype): create the pool with that dtype"));
  }
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> decode,
                           registry.create(selection.decode_backend, ctx));
  if (!selection.is_hybrid()) return decode;
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> prefill,
                           registry.create(selection.prefill_backend, ctx));
  HybridOptions options;
  options.speculative_enabled = selection.speculative.has_value();
  options.speculative_attention_mode = selection.speculative_attention_mode;
  options.is_mla = ctx.is_mla;
  options.page_size = selection.page_size;
  options.kv_dtype = selection.kv_dtype;
  ATTNKIT_ASSIGN_OR_RETURN(
      std::unique_ptr<HybridAttnBackend> hybrid,
      HybridAttnBackend::create(std::move(prefill), std::move(decode), options));
  return std::unique_ptr<AttentionBackend>(std::move(hybrid));
}

}  // namespace attnkit
