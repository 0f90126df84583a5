// The `triton` backend: portable CUDA attention (SM75+). Host side: input checks, the per-forward
// plan (token indices, query layout, split-KV extent) written into preallocated workspace, the
// per-layer launches, and the CUDA-graph trio. Kernels live in kernels/.
//
// Host protocol: init_forward_metadata (once per forward) builds the flattened token indices of
// the pool keys with a GPU kernel and uploads the query layout; forward_extend / forward_decode
// (per layer) only fill an AttentionParams and launch. With CUDA graphs, the plan lives in static
// buffers sized by init_cuda_graph_state; capture and replay refresh them in place.
#include "backends/triton/triton_backend.h"

#ifdef ATTNKIT_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnkit/registry.h"
#include "backend/device_array.h"
#include "backend/graph_captures.h"
#include "backend/kernel_params.h"
#include "backend/plan_stamp.h"
#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/simt_layout.h"
#include "backends/triton/kernels/split_plan.h"
#include "backends/triton/kernels/triton_kernels.h"
#include "core/device_scope.h"
#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/decode_tuning.h"
#include "cuda/common/device_attributes.h"
#include "cuda/common/dispatch.h"
#include "cuda/common/metadata_kernels.h"
#include "cuda/common/ring_shape.h"

namespace attnkit {
namespace {

using triton::AttentionParams;

constexpr int kMinComputeCapability = 75;
constexpr int kTensorCoreComputeCapability = 80;  // mma.sync m16n8k16 bf16/f16

// Token indices of one key set (self-attention prefix or cross-attention encoder keys).
struct IndexSet {
  DeviceArray<int32_t> indptr;   // [bs + 1]
  DeviceArray<int32_t> indices;  // [total]
};

// Everything a forward's layers share.
struct Plan {
  bool valid = false;
  ForwardMode mode = ForwardMode::kIdle;
  int bs = 0;
  // The planned batch's num_tokens (graphs: bs x queries per request): a forward of another count
  // is refused, as the plan's query offsets would index past its q / out.
  int num_tokens = 0;
  std::optional<PlanKey> lengths;  // eager plans: plan_key (plan_stamp.h)
  bool replay = false;             // a CUDA-graph replay plan (no forward runs on it)
  const int32_t* self_indptr = nullptr;
  const int32_t* self_indices = nullptr;
  const int32_t* cross_indptr = nullptr;  // nullptr = no encoder
  const int32_t* cross_indices = nullptr;
  const int32_t* q_start = nullptr;  // [bs] extend modes
  const int32_t* q_len = nullptr;    // [bs]
  int max_q_len = 0;
  int grid_splits = 1;                  // decode: launched split extent
  int min_chunk = triton::kMinChunk;    // decode: this forward's chunk floor (split_plan.h)
  const int* min_chunk_word = nullptr;  // graphs: the same, in device memory (set by replay)
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int32_t* split_counters = nullptr;     // tensor-core decode: [bs, mma_head_blocks] zeros
  const int32_t* zero_indptr = nullptr;  // [bs + 1] zeros: no pool keys (MLA prefill)
  const int32_t* new_slots = nullptr;    // [T] extend modes: the new tokens' slots (req_to_token)
};

class TritonBackend final : public AttentionBackend {
 public:
  TritonBackend(const BackendContext& ctx, int sm_count, int compute_capability, int optin_smem)
      : ctx_(ctx), sm_count_(sm_count), cc_(compute_capability), optin_smem_(optin_smem) {
    const int dqk = ctx.is_mla ? ctx.kv_lora_rank + ctx.qk_rope_head_dim : ctx.qk_head_dim;
    const int dv = ctx.is_mla ? ctx.kv_lora_rank : ctx.v_head_dim;
    const int group = ctx.num_kv_heads > 0 ? ctx.num_q_heads / ctx.num_kv_heads : 1;
    // Blocks of one request and split: the tensor-core decode packs 16 q heads per block, the
    // SIMT kernel simt::gqa_tile.
    const int tile = decode_tensor_cores(ctx.q_dtype) ? triton::kMmaDecodeGroupTile
                                                      : triton::simt::gqa_tile(dqk, dv);
    head_blocks_ = std::max(1, ctx.num_kv_heads) * ((group + tile - 1) / tile);
    ring_ = pick_ring(optin_smem, dqk);
    // Resident CTAs per SM the split planner fills: 2 of the 2 x 4-warp shape, 1 of the one-CTA
    // shape or of the compact CTA that devices without the default's shared memory run (sm_86 /
    // sm_89: d 96 / 128 / 256 with KV of the q dtype, d 80 / 96 fp8; ring_shape.h).
    const DType kv = ctx.kv_pool != nullptr ? ctx.kv_pool->dtype() : ctx.q_dtype;
    const bool compact = decode_tensor_cores(ctx.q_dtype) && dqk <= 256 &&
                         !cuda::ring::default_cta_fits(dqk, dtype_is_fp8(kv), optin_smem);
    blocks_per_sm_ = cuda::decode_blocks_per_sm(
        ring_ == triton::MmaDecodeRing::k2x4 && !compact ? triton::kTargetBlocksPerSm : 1);
    max_splits_ = triton::plan_max_splits(sm_count_, head_blocks_, blocks_per_sm_);
    // Experiment: "request" = old rule.
    batch_chunk_ = env_choice("ATTNKIT_TRITON_SPLIT", {"request"}, "batch") != "request";
    split_sync_fence_all_ =  // experiment (attention_params.h)
        env_choice("ATTNKIT_TRITON_SPLIT_SYNC", {"fence_all"}, "acq_rel") == "fence_all";
    mma_head_blocks_ = std::max(1, ctx.num_kv_heads) *
                       ((group + triton::kMmaDecodeGroupTile - 1) / triton::kMmaDecodeGroupTile);
  }

  std::optional<Device> device() const override { return ctx_.device; }
  const BackendDescriptor& descriptor() const override {
    return *builtin_registry().find("triton");
  }

  // CTA shape of the tensor-core decode (triton_kernels.h): one CTA of 8 warps per SM where the
  // pool holds the activation dtype (the context's pool; none given: assumed), the head dim is
  // <= 128 and a block may opt in to the one-CTA shared memory (SM90); else 2 CTAs of 4 warps.
  // The split planner follows it (1 or 2 blocks per SM). ATTNKIT_TRITON_DECODE_RING=2x4
  // overrides it for experiments (docs/perf/decode_notes.md); not API.
  triton::MmaDecodeRing pick_ring(int optin_smem, int dqk) const {
    using triton::MmaDecodeRing;
    const DType kv = ctx_.kv_pool != nullptr ? ctx_.kv_pool->dtype() : ctx_.q_dtype;
    const bool one_cta_fits = decode_tensor_cores(ctx_.q_dtype) && kv == ctx_.q_dtype &&
                              dqk <= triton::kMmaDecodeOneCtaMaxDim &&
                              optin_smem >= triton::kMmaDecodeOneCtaSmem;
    if (!one_cta_fits) return MmaDecodeRing::k2x4;
    if (env_choice("ATTNKIT_TRITON_DECODE_RING", {"1x8", "2x4"}, "1x8") == "2x4") {
      return MmaDecodeRing::k2x4;
    }
    return MmaDecodeRing::k1x8;
  }

  // Decode on tensor cores (run_mma_decode) for MHA with bf16/f16 activations on SM80+; the pool
  // dtype (the activation dtype or fp8; fp4 stays SIMT) is checked per forward.
  bool decode_tensor_cores(DType q_dtype) const {
    return !ctx_.is_mla && cc_ >= kTensorCoreComputeCapability &&
           (q_dtype == DType::kBF16 || q_dtype == DType::kF16);
  }

  Status init_forward_metadata(const ForwardBatch& batch) override;
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override;
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override;

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

 private:
  StreamHandle stream_for(const ForwardBatch& batch) const {
    return batch.stream != nullptr ? batch.stream : ctx_.stream;
  }
  Status run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionLayer& layer, const ForwardBatch& batch, bool save_kv,
             const TensorView& lse, bool decode);
  Status graph_metadata(int bs, const TensorView& req_pool_indices, const TensorView& seq_lens,
                        ForwardMode mode, const SpecInfo* spec, StreamHandle stream);
  // Replay of a decode graph: this forward's chunk floor from seq_lens_host into the device word
  // the captured kernels read.
  Status upload_graph_chunk(int bs, const int32_t* seq_lens_host, StreamHandle stream);
  // CUDA graphs: the split extent of the tensor-core decode grid captured for batch size bs:
  // ceil(CTA slots / (bs x head blocks)), in [1, max_splits_]: one wave of CTAs, where
  // max_splits_ for every request left thousands of CTAs without a split at large batches.
  int graph_mma_split_extent(int bs) const;
  // Keys a decode query sees: the whole sequence, or the window's last window + 1 tokens.
  int decode_splits(int seq_len, int window, int min_chunk) const;
  // This forward's split chunk floor from the host decode lengths (split_plan.h).
  int forward_chunk(std::span<const int32_t> seq_lens) const;

  BackendContext ctx_;
  int sm_count_ = 0;
  int cc_ = 0;
  int optin_smem_ = 0;  // opt-in shared memory per block (bytes; ATTNKIT_EMULATE_CC applied)
  int head_blocks_ = 1;
  int mma_head_blocks_ = 1;  // blocks of one request/split of the tensor-core decode
  int max_splits_ = 1;
  int blocks_per_sm_ = triton::kTargetBlocksPerSm;
  triton::MmaDecodeRing ring_ = triton::MmaDecodeRing::k2x4;
  bool split_sync_fence_all_ = false;  // ATTNKIT_TRITON_SPLIT_SYNC=fence_all (experiment)
  bool batch_chunk_ = true;  // per-forward chunk floor (split_plan.h); false: kMinChunk always
  Plan plan_;

  // Eager workspace (grow-only; only init_forward_metadata resizes it).
  IndexSet self_, cross_;
  DeviceArray<int32_t> q_start_, zeros_, new_slots_;
  DeviceArray<float> partial_out_, partial_lse_;
  DeviceArray<int32_t> split_counters_;  // zeroed when allocated; kernels leave them zero
  std::vector<int32_t> q_layout_host_;   // [2 * bs]: q_start then q_len

  // CUDA-graph state (fixed addresses for the captured kernels).
  bool graph_ready_ = false;
  int graph_max_bs_ = 0;
  int graph_max_tokens_ = 0;
  IndexSet graph_self_;
  DeviceArray<int32_t> graph_q_start_, graph_q_len_, graph_new_slots_;
  DeviceArray<float> graph_partial_out_, graph_partial_lse_;
  DeviceArray<int32_t> graph_split_counters_;
  DeviceArray<int32_t> graph_min_chunk_;  // [1]: the replayed forward's chunk floor
  int32_t graph_min_chunk_host_ = triton::kMinChunk;
  int graph_draft_tokens_ = 0;
  GraphCaptures graph_captures_;  // what was captured since init_cuda_graph_state
};

int TritonBackend::graph_mma_split_extent(int bs) const {
  const int per_split = std::max(1, bs * mma_head_blocks_);
  const int slots = blocks_per_sm_ * sm_count_;
  return std::clamp((slots + per_split - 1) / per_split, 1, max_splits_);
}

int TritonBackend::decode_splits(int seq_len, int window, int min_chunk) const {
  const int n = window >= 0 ? std::min(seq_len, window + 1) : seq_len;
  return triton::split_count(n, max_splits_, min_chunk);
}

int TritonBackend::forward_chunk(std::span<const int32_t> seq_lens) const {
  if (!batch_chunk_) return triton::kMinChunk;
  return triton::plan_forward_chunk(seq_lens, head_blocks_, blocks_per_sm_ * sm_count_,
                                    max_splits_);
}

Status TritonBackend::init_forward_metadata(const ForwardBatch& batch) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_batch_devices(batch, stream_for(batch), ctx_.device));
  plan_ = Plan{};
  plan_.mode = batch.mode;
  if (batch.mode == ForwardMode::kIdle) {
    plan_.valid = true;
    return Status::ok();
  }
  ATTNKIT_RETURN_IF_ERROR(batch.validate());
  if (batch.req_to_token_pool == nullptr) {
    return Status::invalid_argument("triton: ForwardBatch.req_to_token_pool is null");
  }
  plan_.lengths = plan_key(batch, stream_for(batch));
  const StreamHandle stream = stream_for(batch);
  const Device dev = ctx_.device;
  const int bs = batch.batch_size;
  const bool decode = batch.mode == ForwardMode::kDecode;
  const bool verify = batch.mode == ForwardMode::kTargetVerify;
  const bool has_encoder = !batch.encoder_lens_host.empty();
  plan_.bs = bs;
  plan_.num_tokens = batch.num_tokens;

  const TensorView table = batch.req_to_token_pool->table();
  cuda::TokenIndexArgs idx;
  idx.req_to_token = table.data_as<const int32_t>();
  idx.req_to_token_stride = table.stride(0);
  idx.req_pool_indices = batch.req_pool_indices.data_as<const int32_t>();
  idx.bs = bs;

  // Self-attention keys from the pool: decode: the whole sequence; verify: the committed prefix;
  // other extends: the cached prefix. Decoder tokens follow the encoder tokens in the row.
  int64_t self_total = 0;
  const bool verify_without_extend_arrays = verify && batch.extend_prefix_lens_host.empty();
  const std::vector<int32_t>& prefix_host = (decode || verify_without_extend_arrays)
                                                ? batch.seq_lens_host
                                                : batch.extend_prefix_lens_host;
  for (int32_t n : prefix_host) self_total += n;
  ATTNKIT_RETURN_IF_ERROR(self_.indptr.reserve(dev, bs + 1));
  ATTNKIT_RETURN_IF_ERROR(self_.indices.reserve(dev, self_total));
  idx.start = has_encoder ? batch.encoder_lens.data_as<const int32_t>() : nullptr;
  idx.len = (decode || verify_without_extend_arrays)
                ? batch.seq_lens.data_as<const int32_t>()
                : batch.extend_prefix_lens.data_as<const int32_t>();
  idx.kv_indptr = self_.indptr.data();
  idx.kv_indices = self_.indices.data();
  ATTNKIT_RETURN_IF_ERROR(cuda::build_token_indices(idx, stream));
  plan_.self_indptr = self_.indptr.data();
  plan_.self_indices = self_.indices.data();

  if (has_encoder) {
    int64_t enc_total = 0;
    for (int32_t n : batch.encoder_lens_host) enc_total += n;
    ATTNKIT_RETURN_IF_ERROR(cross_.indptr.reserve(dev, bs + 1));
    ATTNKIT_RETURN_IF_ERROR(cross_.indices.reserve(dev, enc_total));
    idx.start = nullptr;
    idx.len = batch.encoder_lens.data_as<const int32_t>();
    idx.kv_indptr = cross_.indptr.data();
    idx.kv_indices = cross_.indices.data();
    ATTNKIT_RETURN_IF_ERROR(cuda::build_token_indices(idx, stream));
    plan_.cross_indptr = cross_.indptr.data();
    plan_.cross_indices = cross_.indices.data();
  }

  if (decode) {
    // Split extent from the host lengths; the kernels recompute each request's own split count.
    plan_.min_chunk = forward_chunk(batch.seq_lens_host);
    int splits = 1;
    for (int r = 0; r < bs; ++r)
      splits = std::max(splits, decode_splits(batch.seq_lens_host[r], -1, plan_.min_chunk));
    plan_.grid_splits = splits;
    if (splits > 1) {
      const int64_t rows = static_cast<int64_t>(splits) * batch.num_tokens * ctx_.num_q_heads;
      const int dv = ctx_.is_mla ? ctx_.kv_lora_rank : ctx_.v_head_dim;
      ATTNKIT_RETURN_IF_ERROR(partial_out_.reserve(dev, rows * dv));
      ATTNKIT_RETURN_IF_ERROR(partial_lse_.reserve(dev, rows));
      ATTNKIT_RETURN_IF_ERROR(cuda::reserve_zeroed_counters(
          split_counters_, dev, static_cast<int64_t>(bs) * mma_head_blocks_, stream));
      plan_.partial_out = partial_out_.data();
      plan_.partial_lse = partial_lse_.data();
      plan_.split_counters = split_counters_.data();
    }
  } else {
    // Query layout: request r's tokens are [q_start[r], q_start[r] + q_len[r]).
    q_layout_host_.assign(2 * static_cast<size_t>(bs), 0);
    int32_t start = 0;
    for (int r = 0; r < bs; ++r) {
      const int32_t n = batch.extend_seq_lens_host.empty() ? batch.spec.draft_token_num
                                                           : batch.extend_seq_lens_host[r];
      q_layout_host_[r] = start;
      q_layout_host_[bs + r] = n;
      plan_.max_q_len = std::max(plan_.max_q_len, n);
      start += n;
    }
    ATTNKIT_RETURN_IF_ERROR(q_start_.reserve(dev, 2 * static_cast<int64_t>(bs)));
    ATTNKIT_CUDA_TRY(cudaMemcpyAsync(q_start_.data(), q_layout_host_.data(),
                                     q_layout_host_.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, cuda::to_stream(stream)));
    plan_.q_start = q_start_.data();
    plan_.q_len = q_start_.data() + bs;
    ATTNKIT_RETURN_IF_ERROR(zeros_.reserve(dev, bs + 1));
    ATTNKIT_CUDA_TRY(
        cudaMemsetAsync(zeros_.data(), 0, (bs + 1) * sizeof(int32_t), cuda::to_stream(stream)));
    plan_.zero_indptr = zeros_.data();
    // The new tokens' slots, in token order, from the req_to_token columns after each request's
    // prefix (and its encoder tokens): the kernels read new keys from the pool through them.
    // out_cache_loc names the same slots, but only req_to_token is checked against the pool.
    ATTNKIT_RETURN_IF_ERROR(new_slots_.reserve(dev, std::max<int64_t>(batch.num_tokens, 1)));
    ATTNKIT_RETURN_IF_ERROR(cuda::build_new_token_slots(batch, new_slots_.data(), stream));
    plan_.new_slots = new_slots_.data();
  }
  plan_.valid = true;
  return Status::ok();
}

Status TritonBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const AttentionLayer& layer,
                                     const ForwardBatch& batch, bool save_kv,
                                     const TensorView& lse) {
  ATTNKIT_RETURN_IF_ERROR(check_entry_point("triton", /*decode_entry=*/false, batch));
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  return run(q, k, v, out, layer, batch, save_kv, lse, /*decode=*/false);
}

Status TritonBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const AttentionLayer& layer,
                                     const ForwardBatch& batch, bool save_kv,
                                     const TensorView& lse) {
  ATTNKIT_RETURN_IF_ERROR(check_entry_point("triton", /*decode_entry=*/true, batch));
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  return run(q, k, v, out, layer, batch, save_kv, lse, /*decode=*/true);
}

Status TritonBackend::run(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionLayer& layer,
                          const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                          bool decode) {
  ATTNKIT_RETURN_IF_ERROR(
      validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
  // The split-KV partials, counters and head blocks are sized from the context's heads and V
  // width and indexed with the layer's: a layer with more q heads (or, for MHA, other kv heads)
  // or a wider V than the context wrote past them.
  const int ctx_dv = ctx_.is_mla ? ctx_.kv_lora_rank : ctx_.v_head_dim;
  if (layer.num_q_heads != ctx_.num_q_heads || layer.v_head_dim > ctx_dv ||
      (!ctx_.is_mla && layer.num_kv_heads != ctx_.num_kv_heads)) {
    return Status::invalid_argument(
        "triton: layer " + std::to_string(layer.layer_id) + " (heads " +
        std::to_string(layer.num_q_heads) + "/" + std::to_string(layer.num_kv_heads) +
        ", v_head_dim " + std::to_string(layer.v_head_dim) +
        ") does not fit the backend context (heads " + std::to_string(ctx_.num_q_heads) + "/" +
        std::to_string(ctx_.num_kv_heads) + ", v_head_dim " + std::to_string(ctx_dv) +
        "): the layer's q heads (and an MHA layer's kv heads) must equal the context's, its V "
        "no wider");
  }
  // The kernels load and store q / k / v / out rows in 16-byte vectors.
  for (const auto& [t, name] :
       {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&out, "out"}}) {
    ATTNKIT_RETURN_IF_ERROR(check_vector_rows("triton", *t, name));
  }
  if (batch.mode == ForwardMode::kIdle || batch.num_tokens == 0) return Status::ok();
  ATTNKIT_RETURN_IF_ERROR(check_forward_matches_plan(
      "triton",
      PlanStamp{plan_.valid, plan_.mode, plan_.bs, plan_.num_tokens, plan_.lengths, plan_.replay},
      batch, stream_for(batch)));
  if (batch.kv_pool == nullptr)
    return Status::invalid_argument("triton: ForwardBatch.kv_pool is null");
  KVPool& pool = *batch.kv_pool;
  const StreamHandle stream = stream_for(batch);
  const bool mla_absorbed =
      layer.is_mla && layer.qk_head_dim == layer.kv_lora_rank + layer.qk_rope_head_dim;
  const bool mla_prefill = layer.is_mla && !mla_absorbed;
  const bool cross = layer.is_cross_attention;
  if (cross && plan_.cross_indptr == nullptr) {
    return Status::invalid_argument(
        "triton: layer " + std::to_string(layer.layer_id) +
        " is a cross-attention layer but the batch has no encoder_lens");
  }
  if (mla_prefill && decode) {
    return Status::unsupported("triton: MLA decode needs the absorbed head dim " +
                               std::to_string(layer.kv_lora_rank + layer.qk_rope_head_dim) +
                               ", got qk_head_dim " + std::to_string(layer.qk_head_dim));
  }
  if (layer.mla_prefix != nullptr) {
    return Status::unsupported(
        "triton: the MLA chunked prefix cache (layer.mla_prefix) is not supported by this backend "
        "(its MLA row says no; flashinfer, fa3, flashmla and cutlass_mla support it)");
  }
  if (mla_prefill && !k.defined()) {
    return Status::invalid_argument(
        "triton: MLA non-absorbed prefill reads the new tokens' k/v, which are empty");
  }
  if (cc_ < kMinComputeCapability) {
    return Status::unsupported("triton: compute capability " + std::to_string(cc_) +
                               " is below the minimum " + std::to_string(kMinComputeCapability));
  }
  // Head dims this binary has kernels for, checked before the cache write (a refused forward had
  // already stored its k / v). The launch below names the same cases.
  const bool dims_built = mla_absorbed ? layer.qk_head_dim == triton::kMlaHeadDimQK &&
                                             layer.v_head_dim == triton::kMlaHeadDimV
                          : mla_prefill ? layer.qk_head_dim == triton::kMlaPrefillHeadDimQK &&
                                              layer.v_head_dim == triton::kMlaPrefillHeadDimV
                                        : layer.qk_head_dim == layer.v_head_dim &&
                                              triton::HeadDimList::contains(layer.qk_head_dim);
  if (!dims_built) {
    return Status::unsupported("triton: head dims " + std::to_string(layer.qk_head_dim) + "/" +
                               std::to_string(layer.v_head_dim) +
                               " have no kernels in this binary (MHA: equal dims from "
                               "ATTNKIT_HEAD_DIMS; MLA: 576/512, 192/128)");
  }

  // The pool dtype, before the cache write: flashinfer routes pools of another dtype here on
  // purpose, and the kernels' own refusal came after set_kv had written k / v.
  const DType kv_dtype = pool.dtype();
  const bool quant = dtype_is_quantized(kv_dtype);
  if (!mla_prefill)
    ATTNKIT_RETURN_IF_ERROR(triton::check_kv_dtype(q.dtype, kv_dtype, mla_absorbed));
  TensorView kbuf, vbuf, kscale, vscale;
  if (pool.is_mla()) {
    const auto& mla = static_cast<const MLAKVPool&>(pool);
    kbuf = mla.kv_buffer(layer.layer_id);
    vbuf = mla.v_view(layer.layer_id);
    kscale = mla.scale_buffer(layer.layer_id);
    vscale = kscale;
  } else {
    const auto& mha = static_cast<const MHAKVPool&>(pool);
    kbuf = mha.k_buffer(layer.layer_id);
    vbuf = mha.v_buffer(layer.layer_id);
    kscale = mha.k_scale_buffer(layer.layer_id);
    vscale = mha.v_scale_buffer(layer.layer_id);
  }
  // Which MHA kernel runs, and its launch limits, also before the cache write. Extend on tensor
  // cores where the architecture, dtype and shared memory per block allow (the SIMT kernel covers
  // SM75, f32 activations and decode); decode on tensor cores except fp4 pools and
  // cross-attention.
  const bool mha = !mla_absorbed && !mla_prefill;
  const bool tensor_cores =
      mha && cc_ >= kTensorCoreComputeCapability &&
      (q.dtype == DType::kBF16 || q.dtype == DType::kF16) && (kv_dtype == q.dtype || quant) &&
      (decode || triton::mma_extend_fits(layer.qk_head_dim, kv_dtype == q.dtype, optin_smem_));
  const bool mma_decode = mha && decode && !cross && decode_tensor_cores(q.dtype) &&
                          (kv_dtype == q.dtype || dtype_is_fp8(kv_dtype));
  if (mma_decode) {
    ATTNKIT_RETURN_IF_ERROR(cuda::check_ring_decode_row_stride("triton", kv_dtype, kbuf, vbuf));
  }
  if (tensor_cores && !decode) {
    ATTNKIT_RETURN_IF_ERROR(triton::check_mma_extend_grid(plan_.bs, plan_.max_q_len,
                                                          layer.num_q_heads, layer.qk_head_dim));
  }

  // The cache write; cross-attention and MLA prefill layers never write.
  if (save_kv && k.defined() && !cross && !mla_prefill) {
    ATTNKIT_RETURN_IF_ERROR(pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v, layer.k_scale,
                                        layer.v_scale, stream));
  }

  AttentionParams p;
  detail::set_io_params(p, q, out, lse);
  detail::set_kv_pool_params(p, kbuf, vbuf);
  if (kv_dtype == DType::kFP4E2M1) {
    p.k_scales = kscale.data_as<const uint8_t>();
    p.v_scales = vscale.data_as<const uint8_t>();
    p.ks_stride_row = kscale.stride(0);
    p.ks_stride_head = kscale.stride(1);
    p.vs_stride_row = vscale.stride(0);
    p.vs_stride_head = vscale.stride(1);
  }

  p.bs = batch.batch_size;
  p.num_tokens = batch.num_tokens;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.group_size = layer.num_q_heads / layer.num_kv_heads;
  p.sliding_window = cross ? -1 : detail::kernel_sliding_window(layer.sliding_window, batch);
  p.causal = (cross || layer.type == AttentionType::kEncoderOnly) ? 0 : 1;
  p.is_decode = decode ? 1 : 0;
  p.logit_cap = layer.logit_cap;
  // fp8/fp4 store x / scale: k_scale folds into the softmax scale, v_scale into the output
  // (MLA: V is the same stored row as K, so it is dequantised with k_scale). A 192/128 MLA prefill
  // layer reads no pool rows (its keys are the unquantised inputs): no scales.
  const bool scaled = quant && !mla_prefill;
  const float k_scale = scaled ? layer.k_scale : 1.f;
  const float v_scale = scaled ? (pool.is_mla() ? layer.k_scale : layer.v_scale) : 1.f;
  p.sm_scale = layer.scaling * k_scale;
  p.v_scale = v_scale;
  if (layer.sinks.defined()) p.sinks = layer.sinks.data_as<const float>();

  p.kv_indptr = cross ? plan_.cross_indptr : plan_.self_indptr;
  p.kv_indices = cross ? plan_.cross_indices : plan_.self_indices;
  const int dqk = layer.qk_head_dim;
  const int dv = layer.v_head_dim;
  if (!decode) {
    p.q_start = plan_.q_start;
    p.q_len = plan_.q_len;
    p.has_new_keys = cross ? 0 : 1;
    if (mla_prefill) {
      // Plain MHA over the new tokens: an all-zero indptr gives every request zero pool keys.
      p.kv_indptr = plan_.zero_indptr;
      p.kv_indices = nullptr;
    }
    // New keys: the contiguous inputs when they hold exactly what the pool holds (unquantised
    // pool of the activation dtype) or when the pool is not involved (MLA prefill); else the
    // pool at out_cache_loc.
    const bool inputs_exact = k.defined() && kv_dtype == q.dtype;
    if (mla_prefill || (inputs_exact && !cross)) detail::set_new_key_params(p, k, v);
    p.new_slots = plan_.new_slots;
    // Verify: the tree mask when given (required for topk > 1); a topk-1 chain without a mask is
    // plain causal attention over the drafts.
    if (batch.mode == ForwardMode::kTargetVerify && batch.spec.custom_mask.defined()) {
      p.custom_mask = batch.spec.custom_mask.data_as<const uint8_t>();
      p.mask_indptr = batch.spec.mask_indptr.data_as<const int64_t>();
    }
  } else {
    p.max_splits = cross ? 1 : max_splits_;
    p.min_chunk = plan_.min_chunk;
    p.min_chunk_word = plan_.min_chunk_word;
    p.partial_out = plan_.partial_out;
    p.partial_lse = plan_.partial_lse;
    p.split_counters = plan_.split_counters;
    p.split_sync_fence_all = split_sync_fence_all_ ? 1 : 0;
    if (plan_.grid_splits <= 1) p.max_splits = 1;
  }

  const int grid_splits = decode ? (p.max_splits > 1 ? plan_.grid_splits : 1) : 1;
  if (mla_absorbed) {
    if (dqk != triton::kMlaHeadDimQK || dv != triton::kMlaHeadDimV) {
      return Status::unsupported("triton: MLA head dims " + std::to_string(dqk) + "/" +
                                 std::to_string(dv) + " are not compiled in (built: 576/512)");
    }
    return triton::run_simt<triton::kMlaHeadDimQK, triton::kMlaHeadDimV>(
        p, q.dtype, kv_dtype, !decode, grid_splits, stream);
  }
  if (mla_prefill) {
    if (dqk != triton::kMlaPrefillHeadDimQK || dv != triton::kMlaPrefillHeadDimV) {
      return Status::unsupported("triton: MLA prefill head dims " + std::to_string(dqk) + "/" +
                                 std::to_string(dv) + " are not compiled in (built: 192/128)");
    }
    return triton::run_simt<triton::kMlaPrefillHeadDimQK, triton::kMlaPrefillHeadDimV>(
        p, q.dtype, q.dtype, true, 1, stream);
  }
  if (dqk != dv) {
    return Status::unsupported("triton: qk_head_dim " + std::to_string(dqk) + " != v_head_dim " +
                               std::to_string(dv) +
                               " is only supported for MLA (576/512, 192/128)");
  }
  return dispatch_value<triton::HeadDimList>(dqk, "triton: head_dim", [&]<int kD>() {
    if (mma_decode) {
      // Graph replays run the grid captured for this batch size: the split extent that fills the
      // GPU at this size (the kernel loops over further splits), not max_splits_ for every
      // request. Eager launches size it to the plan's largest split count.
      const int mma_splits = plan_.min_chunk_word != nullptr
                                 ? std::min(grid_splits, graph_mma_split_extent(plan_.bs))
                                 : grid_splits;
      return triton::run_mma_decode<kD>(p, q.dtype, kv_dtype, mma_splits, ring_, stream);
    }
    if (tensor_cores && !decode)
      return triton::run_mma_extend<kD>(p, q.dtype, kv_dtype, plan_.max_q_len, stream);
    return triton::run_simt<kD, kD>(p, q.dtype, kv_dtype, !decode, grid_splits, stream);
  });
}

// ---- CUDA graphs ----

Status TritonBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx_.stream, ctx_.device, "BackendContext.stream"));
  if (max_bs < 1 || max_num_tokens < max_bs) {
    return Status::invalid_argument(
        "triton: init_cuda_graph_state(max_bs " + std::to_string(max_bs) + ", max_num_tokens " +
        std::to_string(max_num_tokens) + ") needs max_bs >= 1 and max_num_tokens >= max_bs");
  }
  if (ctx_.req_to_token_pool == nullptr) {
    return Status::invalid_argument("triton: BackendContext.req_to_token_pool is null");
  }
  const Device dev = ctx_.device;
  const int64_t max_ctx = ctx_.req_to_token_pool->max_context_len();
  ATTNKIT_RETURN_IF_ERROR(graph_self_.indptr.reserve(dev, max_bs + 1));
  ATTNKIT_RETURN_IF_ERROR(graph_self_.indices.reserve(dev, static_cast<int64_t>(max_bs) * max_ctx));
  ATTNKIT_RETURN_IF_ERROR(graph_q_start_.reserve(dev, max_bs));
  ATTNKIT_RETURN_IF_ERROR(graph_q_len_.reserve(dev, max_bs));
  ATTNKIT_RETURN_IF_ERROR(graph_new_slots_.reserve(dev, max_num_tokens));
  const int dv = ctx_.is_mla ? ctx_.kv_lora_rank : ctx_.v_head_dim;
  // Decode rows: one token per request, split extent max_splits_.
  const int64_t rows = static_cast<int64_t>(max_splits_) * max_bs * ctx_.num_q_heads;
  ATTNKIT_RETURN_IF_ERROR(graph_partial_out_.reserve(dev, rows * dv));
  ATTNKIT_RETURN_IF_ERROR(graph_partial_lse_.reserve(dev, rows));
  ATTNKIT_RETURN_IF_ERROR(cuda::reserve_zeroed_counters(
      graph_split_counters_, dev, static_cast<int64_t>(max_bs) * mma_head_blocks_, nullptr));
  ATTNKIT_RETURN_IF_ERROR(graph_min_chunk_.reserve(dev, 1));
  graph_min_chunk_host_ = triton::kMinChunk;
  ATTNKIT_CUDA_TRY(cudaMemcpy(graph_min_chunk_.data(), &graph_min_chunk_host_, sizeof(int32_t),
                              cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_TRY(cudaDeviceSynchronize());  // the counters are zero before any capture
  graph_max_bs_ = max_bs;
  graph_max_tokens_ = max_num_tokens;
  graph_draft_tokens_ = 0;
  graph_captures_.clear();  // the workspaces were reallocated: earlier graphs are invalid
  graph_ready_ = true;
  return Status::ok();
}

Status TritonBackend::graph_metadata(int bs, const TensorView& req_pool_indices,
                                     const TensorView& seq_lens, ForwardMode mode,
                                     const SpecInfo* spec, StreamHandle stream) {
  if (!graph_ready_) {
    return Status::invalid_argument("triton: init_cuda_graph_state was not called");
  }
  if (bs < 1 || bs > graph_max_bs_) {
    return Status::invalid_argument("triton: graph batch size " + std::to_string(bs) +
                                    " is outside [1, " + std::to_string(graph_max_bs_) + "]");
  }
  const bool verify = mode == ForwardMode::kTargetVerify;
  if (mode != ForwardMode::kDecode && !verify) {
    return Status::unsupported(std::string("triton: CUDA graphs cover decode and target_verify, "
                                           "not ") +
                               forward_mode_name(mode));
  }
  if (verify && (spec == nullptr || spec->draft_token_num < 1)) {
    return Status::invalid_argument("triton: target_verify graph needs spec.draft_token_num >= 1");
  }
  const TensorView table = ctx_.req_to_token_pool->table();
  cuda::TokenIndexArgs idx;
  idx.req_to_token = table.data_as<const int32_t>();
  idx.req_to_token_stride = table.stride(0);
  idx.req_pool_indices = req_pool_indices.data_as<const int32_t>();
  idx.len = seq_lens.data_as<const int32_t>();
  idx.bs = bs;
  idx.kv_indptr = graph_self_.indptr.data();
  idx.kv_indices = graph_self_.indices.data();
  ATTNKIT_RETURN_IF_ERROR(cuda::build_token_indices(idx, stream));

  plan_ = Plan{};
  plan_.mode = mode;
  plan_.bs = bs;
  plan_.self_indptr = graph_self_.indptr.data();
  plan_.self_indices = graph_self_.indices.data();
  if (verify) {
    const int n = spec->draft_token_num;
    if (static_cast<int64_t>(bs) * n > graph_max_tokens_) {
      return Status::invalid_argument("triton: verify graph needs " + std::to_string(bs * n) +
                                      " tokens, more than max_num_tokens " +
                                      std::to_string(graph_max_tokens_));
    }
    if (n != graph_draft_tokens_) {
      // The query layout of a verify batch depends only on N: uploaded once per N.
      std::vector<int32_t> layout(2 * static_cast<size_t>(graph_max_bs_));
      for (int r = 0; r < graph_max_bs_; ++r) {
        layout[r] = r * n;
        layout[graph_max_bs_ + r] = n;
      }
      ATTNKIT_CUDA_TRY(cudaMemcpyAsync(graph_q_start_.data(), layout.data(),
                                       graph_max_bs_ * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       cuda::to_stream(stream)));
      ATTNKIT_CUDA_TRY(cudaMemcpyAsync(graph_q_len_.data(), layout.data() + graph_max_bs_,
                                       graph_max_bs_ * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       cuda::to_stream(stream)));
      ATTNKIT_CUDA_TRY(cudaStreamSynchronize(cuda::to_stream(stream)));
      graph_draft_tokens_ = n;
    }
    plan_.num_tokens = bs * n;
    // The drafts' slots: req_to_token columns [seq_len, seq_len + N) of each request.
    cuda::TokenIndexArgs fresh = idx;
    fresh.start = seq_lens.data_as<const int32_t>();
    fresh.len = nullptr;
    fresh.len_value = n;
    fresh.kv_indptr = nullptr;
    fresh.kv_indices = graph_new_slots_.data();
    ATTNKIT_RETURN_IF_ERROR(cuda::build_token_indices(fresh, stream));
    plan_.new_slots = graph_new_slots_.data();
    plan_.q_start = graph_q_start_.data();
    plan_.q_len = graph_q_len_.data();
    plan_.max_q_len = n;
  } else {
    plan_.num_tokens = bs;
    plan_.grid_splits = max_splits_;
    plan_.min_chunk_word = graph_min_chunk_.data();
    plan_.partial_out = graph_partial_out_.data();
    plan_.partial_lse = graph_partial_lse_.data();
    plan_.split_counters = graph_split_counters_.data();
  }
  plan_.valid = true;
  return Status::ok();
}

Status TritonBackend::init_forward_metadata_capture_cuda_graph(
    int bs, int num_tokens, const TensorView& req_pool_indices, const TensorView& seq_lens,
    const TensorView& encoder_lens, ForwardMode mode, const SpecInfo* spec) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx_.stream, ctx_.device, "BackendContext.stream"));
  if (encoder_lens.defined()) {
    return Status::unsupported("triton: CUDA graphs with encoder lengths are not supported");
  }
  ATTNKIT_RETURN_IF_ERROR(
      check_graph_inputs("triton", bs, req_pool_indices, seq_lens, encoder_lens, ctx_.device));
  ATTNKIT_RETURN_IF_ERROR(graph_metadata(bs, req_pool_indices, seq_lens, mode, spec, ctx_.stream));
  const int queries = plan_.num_tokens / bs;  // graph_metadata's bs x queries
  if (num_tokens < plan_.num_tokens) {
    plan_.valid = false;
    return Status::invalid_argument(
        "triton: graph capture of bs " + std::to_string(bs) + " x " + std::to_string(queries) +
        " queries needs num_tokens >= " + std::to_string(plan_.num_tokens) + ", got " +
        std::to_string(num_tokens));
  }
  graph_captures_.record(mode, bs, queries);
  plan_.num_tokens = num_tokens;  // the captured forwards' token count (run checks it)
  return Status::ok();
}

Status TritonBackend::init_forward_metadata_replay_cuda_graph(
    int bs, const TensorView& req_pool_indices, const TensorView& seq_lens, int64_t seq_lens_sum,
    const TensorView& encoder_lens, ForwardMode mode, const SpecInfo* spec,
    const int32_t* seq_lens_host) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  if (encoder_lens.defined()) {
    return Status::unsupported("triton: CUDA graphs with encoder lengths are not supported");
  }
  ATTNKIT_RETURN_IF_ERROR(
      check_graph_inputs("triton", bs, req_pool_indices, seq_lens, encoder_lens, ctx_.device));
  if (!graph_ready_) {
    return Status::invalid_argument("triton: init_cuda_graph_state was not called");
  }
  const bool verify = mode == ForwardMode::kTargetVerify;
  const int queries = verify ? (spec != nullptr ? spec->draft_token_num : 0) : 1;
  ATTNKIT_RETURN_IF_ERROR(graph_captures_.check_replay("triton", mode, bs, queries).status());
  // The token-index build's int32 offsets: seq_lens_host's total is checked below where given.
  ATTNKIT_RETURN_IF_ERROR(check_graph_key_total(
      "triton", seq_lens_sum + (verify ? static_cast<int64_t>(bs) * queries : 0)));
  ATTNKIT_RETURN_IF_ERROR(check_graph_lengths("triton", bs, seq_lens_host, verify ? queries : 0,
                                              ctx_.req_to_token_pool->max_context_len()));
  ATTNKIT_RETURN_IF_ERROR(check_graph_table_slots("triton", ctx_.req_to_token_pool, ctx_.kv_pool,
                                                  bs, req_pool_indices, seq_lens_host,
                                                  verify ? queries : 0, ctx_.stream));
  ATTNKIT_RETURN_IF_ERROR(graph_metadata(bs, req_pool_indices, seq_lens, mode, spec, ctx_.stream));
  plan_.replay = true;
  if (mode != ForwardMode::kDecode) return Status::ok();
  return upload_graph_chunk(bs, seq_lens_host, ctx_.stream);
}

Status TritonBackend::upload_graph_chunk(int bs, const int32_t* seq_lens_host,
                                         StreamHandle stream) {
  if (seq_lens_host == nullptr) {
    return Status::invalid_argument(
        "triton: decode replay needs seq_lens_host (the split chunk is planned from the host "
        "lengths, as in eager runs)");
  }
  const int32_t c = forward_chunk(std::span<const int32_t>(seq_lens_host, bs));
  if (c == graph_min_chunk_host_) return Status::ok();
  // Pageable source: staged by the runtime before cudaMemcpyAsync returns.
  graph_min_chunk_host_ = c;
  ATTNKIT_CUDA_TRY(cudaMemcpyAsync(graph_min_chunk_.data(), &graph_min_chunk_host_, sizeof(int32_t),
                                   cudaMemcpyHostToDevice, cuda::to_stream(stream)));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<AttentionBackend>> create_triton_backend(const BackendContext& ctx) {
  if (!ctx.device.is_cuda()) {
    return Status::invalid_argument("triton: BackendContext.device " + ctx.device.to_string() +
                                    " is not a CUDA device");
  }
  if (ctx.num_kv_heads < 1 || ctx.num_q_heads < 1 || ctx.num_q_heads % ctx.num_kv_heads != 0) {
    return Status::invalid_argument("triton: num_q_heads " + std::to_string(ctx.num_q_heads) +
                                    " must be a positive multiple of num_kv_heads " +
                                    std::to_string(ctx.num_kv_heads));
  }
  cuda::DeviceAttributes attrs;
  ATTNKIT_RETURN_IF_ERROR(cuda::query_device_attributes(ctx.device.ordinal, &attrs));
  const int sm_count = attrs.sm_count;
  const int cc = attrs.compute_capability;
  if (cc < kMinComputeCapability) {
    return Status::unsupported("triton: compute capability " + std::to_string(cc) +
                               " is below the minimum " + std::to_string(kMinComputeCapability));
  }
  if (!ctx.is_mla && !triton::HeadDimList::contains(ctx.qk_head_dim)) {
    return Status::unsupported("triton: head_dim " + std::to_string(ctx.qk_head_dim) +
                               " is not compiled in (built: " + triton::HeadDimList::to_string() +
                               ")");
  }
  return std::unique_ptr<AttentionBackend>(
      new TritonBackend(ctx, sm_count, cc, attrs.max_smem_per_block_optin));
}

}  // namespace attnkit

#endif  // ATTNKIT_WITH_CUDA
