// Host side of the shared MLA decode kernel family (see mla_decode_engine.h).
#include "backends/mla/mla_decode_engine.h"

#ifdef ATTNKIT_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "backend/kernel_params.h"
#include "backend/plan_stamp.h"
#include "backends/mla/kernels/mla_decode.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"
#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/device_attributes.h"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::mla {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync m16n8k16 bf16, cp.async
constexpr int kWgmmaComputeCapability = 90;

// The knobs below report other values and keep their defaults (core/env_knob.h).

// ATTNKIT_MLA_WGMMA: "0" keeps 64-row tiles on the mma.sync kernel; unset, "1" or "all" lets
// them run the wgmma kernel where it can, with every page size of the family (1,
// 64, 128: each verified on an H200, page 128 by CutlassMlaKernels.Heads128Bf16BothKernels).
bool wgmma_env_on() { return env_choice("ATTNKIT_MLA_WGMMA", {"0", "1", "all"}, "1") != "0"; }

// ATTNKIT_MLA_WGMMA_BLOCKS: the wgmma kernel's variant (mla_decode_wgmma.cuh, kVariant): "0" one
// full barrier per K tile, "1" block barriers, "2" block barriers + split release (session 7),
// "3" the seesaw schedule (H200 session 9, two runs: +4-6% over 2), "6" the seesaw without the
// phantom tile of odd segments (session 10; H200 2026-11-23 15:18Z, two runs: 128 heads +4.5-6%
// over 3), "7" 6 + the next pair's S0 issued behind P1 V1L, "8" 7 + P1 in its own buffer (stage
// 1's rope block released after S1; slower with the producer's loads, sessions 11 and 21, level
// with the consumers' TMA on an H100, session 24; +4% at 128 heads x s_q 1 on an H200 and the
// auto choice for 128 heads since session 26; docs/perf/mla_notes.md); unset / "auto":
// default_wgmma_variant (mla_decode.h) per launch (-1 here).
int wgmma_variant_env() {
  const std::string v =
      env_choice("ATTNKIT_MLA_WGMMA_BLOCKS", {"auto", "0", "1", "2", "3", "6", "7", "8"}, "auto");
  return v == "auto" ? -1 : std::stoi(v);
}
// ATTNKIT_MLA_WGMMA_FP8=0: an fp8 cache's 64-row tiles stay on the mma.sync kernel; unset / 1:
// the wgmma kernel, its consumers converting the raw tiles (MlaDecodeParams::wgmma_fp8).
bool wgmma_fp8_env() { return env_flag("ATTNKIT_MLA_WGMMA_FP8", true); }
// ATTNKIT_MLA_WGMMA_DIAG=noload / noconvert: timing diagnostics, wrong results (see
// MlaDecodeParams::wgmma_diag).
int wgmma_diag_env() {
  const std::string v = env_choice("ATTNKIT_MLA_WGMMA_DIAG", {"noload", "noconvert"}, "none");
  return v == "noload" ? 1 : v == "noconvert" ? 2 : 0;
}

// ATTNKIT_MLA_MMA_PREFETCH: "0" the mma.sync kernel reads the page table at the refill (session
// 7), "1" one tile ahead for every tile size, "smem" 16-row tiles through a shared-memory ring of
// page-table entries, unset: the per-tile-size default (MlaDecodeParams::mma_prefetch).
int mma_prefetch_env() {
  const std::string v =
      env_choice("ATTNKIT_MLA_MMA_PREFETCH", {"0", "1", "smem"}, "the per-tile-size default");
  return v == "0" ? 0 : v == "1" ? 1 : v == "smem" ? 3 : 2;
}
// ATTNKIT_MLA_FP8_F16=0: fp8 cache with 16-row tiles keeps bf16 tensor-core inputs; unset / 1:
// f16 (MlaDecodeParams::mma_fp8_f16, the default since session 8).
bool fp8_f16_env() { return env_flag("ATTNKIT_MLA_FP8_F16", true); }

// ATTNKIT_MLA_COMBINE_SKIP=0: always launch the combine kernel; unset / 1: eager plans whose
// host schedule (from seq_lens_host) splits no request launch none (MlaDecodeParams::
// skip_combine; the default since session 9: H200 bf16 kv 4k -2.6 / -3.2 us per forward). The
// host schedule equals the device one only when ForwardBatch::seq_lens_host equals seq_lens, as
// the batch's contract requires (forward_batch.h).
bool combine_skip_env() { return env_flag("ATTNKIT_MLA_COMBINE_SKIP", true); }

// ATTNKIT_MLA_GRID_ORDER: "rows" the decode grid's row tiles of one plan part adjacent in launch
// order, "parts" the parts of one row tile, unset / "auto": rows for the wgmma kernel, parts for
// the mma.sync ones (MlaDecodeParams::grid_rows_fastest 1 / 0 / 2).
int grid_rows_fastest_env() {
  const std::string v = env_choice("ATTNKIT_MLA_GRID_ORDER", {"auto", "parts", "rows"}, "auto");
  return v == "rows" ? 1 : v == "parts" ? 0 : 2;
}

// ATTNKIT_MLA_K_TMA=0: the wgmma seesaw loads every K tile by cp.async; 1: whole tiles of a bf16
// cache with pages of >= 64 tokens by TMA from the producer; evict_first: the same with an L2
// evict-first policy; unset / consumer: a segment's later whole tiles by TMA from the releasing
// consumer, its first pair's from the producer (MlaDecodeParams::kv_tma_ok 0 / 1 / 2 / 3;
// session 22, 128 heads: 1 is +18-23% over 0 (H100), consumer +7-14% over 1 (H100, H200)).
int k_tma_env() {
  const std::string v =
      env_choice("ATTNKIT_MLA_K_TMA", {"0", "1", "evict_first", "consumer"}, "consumer");
  return v == "0" ? 0 : v == "1" ? 1 : v == "evict_first" ? 2 : 3;
}

// ATTNKIT_MLA_Q_TMA=0: the wgmma kernel's producer copies Q by cp.async; unset / 1: by TMA where q
// is dense ([tokens, heads, 576] contiguous) and every request's rows fill whole 64-row tiles
// (MlaDecodeParams::q_tma_ok; session 26).
bool q_tma_env() { return env_flag("ATTNKIT_MLA_Q_TMA", true); }

std::string str(int64_t v) { return std::to_string(v); }

// Query tokens per request: decode 1, verify N.
int queries_per_request(ForwardMode mode, const SpecInfo* spec) {
  return mode == ForwardMode::kTargetVerify && spec != nullptr ? spec->draft_token_num : 1;
}
// Keys beyond seq_lens: verify's drafts follow the committed prefix in the row.
int kv_len_extra(ForwardMode mode, int s_q) { return mode == ForwardMode::kTargetVerify ? s_q : 0; }

}  // namespace

Result<std::unique_ptr<MlaDecodeEngine>> MlaDecodeEngine::create(const BackendContext& ctx,
                                                                 std::string owner, int page_size,
                                                                 bool allow_fp8) {
  if (!MlaPageSizes::contains(page_size)) {
    return Status::unsupported(owner + ": MLA decode page_size " + str(page_size) +
                               " is not compiled in (built: " + MlaPageSizes::to_string() + ")");
  }
  cuda::DeviceAttributes attrs;
  ATTNKIT_RETURN_IF_ERROR(cuda::query_device_attributes(ctx.device.ordinal, &attrs));
  const int sm_count = attrs.sm_count;
  const int cc = attrs.compute_capability;
  const int smem_optin = attrs.max_smem_per_block_optin;
  if (cc < kMinComputeCapability) {
    return Status::unsupported(owner + ": the MLA decode kernels need compute capability >= " +
                               str(kMinComputeCapability) + ", device has " + str(cc));
  }
  if (smem_optin < max_smem_bytes()) {
    return Status::unsupported(owner + ": the MLA decode kernels need " + str(max_smem_bytes()) +
                               " bytes of shared memory per block, the device allows " +
                               str(smem_optin));
  }
  std::unique_ptr<MlaDecodeEngine> e(
      new MlaDecodeEngine(ctx, std::move(owner), page_size, allow_fp8, sm_count));
  e->use_wgmma_ = cc == kWgmmaComputeCapability && smem_optin >= wgmma_smem_bytes() &&
                  wgmma_env_on() && wgmma_available();
  e->wgmma_variant_ = wgmma_variant_env();
  e->wgmma_diag_ = wgmma_diag_env();
  e->wgmma_fp8_ = wgmma_fp8_env();
  e->mma_prefetch_ = mma_prefetch_env();
  e->fp8_f16_ = fp8_f16_env();
  e->combine_skip_ = combine_skip_env();
  e->grid_rows_fastest_ = grid_rows_fastest_env();
  e->k_tma_ = k_tma_env();
  e->q_tma_ = q_tma_env();
  return e;
}

std::string MlaDecodeEngine::why_not_common(ForwardMode mode, int topk, DType kv_dtype) const {
  if (!ctx_.is_mla || ctx_.kv_lora_rank != kLatentDim || ctx_.qk_rope_head_dim != kRopeDim ||
      ctx_.qk_head_dim != kRowDim || ctx_.v_head_dim != kLatentDim || ctx_.num_kv_heads != 1) {
    return "not absorbed MLA 576/512 with one latent head";
  }
  if (mode != ForwardMode::kDecode && mode != ForwardMode::kTargetVerify) {
    return std::string("mode ") + forward_mode_name(mode);
  }
  if (mode == ForwardMode::kTargetVerify && topk > 1) return "verify with topk " + str(topk);
  if (ctx_.q_dtype != DType::kBF16) return std::string("q dtype ") + dtype_name(ctx_.q_dtype);
  if (kv_dtype != DType::kBF16 && !(allow_fp8_ && kv_dtype == DType::kFP8E4M3)) {
    return std::string("KV dtype ") + dtype_name(kv_dtype);
  }
  return "";
}

std::string MlaDecodeEngine::why_not(const ForwardBatch& batch) const {
  if (batch.kv_pool == nullptr || !batch.kv_pool->is_mla()) return "no MLA pool";
  if (!batch.encoder_lens_host.empty()) return "encoder lengths";
  const std::string r = why_not_common(batch.mode, batch.spec.topk, batch.kv_pool->dtype());
  if (!r.empty()) return r;
  if (batch.mode == ForwardMode::kTargetVerify &&
      (batch.spec.draft_token_num < 1 ||
       batch.num_tokens != batch.batch_size * batch.spec.draft_token_num)) {
    return "verify batch without N tokens per request";
  }
  return "";
}

std::string MlaDecodeEngine::why_not_graph(ForwardMode mode, const SpecInfo* spec) const {
  if (ctx_.kv_pool == nullptr || !ctx_.kv_pool->is_mla()) return "no MLA pool in the context";
  return why_not_common(mode, spec != nullptr ? spec->topk : 1, ctx_.kv_pool->dtype());
}

Status MlaDecodeEngine::schedule(ForwardMode mode, int bs, int s_q, const TensorView& seq_lens,
                                 int32_t* sched, int32_t* split_indptr, StreamHandle stream) {
  MlaDecodeParams p;
  p.seq_lens = seq_lens.data_as<const int32_t>();
  p.kv_len_extra = kv_len_extra(mode, s_q);
  p.bs = bs;
  p.rows_per_req = s_q * ctx_.num_q_heads;
  p.num_parts = num_parts(sm_count_, p.rows_per_req);
  return launch_schedule(p, sched, split_indptr, stream);
}

Status MlaDecodeEngine::plan(const ForwardBatch& batch, StreamHandle stream) {
  plan_ = Plan{};
  const int bs = batch.batch_size;
  const int s_q = queries_per_request(batch.mode, &batch.spec);
  const int rows = s_q * ctx_.num_q_heads;
  const int parts = num_parts(sm_count_, rows);
  const Device dev = ctx_.device;
  ATTNKIT_RETURN_IF_ERROR(sched_.reserve(dev, static_cast<int64_t>(parts) * kSchedWords));
  ATTNKIT_RETURN_IF_ERROR(split_indptr_.reserve(dev, bs + 1));
  const int64_t partial_rows = static_cast<int64_t>(bs + parts) * rows;
  ATTNKIT_RETURN_IF_ERROR(partial_out_.reserve(dev, partial_rows * kLatentDim));
  ATTNKIT_RETURN_IF_ERROR(partial_lse_.reserve(dev, partial_rows));
  ATTNKIT_RETURN_IF_ERROR(
      schedule(batch.mode, bs, s_q, batch.seq_lens, sched_.data(), split_indptr_.data(), stream));
  plan_.valid = true;
  plan_.mode = batch.mode;
  plan_.bs = bs;
  plan_.s_q = s_q;
  plan_.num_tokens = batch.num_tokens;
  plan_.lengths = plan_key(batch, stream);
  plan_.num_parts = parts;
  plan_.sched = sched_.data();
  plan_.split_indptr = split_indptr_.data();
  plan_.partial_out = partial_out_.data();
  plan_.partial_lse = partial_lse_.data();
  if (combine_skip_ && batch.seq_lens_host.size() == static_cast<size_t>(bs)) {
    // The device schedule, computed on the host: a request with one segment is finished by the
    // decode kernel, so without any split request the combine kernel has nothing to do.
    const int extra = kv_len_extra(batch.mode, s_q);
    std::vector<int32_t> sched(static_cast<size_t>(parts) * kSchedWords);
    std::vector<int32_t> split(static_cast<size_t>(bs) + 1);
    build_schedule(
        bs, parts, schedule_min_parts(parts, rows),
        [&](int b) { return batch.seq_lens_host[static_cast<size_t>(b)] + extra; }, sched.data(),
        split.data());
    bool any_split = false;
    for (int b = 0; b < bs && !any_split; ++b) any_split = split[b + 1] - split[b] > 1;
    plan_.need_combine = any_split;
  }
  return Status::ok();
}

Status MlaDecodeEngine::init_graph(int max_bs, int max_num_tokens) {
  const Device dev = ctx_.device;
  const int max_s_q = std::max(1, ctx_.speculative_num_draft_tokens);
  int64_t partial_rows = 0;
  int max_parts = 1;
  for (int s_q : {1, max_s_q}) {
    const int rows = s_q * ctx_.num_q_heads;
    const int parts = num_parts(sm_count_, rows);
    max_parts = std::max(max_parts, parts);
    partial_rows = std::max(partial_rows, static_cast<int64_t>(max_bs + parts) * rows);
  }
  ATTNKIT_RETURN_IF_ERROR(graph_sched_.reserve(dev, static_cast<int64_t>(max_parts) * kSchedWords));
  ATTNKIT_RETURN_IF_ERROR(graph_split_indptr_.reserve(dev, max_bs + 1));
  ATTNKIT_RETURN_IF_ERROR(graph_partial_out_.reserve(dev, partial_rows * kLatentDim));
  ATTNKIT_RETURN_IF_ERROR(graph_partial_lse_.reserve(dev, partial_rows));
  graph_max_bs_ = max_bs;
  graph_max_tokens_ = max_num_tokens;
  graph_captures_.clear();  // the workspaces may have moved: earlier graphs are invalid
  graph_ready_ = true;
  return Status::ok();
}

Status MlaDecodeEngine::plan_graph(int bs, const TensorView& seq_lens, ForwardMode mode,
                                   const SpecInfo* spec, StreamHandle stream, bool capture) {
  if (!graph_ready_)
    return Status::invalid_argument(owner_ + ": init_cuda_graph_state was not called");
  if (bs < 1 || bs > graph_max_bs_) {
    return Status::invalid_argument(owner_ + ": graph batch size " + str(bs) + " is outside [1, " +
                                    str(graph_max_bs_) + "]");
  }
  const int s_q = queries_per_request(mode, spec);
  if (s_q < 1 || s_q > std::max(1, ctx_.speculative_num_draft_tokens) ||
      static_cast<int64_t>(bs) * s_q > graph_max_tokens_) {
    return Status::invalid_argument(owner_ + ": graph verify with " + str(s_q) +
                                    " draft tokens exceeds the graph state (speculative_num_draft_"
                                    "tokens " +
                                    str(ctx_.speculative_num_draft_tokens) + ", max_num_tokens " +
                                    str(graph_max_tokens_) + ")");
  }
  if (!capture) {
    ATTNKIT_RETURN_IF_ERROR(graph_captures_.check_replay(owner_, mode, bs, s_q).status());
  }
  plan_ = Plan{};
  ATTNKIT_RETURN_IF_ERROR(
      schedule(mode, bs, s_q, seq_lens, graph_sched_.data(), graph_split_indptr_.data(), stream));
  if (capture) {
    graph_captures_.record(mode, bs, s_q);
    plan_.num_tokens = bs * s_q;  // the captured forwards' tokens (run checks them)
  } else {
    plan_.replay = true;
  }
  plan_.valid = true;
  plan_.mode = mode;
  plan_.bs = bs;
  plan_.s_q = s_q;
  plan_.num_parts = num_parts(sm_count_, s_q * ctx_.num_q_heads);
  plan_.sched = graph_sched_.data();
  plan_.split_indptr = graph_split_indptr_.data();
  plan_.partial_out = graph_partial_out_.data();
  plan_.partial_lse = graph_partial_lse_.data();
  return Status::ok();
}

// A bf16 buffer of `rows` rows of >= kRowDim elements, `stride` elements apart (a pool layer, or q
// as [tokens x heads, 576]), as a 2D TMA map {kRowDim, rows}, box 64 x 64 (one 128-byte swizzle
// line per row), encoded once per buffer and kept in `cache`, which is emptied when it holds
// `max_maps` (tma_maps_ for the pool layers; q_tma_maps_, short, for the q buffers that come and
// go per forward, so that those never evict the pool's); nullptr when the driver has no encoder
// or rejects the buffer (the kernel then copies by cp.async).
const cuda::TmaDesc* MlaDecodeEngine::row_tma_map(std::vector<RowTmaMap>* cache, size_t max_maps,
                                                  const void* data, int64_t rows, int64_t stride) {
  for (const RowTmaMap& m : *cache) {
    if (m.data == data && m.rows == rows && m.stride == stride) return &m.desc;
  }
  constexpr int kBytes = 2;
  const uint64_t dims[2] = {static_cast<uint64_t>(kRowDim), static_cast<uint64_t>(rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(stride * kBytes)};
  const uint32_t box[2] = {static_cast<uint32_t>(kBlockN), static_cast<uint32_t>(kBlockN)};
  RowTmaMap m;
  if (rows <= 0 || rows > INT32_MAX ||
      !cuda::encode_tiled_map(cuda::TmaElem::kBF16, 2, data, dims, strides, box, &m.desc)) {
    return nullptr;
  }
  m.data = data;
  m.rows = rows;
  m.stride = stride;
  // Bounded: buffers reallocated at new addresses would otherwise grow the list forever (the
  // returned pointer is only read at once by the caller).
  if (cache->size() >= max_maps) cache->clear();
  cache->push_back(m);
  return &cache->back().desc;
}

Status MlaDecodeEngine::run(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionLayer& layer,
                            const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                            StreamHandle stream) {
  ATTNKIT_RETURN_IF_ERROR(check_forward_matches_plan(
      owner_,
      PlanStamp{plan_.valid, plan_.mode, plan_.bs, plan_.num_tokens, plan_.lengths, plan_.replay},
      batch, stream));
  if (!layer.is_mla || layer.qk_head_dim != kRowDim || layer.v_head_dim != kLatentDim ||
      layer.num_kv_heads != 1 || layer.num_q_heads != ctx_.num_q_heads) {
    return Status::invalid_argument(
        owner_ + ": layer " + str(layer.layer_id) +
        " is not the absorbed MLA layer of the context (qk " + str(layer.qk_head_dim) + ", v " +
        str(layer.v_head_dim) + ", heads " + str(layer.num_q_heads) + "/" +
        str(layer.num_kv_heads) + "; expected 576/512, " + str(ctx_.num_q_heads) + "/1)");
  }
  if (layer.sliding_window >= 0 || layer.logit_cap > 0.f || layer.sinks.defined()) {
    return Status::unsupported(
        owner_ + ": MLA decode supports no sliding window, soft-cap or sinks (layer " +
        str(layer.layer_id) + ")");
  }
  ATTNKIT_RETURN_IF_ERROR(check_vector_rows(owner_, q, "q"));
  ATTNKIT_RETURN_IF_ERROR(check_vector_rows(owner_, out, "out"));
  if (lse.defined() && lse.stride(1) != 1) {
    return Status::unsupported(owner_ + ": MLA decode needs lse with a unit head stride");
  }
  // The kernels read q and write out as bf16 (validate_forward_inputs also allows f16 / f32,
  // which ran as garbage with status ok).
  if (q.dtype != DType::kBF16 || out.dtype != DType::kBF16) {
    return Status::invalid_argument(owner_ + ": MLA decode needs bf16 q and out, got q " +
                                    dtype_name(q.dtype) + " and out " + dtype_name(out.dtype));
  }
  // The kernels address a token's row with the page size they were compiled for; a pool of
  // another page size read other requests' rows (page 1 takes any pool).
  if (page_size_ != 1 && batch.kv_pool->page_size() != page_size_) {
    return Status::invalid_argument(owner_ + ": the batch's KV pool has page_size " +
                                    str(batch.kv_pool->page_size()) +
                                    "; this MLA decode runs page_size " + str(page_size_));
  }
  auto& pool = static_cast<MLAKVPool&>(*batch.kv_pool);
  // fp8 stores x / k_scale: k_scale folds into the softmax scale and (V = the same row) into the
  // output. Checked before anything is written to the pool: the kernels take the row max of raw
  // scores and fold the scale into the exp2 (mla_decode_wgmma.cuh), which needs it positive and
  // finite in fp32, also times 2^kQShiftF16 on the f16 paths.
  const float k_scale = pool.dtype() == DType::kFP8E4M3 ? layer.k_scale : 1.f;
  const float scale_log2 = layer.scaling * k_scale * cuda::kLog2e;
  if (!(scale_log2 > 0.f) || !std::isfinite(scale_log2 * static_cast<float>(1 << kQShiftF16))) {
    return Status::invalid_argument(owner_ + ": layer.scaling " + std::to_string(layer.scaling) +
                                    " times the kv scale " + std::to_string(k_scale) +
                                    " gives a softmax scale outside fp32's positive finite range "
                                    "(times log2(e) * 2^8 it must stay in (0, 3.4e38))");
  }
  if (save_kv && k.defined()) {
    ATTNKIT_RETURN_IF_ERROR(pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v, layer.k_scale,
                                        layer.v_scale, stream));
  }
  const TensorView kv = pool.kv_buffer(layer.layer_id);
  const TensorView table = batch.req_to_token_pool->table();
  const DType kv_dtype = pool.dtype();
  const bool quant = kv_dtype == DType::kFP8E4M3;
  MlaDecodeParams p;
  detail::set_io_params(p, q, out, lse);
  p.kv = kv.data;
  p.kv_stride_row = kv.stride(0);
  p.req_to_token = table.data_as<const int32_t>();
  p.req_to_token_stride = table.stride(0);
  p.req_pool_indices = batch.req_pool_indices.data_as<const int32_t>();
  p.seq_lens = batch.seq_lens.data_as<const int32_t>();
  p.kv_len_extra = kv_len_extra(batch.mode, plan_.s_q);
  p.bs = batch.batch_size;
  p.s_q = plan_.s_q;
  p.num_heads = layer.num_q_heads;
  p.rows_per_req = p.s_q * p.num_heads;
  p.scale_log2 = scale_log2;
  p.v_scale = k_scale;
  p.sched = plan_.sched;
  p.split_indptr = plan_.split_indptr;
  p.partial_out = plan_.partial_out;
  p.partial_lse = plan_.partial_lse;
  p.num_parts = plan_.num_parts;
  // Whole tiles refilled by the consumers' TMA (the auto variant rule; k_tma_eligible below
  // decides the launch): a bf16 cache with pages of >= 64 tokens, the default K_TMA, no diagnostic.
  const bool consumer_tma = k_tma_ == 3 && mla_tma_tiles(page_size_, quant) && wgmma_diag_ == 0;
  p.use_wgmma =
      use_wgmma_ ? 1 + (wgmma_variant_ >= 0 ? wgmma_variant_
                                            : default_wgmma_variant(p.rows_per_req, consumer_tma))
                 : 0;
  p.grid_rows_fastest = grid_rows_fastest_;
  p.wgmma_diag = wgmma_diag_;  // noload: both kernels; noconvert: the fp8 wgmma path
  p.wgmma_fp8 = wgmma_fp8_ ? 1 : 0;
  p.mma_prefetch = mma_prefetch_;
  p.mma_fp8_f16 = fp8_f16_ ? 1 : 0;
  p.skip_combine = plan_.need_combine ? 0 : 1;
  if (k_tma_ != 0 && k_tma_eligible(p, page_size_, quant)) {
    if (const cuda::TmaDesc* m = row_tma_map(&tma_maps_, 1024, kv.data, kv.size(0), kv.stride(0))) {
      p.kv_tma = *m;
      p.kv_tma_ok = k_tma_;
    }
  }
  // The auto variant assumed the consumers' TMA; without a map (no encoder, a rejected buffer) the
  // tiles come by cp.async, where variant 8 was slower (sessions 10-11): take the rule's other
  // choice (both are seesaw variants, so k_tma_eligible is unchanged).
  if (use_wgmma_ && wgmma_variant_ < 0 && consumer_tma && p.kv_tma_ok != 3) {
    p.use_wgmma = 1 + default_wgmma_variant(p.rows_per_req, false);
  }
  // Q by TMA: q dense ([tokens x heads, 576] rows 1152 bytes apart) and no padding rows, so each
  // 64-row tile is 64 consecutive rows of one request.
  if (q_tma_ && runs_wgmma(p, page_size_, quant) && q.dtype == DType::kBF16 &&
      p.rows_per_req % 64 == 0 && q.stride(1) == kRowDim &&
      q.stride(0) == static_cast<int64_t>(p.num_heads) * kRowDim) {
    if (const cuda::TmaDesc* m =
            row_tma_map(&q_tma_maps_, 16, q.data, q.size(0) * q.size(1), kRowDim)) {
      p.q_tma = *m;
      p.q_tma_ok = 1;
    }
  }
  ATTNKIT_RETURN_IF_ERROR(run_decode(p, page_size_, kv_dtype, stream));
#if defined(ATTNKIT_MLA_TIMELINE)
  if (page_size_ == 64) mla_timeline_dump(stream);
#endif
  if (p.kv_tma_ok != 0) ++stats_.k_tma_runs;
  if (p.q_tma_ok != 0) ++stats_.q_tma_runs;
  ++stats_.runs;
  if (p.skip_combine == 0) ++stats_.combine_launches;
  if (quant && fp8_on_wgmma(p, page_size_)) ++stats_.wgmma_fp8_runs;
  if (resolved_grid_rows_fastest(p, runs_wgmma(p, page_size_, quant)) != 0) ++stats_.grid_rows_runs;
  return Status::ok();
}

}  // namespace attnkit::mla

#endif  // ATTNKIT_WITH_CUDA
