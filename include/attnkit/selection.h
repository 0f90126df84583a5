// Backend selection and validation: resolve(ServerArgs, ModelAttentionConfig, DeviceInfo).
//
// A pure function (DESIGN.md section 5). Rules run in SGLang's order: device defaults,
// model-specific rules, generic default, per-backend fix-ups, linear attention, KV4, page size,
// speculative rules; then the CUDA-graph decision. Every decision adds one line to `reasons`;
// documented automatic fix-ups (a value the user gave, or a default, changed to one that works)
// add a line to `warnings`. An explicitly requested backend that does not fit the device, the
// model or the other flags is an error naming the flag, the value and what is allowed.
//
// Virtual devices plan "what would SGLang-style selection choose": a backend need not be built
// in this binary (a warning says so). On a real device an unbuilt backend is an error when
// requested explicitly, and a default falls back to a built one with a warning.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/hybrid_backend.h"
#include "attnkit/model_config.h"
#include "attnkit/registry.h"
#include "attnkit/server_args.h"

namespace attnkit {

enum class BackendRole { kPrefill, kDecode };
const char* backend_role_name(BackendRole role);  // "prefill" / "decode"

// Ok when `d` can serve `role` on `device` (platform, compute capability, role); otherwise
// kUnsupported saying why ("fa3 needs CUDA compute capability 80-90, device is sm75"). Does not
// look at `built`.
Status check_backend_on_device(const BackendDescriptor& d, const DeviceInfo& device,
                               BackendRole role);
Status check_linear_backend_on_device(const LinearAttnDescriptor& d, const DeviceInfo& device);

struct SpeculativeSelection {
  std::string algorithm;  // EAGLE, EAGLE3, STANDALONE, NGRAM (NEXTN is EAGLE)
  int num_steps = 0;
  int topk = 1;
  int num_draft_tokens = 0;
  SpeculativeAttentionMode attention_mode = SpeculativeAttentionMode::kPrefill;
  std::string verify_backend;  // runs TARGET_VERIFY / DRAFT_EXTEND
};

// GDN linear-attention kernels per phase (models with linear-attention layers only).
struct LinearAttnSelection {
  std::string prefill_backend;
  std::string decode_backend;
};

struct Selection {
  std::string device_name;
  std::string model_summary;
  AttentionKind kind = AttentionKind::kMHA;
  std::string prefill_backend;
  std::string decode_backend;
  int page_size = 1;
  // The KV-cache flag after fix-ups (may stay kAuto) and the storage dtype it means.
  KVCacheDType kv_cache_dtype = KVCacheDType::kAuto;
  DType kv_dtype = DType::kBF16;
  bool cuda_graph = false;
  // MLA: whether the prefill backend reads the chunked prefix cache.
  bool mla_chunked_prefix_cache = false;
  std::optional<int> chunked_prefill_size;  // as given (validated against the page size)
  bool enable_mixed_chunk = false;
  bool disable_radix_cache = false;
  SpeculativeAttentionMode speculative_attention_mode = SpeculativeAttentionMode::kPrefill;
  std::optional<SpeculativeSelection> speculative;
  std::optional<LinearAttnSelection> linear_attn;
  std::vector<std::string> reasons;   // one line per decision, in rule order
  std::vector<std::string> warnings;  // documented fix-ups and notes ("not built in this binary")

  bool is_hybrid() const { return prefill_backend != decode_backend; }
  std::string to_text() const;  // what `attnkit select` prints
  std::string to_json() const;  // the same as one JSON object
};

Result<Selection> resolve(const ServerArgs& args, const ModelAttentionConfig& model,
                          const DeviceInfo& device);
Result<Selection> resolve(const ServerArgs& args, const ModelAttentionConfig& model,
                          const DeviceInfo& device, const BackendRegistry& registry);

// Creates what the selection describes: one backend, or a HybridAttnBackend over two. ctx must
// carry the selection's page size; each backend is created through registry.create().
Result<std::unique_ptr<AttentionBackend>> create_selected_backend(
    const Selection& selection, const BackendContext& ctx,
    const BackendRegistry& registry = builtin_registry());

}  // namespace attnkit
