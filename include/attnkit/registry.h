// Backend descriptors: the single statement of what each backend supports. Selection, validation,
// `attnkit matrix` and the runtime checks all read these.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "attnkit/dtype.h"
#include "attnkit/status.h"

namespace attnkit {

enum class AttentionKind { kMHA, kMLA };
const char* attention_kind_name(AttentionKind kind);

// Which page sizes a backend handles natively.
struct PageRule {
  enum class Kind {
    kAny,        // any page size, natively paged
    kFixed,      // only the sizes listed
    kTokenOnly,  // no native paging: works at any page size through token-level indices
  };
  Kind kind = Kind::kTokenOnly;
  std::vector<int> sizes;  // kFixed only
  bool allows(int page_size) const;
  std::string to_string() const;  // "any", "64", "16,32,64", "no (token indices)"
};

// KV-cache dtype names as the flag spells them.
enum class KVCacheDType { kAuto, kBF16, kFP16, kFP8E4M3, kFP8E5M2, kFP4E2M1 };
const char* kv_cache_dtype_name(KVCacheDType d);  // "auto", "bf16", "fp16", "fp8_e4m3", ...
Result<KVCacheDType> parse_kv_cache_dtype(std::string_view name);

// One row of the support matrix (per attention kind).
struct FeatureRow {
  PageRule pages;
  bool fp8_kv = false;  // fp8_e4m3 and fp8_e5m2 KV
  bool fp4_kv = false;
  bool spec_topk1 = false;
  bool spec_topk_gt1 = false;
  bool topk_gt1_needs_page1 = false;  // MLA triton/fa3: topk > 1 only with page size 1
  bool sliding_window = false;
  bool multimodal = false;            // non-causal encoder attention
  bool chunked_prefix_cache = false;  // MLA
  std::vector<int> head_dims;         // qk head dims compiled in (empty = any)
  // The qk head dims some build of the backend can compile (CMake ATTNKIT_HEAD_DIMS picks from
  // them); empty: every build has head_dims. `attnkit select` for a device other than this one
  // plans a head dim of this list that the binary lacks, and refuses one outside it.
  std::vector<int> buildable_head_dims;
  bool fp8_e4m3_only = false;  // fp8 KV only as fp8_e4m3 (fa3, trtllm_mla, nsa)
};

struct BackendDescriptor {
  std::string name;            // the flag value: "triton", "fa3", ...
  std::string implementation;  // one line: what this project's implementation is
  std::vector<Platform> platforms;
  int min_compute_capability = 0;  // CUDA only
  int max_compute_capability = 0;  // CUDA only; 0 = no upper bound
  std::optional<FeatureRow> mha;
  std::optional<FeatureRow> mla;
  bool cuda_graph = false;
  bool decode_role = true;   // may serve as the decode backend
  bool prefill_role = true;  // may serve as the prefill backend
  // CUDA only: the prefill role needs a narrower compute-capability range than the decode role
  // (trtllm_mha: decode on SM90/100/120, prefill on SM100 only). 0 = same as the bounds above.
  int prefill_min_compute_capability = 0;
  int prefill_max_compute_capability = 0;
  // Built and runnable in this binary. When false, not_built_reason says why ("needs ROCm",
  // "not implemented yet", "built without CUDA").
  bool built = false;
  std::string not_built_reason;
  std::function<Result<std::unique_ptr<AttentionBackend>>(const BackendContext&)> create;

  const FeatureRow* row(AttentionKind kind) const {
    return kind == AttentionKind::kMHA ? (mha ? &*mha : nullptr) : (mla ? &*mla : nullptr);
  }
  bool runs_on(Platform p) const;
};

// One GDN (gated delta net) linear-attention kernel backend, chosen by --linear-attn-backend and
// per phase by --linear-attn-decode-backend / --linear-attn-prefill-backend.
struct LinearAttnDescriptor {
  std::string name;            // the flag value: "triton", "cutedsl"
  std::string implementation;  // one line: what this project's implementation is
  std::vector<Platform> platforms;
  int min_compute_capability = 0;  // CUDA only
  bool decode = false;             // one token per request, recurrent state update
  bool extend = false;             // chunked prefill: output + final state + per-chunk states
  bool target_verify = false;      // speculative verify over the draft tokens
  bool built = false;
  std::string not_built_reason;

  bool runs_on(Platform p) const;
};

class BackendRegistry {
 public:
  Status add(BackendDescriptor descriptor);  // error on a duplicate name
  const BackendDescriptor* find(std::string_view name) const;
  Result<const BackendDescriptor*> get(std::string_view name) const;  // error lists valid names
  const std::vector<BackendDescriptor>& all() const { return descriptors_; }
  std::vector<std::string> names() const;
  // Creates a backend, checking it is built, runs on ctx.device, and that ctx fits its row.
  Result<std::unique_ptr<AttentionBackend>> create(std::string_view name,
                                                   const BackendContext& ctx) const;

  // GDN linear-attention kernel backends.
  Status add_linear(LinearAttnDescriptor descriptor);  // error on a duplicate name
  const LinearAttnDescriptor* find_linear(std::string_view name) const;
  Result<const LinearAttnDescriptor*> get_linear(std::string_view name) const;
  const std::vector<LinearAttnDescriptor>& linear_all() const { return linear_; }
  std::vector<std::string> linear_names() const;

 private:
  std::vector<BackendDescriptor> descriptors_;
  std::vector<LinearAttnDescriptor> linear_;
};

// The process-wide registry with every backend of DESIGN.md section 4 registered (explicitly, on
// first use; no static initialisers).
const BackendRegistry& builtin_registry();
// Registers every built-in backend descriptor into `registry`.
Status register_builtin_backends(BackendRegistry& registry);

}  // namespace attnkit
