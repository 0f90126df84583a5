// The `fa3` backend: host side. The SM90 wgmma prefill kernel runs through the shared engine
// (prefill_sm90_engine.h, also used by the flashinfer backend's SM90 prefill); everything it does
// not cover is delegated to an owned flashinfer backend, which plans every forward as well so that
// any layer can fall back.
//
// Host protocol: init_forward_metadata plans the flashinfer path and, for wgmma-eligible
// forwards, the engine's query tiles; forward_extend writes the layer's K/V (save_kv) and runs
// the engine or delegates. CUDA graphs (decode, verify) are the flashinfer backend's.
// MLA contexts: a second engine (PrefillSm90Engine::create_mla_prefill) runs the non-absorbed
// 192 / 128 prefill layers without a chunked prefix cache, and the attention passes of those with
// one (the flashinfer backend's MlaPrefixCacheRunner hands them to it:
// FlashInferOptions::mla_prefix_passes); absorbed layers and decode are the flashinfer backend's
// (its MLA paths).
#include "backends/fa3/fa3_backend.h"

#ifdef ATTNKIT_WITH_CUDA

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "backend/device_array.h"
#include "backend/plan_stamp.h"
#include "backends/fa3/kernels/q_widen.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "backends/fa3/prefill_sm90_engine.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "core/device_scope.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/device_attributes.h"

namespace attnkit {
namespace {

class Fa3Backend final : public AttentionBackend {
 public:
  Fa3Backend(const BackendContext& ctx, std::unique_ptr<fa3::PrefillSm90Engine> mla_prefill,
             std::unique_ptr<AttentionBackend> inner, std::unique_ptr<fa3::PrefillSm90Engine> wgmma)
      : ctx_(ctx),
        mla_prefill_(std::move(mla_prefill)),
        wgmma_(std::move(wgmma)),
        inner_(std::move(inner)) {}

  std::optional<Device> device() const override { return ctx_.device; }
  const BackendDescriptor& descriptor() const override { return *builtin_registry().find("fa3"); }

  Status init_forward_metadata(const ForwardBatch& batch) override {
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    // The previous forward's wgmma plan goes first: a failed init below left it live, and a
    // forward of the same shape then ran on it past the inner backend's stale-plan guard.
    if (wgmma_ != nullptr) wgmma_->drop_plan();
    if (mla_prefill_ != nullptr) mla_prefill_->drop_plan();
    stamp_ = PlanStamp{};
    // The engine first: a mixed forward it partitions leaves its few-token requests to inner_'s
    // decode tiles, which inner_ plans from the engine's partition(). The batch is checked before
    // the engine reads its host lengths (inner_ checks it again).
    small_ranges_n_ = 0;
    if (wgmma_ != nullptr) {
      ATTNKIT_RETURN_IF_ERROR(check_batch_devices(batch, stream_for(batch), ctx_.device));
      if (batch.mode != ForwardMode::kIdle) ATTNKIT_RETURN_IF_ERROR(batch.validate());
      ATTNKIT_RETURN_IF_ERROR(wgmma_->plan(batch, stream_for(batch)));
      ATTNKIT_RETURN_IF_ERROR(plan_small_ranges(batch));
    }
    ATTNKIT_RETURN_IF_ERROR(inner_->init_forward_metadata(batch));
    if (wgmma_ == nullptr && mla_prefill_ == nullptr) return Status::ok();
    if (mla_prefill_ != nullptr) {
      ATTNKIT_RETURN_IF_ERROR(mla_prefill_->plan(batch, stream_for(batch)));
    }
    stamp_ = PlanStamp{true, batch.mode, batch.batch_size, batch.num_tokens,
                       plan_key(batch, stream_for(batch))};
    return Status::ok();
  }
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override;
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(check_entry_point("fa3", /*decode_entry=*/true, batch));
    ++stats_.flashinfer_calls;
    return inner_->forward_decode(q, k, v, out, layer, batch, save_kv, lse);
  }

  Status init_cuda_graph_state(int max_bs, int max_num_tokens) override {
    return inner_->init_cuda_graph_state(max_bs, max_num_tokens);
  }
  Status init_forward_metadata_capture_cuda_graph(int bs, int num_tokens,
                                                  const TensorView& req_pool_indices,
                                                  const TensorView& seq_lens,
                                                  const TensorView& encoder_lens, ForwardMode mode,
                                                  const SpecInfo* spec) override {
    if (wgmma_ != nullptr) wgmma_->drop_plan();  // captured graphs run the flashinfer kernels
    if (mla_prefill_ != nullptr) mla_prefill_->drop_plan();
    stamp_ = PlanStamp{};
    return inner_->init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices,
                                                            seq_lens, encoder_lens, mode, spec);
  }
  Status init_forward_metadata_replay_cuda_graph(int bs, const TensorView& req_pool_indices,
                                                 const TensorView& seq_lens, int64_t seq_lens_sum,
                                                 const TensorView& encoder_lens, ForwardMode mode,
                                                 const SpecInfo* spec,
                                                 const int32_t* seq_lens_host) override {
    return inner_->init_forward_metadata_replay_cuda_graph(
        bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, spec, seq_lens_host);
  }

  const Fa3Stats& stats() const { return stats_; }

 private:
  StreamHandle stream_for(const ForwardBatch& batch) const {
    return batch.stream != nullptr ? batch.stream : ctx_.stream;
  }
  // The (first token, tokens) ranges an e4m3-q layer widens for inner_'s tiles (forward_extend):
  // a partitioned forward over an fp8_e4m3 pool, the tokens of its few-token requests; a forward of
  // few new tokens per request over one, every token. One range per token, so one CTA of
  // widen_e4m3_q_rows each (H200 2026-12-01: b64 with one new token each as one range, one CTA,
  // cost ~40 us; the partition's one range per one-token request did not).
  static void push_token_ranges(int32_t first, int32_t tokens, std::vector<int32_t>* ranges) {
    for (int32_t t = first; t < first + tokens; ++t) {
      ranges->push_back(t);
      ranges->push_back(1);
    }
  }
  Status plan_small_ranges(const ForwardBatch& batch) {
    std::vector<int32_t> ranges;
    if (wgmma_->partitioned() && wgmma_->planned_fp8()) {
      const std::vector<fa3::TileRequest> all = fa3::tile_requests(batch);
      for (size_t r = 0; r < all.size() && r < wgmma_->partition().size(); ++r) {
        if (wgmma_->partition()[r] != 0) push_token_ranges(all[r].q_start, all[r].q_len, &ranges);
      }
    } else if (wgmma_->planned_small_extend() && batch.kv_pool != nullptr &&
               batch.kv_pool->dtype() == DType::kFP8E4M3) {
      push_token_ranges(0, batch.num_tokens, &ranges);
    }
    if (ranges.empty()) return Status::ok();
    ATTNKIT_RETURN_IF_ERROR(
        small_ranges_.reserve(ctx_.device, static_cast<int64_t>(ranges.size())));
    // Pageable source: staged before cudaMemcpyAsync returns.
    ATTNKIT_CUDA_TRY(cudaMemcpyAsync(small_ranges_.data(), ranges.data(),
                                     ranges.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                     cuda::to_stream(stream_for(batch))));
    small_ranges_n_ = static_cast<int>(ranges.size() / 2);
    return Status::ok();
  }

  BackendContext ctx_;
  // MLA contexts on SM90: the non-absorbed prefill layers' kernel, also the chunked prefix cache's
  // passes of inner_ (else nullptr). Declared first: inner_ holds a pointer to it.
  std::unique_ptr<fa3::PrefillSm90Engine> mla_prefill_;
  // nullptr: no forward of this context uses it. Declared before inner_, which reads its
  // partition (FlashInferOptions::wgmma_partner).
  std::unique_ptr<fa3::PrefillSm90Engine> wgmma_;
  std::unique_ptr<AttentionBackend> inner_;  // flashinfer, its own SM90 routing off
  // Fa3Stats of one layer run by engine e (the MHA or the MLA one; the tail split of the layer's
  // mask).
  void record_wgmma_call(const fa3::PrefillSm90Engine& e, const AttentionLayer& layer);
  Status run_mla_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const AttentionLayer& layer,
                         const ForwardBatch& batch, bool save_kv, const TensorView& lse);
  // The batch the engine's tiles were planned for (the flashinfer path checks its own plan).
  PlanStamp stamp_;
  // plan_small_ranges' ranges (small_ranges_n_ of them) and the widened q rows of an e4m3-q
  // layer ([num_tokens, q heads, d] in the context's q dtype, reserved at the first such layer).
  DeviceArray<int32_t> small_ranges_;
  int small_ranges_n_ = 0;
  DeviceArray<uint16_t> q_wide_;
  // The rows of plan_small_ranges widened from the e4m3 q into q_wide_ (exact: every e4m3 value
  // is a bf16 value), and the layer with q_scale folded into its scaling, for inner_'s tiles.
  Status widen_q(const TensorView& q, const AttentionLayer& layer, StreamHandle stream,
                 TensorView* wide, AttentionLayer* wide_layer) {
    // Reserved at the first such layer (a bf16-q forward never needs it); grow-only; never empty
    // (a forward of no tokens still hands inner_ a defined q).
    ATTNKIT_RETURN_IF_ERROR(
        q_wide_.reserve(ctx_.device, std::max<int64_t>(1, q.size(0) * q.size(1) * q.size(2))));
    ATTNKIT_RETURN_IF_ERROR(
        fa3::widen_e4m3_q_rows(q, small_ranges_.data(), small_ranges_n_, q_wide_.data(), stream));
    *wide = TensorView(q_wide_.data(), ctx_.q_dtype, q.device, {q.size(0), q.size(1), q.size(2)});
    *wide_layer = layer;
    wide_layer->scaling = layer.scaling * layer.q_scale;
    wide_layer->q_scale = 1.f;
    return Status::ok();
  }
  Fa3Stats stats_;
};

Status Fa3Backend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const AttentionLayer& layer,
                                  const ForwardBatch& batch, bool save_kv, const TensorView& lse) {
  ATTNKIT_RETURN_IF_ERROR(check_entry_point("fa3", /*decode_entry=*/false, batch));
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  if (layer.is_mla) {
    if (mla_prefill_ != nullptr &&
        mla_prefill_->why_not_mla_layer(q, k, v, out, layer, batch).empty()) {
      return run_mla_prefill(q, k, v, out, layer, batch, save_kv, lse);
    }
    ++stats_.flashinfer_calls;
    // A chunked prefix cache layer: the flashinfer backend's runner hands its passes to
    // mla_prefill_ where it takes them (FlashInferOptions::mla_prefix_passes).
    const int64_t passes = mla_prefill_ != nullptr ? mla_prefill_->prefix_passes_run() : 0;
    const Status s = inner_->forward_extend(q, k, v, out, layer, batch, save_kv, lse);
    if (mla_prefill_ != nullptr) {
      stats_.wgmma_mla_prefix_passes += mla_prefill_->prefix_passes_run() - passes;
    }
    return s;
  }
  if (q.dtype == DType::kFP8E4M3 && wgmma_ != nullptr && wgmma_->planned_small_extend()) {
    // Few new tokens per request (backend/small_extend.h): inner_'s decode / prefill tiles, the
    // e4m3 q widened to bf16 for them (H200 2026-12-01: b63 kv 4k, one new token each, 4.06x the
    // FP8 wgmma tiles that ran it).
    const std::string why = wgmma_->why_not_small_extend_e4m3_q(q, out, layer, batch);
    if (!why.empty()) {
      return Status::invalid_argument(
          "fa3: q dtype fp8_e4m3 (layer " + std::to_string(layer.layer_id) +
          ") of a forward with few new tokens per request runs on flashinfer's tiles widened to "
          "bf16, with the inputs the SM90 FP8 prefill takes (an fp8_e4m3 KV pool, bf16 out, head "
          "dim 128, 16-byte q rows): " +
          why);
    }
    ATTNKIT_RETURN_IF_ERROR(validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse,
                                                    ctx_.device, /*allow_fp8_q=*/true));
    const StreamHandle stream = stream_for(batch);
    ATTNKIT_RETURN_IF_ERROR(check_forward_matches_plan("fa3", stamp_, batch, stream));
    TensorView wide;
    AttentionLayer wide_layer;
    ATTNKIT_RETURN_IF_ERROR(widen_q(q, layer, stream, &wide, &wide_layer));
    ++stats_.flashinfer_calls;
    const Status s = inner_->forward_extend(wide, k, v, out, wide_layer, batch, save_kv, lse);
    if (s.is_ok()) ++stats_.q_widened_calls;
    return s;
  }
  const std::string why_not = wgmma_ == nullptr
                                  ? std::string(
                                        "this context has no SM90 wgmma prefill (it needs an SM90 "
                                        "device with sm_90a code, MHA, bf16 / f16 q, head dim "
                                        "64 / 128 / 256)")
                                  : wgmma_->why_not_layer(q, out, layer, batch);
  if (!why_not.empty() && wgmma_ != nullptr && wgmma_->partitioned() &&
      q.dtype != DType::kFP8E4M3) {
    // inner_ planned only the few-token requests of this forward. For the pools that are split
    // (the q dtype's; fp8_e4m3 on an FP8 plan with the variants), a layer the kernel declines
    // (shape, dtypes, row alignment) is one inner_'s kernels refuse as well; the inputs' own
    // errors come first.
    ATTNKIT_RETURN_IF_ERROR(validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse,
                                                    ctx_.device, /*allow_fp8_q=*/true));
    return Status::invalid_argument(
        "fa3: layer " + std::to_string(layer.layer_id) +
        " of a mixed forward split between the SM90 wgmma kernel and flashinfer's decode tiles "
        "(backend/small_extend.h): the wgmma kernel declined it: " +
        why_not);
  }
  if (!why_not.empty()) {
    // An e4m3 q runs on the FP8 wgmma kernel only; the flashinfer path would refuse it by its
    // dtype alone, so the reason the kernel declined is the one to give.
    if (q.dtype == DType::kFP8E4M3) {
      return Status::invalid_argument(
          "fa3: q dtype fp8_e4m3 (layer " + std::to_string(layer.layer_id) +
          ") runs only on the SM90 FP8 prefill (extend / mixed / draft-extend, an fp8_e4m3 KV "
          "pool, bf16 out, head dim 128; a window / sinks / soft-cap on the plans that have "
          "them), which declined it: " +
          why_not);
    }
    ++stats_.flashinfer_calls;
    return inner_->forward_extend(q, k, v, out, layer, batch, save_kv, lse);
  }
  ATTNKIT_RETURN_IF_ERROR(validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse,
                                                  ctx_.device, /*allow_fp8_q=*/true));
  ATTNKIT_RETURN_IF_ERROR(check_forward_matches_plan("fa3", stamp_, batch, stream_for(batch)));
  const StreamHandle stream = stream_for(batch);
  if (save_kv && k.defined()) {
    auto& pool = static_cast<MHAKVPool&>(*batch.kv_pool);
    ATTNKIT_RETURN_IF_ERROR(pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v, layer.k_scale,
                                        layer.v_scale, stream));
  }
  // A partitioned forward's few-token requests run on inner_'s decode tiles after the wgmma kernel
  // (its plan gives the others no rows; the keys are in the pool already). An e4m3 q (an
  // fp8_e4m3 pool's partition) reaches them widened to the q dtype, exactly, with q_scale folded
  // into the scaling; widened before the wgmma kernel, so that the decode tiles it releases early
  // (the overlap: they skip the grid-dependency wait) read rows written by a finished kernel.
  const bool partitioned = wgmma_->partitioned();
  TensorView q_small = q;
  AttentionLayer small_layer = layer;
  if (partitioned && q.dtype == DType::kFP8E4M3) {
    ATTNKIT_RETURN_IF_ERROR(widen_q(q, layer, stream, &q_small, &small_layer));
  }
  record_wgmma_call(*wgmma_, layer);
  ATTNKIT_RETURN_IF_ERROR(wgmma_->run(q, out, lse, layer, batch, stream));
  if (!partitioned) return Status::ok();
  ++stats_.flashinfer_calls;
  ++stats_.partition_calls;
  const bool overlapped = wgmma_->last_run_overlapped();
  const Status s =
      inner_->forward_extend(q_small, k, v, out, small_layer, batch, /*save_kv=*/false, lse);
  if (s.is_ok() && overlapped) ++stats_.partition_overlap_calls;
  if (s.is_ok() && q.dtype == DType::kFP8E4M3) ++stats_.q_widened_calls;
  return s;
}

void Fa3Backend::record_wgmma_call(const fa3::PrefillSm90Engine& e, const AttentionLayer& layer) {
  ++stats_.wgmma_calls;
  if (e.planned_fp8()) ++stats_.wgmma_fp8_calls;
  if (e.mla_prefill()) ++stats_.wgmma_mla_calls;
  stats_.last_block_n = e.planned_fp8() ? e.planned_fp8_block_n() : e.block_n();
  stats_.last_block_m = e.planned_block_m();
  stats_.last_fp8_vt_pre = e.planned_fp8() && e.planned_fp8_variant().vt_pre;
  stats_.last_fp8_spec = e.planned_fp8() && e.planned_fp8_variant().spec;
  stats_.last_fp8_gemm_sum = e.planned_fp8() && e.planned_fp8_variant().gemm_sum;
  stats_.last_fp8_promote = 0;
  if (e.planned_fp8() && e.planned_fp8_variant().promote) {
    stats_.last_fp8_promote = e.planned_fp8_variant().promote_late ? 2 : 1;
  }
  const fa3::TailSplit split = e.planned_tail_split(layer.type != AttentionType::kEncoderOnly);
  stats_.last_split_units = split.split_units;
  stats_.last_num_splits = split.num_splits;
  stats_.last_section_heads = e.planned_section_heads();
}

Status Fa3Backend::run_mla_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const AttentionLayer& layer,
                                   const ForwardBatch& batch, bool save_kv, const TensorView& lse) {
  // The checks every path makes; a non-absorbed layer writes nothing to the pool
  // (validate_forward_inputs refuses save_kv for it: the absorbed layers store the latent rows).
  ATTNKIT_RETURN_IF_ERROR(
      validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
  ATTNKIT_RETURN_IF_ERROR(check_forward_matches_plan("fa3", stamp_, batch, stream_for(batch)));
  record_wgmma_call(*mla_prefill_, layer);
  return mla_prefill_->run_mla(q, k, v, out, lse, layer, batch, stream_for(batch));
}

}  // namespace

const Fa3Stats* fa3_stats(const AttentionBackend& backend) {
  const auto* f = dynamic_cast<const Fa3Backend*>(&backend);
  return f != nullptr ? &f->stats() : nullptr;
}

Result<std::unique_ptr<AttentionBackend>> create_fa3_backend(const BackendContext& ctx) {
  if (!ctx.device.is_cuda()) {
    return Status::invalid_argument("fa3: BackendContext.device " + ctx.device.to_string() +
                                    " is not a CUDA device");
  }
  cuda::DeviceAttributes attrs;
  ATTNKIT_RETURN_IF_ERROR(cuda::query_device_attributes(ctx.device.ordinal, &attrs));
  // The flashinfer backend serves every forward the wgmma kernel does not (and checks the
  // context: heads, dims, dtypes). Its own SM90 routing to the same kernel is off: this backend
  // routes, so that Fa3Stats counts every wgmma call.
  std::unique_ptr<fa3::PrefillSm90Engine> mla_prefill =
      ctx.is_mla ? fa3::PrefillSm90Engine::create_mla_prefill(ctx, attrs.sm_count,
                                                              attrs.compute_capability, nullptr)
                 : nullptr;
  std::unique_ptr<fa3::PrefillSm90Engine> wgmma =
      fa3::PrefillSm90Engine::create(ctx, attrs.sm_count, attrs.compute_capability, nullptr,
                                     /*allow_fp8_kv=*/true);
  FlashInferOptions fi_options;
  fi_options.sm90_prefill = false;
  fi_options.name = "fa3";  // the paths it runs say fa3 in their errors
  fi_options.mla_prefix_passes = mla_prefill.get();
  fi_options.wgmma_partner = wgmma.get();
  Result<std::unique_ptr<AttentionBackend>> inner = create_flashinfer_backend_with(ctx, fi_options);
  if (!inner.is_ok()) return inner.status();
  return std::unique_ptr<AttentionBackend>(
      new Fa3Backend(ctx, std::move(mla_prefill), std::move(inner).value(), std::move(wgmma)));
}

}  // namespace attnkit

#endif  // ATTNKIT_WITH_CUDA
