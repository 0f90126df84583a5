// Per-phase (hybrid) attention: one backend for prefill, another for decode (DESIGN.md section 6).
//
// Dispatch by ForwardMode:
//   DECODE, IDLE                 -> decode backend
//   TARGET_VERIFY, DRAFT_EXTEND  -> decode backend with --speculative-attention-mode decode,
//                                   else the prefill backend (the default mode is prefill)
//   EXTEND, MIXED                -> prefill backend
// CUDA graphs: the decode backend's graph state is always initialised; the prefill backend's only
// when speculative decoding is on with mode prefill (verify / draft-extend then replay through it).
// Both backends share one KV pool, so one page size and one KV dtype must satisfy both.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "attnkit/backend.h"
#include "attnkit/registry.h"
#include "attnkit/status.h"

namespace attnkit {

// --speculative-attention-mode: which phase's backend runs TARGET_VERIFY and DRAFT_EXTEND.
enum class SpeculativeAttentionMode { kPrefill, kDecode };
const char* speculative_attention_mode_name(SpeculativeAttentionMode mode);  // "prefill"/"decode"
Result<SpeculativeAttentionMode> parse_speculative_attention_mode(std::string_view name);

struct HybridOptions {
  bool speculative_enabled = false;
  SpeculativeAttentionMode speculative_attention_mode = SpeculativeAttentionMode::kPrefill;
  bool is_mla = false;            // which feature row of the descriptors applies
  int page_size = 1;              // shared by both backends
  DType kv_dtype = DType::kBF16;  // shared KV storage dtype
};

class HybridAttnBackend final : public AttentionBackend {
 public:
  // Checks that both backends exist, support the attention kind, and accept the shared page size
  // and KV dtype according to their descriptors; errors name the backend and the constraint.
  static Result<std::unique_ptr<HybridAttnBackend>> create(
      std::unique_ptr<AttentionBackend> prefill, std::unique_ptr<AttentionBackend> decode,
      const HybridOptions& options);

  // A descriptor named "hybrid(prefill=X, decode=Y)" whose CUDA-graph flag says whether every
  // backend that gets captured supports graphs.
  const BackendDescriptor& descriptor() const override { return descriptor_; }
  // The decode backend's device (create checked that the prefill backend's is the same).
  std::optional<Device> device() const override {
    const std::optional<Device> d = decode_->device();
    return d ? d : prefill_->device();
  }

  AttentionBackend& prefill_backend() const { return *prefill_; }
  AttentionBackend& decode_backend() const { return *decode_; }
  const HybridOptions& options() const { return options_; }
  // The backend that serves `mode` (see the table at the top of this file).
  AttentionBackend& backend_for(ForwardMode mode) const;
  // Whether init_cuda_graph_state also initialises the prefill backend.
  bool prefill_graph_state_needed() const;

  Status init_forward_metadata(const ForwardBatch& batch) override;
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv,
                        const TensorView& lse = {}) override;
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv,
                        const TensorView& lse = {}) override;

  Status init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  Status init_forward_metadata_capture_cuda_graph(int bs, int num_tokens,
                                                  const TensorView& req_pool_indices,
                                                  const TensorView& seq_lens,
                                                  const TensorView& encoder_lens, ForwardMode mode,
                                                  const SpecInfo* spec) override;
  Status init_forward_metadata_replay_cuda_graph(int bs, const TensorView& req_pool_indices,
                                                 const TensorView& seq_lens, int64_t seq_lens_sum,
                                                 const TensorView& encoder_lens, ForwardMode mode,
                                                 const SpecInfo* spec,
                                                 const int32_t* seq_lens_host) override;
  // The decode backend's value (padded rows are decode rows); init_cuda_graph_state checks that
  // a captured prefill backend agrees.
  int cuda_graph_seq_len_fill_value() const override;

 private:
  HybridAttnBackend(std::unique_ptr<AttentionBackend> prefill,
                    std::unique_ptr<AttentionBackend> decode, const HybridOptions& options);
  // Graph capture/replay for `mode` is only valid on a backend whose graph state was initialised.
  Status check_graph_ready(ForwardMode mode) const;

  std::unique_ptr<AttentionBackend> prefill_;
  std::unique_ptr<AttentionBackend> decode_;
  HybridOptions options_;
  BackendDescriptor descriptor_;
  bool graph_state_ready_ = false;
};

}  // namespace attnkit
