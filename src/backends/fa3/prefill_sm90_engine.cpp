// The SM90 wgmma prefill engine (see prefill_sm90_engine.h): eligibility, the per-forward tile
// plan, TMA descriptors of the layer's pool and the launch.
#include "backends/fa3/prefill_sm90_engine.h"

#ifdef ATTNKIT_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/kv_cache.h"
#include "backend/kernel_params.h"
#include "backend/small_extend.h"
#include "backends/fa3/kernels/fa3_kernels.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "core/env_knob.h"
#include "core/math_constants.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dispatch.h"
#include "cuda/common/tma_map.h"

namespace attnkit::fa3 {
namespace {

constexpr int kWgmmaComputeCapability = 90;
constexpr int kVecElems = 8;  // 16-byte rows of bf16/f16

std::string str(int64_t v) { return std::to_string(v); }

bool vec_aligned(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % (kVecElems * 2) == 0 &&
         t.stride(0) % kVecElems == 0 && t.stride(1) % kVecElems == 0;
}
// 16-byte rows of a 1-byte (e4m3) pool buffer.
bool vec_aligned_fp8(const TensorView& t) {
  constexpr int kBytes = 16;
  return reinterpret_cast<uintptr_t>(t.data) % kBytes == 0 && t.stride(0) % kBytes == 0 &&
         t.stride(1) % kBytes == 0;
}
constexpr int kFp8HeadDim = 128;
// MLA prefill: the fewest tiles of each head a round of the tile-major unit order must hold
// (else sections of one head; plan()).
constexpr int kMlaTilesPerHeadRound = 2;

// Unset: on; "0": off; "1": on (core/env_knob.h reports other values).
bool env_on(const char* name) { return env_flag(name, true); }

// Encodes buf [rows, Hkv, D] (strides in elements) as a 3D map {D, Hkv, rows}, box {64, 1, rows}
// (bf16 / f16) or {128, 1, rows} (e4m3): one 128-byte swizzle line per row and box column.
bool encode_pool_map(const TensorView& buf, DType dtype, int box_rows, TmaDesc* out) {
  const bool fp8 = dtype == DType::kFP8E4M3;
  const int elem = fp8 ? 1 : 2;
  const uint64_t dims[3] = {static_cast<uint64_t>(buf.size(2)), static_cast<uint64_t>(buf.size(1)),
                            static_cast<uint64_t>(buf.size(0))};
  const uint64_t strides[2] = {static_cast<uint64_t>(buf.stride(1) * elem),
                               static_cast<uint64_t>(buf.stride(0) * elem)};
  const uint32_t box[3] = {static_cast<uint32_t>(128 / elem), 1, static_cast<uint32_t>(box_rows)};
  return cuda::encode_tiled_map(fp8                     ? cuda::TmaElem::kU8
                                : dtype == DType::kBF16 ? cuda::TmaElem::kBF16
                                                        : cuda::TmaElem::kF16,
                                3, buf.data, dims, strides, box, out);
}

// Whether the forward mode's queries are "the last q_len keys of each request" (the kernel's
// causal convention). Target verify (tree positions) and decode are not.
bool wgmma_mode(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kDraftExtend;
}

// Timeline builds (-DATTNKIT_FA3_TIMELINE; scripts/device/fa3_timeline.sh): with the file
// ATTNKIT_FA3_TIMELINE names, each launch's unit-boundary stamps (Fa3Params::timeline) are written
// there (rewritten per launch, so a bench leaves its last one; the stream is synchronised, so no
// CUDA graphs). Other builds: nothing.
struct Timeline {
#if defined(ATTNKIT_FA3_TIMELINE)
  const char* path = std::getenv("ATTNKIT_FA3_TIMELINE");
  static size_t words(int sm_count) {
    return static_cast<size_t>(sm_count) * kTimelineRounds * kTimelineEvents;
  }
  Status begin(Fa3Params& p, int sm_count, StreamHandle stream) {
    static unsigned long long* buf = nullptr;  // one per process, sized for every SM
    if (path == nullptr) return Status::ok();
    const size_t bytes = words(sm_count) * sizeof(unsigned long long);
    if (buf == nullptr) ATTNKIT_CUDA_TRY(cudaMalloc(&buf, bytes));
    ATTNKIT_CUDA_TRY(cudaMemsetAsync(buf, 0, bytes, cuda::to_stream(stream)));
    p.timeline = buf;
    return Status::ok();
  }
  Status end(const Fa3Params& p, int sm_count, StreamHandle stream) {
    if (path == nullptr) return Status::ok();
    std::vector<unsigned long long> host(words(sm_count));
    ATTNKIT_CUDA_TRY(cudaMemcpyAsync(host.data(), p.timeline, host.size() * sizeof(host[0]),
                                     cudaMemcpyDeviceToHost, cuda::to_stream(stream)));
    ATTNKIT_CUDA_TRY(cudaStreamSynchronize(cuda::to_stream(stream)));
    FILE* f = std::fopen(path, "wb");
    if (f == nullptr)
      return Status::invalid_argument(std::string("ATTNKIT_FA3_TIMELINE: cannot write ") + path);
    const int header[4] = {sm_count, kTimelineRounds, kTimelineEvents, p.causal};
    std::fwrite(header, sizeof(header), 1, f);
    std::fwrite(host.data(), sizeof(host[0]), host.size(), f);
    std::fclose(f);
    return Status::ok();
  }
#else
  Status begin(Fa3Params&, int, StreamHandle) { return Status::ok(); }
  Status end(const Fa3Params&, int, StreamHandle) { return Status::ok(); }
#endif
};

}  // namespace

void PrefillSm90Engine::read_kernel_knobs(int d) {
  dqk_ = dv_ = d;
  pingpong_ = env_flag("ATTNKIT_FA3_PINGPONG", default_pingpong(d));
  tma_ = env_on("ATTNKIT_FA3_TMA");
  fence_tma_ = env_on("ATTNKIT_FA3_FENCE_TMA");
  overlap_ = env_flag("ATTNKIT_FA3_OVERLAP", default_overlap(d));
  zigzag_ = env_on("ATTNKIT_FA3_SCHED");
  lazy_rescale_ = env_on("ATTNKIT_FA3_LAZY_RESCALE");  // on unless "0"
  epi_wide_ = env_on("ATTNKIT_FA3_EPI_WIDE");
  uniform_wg_ = env_on("ATTNKIT_FA3_UNIFORM_WG");
  q_tma_ = env_on("ATTNKIT_FA3_Q_TMA");
  o_tma_ = env_on("ATTNKIT_FA3_O_TMA");
  unit_smem_ = env_on("ATTNKIT_FA3_UNIT_SMEM");
  fp8_half_diag_ = env_on("ATTNKIT_FA3_FP8_HALF_DIAG");
  tile_anchor_ = tile_anchor_from_env();
  diag_ = env_int_if(
      "ATTNKIT_FA3_DIAG", 0,
      [](int bits) { return bits >= 0 && (bits & ~(1 | 2 | 4 | 8 | 16 | 32)) == 0; },
      "a sum of the Fa3Params::diag bits 1, 2, 4, 8, 16, 32");
  // 0: never split the tail; n >= 2: split it into up to n pieces whenever possible (tests).
  split_forced_ = env_int_if(
      "ATTNKIT_FA3_SPLIT", -1, [](int n) { return n == 0 || (n >= 2 && n <= 1024); },
      "0 (no tail split) or a piece count 2..1024");
  // L2 sections: off by default (one section; H200 2026-11-24 04:38Z: the 32 MiB rule cost causal
  // 16k d 128 / d 256 3-7% and gained 0.5-1.2% at 32k; docs/perf/fa3_notes.md session 17);
  // "auto": choose_section_heads' rule; n: n kv heads per section.
  const char* section = std::getenv("ATTNKIT_FA3_L2_SECTION");
  section_set_ = section != nullptr;
  section_forced_ =
      section != nullptr && std::string_view(section) == "auto"
          ? -1
          : env_int_if(
                "ATTNKIT_FA3_L2_SECTION", 0, [](int n) { return n >= 0 && n <= 1024; },
                "0 (one section, the default), auto, or kv heads per L2 section");
}

std::unique_ptr<PrefillSm90Engine> PrefillSm90Engine::create(const BackendContext& ctx,
                                                             int sm_count, int cc,
                                                             std::string* why_not,
                                                             bool allow_fp8_kv) {
  std::string off;
  if (cc != kWgmmaComputeCapability) {
    off = "compute capability " + str(cc) + " (wgmma needs 90)";
  } else if (ctx.is_mla) {
    off = "MLA";
  } else if (ctx.q_dtype != DType::kBF16 && ctx.q_dtype != DType::kF16) {
    off = std::string("q dtype ") + dtype_name(ctx.q_dtype);
  } else if (ctx.qk_head_dim != ctx.v_head_dim) {
    off = "qk_head_dim " + str(ctx.qk_head_dim) + " != v_head_dim " + str(ctx.v_head_dim);
  } else if (!wgmma_head_dim_compiled(ctx.qk_head_dim)) {
    off = "head_dim " + str(ctx.qk_head_dim) + " (wgmma head dims built: " +
          head_dims_built<WgmmaHeadDims>([](int d) { return wgmma_head_dim_compiled(d); }) + ")";
  } else {
    bool available = false;
    (void)dispatch_value<WgmmaHeadDims>(ctx.qk_head_dim, "head_dim", [&]<int kD>() {
      if constexpr (wgmma_head_dim_compiled(kD)) available = prefill_sm90_available<kD>();
      return Status::ok();
    });
    if (!available) off = "no sm_90a code in this build (CMAKE_CUDA_ARCHITECTURES lacks 90a)";
  }
  if (!off.empty()) {
    if (why_not != nullptr) *why_not = off;
    return nullptr;
  }
  std::unique_ptr<PrefillSm90Engine> e(new PrefillSm90Engine(ctx, sm_count));
  e->read_kernel_knobs(ctx.qk_head_dim);
  e->kv_heads_ = ctx.num_kv_heads;
  e->extend_decode_rows_ = detail::extend_decode_rows_from_env();
  e->min_q_len_ = detail::wgmma_min_q_len_from_env();
  e->partition_on_ = detail::extend_partition_from_env();
  e->overlap_on_ = detail::partition_overlap_from_env();
  e->reserve_forced_ = detail::partition_reserve_from_env();
  const int d = ctx.qk_head_dim;
  std::string block_ns;  // the key blocks instantiated for d
  for (int n : {64, 80, 128, 192}) {
    if (block_n_supported(d, n)) block_ns += (block_ns.empty() ? "" : ", ") + std::to_string(n);
  }
  e->block_n_ = env_int_if(
      "ATTNKIT_FA3_BLOCK_N", default_block_n(d), [d](int n) { return block_n_supported(d, n); },
      block_ns + " at head dim " + std::to_string(d));
  // Three consumer warpgroups (192-row tiles) at d 64 with 128-key blocks (the default;
  // ATTNKIT_FA3_WG3=0: two). H200 10:38Z, causal 4k / 8k / 16k, bidir 8k vs the default
  // (two warpgroups, 192 keys): +9 / +16 / +16 / +25% (docs/perf/fa3_notes.md, session 9).
  // d 128 with 128-key blocks: three warpgroups (serial loop, 2 stages) per forward by
  // choose_block_m_d128 (unset), always (=1) or never (=0); tile_plan.h has the figures.
  const std::string wg3 =
      env_choice("ATTNKIT_FA3_WG3", {"0", "1"}, "d 64: on; d 128: by the forward");
  // The three-warpgroup kernels exist in the uniform variant only (ATTNKIT_FA3_UNIFORM_WG=0: two).
  if (ctx.qk_head_dim == 64 && e->block_n_ == 128 && wg3 != "0" && e->uniform_wg_) {
    e->block_m_ = 192;
  }
  if (ctx.qk_head_dim == 128 && e->block_n_ == 128 && e->uniform_wg_) {
    e->block_m_ = wg3 == "1" ? 192 : wg3 == "0" ? 128 : 0;  // 0: choose_block_m_d128
  }
  e->fp8_kv_ = allow_fp8_kv && env_on("ATTNKIT_FA3_FP8") && ctx.q_dtype == DType::kBF16 &&
               ctx.qk_head_dim == kFp8HeadDim && ctx.v_head_dim == kFp8HeadDim &&
               wgmma_head_dim_compiled(kFp8HeadDim) && prefill_sm90_fp8_available();
  if (e->fp8_kv_) e->fp8_knobs_ = fp8_knobs_from_env();
  return e;
}

std::unique_ptr<PrefillSm90Engine> PrefillSm90Engine::create_mla_prefill(const BackendContext& ctx,
                                                                         int sm_count, int cc,
                                                                         std::string* why_not) {
  std::string off;
  if (cc != kWgmmaComputeCapability) {
    off = "compute capability " + str(cc) + " (wgmma needs 90)";
  } else if (!ctx.is_mla) {
    off = "not an MLA context";
  } else if (ctx.q_dtype != DType::kBF16 && ctx.q_dtype != DType::kF16) {
    off = std::string("q dtype ") + dtype_name(ctx.q_dtype);
  } else if (!prefill_sm90_mla_available()) {
    off = "no sm_90a code for the MLA prefill kernel in this binary";
  }
  if (!off.empty()) {
    if (why_not != nullptr) *why_not = off;
    return nullptr;
  }
  std::unique_ptr<PrefillSm90Engine> e(new PrefillSm90Engine(ctx, sm_count));
  e->read_kernel_knobs(kMlaPrefillDimQK);
  e->mla_ = true;
  e->dv_ = kMlaPrefillDimV;
  e->kv_heads_ = ctx.num_q_heads;  // the non-absorbed layer: one K / V head per q head
  e->block_n_ = kMlaPrefillBlockN;
  e->block_m_ = kBlockM;
  e->split_empty_ = env_on("ATTNKIT_FA3_SPLIT_EMPTY");
  e->prefix_passes_on_ = env_on("ATTNKIT_FA3_MLA_PREFIX");
  e->prefix_skip_empty_ = env_on("ATTNKIT_FA3_MLA_PREFIX_SKIP");
  return e;
}

std::string PrefillSm90Engine::why_not(const ForwardBatch& batch) const {
  if (!wgmma_mode(batch.mode)) {
    return std::string("forward mode ") + forward_mode_name(batch.mode) +
           " (wgmma prefill: extend / mixed / draft_extend)";
  }
  if (!batch.encoder_lens_host.empty()) return "encoder / cross-attention batch";
  if (mla_) {  // the pool is not read: any dtype; mixed batches refuse non-absorbed layers
    if (batch.mode == ForwardMode::kMixed) return "mixed batch (no non-absorbed MLA layer runs)";
    return batch.kv_pool == nullptr || !batch.kv_pool->is_mla() ? "no MLA pool" : "";
  }
  if (batch.kv_pool == nullptr || batch.kv_pool->is_mla()) return "no MHA pool";
  if (batch.kv_pool->dtype() != ctx_.q_dtype &&
      !(fp8_kv_ && batch.kv_pool->dtype() == DType::kFP8E4M3)) {
    return std::string("KV dtype ") + dtype_name(batch.kv_pool->dtype()) + " (needs the q dtype " +
           dtype_name(ctx_.q_dtype) + (fp8_kv_ ? ", or fp8_e4m3" : "") + ")";
  }
  return "";
}

Status PrefillSm90Engine::plan(const ForwardBatch& batch, StreamHandle stream) {
  planned_ = false;
  planned_small_extend_ = false;
  partition_.clear();
  overlap_reserve_ = 0;
  last_run_overlapped_ = false;
  if (!why_not(batch).empty()) return Status::ok();
  const int bs = batch.batch_size;
  const int group = ctx_.num_q_heads / std::max(1, ctx_.num_kv_heads);
  planned_small_extend_ =
      !mla_ && detail::few_new_tokens_per_request(batch, group, extend_decode_rows_, min_q_len_);
  // Few new tokens per request: every layer goes to flashinfer's tiles (why_not_layer), an e4m3
  // q widened to bf16 for them (why_not_small_extend_e4m3_q); nothing is planned here (no plan
  // copy, no workspace).
  if (planned_small_extend_) return Status::ok();
  const bool fp8 = !mla_ && batch.kv_pool->dtype() == DType::kFP8E4M3;
  // A mixed forward of few-token requests beside longer ones: the former on flashinfer's decode
  // tiles (q_len 0 here), the latter here; over the q dtype's pool, or an fp8_e4m3 one on the FP8
  // kernel (fp8 is then true: why_not passed it only with fp8_kv_).
  if (!mla_ && partition_on_ && (batch.kv_pool->dtype() == ctx_.q_dtype || fp8)) {
    partition_ = detail::extend_partition(batch, group, extend_decode_rows_, min_q_len_);
  }
  // FP8: pre-transpose V once per layer (one read + write of V) instead of in every tile's
  // producer for prefill-like forwards (a few queries over a long prefix keep the in-kernel
  // transpose), speculative softmax, 192-key blocks for long requests: choose_fp8_variant.
  // A partitioned forward's FP8 plan must take a window / sinks / soft-cap (its layers cannot
  // leave for flashinfer's tiles one by one, why_not_layer): else it stays whole
  // (choose_fp8_variant_partitioned, which may clear partition_).
  fp8_variant_ = Fp8Variant{};
  if (fp8) {
    fp8_variant_ = choose_fp8_variant_partitioned(tile_requests(batch), &partition_,
                                                  ctx_.num_kv_heads, fp8_knobs_);
  }
  std::vector<TileRequest> reqs = tile_requests(batch, partition_);
  if (!partition_.empty() && overlap_on_) overlap_reserve_ = choose_overlap_reserve(batch, fp8);
  std::vector<int32_t> kv_rows;  // MLA: key k of a request is row q_start + k of the layer's k / v
  if (mla_) {                    // the new tokens attend each other
    MlaPassRequests m = mla_pass_requests(reqs, nullptr);
    reqs = std::move(m.reqs);
    kv_rows = std::move(m.kv_rows);
  }
  const int rows = fp8             ? fp8_variant_.block_m
                   : block_m_ != 0 ? block_m_
                                   : choose_block_m_d128(reqs, tile_anchor_);
  planned_block_m_ = rows;
  ATTNKIT_ASSIGN_OR_RETURN(TilePlan plan, build_tile_plan(reqs, rows, tile_anchor_, kv_rows));
  words_ = std::move(plan.words);
  ATTNKIT_RETURN_IF_ERROR(plan_words_.reserve(ctx_.device, static_cast<int64_t>(words_.size())));
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so words_ may be reused.
  ATTNKIT_CUDA_TRY(cudaMemcpyAsync(plan_words_.data(), words_.data(),
                                   words_.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   cuda::to_stream(stream)));
  plan_bs_ = bs;
  plan_tokens_ = batch.num_tokens;
  num_tiles_ = plan.num_tiles;
  planned_fp8_ = fp8;
  if (planned_fp8_) {
    if (fp8_variant_.vt_units != words_[1]) {
      return Status::internal("fa3 fp8: V^T units " + str(fp8_variant_.vt_units) +
                              " != the plan's " + str(words_[1]));
    }
    if (!fp8_variant_.not_honoured.empty() && !warned_fp8_knob_) {
      std::cerr << "attnkit fa3: " << fp8_variant_.not_honoured << "\n";
      warned_fp8_knob_ = true;
    }
    if (fp8_variant_.vt_pre) {
      ATTNKIT_RETURN_IF_ERROR(vt_ws_.reserve(ctx_.device, fp8_variant_.vt_bytes));
    }
  }
  // Tail split of the causal and the bidirectional (encoder-only) layers of this forward, with
  // the rows and key block of the kernel that runs it.
  const int keys = fp8 ? fp8_variant_.block_n : block_n_;
  int64_t max_kv_len = 0;
  for (const TileRequest& r : reqs) {
    if (r.q_len > 0) max_kv_len = std::max<int64_t>(max_kv_len, r.kv_len);
  }
  section_heads_ = section_heads_for(max_kv_len, fp8 ? 1 : 2);
  // An overlapped partition runs without it (forced 0): its merge would sit between the kernels.
  const int split_forced = overlap_reserve_ > 0 ? 0 : split_forced_;
  for (const bool causal : {true, false}) {
    TailSplit& ts = causal ? split_causal_ : split_bidir_;
    ts = choose_tail_split(words_, bs, ctx_.num_q_heads, rows, keys, causal, sm_count_, zigzag_,
                           split_forced, section_heads_);
    const int64_t floats = static_cast<int64_t>(ts.split_units) * ts.num_splits * rows * (dv_ + 1);
    if (floats > 0) ATTNKIT_RETURN_IF_ERROR(split_ws_.reserve(ctx_.device, floats));
  }
  planned_ = true;
  return Status::ok();
}

int PrefillSm90Engine::choose_overlap_reserve(const ForwardBatch& batch, bool fp8) const {
  if (reserve_forced_ >= 0) return std::min(reserve_forced_, sm_count_ - 1);
  const detail::PartitionWork w = detail::partition_work(
      partition_, batch.extend_seq_lens_host, batch.seq_lens_host, ctx_.num_q_heads,
      ctx_.num_kv_heads, dqk_, dv_, dtype_bits(batch.kv_pool->dtype()) / 8);
  return fp8 ? detail::partition_overlap_reserve_fp8(w.decode_bytes, w.wgmma_flops, sm_count_)
             : detail::partition_overlap_reserve(w.decode_bytes, w.wgmma_flops, sm_count_);
}

int PrefillSm90Engine::section_heads_for(int64_t max_kv_len, int elem_bytes) const {
  if (mla_ && !section_set_ && sm_count_ < kMlaTilesPerHeadRound * ctx_.num_q_heads) {
    // MLA prefill (one K / V head per q head): with so many heads that a round of the tile-major
    // order holds fewer than two tiles of each head, every CTA streams its own head's K / V and L2
    // reuses nothing; take the units head by head (sections of one head) instead. H200
    // 2026-11-30 01:34Z, 128 heads x 4k: 1.09-1.15 ms against 1.51 (sections of 2 / 4 / 8 / 16
    // heads: 1.18-1.22 / 1.18-1.19 / 1.74 / 1.41-1.49); 16 heads x 16k keeps one section (2.21-2.33
    // ms; one-head sections 2.91). docs/perf/fa3_notes.md "Session 67".
    return 1;
  }
  return choose_section_heads(ctx_.num_q_heads, kv_heads_, max_kv_len, dqk_, elem_bytes,
                              section_forced_);
}

// ---- the MLA chunked prefix cache's passes (mla::MlaPrefixPassKernel) ----

Status PrefillSm90Engine::plan_prefix_passes(const ForwardBatch& batch,
                                             const mla::PrefixChunkLayout& layout,
                                             StreamHandle stream) {
  passes_.planned = false;
  if (!mla_ || !prefix_passes_on_ || !why_not(batch).empty()) return Status::ok();
  const int bs = batch.batch_size;
  const std::vector<TileRequest> reqs = tile_requests(batch);
  passes_.words.clear();
  passes_.offset.clear();
  passes_.tiles.clear();
  passes_.sections.clear();
  // Pass 0: the new tokens over their own rows (the plan of plan() above); pass c + 1: chunk c,
  // request r's keys rows [indptr[r], indptr[r + 1]) of the chunk's k / v, bidirectional, without
  // the requests that have no keys in the chunk (mla_pass_requests).
  for (int pass = 0; pass <= layout.chunks; ++pass) {
    const int32_t* indptr =
        pass > 0 ? layout.indptr.data() + static_cast<size_t>(pass - 1) * (bs + 1) : nullptr;
    const MlaPassRequests m = mla_pass_requests(reqs, indptr, prefix_skip_empty_);
    ATTNKIT_ASSIGN_OR_RETURN(TilePlan plan, build_tile_plan(m.reqs, kBlockM, tile_anchor_,
                                                            m.kv_rows, /*causal=*/pass == 0));
    passes_.offset.push_back(static_cast<int64_t>(passes_.words.size()));
    passes_.tiles.push_back(plan.num_tiles);
    passes_.sections.push_back(section_heads_for(m.max_kv_len, 2));
    passes_.words.insert(passes_.words.end(), plan.words.begin(), plan.words.end());
  }
  ATTNKIT_RETURN_IF_ERROR(
      passes_.device.reserve(ctx_.device, static_cast<int64_t>(passes_.words.size())));
  ATTNKIT_CUDA_TRY(cudaMemcpyAsync(passes_.device.data(), passes_.words.data(),
                                   passes_.words.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   cuda::to_stream(stream)));
  passes_.bs = bs;
  passes_.tokens = batch.num_tokens;
  passes_.planned = true;
  return Status::ok();
}

std::string PrefillSm90Engine::why_not_prefix_passes(const TensorView& q, const TensorView& k,
                                                     const TensorView& v,
                                                     const AttentionLayer& layer,
                                                     const ForwardBatch& batch) const {
  if (!mla_) return "not the MLA prefill engine";
  if (!prefix_passes_on_) return "ATTNKIT_FA3_MLA_PREFIX=0";
  if (!passes_.planned) return "forward not planned for the wgmma prefix passes";
  if (batch.batch_size != passes_.bs || batch.num_tokens != passes_.tokens) {
    return "batch differs from the planned passes";
  }
  return why_not_mla_shape(q, k, v, layer, batch);  // (encoder-only layers too: no tail split)
}

Status PrefillSm90Engine::run_prefix_pass(int pass, const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& out,
                                          const AttentionLayer& layer, const ForwardBatch& batch,
                                          float* part_o, float* part_lse, bool merge,
                                          StreamHandle stream) {
  if (!passes_.planned || pass < 0 || pass >= static_cast<int>(passes_.tiles.size())) {
    return Status::internal("wgmma MLA prefix pass " + str(pass) + " is not planned");
  }
  if (pass > 0 && !merge && prefix_skip_empty_) {
    // The chunk passes leave the rows of requests without keys in their chunk to the running
    // partial (mla_pass_requests): without one to merge into, those rows would not be written.
    return Status::internal("wgmma MLA prefix pass " + str(pass) +
                            " (a chunk pass) needs merge: it writes only requests with keys in "
                            "its chunk");
  }
  const size_t i = static_cast<size_t>(pass);
  // (Rows per tile given: the Q TMA box follows them whether or not plan() ran.)
  Fa3Params p = base_params(q, out, TensorView{}, layer, batch, kBlockM);
  p.plan = passes_.device.data() + passes_.offset[i];
  p.num_tiles = passes_.tiles[i];
  p.section_heads = passes_.sections[i];
  p.causal = pass == 0 && layer.type != AttentionType::kEncoderOnly ? 1 : 0;
  p.split_units = 0;  // no tail split: every unit writes its rows to part_o
  p.num_splits = 1;
  p.split_o = p.split_lse = nullptr;
  p.part_o = part_o;
  p.part_lse = part_lse;
  p.part_merge = merge ? 1 : 0;
  set_mla_kv(p, k, v);
  ++prefix_passes_run_;
  if (p.num_tiles == 0) return Status::ok();
  return run_prefill_sm90_mla(p, q.dtype, sm_count_, stream);
}

// Why an e4m3 q cannot run here: only the FP8 kernel takes it.
constexpr const char* kE4m3QNeedsFp8 =
    "q dtype fp8_e4m3 (needs the FP8 kernel: an fp8_e4m3 KV pool, bf16 activations, head dim 128)";

std::string PrefillSm90Engine::why_not_layer_shape(const AttentionLayer& layer) const {
  if (layer.qk_head_dim != ctx_.qk_head_dim || layer.v_head_dim != ctx_.qk_head_dim ||
      layer.num_q_heads != ctx_.num_q_heads || layer.num_kv_heads != ctx_.num_kv_heads) {
    return "layer shape differs from the context";
  }
  return "";
}

std::string PrefillSm90Engine::why_not_e4m3_q_rows(const TensorView& q,
                                                   const TensorView& out) const {
  if (out.dtype != ctx_.q_dtype) return "out dtype (must be the context's q_dtype)";
  if (q.ndim != 3) return "fp8 q's innermost stride is not 1";
  if (!vec_aligned_fp8(q)) return "fp8 q rows not 16-byte aligned";
  if (q.stride(2) != 1) return "fp8 q's innermost stride is not 1";
  return "";
}

std::string PrefillSm90Engine::why_not_small_extend_e4m3_q(const TensorView& q,
                                                           const TensorView& out,
                                                           const AttentionLayer& layer,
                                                           const ForwardBatch& batch) const {
  if (!planned_small_extend_) return "not a forward of few new tokens per request";
  if (q.dtype != DType::kFP8E4M3) return "q is not fp8_e4m3";
  // The conditions under which the FP8 kernel took an e4m3 q (the accepted inputs stay the same).
  if (!fp8_kv_ || batch.kv_pool == nullptr || batch.kv_pool->dtype() != DType::kFP8E4M3) {
    return kE4m3QNeedsFp8;
  }
  if (layer.is_mla || layer.is_cross_attention) return "MLA / cross-attention layer";
  if (std::string why = why_not_layer_shape(layer); !why.empty()) return why;
  return why_not_e4m3_q_rows(q, out);
}

std::string PrefillSm90Engine::why_not_layer(const TensorView& q, const TensorView& out,
                                             const AttentionLayer& layer,
                                             const ForwardBatch& batch) const {
  const auto small_extend = [&] {
    return "few new tokens per request (at most " + str(min_q_len_) + ", or " +
           str(extend_decode_rows_) +
           " packed rows): flashinfer's decode / prefill tiles (backend/small_extend.h)";
  };
  if (!planned_) {
    if (!planned_small_extend_) return "forward not planned for wgmma";
    // (An e4m3 q that why_not_small_extend_e4m3_q does not let through: no FP8 kernel for it.)
    return q.dtype == DType::kFP8E4M3 ? std::string(kE4m3QNeedsFp8) : small_extend();
  }
  if (mla_) return "the MLA prefill engine runs non-absorbed MLA layers only (run_mla)";
  if (layer.is_mla || layer.is_cross_attention) return "MLA / cross-attention layer";
  if (planned_fp8_) {  // the FP8 kernel's variants take window / sinks / soft-cap on one plan
    if ((layer.sliding_window >= 0 || layer.sinks.defined() || layer.logit_cap != 0.f) &&
        !fp8_plan_takes_variants(fp8_variant_)) {
      return "sliding window / sinks / soft-cap with an fp8_e4m3 pool on an FP8 plan without them "
             "(they run on the three-warpgroup plan and the two-warpgroup one with V^T in the "
             "kernel: fp8_plan_takes_variants)";
    }
  }
  if (std::string why = why_not_layer_shape(layer); !why.empty()) return why;
  if (q.dtype == DType::kFP8E4M3) {  // e4m3 q (AttentionLayer::q_scale): the FP8 kernel only
    if (!planned_fp8_) {
      return kE4m3QNeedsFp8;
    }
    if (std::string why = why_not_e4m3_q_rows(q, out); !why.empty()) return why;
  } else if (q.dtype != ctx_.q_dtype || out.dtype != ctx_.q_dtype) {
    return "q / out dtype";
  } else if (!vec_aligned(q)) {
    return "q rows not 16-byte aligned";
  }
  if (!vec_aligned(out)) return "out rows not 16-byte aligned";
  if (batch.kv_pool == nullptr || batch.kv_pool->is_mla()) return "no MHA pool";
  if (batch.batch_size != plan_bs_) return "batch size differs from the plan";
  if (batch.num_tokens != plan_tokens_) return "num_tokens differs from the plan";
  const auto& pool = static_cast<const MHAKVPool&>(*batch.kv_pool);
  const auto aligned = planned_fp8_ ? vec_aligned_fp8 : vec_aligned;
  if (!aligned(pool.k_buffer(layer.layer_id)) || !aligned(pool.v_buffer(layer.layer_id))) {
    return "K / V pool rows not 16-byte aligned";
  }
  return "";
}

Fa3Params PrefillSm90Engine::base_params(const TensorView& q, const TensorView& out,
                                         const TensorView& lse, const AttentionLayer& layer,
                                         const ForwardBatch& batch, int block_m) {
  Fa3Params p;
  detail::set_io_params(p, q, out, lse);
  p.plan = plan_words_.data();
  p.bs = batch.batch_size;
  p.num_tiles = num_tiles_;
  p.num_q_heads = layer.num_q_heads;
  p.scale_log2 = layer.scaling * kLog2e;
  p.block_m = block_m > 0 ? block_m : planned_block_m_;
  p.causal = layer.type == AttentionType::kEncoderOnly ? 0 : 1;
  p.pingpong = pingpong_ ? 1 : 0;
  p.diag = diag_;
  p.fence_tma = fence_tma_ ? 1 : 0;
  p.sched = zigzag_ ? 1 : 0;
  p.lazy_rescale = lazy_rescale_ ? 1 : 0;
  p.uniform_wg = uniform_wg_ ? 1 : 0;
  p.epi_wide = epi_wide_ && reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0 &&
                       p.o_stride_token % 8 == 0 && p.o_stride_head % 8 == 0
                   ? 1
                   : 0;
  p.overlap = overlap_ ? 1 : 0;
  // Q by TMA (both kernels): the map covers every token of q; box rows = the tile's rows.
  p.q_tma = q_tma_ && q.stride(2) == 1 && encode_pool_map(q, q.dtype, p.block_m, &p.tma_q) ? 1 : 0;
  p.unit_smem = unit_smem_ ? 1 : 0;
  p.section_heads = section_heads_;
  // Window / soft-cap / sinks (the kernels' variant instantiations; FP8: on the plans
  // fp8_plan_takes_variants names, why_not_layer). A window moves
  // each unit's first key block (decode_tile) and the sinks join each whole row's denominator, so
  // these layers run without the tail split (planned for the forward's plain layers).
  p.sliding_window = detail::kernel_sliding_window(layer.sliding_window, batch);
  p.logit_cap = layer.logit_cap;
  if (layer.sinks.defined()) p.sinks = layer.sinks.data_as<const float>();
  const TailSplit ts = uses_variant_features(p) ? TailSplit{} : planned_tail_split(p.causal != 0);
  if (ts.split_units > 0) {
    const int64_t o_floats = static_cast<int64_t>(ts.split_units) * ts.num_splits * p.block_m * dv_;
    p.split_units = ts.split_units;
    p.num_splits = ts.num_splits;
    p.split_o = split_ws_.data();
    p.split_lse = p.split_o + o_floats;
  }
  return p;
}

Status PrefillSm90Engine::run(const TensorView& q, const TensorView& out, const TensorView& lse,
                              const AttentionLayer& layer, const ForwardBatch& batch,
                              StreamHandle stream) {
  last_run_overlapped_ = false;
  if (const std::string why = why_not_layer(q, out, layer, batch); !why.empty()) {
    return Status::invalid_argument("wgmma prefill: layer " + str(layer.layer_id) +
                                    " cannot run on it: " + why);
  }
  const auto& pool = static_cast<const MHAKVPool&>(*batch.kv_pool);
  const TensorView kbuf = pool.k_buffer(layer.layer_id);
  const TensorView vbuf = pool.v_buffer(layer.layer_id);

  const int block_n = planned_fp8_ ? planned_fp8_block_n() : block_n_;
  Fa3Params p = base_params(q, out, lse, layer, batch);
  detail::set_kv_pool_params(p, kbuf, vbuf);
  detail::set_page_table_params(p, batch);
  p.page_size = pool.page_size();
  p.group = layer.num_q_heads / layer.num_kv_heads;
  if (planned_fp8_) {
    p.scale_log2 *= layer.k_scale;
    p.v_scale = layer.v_scale;
    if (q.dtype == DType::kFP8E4M3) {
      p.q_fp8 = 1;
      p.scale_log2 *= layer.q_scale;
    }
  }
  p.fp8_gemm_sum = fp8_variant_.gemm_sum ? 1 : 0;
  p.tma_rows = tma_ ? tma_rows_for(p.page_size, block_n) : 0;
  const DType kv_dtype = pool.dtype();
  if (p.tma_rows > 0 && (kbuf.stride(2) != 1 || vbuf.stride(2) != 1 ||
                         !encode_pool_map(kbuf, kv_dtype, p.tma_rows, &p.tma_k) ||
                         !encode_pool_map(vbuf, kv_dtype, p.tma_rows, &p.tma_v))) {
    p.tma_rows = 0;  // the cp.async gather serves every block
  }
  // O by TMA stores: the FP8 kernel on three consumer warpgroups (192-row tiles) only.
  p.o_tma = o_tma_ && planned_fp8_ && p.block_m == 192 && out.dtype == DType::kBF16 &&
                    out.stride(2) == 1 && encode_pool_map(out, out.dtype, 64, &p.tma_o)
                ? 1
                : 0;
  // Timeline builds: the bf16 / f16 kernel's unit-boundary stamps, or the FP8 three-warpgroup
  // loop's per-block ones (kFp8Tl*, fa3_params.h).
  Timeline timeline;
  ATTNKIT_RETURN_IF_ERROR(timeline.begin(p, sm_count_, stream));
  // A partitioned forward with a reserve (planned_overlap_reserve): the grid leaves those SMs free
  // and releases the decode tiles' launch at its start.
  const int reserve = planned_overlap_reserve();
  const int grid_sms = sm_count_ - reserve;
  p.trigger_dependents = reserve > 0 ? 1 : 0;
  Status launched;
  if (planned_fp8_) {
    const Fp8Variant& v = fp8_variant_;
    if (v.vt_pre) {
      p.vt_pre = 1;
      p.fp8_spec = v.spec ? 1 : 0;
      p.vt_ws = vt_ws_.data();
      p.vt_head_stride = static_cast<int64_t>(v.vt_units) * kVtBlockKeys * kFp8HeadDim;
    }
    p.fp8_block_n = v.block_n;
    p.fp8_promote = v.promote ? (v.promote_late ? 2 : 1) : 0;
    p.fp8_half_diag = fp8_half_diag_ ? 1 : 0;
    launched = run_prefill_sm90_fp8(p, grid_sms, stream, v.vt_pre ? v.max_kv_len : 0);
  } else {
    launched = dispatch_value<WgmmaHeadDims>(
        ctx_.qk_head_dim, "wgmma prefill: head_dim", [&]<int kD>() -> Status {
          if constexpr (wgmma_head_dim_compiled(kD)) {
            return run_prefill_sm90<kD>(p, q.dtype, block_n_, grid_sms, stream);
          } else {
            return Status::unsupported("wgmma prefill: head_dim " + str(kD) +
                                       " is not compiled in");
          }
        });
  }
  if (!launched) return launched;
  last_run_overlapped_ = reserve > 0 && num_tiles_ > 0;
  return timeline.end(p, sm_count_, stream);
}

std::string PrefillSm90Engine::why_not_mla_shape(const TensorView& q, const TensorView& k,
                                                 const TensorView& v, const AttentionLayer& layer,
                                                 const ForwardBatch& batch) const {
  if (!layer.is_mla || layer.is_cross_attention) return "not an MLA layer";
  if (layer.qk_head_dim == layer.kv_lora_rank + layer.qk_rope_head_dim) {
    return "absorbed MLA layer (qk_head_dim = kv_lora_rank + qk_rope_head_dim)";
  }
  if (layer.qk_head_dim != dqk_ || layer.v_head_dim != dv_) {
    return "head dims " + str(layer.qk_head_dim) + "/" + str(layer.v_head_dim) +
           " (the wgmma MLA prefill runs " + str(dqk_) + "/" + str(dv_) + ")";
  }
  if (layer.num_q_heads != ctx_.num_q_heads || layer.num_kv_heads != layer.num_q_heads) {
    return "heads " + str(layer.num_q_heads) + "/" + str(layer.num_kv_heads) +
           " (needs the context's q heads " + str(ctx_.num_q_heads) + ", one kv head per q head)";
  }
  if (layer.sliding_window >= 0 || layer.logit_cap != 0.f || layer.sinks.defined()) {
    return "sliding window / soft-cap / sinks";
  }
  if (q.dtype != ctx_.q_dtype || k.dtype != ctx_.q_dtype || v.dtype != ctx_.q_dtype) {
    return "q / k / v dtype";
  }
  const auto shaped = [&](const TensorView& t, int d) {
    return t.defined() && t.ndim == 3 && t.size(0) == batch.num_tokens &&
           t.size(1) == layer.num_q_heads && t.size(2) == d && t.stride(2) == 1 && vec_aligned(t);
  };
  if (!shaped(k, dqk_) || !shaped(v, dv_)) {
    return "k / v not [num_tokens, heads, " + str(dqk_) + " / " + str(dv_) +
           "] with unit innermost stride and 16-byte rows";
  }
  if (!vec_aligned(q)) return "q rows not 16-byte aligned";
  return "";
}

std::string PrefillSm90Engine::why_not_mla_layer(const TensorView& q, const TensorView& k,
                                                 const TensorView& v, const TensorView& out,
                                                 const AttentionLayer& layer,
                                                 const ForwardBatch& batch) const {
  if (!mla_) return "not the MLA prefill engine";
  if (!planned_) return "forward not planned for wgmma";
  if (!wgmma_mode(batch.mode)) {  // (a plan of an earlier forward is never this one's)
    return std::string("forward mode ") + forward_mode_name(batch.mode);
  }
  if (const std::string why = why_not_mla_shape(q, k, v, layer, batch); !why.empty()) return why;
  if (layer.type != AttentionType::kDecoder) {
    return "not a decoder (causal) layer";  // the kernel's causal plan; nothing runs it otherwise
  }
  if (layer.mla_prefix != nullptr) return "chunked prefix cache layer (layer.mla_prefix)";
  if (out.dtype != ctx_.q_dtype) return "out dtype";
  if (batch.batch_size != plan_bs_) return "batch size differs from the plan";
  if (batch.num_tokens != plan_tokens_) return "num_tokens differs from the plan";
  if (!vec_aligned(out)) return "out rows not 16-byte aligned";
  return "";
}

Status PrefillSm90Engine::run_mla(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& lse,
                                  const AttentionLayer& layer, const ForwardBatch& batch,
                                  StreamHandle stream) {
  if (const std::string why = why_not_mla_layer(q, k, v, out, layer, batch); !why.empty()) {
    return Status::invalid_argument("wgmma MLA prefill: layer " + str(layer.layer_id) +
                                    " cannot run on it: " + why);
  }
  Fa3Params p = base_params(q, out, lse, layer, batch);
  set_mla_kv(p, k, v);
  return run_prefill_sm90_mla(p, q.dtype, sm_count_, stream);
}

void PrefillSm90Engine::set_mla_kv(Fa3Params& p, const TensorView& k, const TensorView& v) const {
  // K / V: rows of the tensors (PrefillTraits::kContigKV; a request's key 0 at its plan word
  // kv_row); one 128-row TMA box per full key block and 64 columns.
  detail::set_kv_pool_params(p, k, v);
  p.group = 1;
  p.split_empty = split_empty_ ? 1 : 0;
  p.tma_rows = tma_ && encode_pool_map(k, k.dtype, kMlaPrefillBlockN, &p.tma_k) &&
                       encode_pool_map(v, v.dtype, kMlaPrefillBlockN, &p.tma_v)
                   ? kMlaPrefillBlockN
                   : 0;
}

}  // namespace attnkit::fa3

#endif  // ATTNKIT_WITH_CUDA
