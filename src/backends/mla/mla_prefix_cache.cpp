// The MLA chunked prefix cache runner (see mla_prefix_cache.h).
#include "backends/mla/mla_prefix_cache.h"

#include <algorithm>
#include <vector>

namespace attnkit::mla {

PrefixChunkLayout plan_prefix_chunks(const std::vector<int32_t>& prefix_lens, int chunk_tokens) {
  PrefixChunkLayout l;
  const size_t bs = prefix_lens.size();
  l.capacity = std::max(1, chunk_tokens);
  std::vector<int32_t> done(bs, 0);  // prefix positions already in a chunk
  std::vector<int32_t> take(bs, 0);
  std::vector<size_t> left;  // requests with prefix left, by remainder (ascending)
  for (size_t r = 0; r < bs; ++r) {
    if (prefix_lens[r] > 0) left.push_back(r);
  }
  const auto remainder = [&](size_t r) { return prefix_lens[r] - done[r]; };
  const auto before = [&](size_t a, size_t b) { return remainder(a) < remainder(b); };
  std::stable_sort(left.begin(), left.end(), before);
  while (!left.empty()) {
    // Shares differ by at most one token, so the order of the remainders changes only between
    // near-equal ones: an insertion pass keeps it sorted in about one step per request.
    for (size_t i = 1; i < left.size(); ++i) {
      for (size_t j = i; j > 0 && before(left[j], left[j - 1]); --j)
        std::swap(left[j], left[j - 1]);
    }
    int64_t room = l.capacity;
    std::fill(take.begin(), take.end(), 0);
    for (size_t i = 0; i < left.size(); ++i) {
      const int64_t share = room / static_cast<int64_t>(left.size() - i);
      take[left[i]] = static_cast<int32_t>(std::min<int64_t>(remainder(left[i]), share));
      room -= take[left[i]];
    }
    l.indptr.push_back(0);
    for (size_t r = 0; r < bs; ++r) {
      l.indptr.push_back(l.indptr.back() + take[r]);
      l.starts.push_back(done[r]);
      done[r] += take[r];
    }
    l.tokens.push_back(l.indptr.back());
    ++l.chunks;
    std::erase_if(left, [&](size_t r) { return remainder(r) == 0; });
  }
  return l;
}

MergeStep merge_step(int acc, bool last) {
  MergeStep m;
  m.first = acc == 0 ? 0 : 1;  // (acc, 1) or (1, acc)
  m.dst = last ? -1 : (acc == 0 ? 2 : 0);
  return m;
}

}  // namespace attnkit::mla

#ifdef ATTNKIT_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "backend/kernel_params.h"
#include "backends/flashinfer/kernels/cascade_kernels.h"
#include "backends/mla/kernels/mla_prefix_gather.h"
#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/triton_kernels.h"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::mla {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

}  // namespace

std::string MlaPrefixCacheRunner::why_not(const TensorView& q, const AttentionLayer& layer,
                                          const ForwardBatch& batch) {
  if (layer.qk_head_dim != triton::kMlaPrefillHeadDimQK ||
      layer.v_head_dim != triton::kMlaPrefillHeadDimV) {
    return "head dims " + str(layer.qk_head_dim) + "/" + str(layer.v_head_dim) +
           " are not compiled in (built: " + str(triton::kMlaPrefillHeadDimQK) + "/" +
           str(triton::kMlaPrefillHeadDimV) + ")";
  }
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16) {
    return std::string("q dtype ") + dtype_name(q.dtype) + " (bf16, f16)";
  }
  if (layer.sliding_window >= 0) return "sliding window";
  if (layer.sinks.defined()) return "attention sinks";
  if (batch.kv_pool == nullptr || !batch.kv_pool->is_mla()) return "no MLA pool";
  const DType kv = batch.kv_pool->dtype();
  if (kv != DType::kBF16 && kv != DType::kF16 && !dtype_is_fp8(kv) && kv != DType::kFP4E2M1) {
    return std::string("latent pool dtype ") + dtype_name(kv) + " (bf16, f16, fp8, fp4_e2m1)";
  }
  if (static_cast<const MLAKVPool&>(*batch.kv_pool).kv_buffer(layer.layer_id).size(2) !=
      layer.kv_lora_rank + layer.qk_rope_head_dim) {
    return "pool row width differs from kv_lora_rank + qk_rope_head_dim";
  }
  return "";
}

bool MlaPrefixCacheRunner::takes(const BackendContext& ctx, const ForwardBatch& batch) {
  return ctx.is_mla && ctx.mla_prefix_chunk_tokens > 0 &&
         (batch.mode == ForwardMode::kExtend || batch.mode == ForwardMode::kMixed ||
          batch.mode == ForwardMode::kDraftExtend) &&
         batch.extend_prefix_lens_host.size() == static_cast<size_t>(batch.batch_size) &&
         batch.extend_seq_lens_host.size() == static_cast<size_t>(batch.batch_size) &&
         batch.encoder_lens_host.empty();
}

Status MlaPrefixCacheRunner::plan(const ForwardBatch& batch, StreamHandle stream) {
  planned_ = false;
  const int bs = batch.batch_size;
  const int64_t t = batch.num_tokens;
  const int h = ctx_.num_q_heads;
  const int64_t es = dtype_storage_bytes(ctx_.q_dtype, 1);
  const int width = ctx_.kv_lora_rank + ctx_.qk_rope_head_dim;
  const cudaStream_t s = cuda::to_stream(stream);

  // Chunk layout (plan_prefix_chunks) and the meta buffer:
  // [bs] q_start, [bs] q_len, [bs + 1] zeros, then [chunks][bs + 1] chunk offsets, then
  // [chunks][bs] the prefix position of each request's first chunk token.
  layout_ = plan_prefix_chunks(batch.extend_prefix_lens_host, ctx_.mla_prefix_chunk_tokens);
  // The largest chunk (every chunk but the last is full): at most the budget, less for a batch
  // with less prefix.
  const int64_t cap =
      layout_.chunks > 0 ? *std::max_element(layout_.tokens.begin(), layout_.tokens.end()) : 0;
  meta_host_.assign(static_cast<size_t>(3 * bs + 1), 0);
  int32_t start = 0;
  for (int r = 0; r < bs; ++r) {
    const int32_t n = batch.extend_seq_lens_host[static_cast<size_t>(r)];
    meta_host_[static_cast<size_t>(r)] = batch.extend_start_loc_host.empty()
                                             ? start
                                             : batch.extend_start_loc_host[static_cast<size_t>(r)];
    meta_host_[static_cast<size_t>(bs + r)] = n;
    start += n;
  }
  chunk_base_ = meta_host_.size();
  meta_host_.insert(meta_host_.end(), layout_.indptr.begin(), layout_.indptr.end());
  starts_base_ = meta_host_.size();
  meta_host_.insert(meta_host_.end(), layout_.starts.begin(), layout_.starts.end());
  ATTNKIT_RETURN_IF_ERROR(meta_.reserve(ctx_.device, static_cast<int64_t>(meta_host_.size())));
  ATTNKIT_CUDA_TRY(cudaMemcpyAsync(meta_.data(), meta_host_.data(),
                                   meta_host_.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));

  // Workspace (grow-only).
  const int64_t rows = t * h;
  ATTNKIT_RETURN_IF_ERROR(
      partial_out_.reserve(ctx_.device, 3 * rows * triton::kMlaPrefillHeadDimV));
  ATTNKIT_RETURN_IF_ERROR(partial_lse_.reserve(ctx_.device, 3 * rows));
  if (layout_.chunks > 0) {
    ATTNKIT_RETURN_IF_ERROR(latent_.reserve(ctx_.device, cap * width * es));
    ATTNKIT_RETURN_IF_ERROR(kc_.reserve(ctx_.device, cap * h * triton::kMlaPrefillHeadDimQK * es));
    ATTNKIT_RETURN_IF_ERROR(vc_.reserve(ctx_.device, cap * h * triton::kMlaPrefillHeadDimV * es));
    if (iota_filled_ < cap) {
      ATTNKIT_RETURN_IF_ERROR(iota_.reserve(ctx_.device, cap));
      iota_host_.resize(static_cast<size_t>(iota_.capacity));
      for (size_t i = 0; i < iota_host_.size(); ++i) iota_host_[i] = static_cast<int32_t>(i);
      ATTNKIT_CUDA_TRY(cudaMemcpyAsync(iota_.data(), iota_host_.data(),
                                       iota_host_.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       s));
      iota_filled_ = iota_.capacity;
    }
  }
  if (passes_ != nullptr)
    ATTNKIT_RETURN_IF_ERROR(passes_->plan_prefix_passes(batch, layout_, stream));
  planned_ = true;
  planned_bs_ = bs;
  planned_tokens_ = t;
  return Status::ok();
}

Status MlaPrefixCacheRunner::run(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const AttentionLayer& layer,
                                 const ForwardBatch& batch, const TensorView& lse,
                                 StreamHandle stream) {
  const std::string why = why_not(q, layer, batch);
  if (!why.empty()) {
    return Status::unsupported("MLA chunked prefix cache (layer.mla_prefix): " + why);
  }
  if (layer.mla_prefix->chunk_tokens != ctx_.mla_prefix_chunk_tokens) {
    return Status::invalid_argument(
        "MLA chunked prefix cache: layer " + str(layer.layer_id) +
        " has mla_prefix->chunk_tokens " + str(layer.mla_prefix->chunk_tokens) +
        " but BackendContext.mla_prefix_chunk_tokens is " + str(ctx_.mla_prefix_chunk_tokens) +
        " (init_forward_metadata plans the prefix chunks for it: set it to the layers' chunk "
        "budget)");
  }
  if (!planned_ || planned_bs_ != batch.batch_size || planned_tokens_ != batch.num_tokens) {
    return Status::invalid_argument(
        "MLA chunked prefix cache (layer.mla_prefix): no plan for this batch (batch_size " +
        str(batch.batch_size) + ", num_tokens " + str(batch.num_tokens) +
        "): init_forward_metadata plans it for extend / mixed / draft-extend batches with "
        "extend_prefix_lens_host and no encoder_lens, not for CUDA-graph captures or replays");
  }
  if (layer.num_q_heads != ctx_.num_q_heads || q.dtype != ctx_.q_dtype ||
      layer.kv_lora_rank + layer.qk_rope_head_dim != ctx_.kv_lora_rank + ctx_.qk_rope_head_dim) {
    return Status::invalid_argument(
        "MLA chunked prefix cache: layer " + str(layer.layer_id) + " (q heads " +
        str(layer.num_q_heads) + ", q dtype " + dtype_name(q.dtype) + ", latent row " +
        str(layer.kv_lora_rank + layer.qk_rope_head_dim) +
        ") differs from the backend context the workspace was planned for (q heads " +
        str(ctx_.num_q_heads) + ", q dtype " + dtype_name(ctx_.q_dtype) + ", latent row " +
        str(ctx_.kv_lora_rank + ctx_.qk_rope_head_dim) + ")");
  }
  const int bs = batch.batch_size;
  const int64_t t = batch.num_tokens;
  const int h = layer.num_q_heads;
  const int dqk = layer.qk_head_dim;
  const int dv = layer.v_head_dim;
  const int width = layer.kv_lora_rank + layer.qk_rope_head_dim;
  const DType act = q.dtype;
  const int chunks = layout_.chunks;
  const int32_t* q_start = meta_.data();
  const int32_t* q_len = meta_.data() + bs;
  const int32_t* zeros = meta_.data() + 2 * bs;
  const int64_t rows = t * h;
  const auto slot_out = [&](int i) { return partial_out_.data() + i * rows * dv; };
  const auto slot_lse = [&](int i) { return partial_lse_.data() + i * rows; };

  // Attention params shared by the new-token pass and the chunk passes.
  triton::AttentionParams base;
  base.q = q.data;
  base.q_stride_token = q.stride(0);
  base.q_stride_head = q.stride(1);
  base.bs = bs;
  base.num_tokens = static_cast<int>(t);
  base.num_q_heads = h;
  base.num_kv_heads = h;
  base.group_size = 1;
  base.is_decode = 0;
  base.logit_cap = layer.logit_cap;
  base.sm_scale = layer.scaling;  // k/v are activations (no pool scale)
  base.v_scale = 1.f;
  base.q_start = q_start;
  base.q_len = q_len;
  base.max_splits = 1;
  base.partial_single = 1;

  // The passes on the pass kernel where it takes the layer, else the SIMT kernel.
  MlaPrefixPassKernel* const fast =
      passes_ != nullptr && passes_->why_not_prefix_passes(q, k, v, layer, batch).empty() ? passes_
                                                                                          : nullptr;
  // 1. New tokens over new tokens (causal; encoder-only layers: bidirectional) -> slot 0.
  if (fast != nullptr) {
    ATTNKIT_RETURN_IF_ERROR(fast->run_prefix_pass(0, q, k, v, out, layer, batch, slot_out(0),
                                                  slot_lse(0), /*merge=*/false, stream));
  } else {
    triton::AttentionParams p = base;
    p.k_pool = k.data;
    p.v_pool = v.data;
    p.kv_indptr = zeros;
    p.kv_indices = nullptr;
    p.causal = layer.type == AttentionType::kEncoderOnly ? 0 : 1;
    p.has_new_keys = 1;
    detail::set_new_key_params(p, k, v);
    // k_new is set: the new keys come from the inputs, not from the pool (new_slots unused).
    p.partial_out = slot_out(0);
    p.partial_lse = slot_lse(0);
    ATTNKIT_RETURN_IF_ERROR(
        (triton::run_simt<triton::kMlaPrefillHeadDimQK, triton::kMlaPrefillHeadDimV>(
            p, act, act, /*extend=*/true, 1, stream)));
  }

  flashinfer::CascadeMergeParams m;
  m.tokens = static_cast<int>(t);
  m.bs = bs;
  m.num_q_heads = h;
  m.head_dim = dv;
  m.v_scale = 1.f;
  const auto merge_to_out = [&](int first_slot, int n) {
    flashinfer::CascadeMergeParams f = m;
    f.prefix_chunks = n;
    f.partial_out = slot_out(first_slot);
    f.partial_lse = slot_lse(first_slot);
    detail::set_out_params(f, out, lse);
    return flashinfer::cascade_merge(f, act, stream);
  };
  if (chunks == 0 || t == 0) return merge_to_out(0, 1);

  const auto& pool = static_cast<const MLAKVPool&>(*batch.kv_pool);
  const TensorView kv = pool.kv_buffer(layer.layer_id);
  const DType kv_dtype = pool.dtype();
  const TensorView table = batch.req_to_token_pool->table();
  const Device dev = ctx_.device;
  PrefixGatherParams g;  // the chunk-independent fields
  g.pool = kv.data;
  g.pool_stride_row = kv.stride(0);
  g.req_to_token = table.data_as<const int32_t>();
  g.req_to_token_stride = table.stride(0);
  g.req_pool_indices = batch.req_pool_indices.data_as<const int32_t>();
  g.bs = bs;
  g.width = width;
  g.k_scale = dtype_is_quantized(kv_dtype) ? layer.k_scale : 1.f;
  if (kv_dtype == DType::kFP4E2M1) {
    const TensorView scales = pool.scale_buffer(layer.layer_id);
    g.scales = scales.data_as<const uint8_t>();
    g.scale_stride_row = scales.stride(0);
  }
  int acc = 0;  // slot of the running merge: 0 or 2; chunk partials always land in slot 1
  for (int c = 0; c < chunks; ++c) {
    const int32_t* indptr = meta_.data() + chunk_base_ + static_cast<size_t>(c) * (bs + 1);
    const int n = layout_.tokens[static_cast<size_t>(c)];
    g.chunk_indptr = indptr;
    g.chunk_starts = meta_.data() + starts_base_ + static_cast<size_t>(c) * bs;
    g.tokens = n;
    g.latent = latent_.data();
    ATTNKIT_RETURN_IF_ERROR(gather_prefix_latent(g, kv_dtype, act, stream));
    const TensorView lat(latent_.data(), act, dev, {n, width});
    const TensorView kt(kc_.data(), act, dev, {n, h, dqk});
    const TensorView vt(vc_.data(), act, dev, {n, h, dv});
    ATTNKIT_RETURN_IF_ERROR(layer.mla_prefix->expand(lat, kt, vt, stream));

    if (fast != nullptr) {
      // The pass merges itself into the running partial (slot 0); out / lse after the last.
      ATTNKIT_RETURN_IF_ERROR(fast->run_prefix_pass(
          c + 1, q, kt, vt, out, layer, batch, slot_out(0), slot_lse(0), /*merge=*/true, stream));
      if (c + 1 == chunks) return merge_to_out(0, 1);
      continue;
    }
    triton::AttentionParams p = base;
    p.k_pool = kc_.data();
    p.v_pool = vc_.data();
    p.k_stride_row = static_cast<int64_t>(h) * dqk;
    p.k_stride_head = dqk;
    p.v_stride_row = static_cast<int64_t>(h) * dv;
    p.v_stride_head = dv;
    p.kv_indptr = indptr;
    p.kv_indices = iota_.data();
    p.causal = 0;
    p.has_new_keys = 0;
    p.partial_out = slot_out(1);
    p.partial_lse = slot_lse(1);
    ATTNKIT_RETURN_IF_ERROR(
        (triton::run_simt<triton::kMlaPrefillHeadDimQK, triton::kMlaPrefillHeadDimV>(
            p, act, act, /*extend=*/true, 1, stream)));

    const MergeStep step = merge_step(acc, c + 1 == chunks);
    if (step.dst < 0) return merge_to_out(step.first, 2);
    flashinfer::CascadeMergeParams f = m;
    f.prefix_chunks = 2;
    f.partial_out = slot_out(step.first);
    f.partial_lse = slot_lse(step.first);
    f.merged_partial_out = slot_out(step.dst);
    f.merged_partial_lse = slot_lse(step.dst);
    f.out = out.data;  // unused with merged_partial_out
    ATTNKIT_RETURN_IF_ERROR(flashinfer::cascade_merge(f, act, stream));
    acc = step.dst;
  }
  return Status::ok();
}

}  // namespace attnkit::mla

#endif  // ATTNKIT_WITH_CUDA
