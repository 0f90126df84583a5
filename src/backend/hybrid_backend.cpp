// HybridAttnBackend: per-phase dispatch between a prefill and a decode backend.
#include "attnkit/hybrid_backend.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

namespace attnkit {
namespace {

// The shared page size and KV dtype must fit `backend`'s descriptor row.
Status check_shared_constraints(const AttentionBackend& backend, const char* role,
                                const HybridOptions& options) {
  const BackendDescriptor& d = backend.descriptor();
  const AttentionKind kind = options.is_mla ? AttentionKind::kMLA : AttentionKind::kMHA;
  const FeatureRow* row = d.row(kind);
  const std::string who = std::string(role) + " backend " + d.name;
  if (row == nullptr) {
    return Status::unsupported("HybridAttnBackend: " + who + " does not support " +
                               attention_kind_name(kind) + " attention");
  }
  if (!row->pages.allows(options.page_size)) {
    return Status::unsupported("HybridAttnBackend: shared page_size " +
                               std::to_string(options.page_size) + " is not supported by " + who +
                               " (needs " + row->pages.to_string() + ")");
  }
  if (dtype_is_fp8(options.kv_dtype) && !row->fp8_kv) {
    return Status::unsupported("HybridAttnBackend: shared KV dtype " +
                               std::string(dtype_name(options.kv_dtype)) + " is not supported by " +
                               who);
  }
  if (options.kv_dtype == DType::kFP8E5M2 && row->fp8_e4m3_only) {
    return Status::unsupported("HybridAttnBackend: shared KV dtype fp8_e5m2 is not supported by " +
                               who + " (fp8_e4m3 only)");
  }
  if (options.kv_dtype == DType::kFP4E2M1 && !row->fp4_kv) {
    return Status::unsupported("HybridAttnBackend: shared KV dtype fp4_e2m1 is not supported by " +
                               who);
  }
  return Status::ok();
}

}  // namespace

const char* speculative_attention_mode_name(SpeculativeAttentionMode mode) {
  return mode == SpeculativeAttentionMode::kDecode ? "decode" : "prefill";
}

Result<SpeculativeAttentionMode> parse_speculative_attention_mode(std::string_view name) {
  if (name == "prefill") return SpeculativeAttentionMode::kPrefill;
  if (name == "decode") return SpeculativeAttentionMode::kDecode;
  return Status::invalid_argument("--speculative-attention-mode \"" + std::string(name) +
                                  "\" is not valid; valid values: prefill, decode");
}

HybridAttnBackend::HybridAttnBackend(std::unique_ptr<AttentionBackend> prefill,
                                     std::unique_ptr<AttentionBackend> decode,
                                     const HybridOptions& options)
    : prefill_(std::move(prefill)), decode_(std::move(decode)), options_(options) {
  const BackendDescriptor& p = prefill_->descriptor();
  const BackendDescriptor& d = decode_->descriptor();
  descriptor_ = d;
  descriptor_.name = "hybrid(prefill=" + p.name + ", decode=" + d.name + ")";
  descriptor_.implementation = "per-phase dispatch: prefill -> " + p.name + ", decode -> " + d.name;
  descriptor_.cuda_graph = d.cuda_graph && (!prefill_graph_state_needed() || p.cuda_graph);
  descriptor_.built = true;
  descriptor_.not_built_reason.clear();
  descriptor_.create = nullptr;
}

Result<std::unique_ptr<HybridAttnBackend>> HybridAttnBackend::create(
    std::unique_ptr<AttentionBackend> prefill, std::unique_ptr<AttentionBackend> decode,
    const HybridOptions& options) {
  if (prefill == nullptr) {
    return Status::invalid_argument("HybridAttnBackend::create: prefill backend is null");
  }
  if (decode == nullptr) {
    return Status::invalid_argument("HybridAttnBackend::create: decode backend is null");
  }
  if (options.page_size < 1) {
    return Status::invalid_argument("HybridAttnBackend::create: page_size " +
                                    std::to_string(options.page_size) + " must be >= 1");
  }
  // The KV pool's storage dtypes (KVPoolConfig::dtype).
  constexpr DType kKvDtypes[] = {DType::kBF16,    DType::kF16,     DType::kF32,
                                 DType::kFP8E4M3, DType::kFP8E5M2, DType::kFP4E2M1};
  if (std::find(std::begin(kKvDtypes), std::end(kKvDtypes), options.kv_dtype) ==
      std::end(kKvDtypes)) {
    return Status::invalid_argument(
        std::string("HybridAttnBackend::create: kv_dtype ") + dtype_name(options.kv_dtype) +
        " is not a KV storage dtype (bf16, f16, f32, fp8_e4m3, fp8_e5m2, fp4_e2m1)");
  }
  ATTNKIT_RETURN_IF_ERROR(check_shared_constraints(*prefill, "prefill", options));
  ATTNKIT_RETURN_IF_ERROR(check_shared_constraints(*decode, "decode", options));
  // Both parts serve one KV pool, so they must run where it lives.
  const std::optional<Device> pd = prefill->device();
  const std::optional<Device> dd = decode->device();
  if (pd && dd && *pd != *dd) {
    return Status::invalid_argument(
        "HybridAttnBackend::create: prefill backend " + prefill->descriptor().name + " runs on " +
        pd->to_string() + ", decode backend " + decode->descriptor().name + " on " +
        dd->to_string() + ": make both for the device of the shared KV pool");
  }
  return std::unique_ptr<HybridAttnBackend>(
      new HybridAttnBackend(std::move(prefill), std::move(decode), options));
}

AttentionBackend& HybridAttnBackend::backend_for(ForwardMode mode) const {
  switch (mode) {
    case ForwardMode::kDecode:
    case ForwardMode::kIdle:
      return *decode_;
    case ForwardMode::kTargetVerify:
    case ForwardMode::kDraftExtend:
      return options_.speculative_attention_mode == SpeculativeAttentionMode::kDecode ? *decode_
                                                                                      : *prefill_;
    case ForwardMode::kExtend:
    case ForwardMode::kMixed:
      return *prefill_;
  }
  return *prefill_;
}

bool HybridAttnBackend::prefill_graph_state_needed() const {
  return options_.speculative_enabled &&
         options_.speculative_attention_mode == SpeculativeAttentionMode::kPrefill;
}

Status HybridAttnBackend::init_forward_metadata(const ForwardBatch& batch) {
  return backend_for(batch.mode).init_forward_metadata(batch);
}

Status HybridAttnBackend::forward_extend(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const AttentionLayer& layer, const ForwardBatch& batch,
                                         bool save_kv, const TensorView& lse) {
  return backend_for(batch.mode).forward_extend(q, k, v, out, layer, batch, save_kv, lse);
}

Status HybridAttnBackend::forward_decode(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const AttentionLayer& layer, const ForwardBatch& batch,
                                         bool save_kv, const TensorView& lse) {
  return decode_->forward_decode(q, k, v, out, layer, batch, save_kv, lse);
}

Status HybridAttnBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  // Not ready until both backends have the new state: a failed re-initialisation must not leave
  // captures going ahead on one backend's new and the other's old workspaces.
  graph_state_ready_ = false;
  ATTNKIT_RETURN_IF_ERROR(decode_->init_cuda_graph_state(max_bs, max_num_tokens));
  if (prefill_graph_state_needed()) {
    ATTNKIT_RETURN_IF_ERROR(prefill_->init_cuda_graph_state(max_bs, max_num_tokens));
    if (prefill_->cuda_graph_seq_len_fill_value() != decode_->cuda_graph_seq_len_fill_value()) {
      return Status::unsupported("HybridAttnBackend: prefill backend " +
                                 prefill_->descriptor().name +
                                 " pads CUDA-graph rows with seq_len " +
                                 std::to_string(prefill_->cuda_graph_seq_len_fill_value()) +
                                 " but decode backend " + decode_->descriptor().name + " with " +
                                 std::to_string(decode_->cuda_graph_seq_len_fill_value()) +
                                 "; they cannot share one captured batch");
    }
  }
  graph_state_ready_ = true;
  return Status::ok();
}

Status HybridAttnBackend::check_graph_ready(ForwardMode mode) const {
  if (!graph_state_ready_) {
    return Status::invalid_argument(
        "HybridAttnBackend: init_cuda_graph_state must run before capture/replay");
  }
  if (&backend_for(mode) == prefill_.get() && prefill_.get() != decode_.get() &&
      !prefill_graph_state_needed()) {
    return Status::unsupported(
        std::string("HybridAttnBackend: forward mode ") + forward_mode_name(mode) +
        " runs on prefill backend " + prefill_->descriptor().name +
        ", whose CUDA-graph state is only initialised with speculative decoding in mode prefill");
  }
  return Status::ok();
}

Status HybridAttnBackend::init_forward_metadata_capture_cuda_graph(
    int bs, int num_tokens, const TensorView& req_pool_indices, const TensorView& seq_lens,
    const TensorView& encoder_lens, ForwardMode mode, const SpecInfo* spec) {
  ATTNKIT_RETURN_IF_ERROR(check_graph_ready(mode));
  return backend_for(mode).init_forward_metadata_capture_cuda_graph(
      bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, mode, spec);
}

Status HybridAttnBackend::init_forward_metadata_replay_cuda_graph(
    int bs, const TensorView& req_pool_indices, const TensorView& seq_lens, int64_t seq_lens_sum,
    const TensorView& encoder_lens, ForwardMode mode, const SpecInfo* spec,
    const int32_t* seq_lens_host) {
  ATTNKIT_RETURN_IF_ERROR(check_graph_ready(mode));
  return backend_for(mode).init_forward_metadata_replay_cuda_graph(
      bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, spec, seq_lens_host);
}

int HybridAttnBackend::cuda_graph_seq_len_fill_value() const {
  return decode_->cuda_graph_seq_len_fill_value();
}

}  // namespace attnkit
