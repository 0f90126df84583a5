// The `flashmla` and `cutlass_mla` backends: one host class parameterised by name and page size
// (see mla_paged_backend.h).
#include "backends/mla/mla_paged_backend.h"

#ifdef ATTNKIT_WITH_CUDA

#include <algorithm>
#include <string>

#include "attnkit/registry.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "backends/mla/mla_decode_engine.h"
#include "core/device_scope.h"

namespace attnkit {
namespace {

constexpr int kFlashMlaPage = 64;
constexpr int kCutlassMlaPage = 128;

class MlaPagedBackend final : public AttentionBackend {
 public:
  MlaPagedBackend(const BackendContext& ctx, std::string name,
                  std::unique_ptr<mla::MlaDecodeEngine> engine,
                  std::unique_ptr<AttentionBackend> other)
      : ctx_(ctx), name_(std::move(name)), engine_(std::move(engine)), other_(std::move(other)) {}

  std::optional<Device> device() const override { return ctx_.device; }
  const BackendDescriptor& descriptor() const override { return *builtin_registry().find(name_); }
  const mla::MlaDecodeStats& stats() const { return engine_->stats(); }

  Status init_forward_metadata(const ForwardBatch& batch) override {
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    ATTNKIT_RETURN_IF_ERROR(check_batch_devices(batch, stream_for(batch), ctx_.device));
    engine_forward_ = false;
    if (batch.mode != ForwardMode::kIdle && engine_->why_not(batch).empty()) {
      ATTNKIT_RETURN_IF_ERROR(batch.validate());
      if (batch.req_to_token_pool == nullptr) {
        return Status::invalid_argument(name_ + ": ForwardBatch.req_to_token_pool is null");
      }
      engine_forward_ = true;
      return engine_->plan(batch, stream_for(batch));
    }
    return other_->init_forward_metadata(batch);
  }
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(check_entry_point(name_, /*decode_entry=*/false, batch));
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    if (engine_forward_) return run_engine(q, k, v, out, layer, batch, save_kv, lse);
    return other_->forward_extend(q, k, v, out, layer, batch, save_kv, lse);
  }
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(check_entry_point(name_, /*decode_entry=*/true, batch));
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    if (engine_forward_) return run_engine(q, k, v, out, layer, batch, save_kv, lse);
    return other_->forward_decode(q, k, v, out, layer, batch, save_kv, lse);
  }

  Status init_cuda_graph_state(int max_bs, int max_num_tokens) override {
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx_.stream, ctx_.device, "BackendContext.stream"));
    // Checked before either part is touched (the engine does not check them; a refusal by the
    // other part after the engine re-sized its workspaces left the two out of step).
    if (max_bs < 1 || max_num_tokens < max_bs) {
      return Status::invalid_argument(
          name_ + ": init_cuda_graph_state(max_bs " + std::to_string(max_bs) + ", max_num_tokens " +
          std::to_string(max_num_tokens) + ") needs max_bs >= 1 and max_num_tokens >= max_bs");
    }
    ATTNKIT_RETURN_IF_ERROR(engine_->init_graph(max_bs, max_num_tokens));
    return other_->init_cuda_graph_state(max_bs, max_num_tokens);
  }
  Status init_forward_metadata_capture_cuda_graph(int bs, int num_tokens,
                                                  const TensorView& req_pool_indices,
                                                  const TensorView& seq_lens,
                                                  const TensorView& encoder_lens, ForwardMode mode,
                                                  const SpecInfo* spec) override {
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx_.stream, ctx_.device, "BackendContext.stream"));
    engine_forward_ = !encoder_lens.defined() && engine_->why_not_graph(mode, spec).empty();
    if (engine_forward_) {
      ATTNKIT_RETURN_IF_ERROR(
          check_graph_inputs(name_, bs, req_pool_indices, seq_lens, encoder_lens, ctx_.device));
      return engine_->plan_graph(bs, seq_lens, mode, spec, ctx_.stream, /*capture=*/true);
    }
    return other_->init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices,
                                                            seq_lens, encoder_lens, mode, spec);
  }
  Status init_forward_metadata_replay_cuda_graph(int bs, const TensorView& req_pool_indices,
                                                 const TensorView& seq_lens, int64_t seq_lens_sum,
                                                 const TensorView& encoder_lens, ForwardMode mode,
                                                 const SpecInfo* spec,
                                                 const int32_t* seq_lens_host) override {
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    engine_forward_ = !encoder_lens.defined() && engine_->why_not_graph(mode, spec).empty();
    if (engine_forward_) {
      ATTNKIT_RETURN_IF_ERROR(
          check_graph_inputs(name_, bs, req_pool_indices, seq_lens, encoder_lens, ctx_.device));
      ATTNKIT_RETURN_IF_ERROR(check_graph_lengths(
          name_, bs, seq_lens_host,
          mode == ForwardMode::kTargetVerify && spec != nullptr ? spec->draft_token_num : 0,
          ctx_.req_to_token_pool != nullptr ? ctx_.req_to_token_pool->max_context_len() : 0));
      // Verify: the engine reads s_q drafts past seq_lens (1 without a spec).
      ATTNKIT_RETURN_IF_ERROR(check_graph_table_slots(
          name_, ctx_.req_to_token_pool, ctx_.kv_pool, bs, req_pool_indices, seq_lens_host,
          mode == ForwardMode::kTargetVerify
              ? std::max(spec != nullptr ? spec->draft_token_num : 0, 1)
              : 0,
          ctx_.stream));
      return engine_->plan_graph(bs, seq_lens, mode, spec, ctx_.stream, /*capture=*/false);
    }
    return other_->init_forward_metadata_replay_cuda_graph(
        bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, spec, seq_lens_host);
  }

 private:
  StreamHandle stream_for(const ForwardBatch& batch) const {
    return batch.stream != nullptr ? batch.stream : ctx_.stream;
  }
  Status run_engine(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                    bool save_kv, const TensorView& lse) {
    ATTNKIT_RETURN_IF_ERROR(
        validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
    if (batch.mode == ForwardMode::kIdle || batch.num_tokens == 0) return Status::ok();
    return engine_->run(q, k, v, out, layer, batch, save_kv, lse, stream_for(batch));
  }

  BackendContext ctx_;
  std::string name_;
  std::unique_ptr<mla::MlaDecodeEngine> engine_;
  std::unique_ptr<AttentionBackend> other_;  // the page-1 flashinfer MLA path
  bool engine_forward_ = false;
};

Result<std::unique_ptr<AttentionBackend>> create_paged_mla(const BackendContext& ctx,
                                                           const std::string& name, int page) {
  if (!ctx.device.is_cuda()) {
    return Status::invalid_argument(name + ": BackendContext.device " + ctx.device.to_string() +
                                    " is not a CUDA device");
  }
  if (!ctx.is_mla) {
    return Status::unsupported(name + " is an MLA backend; the model has MHA attention");
  }
  if (ctx.page_size != page) {
    return Status::invalid_argument(name + ": page_size " + std::to_string(ctx.page_size) +
                                    " is not supported (needs " + std::to_string(page) + ")");
  }
  const BackendDescriptor* d = builtin_registry().find(name);
  const bool fp8 = d != nullptr && d->mla.has_value() && d->mla->fp8_kv;
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<mla::MlaDecodeEngine> engine,
                           mla::MlaDecodeEngine::create(ctx, name, page, fp8));
  FlashInferOptions other_options;
  other_options.name = name;  // its errors (extends, prefill) carry this backend's name
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> other,
                           create_flashinfer_backend_with(ctx, other_options));
  return std::unique_ptr<AttentionBackend>(
      new MlaPagedBackend(ctx, name, std::move(engine), std::move(other)));
}

}  // namespace

Result<std::unique_ptr<AttentionBackend>> create_flashmla_backend(const BackendContext& ctx) {
  return create_paged_mla(ctx, "flashmla", kFlashMlaPage);
}

Result<std::unique_ptr<AttentionBackend>> create_cutlass_mla_backend(const BackendContext& ctx) {
  return create_paged_mla(ctx, "cutlass_mla", kCutlassMlaPage);
}

const mla::MlaDecodeStats* mla_paged_stats(const AttentionBackend& backend) {
  const auto* paged = dynamic_cast<const MlaPagedBackend*>(&backend);
  return paged != nullptr ? &paged->stats() : nullptr;
}

}  // namespace attnkit

#endif  // ATTNKIT_WITH_CUDA
