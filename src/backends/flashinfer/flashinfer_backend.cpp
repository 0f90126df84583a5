// The `flashinfer` backend: host side. Input checks, the per-forward plan (build_work_plan on the
// host lengths, uploaded through pinned staging into a preallocated device workspace), the
// per-layer launches and the CUDA-graph trio. Kernels live in kernels/.
//
// Host protocol: init_forward_metadata plans once per forward; forward_extend / forward_decode
// fill a PagedParams and launch (no allocation, no synchronisation). For CUDA graphs the plan
// lives in a fixed workspace sized by init_cuda_graph_state; the captured grid is the workspace's
// capacity (CTAs past the plan's item count exit) and replay rewrites the plan in place from
// seq_lens_host with the same planner as eager execution, so replay and eager runs split every
// request identically and give bit-identical outputs.
#include "backends/flashinfer/flashinfer_backend.h"

#ifdef ATTNKIT_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/registry.h"
#include "backend/device_array.h"
#include "backend/graph_captures.h"
#include "backend/kernel_params.h"
#include "backend/plan_stamp.h"
#include "backend/small_extend.h"
#include "backends/fa3/prefill_sm90_engine.h"
#include "backends/flashinfer/cascade.h"
#include "backends/flashinfer/kernels/balanced_plan.h"
#include "backends/flashinfer/kernels/cascade_kernels.h"
#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "backends/flashinfer/kernels/mla_quantized_portable.h"
#include "backends/flashinfer/kernels/plan_expand.h"
#include "backends/flashinfer/kernels/work_plan.h"
#include "backends/mla/mla_decode_engine.h"
#include "backends/mla/mla_prefix_cache.h"
#include "backends/triton/kernels/simt_layout.h"
#include "backends/triton/kernels/split_plan.h"
#include "backends/triton/kernels/triton_kernels.h"
#include "backends/triton/triton_backend.h"
#include "core/device_scope.h"
#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/decode_tuning.h"
#include "cuda/common/device_attributes.h"
#include "cuda/common/dispatch.h"
#include "cuda/common/metadata_kernels.h"
#include "cuda/common/online_softmax.cuh"

namespace attnkit {
namespace {

using flashinfer::PagedParams;
using flashinfer::PlanConfig;
using flashinfer::PlanRequest;
using flashinfer::TileShape;
using flashinfer::WorkPlan;

constexpr int kMinComputeCapability = 80;

std::string str(int64_t v) { return std::to_string(v); }

// Pinned host staging for plan uploads: a ring of kSlots buffers, each with an event marking its
// last copy out, so a plan is written into a buffer only after that buffer's previous upload has
// been consumed. The stream runs an upload after the forwards enqueued before it, so with one
// buffer a host more than one forward (or graph replay) ahead of the GPU would stall in the
// refresh for a whole forward; with two it may run two ahead (SGLang's overlap scheduler runs
// one).
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging() {
    for (Slot& s : slots_) {
      if (s.event != nullptr) cudaEventDestroy(s.event);
      if (s.host != nullptr) cudaFreeHost(s.host);
    }
  }
  // Serialises plan (a WorkPlan or BalancedPlan: serialized_words() / serialize(int32_t*)) into
  // the next staging buffer and copies it to dst (device) on stream.
  template <class Plan>
  Status upload(const Plan& plan, int32_t* dst, StreamHandle stream) {
    Slot& s = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (s.event == nullptr)
      ATTNKIT_CUDA_TRY(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
    ATTNKIT_CUDA_TRY(cudaEventSynchronize(s.event));
    const int64_t n = plan.serialized_words();
    if (n > s.capacity) {
      if (s.host != nullptr) ATTNKIT_CUDA_TRY(cudaFreeHost(s.host));
      s.host = nullptr;
      s.capacity = 0;
      ATTNKIT_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&s.host),
                                      static_cast<size_t>(n) * sizeof(int32_t)));
      s.capacity = n;
    }
    plan.serialize(s.host);
    ATTNKIT_CUDA_TRY(cudaMemcpyAsync(dst, s.host, static_cast<size_t>(n) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, cuda::to_stream(stream)));
    ATTNKIT_CUDA_TRY(cudaEventRecord(s.event, cuda::to_stream(stream)));
    return Status::ok();
  }

 private:
  static constexpr int kSlots = 2;
  struct Slot {
    int32_t* host = nullptr;
    int64_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  Slot slots_[kSlots];
  int next_ = 0;
};

// Everything a forward's layers share.
struct Plan {
  bool valid = false;
  bool portable = false;       // this forward runs on the portable SIMT path (the triton backend)
  bool mla_quantized = false;  // MLA over an fp4 / fp8_e4m3 pool (run_mla_quantized_portable)
  bool mla_native = false;     // this forward runs on the shared tensor-core MLA decode kernels
  ForwardMode mode = ForwardMode::kIdle;
  int bs = 0;
  // The planned batch's num_tokens (a graph plan: the capture's), its q / out rows: a forward of
  // another count is refused, as the plan's query offsets would index past them; -1 where the
  // path it delegates to checks (portable, MLA engine).
  int num_tokens = -1;
  std::optional<PlanKey> lengths;  // eager plans: plan_key (plan_stamp.h)
  bool replay = false;             // a CUDA-graph replay plan (no forward runs on it)
  TileShape shape = TileShape::kDecode;
  int grid_items = 0;  // CTAs per kv head launched (balanced plan: CTAs)
  // > 0: the decode plan is a balanced-kernel plan of this many slots (the default,
  // ATTNKIT_FLASHINFER_DECODE_BALANCE=auto or =1; balanced_plan.h; PagedParams::balance_slots).
  int balance_slots = 0;
  // With balance_slots > 0: the plan is the cut one; false: the default plan in the balanced
  // format (balanced_from_work_plan, chosen by choose_auto_plan).
  bool balance_cut = false;
  bool split = false;       // some request is split (stats)
  bool split_long = false;  // the split-long rule cut some request (stats)
  // Target verify on decode tiles (PagedParams::decode_verify / decode_q_tiles), or an extend
  // with few new tokens per request on them (extend_decode; backend/small_extend.h).
  bool verify_decode = false;
  bool extend_decode = false;
  // extend_decode for the few-token requests of a partitioned mixed forward only (the SM90 wgmma
  // kernel runs the others; backend/small_extend.h extend_partition): the plan gives them q_len 0.
  bool partition = false;
  int decode_q_tiles = 0;
  int decode_tile_rows = flashinfer::kDecodeTileRows;
  // Captured for CUDA-graph replay: the launch (PDL attribute included) is fixed at capture while
  // each replay's plan may or may not split.
  bool graph = false;
  const int32_t* words = nullptr;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int32_t* split_counters = nullptr;  // decode: [bs * q_tiles * Hkv] zeros (fused merge)
};

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

// FlashInferBackend::verify_decode_tiles' default bound on a request's packed (draft, q head) rows.
inline constexpr int kVerifyDecodeRows = 32;

int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

class FlashInferBackend final : public AttentionBackend {
 public:
  FlashInferBackend(const BackendContext& ctx, std::string name, int sm_count, int cc,
                    std::unique_ptr<AttentionBackend> portable, std::string portable_reason,
                    std::unique_ptr<mla::MlaDecodeEngine> mla_engine,
                    std::unique_ptr<fa3::PrefillSm90Engine> sm90_prefill,
                    std::unique_ptr<fa3::PrefillSm90Engine> sm90_mla_prefill,
                    mla::MlaPrefixPassKernel* mla_prefix_passes)
      : ctx_(ctx),
        sm90_mla_prefill_(std::move(sm90_mla_prefill)),
        name_(std::move(name)),
        head_dim_what_(name_ + ": head_dim"),
        sm_count_(sm_count),
        cc_(cc),
        portable_(std::move(portable)),
        ctx_portable_reason_(std::move(portable_reason)),
        mla_engine_(std::move(mla_engine)),
        prefix_cache_(ctx,
                      mla_prefix_passes != nullptr ? mla_prefix_passes : sm90_mla_prefill_.get()),
        sm90_prefill_(std::move(sm90_prefill)),
        pdl_split_(env_flag("ATTNKIT_FLASHINFER_PDL_SPLIT", true)),
        pdl_graph_(env_flag("ATTNKIT_FLASHINFER_PDL_GRAPH", true)),
        pdl_early_(env_choice("ATTNKIT_FLASHINFER_PDL_TRIGGER", {"early", "end"}, "early") !=
                   "end"),
        balance_(balance_from_env()),
        split_long_(env_flag("ATTNKIT_FLASHINFER_SPLIT_LONG", false)),
        verify_decode_rows_(
            env_int_range("ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS", kVerifyDecodeRows, 0, 1 << 20)),
        extend_decode_rows_(detail::extend_decode_rows_from_env()),
        verify_ctas_per_sm_(env_int_range("ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM", 0, 0, 2)),
        verify_tile_rows_(env_int("ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS", 32, {16, 32})),
        device_plan_(env_int_range("ATTNKIT_FLASHINFER_DEVICE_PLAN", 1, 0, 2)) {}

  std::optional<Device> device() const override { return ctx_.device; }
  const BackendDescriptor& descriptor() const override {
    return *builtin_registry().find("flashinfer");
  }

  Status init_forward_metadata(const ForwardBatch& batch) override;
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(check_entry_point(name_, /*decode_entry=*/false, batch));
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    return run(q, k, v, out, layer, batch, save_kv, lse, /*decode=*/false);
  }
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(check_entry_point(name_, /*decode_entry=*/true, batch));
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    return run(q, k, v, out, layer, batch, save_kv, lse, /*decode=*/true);
  }

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

  const FlashInferStats& stats() const { return stats_; }
  FlashInferCascadeOptions cascade_options;
  void set_wgmma_partner(const fa3::PrefillSm90Engine* partner) { wgmma_partner_ = partner; }

  // MLA absorbed over an fp4_e2m1 or fp8_e4m3 pool that the tensor-core MLA engine does not take
  // (fp4; fp8 extend / prefill for `flashmla` and `cutlass_mla`, whose engines decode fp8
  // natively): the portable SIMT kernel's quantised instantiations, planned here as the triton
  // backend plans MLA (token indices, query layout, split extent).
  bool mla_quantized_context(const ForwardBatch& batch) const {
    if (!ctx_.is_mla || batch.kv_pool == nullptr) return false;
    const DType kv = batch.kv_pool->dtype();
    return (kv == DType::kFP4E2M1 || kv == DType::kFP8E4M3) &&
           ctx_.qk_head_dim == ctx_.kv_lora_rank + ctx_.qk_rope_head_dim;
  }

 private:
  StreamHandle stream_for(const ForwardBatch& batch) const {
    return batch.stream != nullptr ? batch.stream : ctx_.stream;
  }
  // The single answer to "tensor cores or the portable path" for this forward: "" = tensor cores.
  std::string portable_reason(const ForwardBatch& batch) const;
  // Split counters of one decode request or decode-tile verify request (verify: its N drafts in
  // tiles of verify_tile_rows(N) rows): one per (q tile, kv head).
  int64_t verify_q_tiles(int draft_tokens) const {
    const int group = ctx_.num_q_heads / std::max(1, ctx_.num_kv_heads);
    const int rows = verify_tile_rows(draft_tokens);
    return (static_cast<int64_t>(draft_tokens) * group + rows - 1) / rows;
  }
  int64_t decode_counters_per_request(bool verify = false, int draft_tokens = 1) const {
    const int64_t q_tiles = verify ? verify_q_tiles(draft_tokens) : decode_q_tiles();
    return q_tiles * std::max(1, ctx_.num_kv_heads);
  }
  // Rows of a decode-tile verify item: 32 (the two-M-tile CTA, RingVerify32Traits) where a
  // request has more than 16 rows at head dims <= 128 over the context's 16-bit pool, else 16;
  // ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS=16 (an A/B knob) keeps 16. H200 03:19Z (docs/PERF.md
  // session 60), b16 kv 4k s_q 8 topk 4: bf16 0.1068-0.1077 ms on 32-row tiles vs 0.1129 on
  // 16-row ones; over fp8 the 32-row CTA (255 registers) took 0.147 vs 0.0687 ms, so fp8 pools
  // (and a context without a pool, whose dtype the graph workspace cannot know) keep 16 rows. The
  // context's pool decides for eager forwards and graphs alike (the same plans); a batch pool of
  // another dtype still runs (every tile shape is built for every pool dtype).
  int verify_tile_rows(int draft_tokens) const {
    const int group = ctx_.num_q_heads / std::max(1, ctx_.num_kv_heads);
    const bool wide = static_cast<int64_t>(draft_tokens) * group > flashinfer::kDecodeTileRows;
    const bool pool_16bit = ctx_.kv_pool != nullptr && !dtype_is_fp8(ctx_.kv_pool->dtype());
    return wide && pool_16bit && ctx_.qk_head_dim <= 128 && verify_tile_rows_ == 32
               ? 2 * flashinfer::kDecodeTileRows
               : flashinfer::kDecodeTileRows;
  }
  // Target verify of N drafts per request on decode tiles (paged_decode_ring_kernel's kVerify:
  // the decode's warps-along-keys shape, <= 16 (draft, q head) rows per CTA, the drafts' mask over
  // the last keys) or on prefill tiles (128 rows per CTA, one warp of MMAs per 32 rows). A verify
  // reads the bytes of the decode of its shape; on decode tiles each q tile of a request streams
  // them again (from L2 when its tiles run together), so past a few tiles the prefill tile's one
  // pass wins (H200 measurements: docs/PERF.md session 60). The same answer for eager forwards,
  // graph sizing, capture and replay.
  bool verify_decode_tiles(int draft_tokens) const {
    const int group = ctx_.num_q_heads / std::max(1, ctx_.num_kv_heads);
    return draft_tokens >= 1 && static_cast<int64_t>(draft_tokens) * group <= verify_decode_rows_;
  }
  // plan_'s decode-tile verify fields (PagedParams::decode_verify / decode_q_tiles /
  // decode_tile_rows) for N drafts, eager and captured alike.
  void plan_verify_on_decode_tiles(int draft_tokens) {
    plan_.verify_decode = true;
    plan_.decode_q_tiles = static_cast<int>(verify_q_tiles(draft_tokens));
    plan_.decode_tile_rows = verify_tile_rows(draft_tokens);
  }

  // The decode-tile verify plan's CTAs per SM for its tile rows (verify_tile_rows): 2 on 32-row
  // tiles, 1 on 16-row ones (the decode's own target); ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM=1|2
  // (an A/B knob) fixes it. H200 2026-11-29 06:37Z (docs/PERF.md session 61, --launches 10, two
  // alternated rounds), b16 kv 4k s_q 8 topk 4 (32-row tiles: 128 unsplit CTAs, one per SM, each
  // two M tiles deep) p1 / p16 / p64: 0.1058-0.1079 ms at 1, 0.0978-0.0985 at 2 (+9%; 2-way
  // splits, both CTAs of an SM streaming); b1 kv 32k s_q 8 topk 4 0.0710-0.0713 vs
  // 0.0696-0.0700; s_q 4 (16-row tiles, 128 CTAs of one M tile) 0.0760-0.0767 at 1, 0.0830-0.0833
  // at 2 (its split's merge costs more than the second CTA gives); fp8 pools (16-row tiles) level
  // to 1% slower at 2. SM90 only, where two
  // 32-row CTAs (113 KB each) are resident per SM: an A100's 164 KB per SM holds one and sm_86 /
  // sm_89 run the compact CTA, one per SM, so a second CTA per SM would be a second wave there.
  int verify_ctas_per_sm(int tile_rows) const {
    if (verify_ctas_per_sm_ != 0) return verify_ctas_per_sm_;
    return tile_rows == 2 * flashinfer::kDecodeTileRows && cc_ / 10 == 9 ? 2 : 1;
  }
  // Target-verify plans on prefill tiles, eager and graph replays: split like a decode (a verify
  // has a few drafts per request over a long cached prefix, so its unsplit grid is one CTA per
  // request and kv head: 8 CTAs at bs 1 on a 132-SM H200, 4.5 ms at kv 32k), towards two CTAs per
  // SM (two prefill CTAs fit at d <= 128; with few packed rows one warp of each does the MMAs).
  // The partials are merged by cascade_merge after the kernel (run). A graph's grid is the bound
  // verify_items, so at a small bs most of its CTAs exit at once when the replay does not split.
  // On decode tiles (verify_decode_tiles) the decode's config at verify_ctas_per_sm CTAs per SM
  // (two resident) for the tile rows of N drafts.
  // The split-long rule stays off for verify (its graph bound, verify_items, assumes the chunk
  // rule). decode_tiles: the forward's choice (verify_decode_tiles, default).
  PlanConfig verify_plan_config(int draft_tokens) const {
    return verify_plan_config(draft_tokens, verify_decode_tiles(draft_tokens));
  }
  PlanConfig verify_plan_config(int draft_tokens, bool decode_tiles) const {
    if (decode_tiles) {
      PlanConfig c = plan_config(TileShape::kDecode, true);
      c.tile_rows = verify_tile_rows(draft_tokens);
      c.target_ctas *= verify_ctas_per_sm(c.tile_rows);
      c.split_long = false;
      return c;
    }
    PlanConfig c = plan_config(TileShape::kPrefill, true);
    c.target_ctas *= 2;
    return c;
  }

  PlanConfig plan_config(TileShape shape, bool allow_split) const {
    PlanConfig c;
    c.shape = shape;
    c.num_kv_heads = ctx_.num_kv_heads;
    c.group = ctx_.num_q_heads / ctx_.num_kv_heads;
    c.target_ctas = cuda::decode_blocks_per_sm(flashinfer::kTargetCtasPerSm) * sm_count_;
    c.allow_split = allow_split;
    // Experiment knob (work_plan.h PlanConfig::split_ctas).
    static const int split_ctas = env_int_range("ATTNKIT_FLASHINFER_SPLIT_CTAS", 0, 1, 4096);
    c.split_ctas = split_ctas;
    // split_long_ (work_plan.h PlanConfig::split_long). Eager plans and graph replays both plan
    // through here, and init_cuda_graph_state sizes the workspace from the same config
    // (max_decode_items), so both see the same plan.
    c.split_long = split_long_;
    return c;
  }
  // Balanced decode plans (balance_): one chunk per slot of the balanced kernel's grid
  // (balanced_kernel_slots: the default plan's CTA bound for bs requests), cuts on multiples of 16
  // keys (one ring sub-tile; a page-size granule would leave chunks of a 64-key page up to 1.6%
  // apart at b16 kv 4k).
  flashinfer::BalanceConfig balance_config(int bs) const {
    flashinfer::BalanceConfig c;
    c.num_kv_heads = ctx_.num_kv_heads;
    c.group = ctx_.num_q_heads / ctx_.num_kv_heads;
    c.slots = flashinfer::balanced_kernel_slots(bs, plan_config(TileShape::kDecode, true));
    c.granule = flashinfer::kDecodeRingKeys;
    return c;
  }
  // Decode q tiles per request (the group's packed rows in kDecodeTileRows-row tiles).
  int decode_q_tiles() const {
    const int group = ctx_.num_q_heads / ctx_.num_kv_heads;
    return (group + flashinfer::kDecodeTileRows - 1) / flashinfer::kDecodeTileRows;
  }
  // Partial entries the balanced kernel writes for a plan of `partial_rows` rows (each
  // balanced_partial_width entries wide).
  int64_t balanced_partial_entries(int64_t partial_rows) const {
    return partial_rows * flashinfer::balanced_partial_width(ctx_.num_q_heads / ctx_.num_kv_heads);
  }
  // Decode plans on the balanced kernel: with kAlways the balanced (cut) plan; with kAuto the
  // cut plan where choose_auto_plan picks it (an uneven batch, or a default plan that leaves slots
  // of the grid empty), else the default plan in the balanced format (balanced_from_work_plan). A
  // plan depends on the requests only (the slots on their count), so eager forwards and graph
  // replays of one batch run the same kernel and the same plan. *cut: the cut plan was chosen.
  // The plan lands in balanced_plan_ (work_plan_ holds the default plan it may encode): both
  // keep their storage, so a CUDA-graph replay's refresh allocates nothing on the host.
  Status balanced_kernel_plan(std::span<const PlanRequest> reqs, bool* cut, bool* split_long) {
    ATTNKIT_RETURN_IF_ERROR(choose_balanced_plan(reqs, cut, split_long));
    return build_chosen_balanced_plan(reqs, *cut);
  }
  // Its two steps. The choice: with kAuto the default plan is built into work_plan_ and
  // choose_auto_plan decides (*cut); kAlways cuts. *padded: work_plan_ has padding items.
  Status choose_balanced_plan(std::span<const PlanRequest> reqs, bool* cut, bool* split_long,
                              bool* padded = nullptr) {
    *cut = true;
    *split_long = false;
    if (padded != nullptr) *padded = false;
    if (balance_ != Balance::kAuto) return Status::ok();
    const PlanConfig pc = plan_config(TileShape::kDecode, true);
    ATTNKIT_RETURN_IF_ERROR(flashinfer::build_work_plan(reqs, pc, &work_plan_));
    const WorkPlan& wp = work_plan_;
    const flashinfer::AutoPlanChoice choice = flashinfer::choose_auto_plan(
        wp, ctx_.num_kv_heads, pc.target_ctas, balance_config(static_cast<int>(reqs.size())).slots);
    *cut = choice.cut;
    *split_long = !*cut && wp.split_long && wp.any_split;  // the encoded plan is a split-long one
    if (padded != nullptr) {
      *padded =
          choice.verdict.default_ctas != static_cast<int64_t>(wp.items.size()) * ctx_.num_kv_heads;
    }
    return Status::ok();
  }
  // The chosen plan into balanced_plan_: cut from reqs, or work_plan_ in the balanced format.
  Status build_chosen_balanced_plan(std::span<const PlanRequest> reqs, bool cut) {
    const flashinfer::BalanceConfig bc = balance_config(static_cast<int>(reqs.size()));
    if (cut) return flashinfer::build_balanced_plan(reqs, bc, &balanced_plan_);
    return flashinfer::balanced_from_work_plan(work_plan_, bc, &balanced_plan_);
  }
  // A replay's encoded default plan expanded on the GPU from work_plan_.
  Status replay_device_plan(int bs, int slots);
  // The same with nothing uploaded and no host plan (kernels/plan_expand.h,
  // expand_plan_from_lengths), where the decode batch's work plan cannot split and kAuto keeps
  // it, or kAuto's cut plan written on the GPU (cut_plan_from_lengths): *done says whether one
  // ran; otherwise the caller plans on the host (which also names bad lengths).
  Status replay_plan_from_lengths(int bs, const int32_t* seq_lens_host, int captured_slots,
                                  bool* done);
  Status run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionLayer& layer, const ForwardBatch& batch, bool save_kv,
             const TensorView& lse, bool decode);
  Status plan_mla_quantized(const ForwardBatch& batch);
  // The split verify plan's merge (verify_plan_config): partials of the split requests -> out /
  // lse, with the sinks and v_scale; after the prefill kernel on the same stream.
  Status merge_prefill_splits(const PagedParams& p, DType q_dtype, int tokens, StreamHandle stream);
  bool graph_mla_native(const TensorView& encoder_lens, ForwardMode mode,
                        const SpecInfo* spec) const {
    return mla_engine_ != nullptr && !encoder_lens.defined() &&
           mla_engine_->why_not_graph(mode, spec).empty();
  }
  Status run_mla_quantized(const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& out, const AttentionLayer& layer,
                           const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                           bool decode);
  Status portable_or_error(const char* what) const {
    if (portable_ == nullptr) {
      return Status::unsupported(name_ + ": " + std::string(what) +
                                 " needs the portable path, which is unavailable here (" +
                                 ctx_portable_reason_ + ")");
    }
    return Status::ok();
  }

  BackendContext ctx_;
  // MLA contexts on SM90 (sm90_prefill): the non-absorbed 192 / 128 prefill layers' wgmma kernel
  // (fa3::PrefillSm90Engine::create_mla_prefill), which also runs prefix_cache_'s passes unless
  // the owner hands its own (FlashInferOptions::mla_prefix_passes); nullptr elsewhere. Declared
  // before prefix_cache_, which holds a pointer to it.
  std::unique_ptr<fa3::PrefillSm90Engine> sm90_mla_prefill_;
  // The name its errors carry: "flashinfer", or the backend that owns this one (fa3, flashmla,
  // cutlass_mla: FlashInferOptions::name).
  std::string name_;
  std::string head_dim_what_;  // "<name_>: head_dim", for dispatch_value's errors
  int sm_count_ = 0;
  int cc_ = 0;
  std::unique_ptr<AttentionBackend> portable_;
  std::string ctx_portable_reason_;  // non-empty: every forward is portable
  // MLA contexts: absorbed decode / verify (topk 1) with a bf16 pool on the shared tensor-core MLA
  // kernels (page-1 loader); nullptr when the device cannot run them.
  std::unique_ptr<mla::MlaDecodeEngine> mla_engine_;
  // MLA non-absorbed prefill layers with layer.mla_prefix (the chunked prefix cache).
  mla::MlaPrefixCacheRunner prefix_cache_;
  // SM90: the wgmma prefill kernel for eligible extend layers (shared with the fa3 backend);
  // nullptr on other devices, when the build lacks sm_90a code or when turned off.
  std::unique_ptr<fa3::PrefillSm90Engine> sm90_prefill_;
  // An owning backend's engine for partitioned mixed forwards (FlashInferOptions::wgmma_partner);
  // nullptr: sm90_prefill_ (if any) plays that part.
  const fa3::PrefillSm90Engine* wgmma_partner_ = nullptr;
  // The engine that runs the long requests of a partitioned forward: the own one, else the owner's.
  const fa3::PrefillSm90Engine* partition_engine() const {
    return sm90_prefill_ != nullptr ? sm90_prefill_.get() : wgmma_partner_;
  }
  // A/B knobs of the decode's programmatic dependent launch, read when the backend is created (run:
  // decode_pdl): ATTNKIT_FLASHINFER_PDL_SPLIT=0 launches eager split plans without PDL,
  // ATTNKIT_FLASHINFER_PDL_GRAPH=0 captured decode graphs,
  // ATTNKIT_FLASHINFER_PDL_TRIGGER=end releases the next grid after streaming.
  bool pdl_split_ = true;
  bool pdl_graph_ = true;
  bool pdl_early_ = true;
  // ATTNKIT_FLASHINFER_DECODE_BALANCE (read when the backend is created): "auto" (the default
  // since session 12): every tensor-core decode forward, eager or replayed, runs
  // paged_decode_balanced_kernel on a grid of balanced_kernel_slots(bs), on the cut plan where
  // choose_auto_plan picks it (uneven batches; default plans that leave slots empty), else on the
  // default plan in the balanced format (balanced_from_work_plan), so replays are bit-identical to
  // eager; "1": the cut plan for every decode; "0": the default plan on the WorkItem kernel
  // (paged_decode_ring_kernel), as in sessions 1-11.
  enum class Balance { kOff, kAlways, kAuto };
  static Balance balance_from_env() {
    // Default auto since 2026-11-23 (H200 17:57Z A/B in docs/PERF.md, session 12); 0 = the
    // WorkItem kernel and plan of sessions 1-11 (eager and graphs), 1 = the cut plan everywhere.
    const std::string v =
        env_choice("ATTNKIT_FLASHINFER_DECODE_BALANCE", {"0", "1", "auto"}, "auto");
    return v == "1" ? Balance::kAlways : v == "auto" ? Balance::kAuto : Balance::kOff;
  }
  // Whether decode forwards run paged_decode_balanced_kernel (any plan).
  bool balanced_kernel() const { return balance_ != Balance::kOff; }
  Balance balance_ = Balance::kOff;
  // Experiment knob ATTNKIT_FLASHINFER_SPLIT_LONG=1 (read when the backend is created; default off,
  // not yet run on a GPU): decode plans cut requests much longer than the per-slot share even at
  // bs >= 16 (work_plan.h PlanConfig::split_long), on the split kernel and its fused merge.
  bool split_long_ = false;
  // Target verify on decode tiles (paged_decode_ring_kernel's kVerify) up to this many packed rows
  // per request (N drafts x group), on prefill tiles above (verify_decode_tiles).
  // ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS (read when the backend is created): 0 = prefill tiles
  // always (sessions 58-59).
  int verify_decode_rows_ = kVerifyDecodeRows;
  // Extends on decode tiles up to this many packed rows per request (backend/small_extend.h;
  // ATTNKIT_EXTEND_DECODE_ROWS, read when the backend is created; 0 = never).
  int extend_decode_rows_ = detail::kExtendDecodeRows;
  // ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM (read when the backend is created): 0 (unset) = the rule
  // of verify_ctas_per_sm, 1 or 2 = that many for every decode-tile verify plan.
  int verify_ctas_per_sm_ = 0;
  int verify_tile_rows_ = 32;
  Plan plan_;
  FlashInferStats stats_;
  flashinfer::Cascade cascade_;  // shared-prefix plans of this forward (cascade.h)

  // Host plans of the last init_forward_metadata / replay refresh (their vectors keep their storage
  // from forward to forward) and the requests they were planned from.
  std::vector<PlanRequest> plan_requests_;
  WorkPlan work_plan_;
  flashinfer::BalancedPlan balanced_plan_;
  // Eager workspace (grow-only; only init_forward_metadata resizes it).
  DeviceArray<int32_t> plan_words_;
  DeviceArray<float> partial_out_, partial_lse_;
  DeviceArray<int32_t> split_counters_;  // zeroed when allocated; the kernel leaves them zero
  PinnedStaging staging_;

  // Quantised-MLA workspace.
  DeviceArray<int32_t> mla_indptr_, mla_indices_, mla_q_layout_;
  DeviceArray<int32_t> mla_new_slots_;  // extend modes: the new tokens' slots (req_to_token)
  std::vector<int32_t> mla_q_layout_host_;
  int mla_grid_splits_ = 1;
  int mla_max_splits_ = 1;
  int mla_max_q_len_ = 0;

  // CUDA-graph workspace (fixed addresses for the captured kernels).
  bool graph_ready_ = false;
  bool graph_portable_ = false;
  int graph_max_bs_ = 0;
  int64_t graph_items_ = 0;
  int64_t graph_partial_entries_ = 0;      // partial entries (LSE floats) of the graph workspace
  int graph_verify_drafts_ = 1;            // the N init_cuda_graph_state sized verify for
  int64_t graph_split_counter_count_ = 0;  // split counters it reserved
  // (mode, bs) of the captured graphs -> their queries per request (1, or verify's N) and the grid
  // (CTAs per kv head) each launches.
  GraphCaptures graph_captures_;
  // The req_to_token rows' length of the captured forwards (replay bounds seq_lens_host by it).
  int graph_max_context_ = 0;
  // That length: the context's req_to_token pool where it names one, else the captured forwards'
  // (0: unknown).
  int graph_rows() const {
    return ctx_.req_to_token_pool != nullptr ? ctx_.req_to_token_pool->max_context_len()
                                             : graph_max_context_;
  }
  // Target verify: the most work items (CTAs per kv head) of a plan of bs requests x N drafts
  // (verify_plan_config, decode or prefill tiles): one per (request, q tile) unsplit, and a plan
  // that splits stays within its per-head target (build_work_plan's chunk rule splits only below
  // it).
  int64_t verify_split_target(int draft_tokens) const {
    const PlanConfig c = verify_plan_config(draft_tokens);
    return std::max(c.target_ctas, c.split_ctas) / std::max(1, c.num_kv_heads);
  }
  int64_t verify_items(int bs, int draft_tokens) const {
    const int group = ctx_.num_q_heads / ctx_.num_kv_heads;
    const int64_t q_tiles =
        verify_decode_tiles(draft_tokens)
            ? verify_q_tiles(draft_tokens)
            : (static_cast<int64_t>(draft_tokens) * group + flashinfer::kPrefillTileRows - 1) /
                  flashinfer::kPrefillTileRows;
    return std::max(static_cast<int64_t>(bs) * q_tiles, verify_split_target(draft_tokens));
  }
  // Partial rows of a split verify plan: splits x N per split request, and the splits of all
  // requests together stay within the per-head target (times Hq entries each).
  int64_t verify_partial_entries(int draft_tokens) const {
    return verify_split_target(draft_tokens) * draft_tokens * ctx_.num_q_heads;
  }
  int draft_tokens(const SpecInfo* spec) const {
    return spec != nullptr && spec->draft_token_num > 0 ? spec->draft_token_num
                                                        : ctx_.speculative_num_draft_tokens;
  }
  DeviceArray<int32_t> graph_words_;
  // The work plan a replay uploads for its encoded default plan to be expanded on the GPU
  // (kernels/plan_expand.h), kAuto only. device_plan_ = ATTNKIT_FLASHINFER_DEVICE_PLAN: 1 (the
  // default) from kDevicePlanMinCtas CTAs (the plan from the lengths from kLengthPlanMinCtas, the
  // cut plan from kDeviceCutMinSlots slots), 2 at every batch (tests), 0 never.
  DeviceArray<int32_t> graph_work_words_;
  int device_plan_ = 1;
  // The expansion kernel's launch costs the host ~3-4 us, the host encoder ~5 ns per segment
  // (the H200 lease host, 2026-11-26 01:10Z, bench refresh medians with the expansion at every
  // batch vs none: bs 256 (2048 CTAs) 18-27 vs 26-33 us, bs 64 (512) 12-14 vs 9-18, bs 1 / 16
  // (128) 8-13 vs 5-7): from 1024 CTAs (bs >= 128 at 8 kv heads) it pays.
  static constexpr int64_t kDevicePlanMinCtas = 1024;
  // The plan from the lengths alone (no work plan, no upload, no event: the launch and the length
  // scan) from 512 CTAs (bs >= 64 at 8 kv heads): H200 lease host, bench refresh medians over five
  // alternated rounds (2026-11-26 04:02Z and 05:50Z), b64 kv 4k 10-36 us on the host path vs 6-15
  // with the lengths path; at 128-256 CTAs (b16 / b32) the rounds disagreed.
  static constexpr int64_t kLengthPlanMinCtas = 512;
  // The cut plan on the GPU from 512 slots (bs >= 64 at 8 kv heads): the host's cut plan costs
  // ~12 us there on the development VM (uneven b64, 1019 segments) plus its upload, ~47 us at bs
  // 256 (4083 segments); the launch ~3-4 us.
  static constexpr int kDeviceCutMinSlots = 512;
  flashinfer::PlanFromLengthsParams lengths_params_;  // 4 KB: the launch's parameters
  DeviceArray<float> graph_partial_out_, graph_partial_lse_;
  DeviceArray<int32_t> graph_split_counters_;
};

std::string FlashInferBackend::portable_reason(const ForwardBatch& batch) const {
  if (!ctx_portable_reason_.empty()) return ctx_portable_reason_;
  if (!batch.encoder_lens_host.empty()) return "encoder / cross-attention batch";
  if (batch.kv_pool != nullptr) {
    const DType kv = batch.kv_pool->dtype();
    if (kv != ctx_.q_dtype && !dtype_is_fp8(kv)) {
      return std::string("KV dtype ") + dtype_name(kv) + " with q dtype " +
             dtype_name(ctx_.q_dtype);
    }
  }
  return "";
}

Status FlashInferBackend::init_forward_metadata(const ForwardBatch& batch) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_batch_devices(batch, stream_for(batch), ctx_.device));
  plan_ = Plan{};
  prefix_cache_.drop_plan();
  cascade_.reset();
  if (sm90_prefill_ != nullptr) sm90_prefill_->drop_plan();
  if (sm90_mla_prefill_ != nullptr) sm90_mla_prefill_->drop_plan();
  stats_.cascade_shared_prefix = 0;
  plan_.mode = batch.mode;
  if (batch.mode == ForwardMode::kIdle) {
    plan_.valid = true;
    return Status::ok();
  }
  ATTNKIT_RETURN_IF_ERROR(batch.validate());
  if (batch.req_to_token_pool == nullptr) {
    return Status::invalid_argument(name_ + ": ForwardBatch.req_to_token_pool is null");
  }
  plan_.lengths = plan_key(batch, stream_for(batch));
  plan_.num_tokens = batch.num_tokens;
  const int bs = batch.batch_size;
  plan_.bs = bs;
  // The MLA chunked prefix cache of this forward's non-absorbed layers (layer.mla_prefix).
  if (mla::MlaPrefixCacheRunner::takes(ctx_, batch)) {
    ATTNKIT_RETURN_IF_ERROR(prefix_cache_.plan(batch, stream_for(batch)));
  }
  // The non-absorbed MLA prefill layers' wgmma plan (no-op for forwards it does not take).
  if (sm90_mla_prefill_ != nullptr) {
    ATTNKIT_RETURN_IF_ERROR(sm90_mla_prefill_->plan(batch, stream_for(batch)));
  }
  if (mla_engine_ != nullptr && mla_engine_->why_not(batch).empty()) {
    ATTNKIT_RETURN_IF_ERROR(mla_engine_->plan(batch, stream_for(batch)));
    plan_.mla_native = true;
    plan_.valid = true;
    return Status::ok();
  }
  if (mla_quantized_context(batch)) {
    ATTNKIT_RETURN_IF_ERROR(plan_mla_quantized(batch));
    // Non-absorbed 192/128 prefill layers of an extend forward read no pool rows: they run on the
    // portable kernels as over a bf16 pool, planned here as well.
    if (batch.mode != ForwardMode::kDecode && portable_ != nullptr) {
      ATTNKIT_RETURN_IF_ERROR(portable_->init_forward_metadata(batch));
    }
    return Status::ok();
  }
  if (!portable_reason(batch).empty()) {
    ATTNKIT_RETURN_IF_ERROR(portable_or_error(portable_reason(batch).c_str()));
    ATTNKIT_RETURN_IF_ERROR(portable_->init_forward_metadata(batch));
    plan_.portable = true;
    plan_.valid = true;
    return Status::ok();
  }

  const bool decode = batch.mode == ForwardMode::kDecode;
  const bool verify = batch.mode == ForwardMode::kTargetVerify;
  // SM90 wgmma tiles for the extend layers it takes (the plan below serves the others); planned
  // first: a partitioned forward's plan below takes the requests the engine left (partition()).
  if (sm90_prefill_ != nullptr) {
    ATTNKIT_RETURN_IF_ERROR(sm90_prefill_->plan(batch, stream_for(batch)));
  }
  const fa3::PrefillSm90Engine* partner = partition_engine();
  const std::vector<uint8_t>* partition =
      !decode && !verify && partner != nullptr && partner->partitioned() &&
              partner->partition().size() == static_cast<size_t>(bs)
          ? &partner->partition()
          : nullptr;
  std::vector<PlanRequest>& reqs = plan_requests_;
  reqs.assign(static_cast<size_t>(bs), PlanRequest{});
  int32_t start = 0;
  for (int r = 0; r < bs; ++r) {
    PlanRequest& q = reqs[static_cast<size_t>(r)];
    const int32_t seq = batch.seq_lens_host[static_cast<size_t>(r)];
    if (decode) {
      q.q_start = r;
      q.q_len = 1;
      q.kv_len = seq;
    } else {
      const bool have_extend = !batch.extend_seq_lens_host.empty();
      q.q_len = have_extend ? batch.extend_seq_lens_host[static_cast<size_t>(r)]
                            : batch.spec.draft_token_num;
      q.q_start = have_extend && !batch.extend_start_loc_host.empty()
                      ? batch.extend_start_loc_host[static_cast<size_t>(r)]
                      : start;
      // seq_lens counts the new tokens, except in verify where the drafts follow the prefix.
      q.kv_len = verify ? seq + q.q_len : seq;
    }
    start += q.q_len;
  }
  // A partitioned mixed forward: the requests the wgmma engine runs get no rows here, and the
  // decode tiles take the others (extend_partition flags them: 1 .. extend_decode_rows / group new
  // tokens each).
  int partition_n = 0;
  if (partition != nullptr) {
    for (size_t r = 0; r < reqs.size(); ++r) {
      if ((*partition)[r] != 0) {
        partition_n = std::max(partition_n, reqs[r].q_len);
      } else {
        reqs[r].q_len = 0;
      }
    }
  }
  // Target verify's N: the same for every request (draft_token_num), the first one's here.
  const int verify_n = verify && bs > 0 ? reqs[0].q_len : 0;
  bool uniform_drafts = true;
  for (const PlanRequest& q : reqs) uniform_drafts = uniform_drafts && q.q_len == verify_n;
  const bool verify_decode = verify && uniform_drafts && verify_decode_tiles(verify_n);
  // An extend whose requests have few new tokens each (backend/small_extend.h): the same decode
  // tiles with the causal mask over the new tokens, tiles and split counters for the longest
  // request (extend_decode_n new tokens).
  const int group = ctx_.num_q_heads / std::max(1, ctx_.num_kv_heads);
  int extend_decode_n = decode || verify ? 0
                        : partition != nullptr
                            ? partition_n
                            : detail::extend_decode_q_len(batch, group, extend_decode_rows_);
  // (A batch whose decode-tile grid could pass a launch's 65535 items per kv head stays on the
  // prefill tiles: the planner's splits only add items where there are few. extend_partition
  // only splits a forward whose few-token requests stay under the same count in 16-row tiles.)
  constexpr int64_t kDecodeTileItemsBound = detail::kPartitionDecodeItemsBound;
  if (partition == nullptr && extend_decode_n > 0 &&
      bs * verify_q_tiles(extend_decode_n) > kDecodeTileItemsBound) {
    extend_decode_n = 0;
  }
  const bool tiles_decode = verify_decode || extend_decode_n > 0;
  const int tile_n = verify ? verify_n : extend_decode_n;
  const TileShape shape = decode || tiles_decode ? TileShape::kDecode : TileShape::kPrefill;
  // The cascade keeps planning verify on prefill tiles (its passes run their own plans).
  const TileShape cascade_shape = decode ? TileShape::kDecode : TileShape::kPrefill;
  const StreamHandle stream = stream_for(batch);
  int64_t partial_entries = 0;  // partial rows x their width (balanced_plan.h)
  if (decode && balanced_kernel()) {
    bool cut = false;
    bool split_long = false;
    ATTNKIT_RETURN_IF_ERROR(balanced_kernel_plan(reqs, &cut, &split_long));
    const flashinfer::BalancedPlan& bp = balanced_plan_;
    ATTNKIT_RETURN_IF_ERROR(plan_words_.reserve(ctx_.device, bp.serialized_words()));
    ATTNKIT_RETURN_IF_ERROR(staging_.upload(bp, plan_words_.data(), stream));
    partial_entries = balanced_partial_entries(bp.num_partials);
    plan_.split_long = split_long;
    plan_.balance_slots = bp.slots();
    plan_.balance_cut = cut;
    // Eager launches up to the last slot with segments: empty CTAs at the end of a PDL-chained
    // grid cost 20-35% (balanced_plan.h balanced_kernel_slots); a graph keeps its captured grid.
    plan_.grid_items = bp.slots();
    while (plan_.grid_items > 1 && bp.cta_begin[static_cast<size_t>(plan_.grid_items) - 1] ==
                                       bp.cta_begin[static_cast<size_t>(plan_.grid_items)]) {
      --plan_.grid_items;
    }
  } else {
    ATTNKIT_RETURN_IF_ERROR(flashinfer::build_work_plan(
        reqs,
        verify || tiles_decode ? verify_plan_config(tile_n, tiles_decode)
                               : plan_config(shape, decode),
        &work_plan_));
    const WorkPlan& wp = work_plan_;
    ATTNKIT_RETURN_IF_ERROR(plan_words_.reserve(ctx_.device, wp.serialized_words()));
    ATTNKIT_RETURN_IF_ERROR(staging_.upload(wp, plan_words_.data(), stream));
    partial_entries = static_cast<int64_t>(wp.num_partials) * ctx_.num_q_heads;
    plan_.grid_items = static_cast<int>(wp.items.size());
    plan_.split_long = wp.split_long && wp.any_split;
  }
  if (partial_entries > 0) {
    ATTNKIT_RETURN_IF_ERROR(partial_out_.reserve(ctx_.device, partial_entries * ctx_.v_head_dim));
    ATTNKIT_RETURN_IF_ERROR(partial_lse_.reserve(ctx_.device, partial_entries));
    ATTNKIT_RETURN_IF_ERROR(cuda::reserve_zeroed_counters(
        split_counters_, ctx_.device, bs * decode_counters_per_request(tiles_decode, tile_n),
        stream));
  }
  if (tiles_decode) plan_verify_on_decode_tiles(tile_n);  // (plan_ was reset above)
  plan_.extend_decode = extend_decode_n > 0;
  plan_.partition = partition != nullptr;
  plan_.shape = shape;
  plan_.split = partial_entries > 0;
  plan_.words = plan_words_.data();
  plan_.partial_out = partial_out_.data();
  plan_.partial_lse = partial_lse_.data();
  plan_.split_counters = split_counters_.data();
  // (A partitioned forward has no cascade: its plan holds the few-token requests only.)
  if (!plan_.partition) {
    ATTNKIT_RETURN_IF_ERROR(cascade_.plan(batch, reqs, cascade_shape,
                                          plan_config(cascade_shape, decode), ctx_.num_q_heads,
                                          ctx_.qk_head_dim, ctx_.device, cascade_options, stream));
  }
  stats_.cascade_shared_prefix = cascade_.active() ? cascade_.shared_prefix() : 0;
  plan_.valid = true;
  return Status::ok();
}

Status FlashInferBackend::run(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const AttentionLayer& layer,
                              const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                              bool decode) {
  ATTNKIT_RETURN_IF_ERROR(
      validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
  if (batch.mode == ForwardMode::kIdle || batch.num_tokens == 0) return Status::ok();
  ATTNKIT_RETURN_IF_ERROR(check_forward_matches_plan(
      name_,
      PlanStamp{plan_.valid, plan_.mode, plan_.bs, plan_.num_tokens, plan_.lengths, plan_.replay},
      batch, stream_for(batch)));
  if (plan_.graph || plan_.mla_native) {  // the rows a replay's lengths must fit
    if (batch.req_to_token_pool != nullptr) {
      graph_max_context_ = batch.req_to_token_pool->max_context_len();
    }
  }
  if (layer.mla_prefix != nullptr) {
    ++stats_.portable_calls;  // (its passes may run on sm90_mla_prefill_: the runner decides)
    return prefix_cache_.run(q, k, v, out, layer, batch, lse, stream_for(batch));
  }
  if (sm90_mla_prefill_ != nullptr && layer.is_mla &&
      sm90_mla_prefill_->why_not_mla_layer(q, k, v, out, layer, batch).empty()) {
    ++stats_.native_calls;
    ++stats_.wgmma_mla_calls;
    return sm90_mla_prefill_->run_mla(q, k, v, out, lse, layer, batch, stream_for(batch));
  }
  if (plan_.mla_native) {
    ++stats_.native_calls;
    return mla_engine_->run(q, k, v, out, layer, batch, save_kv, lse, stream_for(batch));
  }
  if (plan_.mla_quantized) {
    ++stats_.portable_calls;
    if (!decode && portable_ != nullptr &&
        layer.qk_head_dim != ctx_.kv_lora_rank + ctx_.qk_rope_head_dim) {
      return portable_->forward_extend(q, k, v, out, layer, batch, save_kv, lse);
    }
    return run_mla_quantized(q, k, v, out, layer, batch, save_kv, lse, decode);
  }
  if (plan_.portable) {
    ++stats_.portable_calls;
    return decode ? portable_->forward_decode(q, k, v, out, layer, batch, save_kv, lse)
                  : portable_->forward_extend(q, k, v, out, layer, batch, save_kv, lse);
  }
  if (batch.kv_pool == nullptr || batch.kv_pool->is_mla()) {
    return Status::invalid_argument(name_ + ": ForwardBatch.kv_pool must be an MHA pool");
  }
  if (layer.is_cross_attention) {
    return Status::invalid_argument(
        name_ + ": layer " + str(layer.layer_id) +
        " is a cross-attention layer but the batch has no encoder_lens");
  }
  if (layer.qk_head_dim != ctx_.qk_head_dim || layer.v_head_dim != ctx_.qk_head_dim ||
      layer.num_q_heads != ctx_.num_q_heads || layer.num_kv_heads != ctx_.num_kv_heads) {
    return Status::invalid_argument(
        name_ + ": layer " + str(layer.layer_id) + " (heads " + str(layer.num_q_heads) + "/" +
        str(layer.num_kv_heads) + ", dims " + str(layer.qk_head_dim) + "/" + str(layer.v_head_dim) +
        ") differs from the backend context (heads " + str(ctx_.num_q_heads) + "/" +
        str(ctx_.num_kv_heads) + ", dim " + str(ctx_.qk_head_dim) + ")");
  }
  if (q.dtype != ctx_.q_dtype || out.dtype != ctx_.q_dtype) {
    return Status::invalid_argument((name_ + ": q ") + dtype_name(q.dtype) + " / out " +
                                    dtype_name(out.dtype) + " differ from the context's q dtype " +
                                    dtype_name(ctx_.q_dtype));
  }
  ATTNKIT_RETURN_IF_ERROR(check_vector_rows(name_, q, "q"));
  ATTNKIT_RETURN_IF_ERROR(check_vector_rows(name_, out, "out"));

  auto& pool = static_cast<MHAKVPool&>(*batch.kv_pool);
  const StreamHandle stream = stream_for(batch);
  const TensorView kbuf = pool.k_buffer(layer.layer_id);
  const TensorView vbuf = pool.v_buffer(layer.layer_id);
  const DType kv_dtype = pool.dtype();
  const bool quant = dtype_is_fp8(kv_dtype);
  // Which kernel runs and its launch limits, before the cache write (a refusal after it would
  // leave the new k / v stored for a forward that did not run).
  const std::string wgmma_why_not = decode || sm90_prefill_ == nullptr
                                        ? std::string("no wgmma engine for this call")
                                        : sm90_prefill_->why_not_layer(q, out, layer, batch);
  const bool wgmma = wgmma_why_not.empty();
  // A partitioned forward's plan holds only its few-token requests: the engine must run the rest
  // (for the pools it partitions -- the q dtype's, and fp8_e4m3 ones on fa3's FP8 plans with the
  // variants -- a layer it declines is one the kernels below refuse too: head dims, dtypes, row
  // alignment), with the plan this one was made beside.
  const fa3::PrefillSm90Engine* partner = partition_engine();
  if (plan_.partition && (partner == nullptr || !partner->partitioned())) {
    return Status::internal(name_ + ": a partitioned plan without its wgmma engine's plan");
  }
  if (plan_.partition && sm90_prefill_ != nullptr && !wgmma) {
    return Status::invalid_argument(
        name_ + ": layer " + str(layer.layer_id) +
        " of a mixed forward split between the SM90 wgmma kernel and the decode tiles "
        "(backend/small_extend.h): the wgmma kernel declined it: " +
        wgmma_why_not);
  }
  const bool cascade = cascade_.active() && layer.sliding_window < 0;  // windows: plain plan
  if ((!wgmma || plan_.partition) && !cascade) {
    if (plan_.shape == TileShape::kDecode) {
      ATTNKIT_RETURN_IF_ERROR(
          cuda::check_ring_decode_row_stride(name_.c_str(), kv_dtype, kbuf, vbuf));
      if (plan_.balance_slots == 0) {  // a balanced plan's grid is 1-D
        ATTNKIT_RETURN_IF_ERROR(flashinfer::check_decode_grid(
            plan_.grid_items,
            plan_.extend_decode   ? "extend"
            : plan_.verify_decode ? "target_verify"
                                  : "decode",
            plan_.verify_decode
                ? std::string(" (fewer requests, or ") +
                      (plan_.extend_decode ? "ATTNKIT_EXTEND_DECODE_ROWS"
                                           : "ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS") +
                      " below " + str(plan_.decode_q_tiles * plan_.decode_tile_rows) +
                      " for the prefill tiles)"
                : std::string()));
      }
    } else {
      ATTNKIT_RETURN_IF_ERROR(flashinfer::check_prefill_grid(plan_.grid_items, layer.num_kv_heads));
    }
  }
  if (save_kv && k.defined()) {
    ATTNKIT_RETURN_IF_ERROR(pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v, layer.k_scale,
                                        layer.v_scale, stream));
  }
  if (wgmma) {
    ++stats_.native_calls;
    ++stats_.wgmma_calls;
    ATTNKIT_RETURN_IF_ERROR(sm90_prefill_->run(q, out, lse, layer, batch, stream));
    if (!plan_.partition) return Status::ok();  // else the few-token requests, below
  }

  PagedParams p;
  detail::set_io_params(p, q, out, lse);
  detail::set_kv_pool_params(p, kbuf, vbuf);
  detail::set_page_table_params(p, batch);
  p.page_size = pool.page_size();
  p.page_shift = is_power_of_two(p.page_size) ? log2_exact(p.page_size) : -1;
  static const bool generic_loop =  // decode experiment knob (paged_params.h)
      env_choice("ATTNKIT_FLASHINFER_DECODE_LOOP", {"generic"}, "the default loop") == "generic";
  p.decode_generic_loop = generic_loop ? 1 : 0;
  static const bool split_fence_all =  // decode experiment knob (paged_params.h)
      env_choice("ATTNKIT_FLASHINFER_SPLIT_SYNC", {"fence_all"}, "acq_rel") == "fence_all";
  p.split_sync_fence_all = split_fence_all ? 1 : 0;
  // Programmatic dependent launch (paged_attention_sm80.cuh decode_pdl: mode 2 where allowed, the
  // next grid released right after each CTA's wait) for every decode launch, eager and captured,
  // split or not. Eager split plans: H200 2026-11-23 10:41Z, --launches 10, b1 kv 32k (16 splits)
  // 42.6 us (74.1% of copy) with PDL vs 44.6-45.0 us (70.3-70.8%) without, the same launch the
  // graphs already had (session 7 had measured mode 1 with the late trigger slower: 44.3 -> 48.9
  // us). Graphs: H200 2026-11-23 10:06Z, --graph --launches 32, mode 2 + early trigger captured
  // vs no PDL: b16 kv 4k p16 68.7 vs 69.7 us bf16, 38.3 vs 39.9 fp8, b1 kv 32k 41.9 vs 43.6 (with
  // mode 1 and the late trigger, session 7 measured b1 replays slower: 66.1% vs 70%).
  // ATTNKIT_FLASHINFER_PDL_SPLIT=0 / ATTNKIT_FLASHINFER_PDL_GRAPH=0 /
  // ATTNKIT_FLASHINFER_PDL_TRIGGER=end restore the previous launches (A/B knobs, read when the
  // backend is created: pdl_split_, pdl_graph_, pdl_early_).
  // Mode 2 (plan and first page-table words read before the wait) only where the previous kernel
  // cannot have written them: attnkit's own KV store just ran, or the context says so
  // (BackendContext::early_page_table_reads); mode 1 (wait first) otherwise.
  const bool early_reads = ctx_.early_page_table_reads || (save_kv && k.defined());
  const bool no_pdl = (plan_.split && !pdl_split_) || (plan_.graph && !pdl_graph_);
  p.decode_pdl = no_pdl ? 0 : (early_reads ? 2 : 1);
  p.decode_pdl_early = pdl_early_ ? 1 : 0;  // paged_params.h decode_pdl_early
  // A partitioned forward whose wgmma kernel (the launch just before this one: the own engine's
  // above, or the owner's) released its dependents at its start: the decode tiles start beside it
  // (paged_params.h decode_overlap; the ring kernel only).
  p.decode_overlap = plan_.partition && partner != nullptr && partner->last_run_overlapped() &&
                             plan_.shape == TileShape::kDecode && plan_.verify_decode &&
                             plan_.balance_slots == 0 && !cascade
                         ? 1
                         : 0;
  if (p.decode_overlap != 0) {
    p.decode_pdl = 0;  // no wait at the CTAs' start (launch_paged keeps the programmatic launch)
    ++stats_.partition_overlap_calls;
  }
  p.plan = plan_.words;
  p.bs = batch.batch_size;
  if (batch.mode == ForwardMode::kTargetVerify && batch.spec.custom_mask.defined()) {
    p.custom_mask = batch.spec.custom_mask.data_as<const uint8_t>();
    p.mask_indptr = batch.spec.mask_indptr.data_as<const int64_t>();
  }
  if (layer.sinks.defined()) p.sinks = layer.sinks.data_as<const float>();
  p.partial_out = plan_.partial_out;
  p.partial_lse = plan_.partial_lse;
  p.split_counters = plan_.split_counters;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.group = layer.num_q_heads / layer.num_kv_heads;
  // fp8 stores x / scale: k_scale folds into the logit scale, v_scale into the output.
  const float k_scale = quant ? layer.k_scale : 1.f;
  p.scale = layer.scaling * k_scale;
  p.scale_log2 = p.scale * cuda::kLog2e;
  p.logit_cap = layer.logit_cap;
  p.v_scale = quant ? layer.v_scale : 1.f;
  p.sliding_window = detail::kernel_sliding_window(layer.sliding_window, batch);
  p.causal = layer.type == AttentionType::kEncoderOnly ? 0 : 1;

  if (!wgmma) ++stats_.native_calls;  // (a partition's second kernel counts with its wgmma call)
  if (cascade) {
    ++stats_.cascade_calls;
    return cascade_.run(p, q.dtype, kv_dtype, ctx_.qk_head_dim, stream);
  }
  if (plan_.split && plan_.shape == TileShape::kDecode) ++stats_.split_calls;
  if (plan_.split_long) ++stats_.decode_split_long_calls;
  p.balance_slots = plan_.balance_slots;  // after the cascade: its passes run WorkItem plans
  p.decode_verify = plan_.verify_decode ? 1 : 0;
  p.decode_q_tiles = plan_.decode_q_tiles;
  p.decode_tile_rows = plan_.decode_tile_rows;
  if (plan_.extend_decode) {
    ++stats_.extend_decode_calls;
    if (plan_.partition) ++stats_.extend_partition_calls;
  } else if (plan_.verify_decode) {
    ++stats_.verify_decode_calls;
    if (plan_.decode_tile_rows == 2 * flashinfer::kDecodeTileRows) {
      ++stats_.verify_decode_rows32_calls;
    }
    stats_.last_verify_ctas_per_sm = verify_ctas_per_sm(plan_.decode_tile_rows);
  }
  if (plan_.balance_slots > 0 && plan_.balance_cut) ++stats_.decode_balanced_calls;
  if (plan_.balance_slots > 0 && !plan_.balance_cut) ++stats_.decode_encoded_default_calls;
  const int grid = plan_.grid_items;
  stats_.last_grid_items = grid;
  const TileShape shape = plan_.shape;
  if (shape == TileShape::kDecode) {
    if (p.decode_pdl == 1) ++stats_.decode_pdl_wait_first_calls;
    if (p.decode_pdl == 2) ++stats_.decode_pdl_early_reads_calls;
  }
  return dispatch_value<flashinfer::NativeHeadDims>(
      ctx_.qk_head_dim, head_dim_what_.c_str(), [&]<int kD>() -> Status {
        if constexpr (!flashinfer::head_dim_compiled(kD)) {
          return Status::unsupported(name_ + ": head_dim " + str(kD) + " is not compiled in");
        } else if (shape == TileShape::kDecode) {
          return flashinfer::run_paged<kD, TileShape::kDecode>(p, q.dtype, kv_dtype, grid, stream);
        } else {
          const Status ran =
              flashinfer::run_paged<kD, TileShape::kPrefill>(p, q.dtype, kv_dtype, grid, stream);
          if (!ran.is_ok()) return ran;
          // A split verify plan: the split requests' partials -> out / lse (the whole ones were
          // written by the kernel; the merge leaves them).
          return plan_.split ? merge_prefill_splits(p, q.dtype, batch.num_tokens, stream)
                             : Status::ok();
        }
      });
}

Status FlashInferBackend::merge_prefill_splits(const PagedParams& p, DType q_dtype, int tokens,
                                               StreamHandle stream) {
  flashinfer::CascadeMergeParams m = flashinfer::merge_output_params(p, ctx_.qk_head_dim);
  m.suffix_plan = p.plan;
  m.bs = p.bs;
  m.tokens = tokens;
  m.partial_out = p.partial_out;
  m.partial_lse = p.partial_lse;
  ++stats_.verify_split_merges;
  return flashinfer::cascade_merge(m, q_dtype, stream);
}

// ---- MLA over an fp4 / fp8_e4m3 pool (portable SIMT kernel, planned like the triton backend) --

Status FlashInferBackend::plan_mla_quantized(const ForwardBatch& batch) {
  if (!batch.encoder_lens_host.empty()) {
    return Status::unsupported(name_ + ": MLA with encoder lengths is not supported");
  }
  const int bs = batch.batch_size;
  const bool decode = batch.mode == ForwardMode::kDecode;
  const bool verify = batch.mode == ForwardMode::kTargetVerify;
  const bool pool_prefix_is_seq = decode || (verify && batch.extend_prefix_lens_host.empty());
  const StreamHandle stream = stream_for(batch);
  const TensorView table = batch.req_to_token_pool->table();
  cuda::TokenIndexArgs idx;
  idx.req_to_token = table.data_as<const int32_t>();
  idx.req_to_token_stride = table.stride(0);
  idx.req_pool_indices = batch.req_pool_indices.data_as<const int32_t>();
  idx.bs = bs;
  idx.len = pool_prefix_is_seq ? batch.seq_lens.data_as<const int32_t>()
                               : batch.extend_prefix_lens.data_as<const int32_t>();
  const std::vector<int32_t>& lens =
      pool_prefix_is_seq ? batch.seq_lens_host : batch.extend_prefix_lens_host;
  int64_t total = 0;
  for (int32_t n : lens) total += n;
  ATTNKIT_RETURN_IF_ERROR(mla_indptr_.reserve(ctx_.device, bs + 1));
  ATTNKIT_RETURN_IF_ERROR(mla_indices_.reserve(ctx_.device, total));
  idx.kv_indptr = mla_indptr_.data();
  idx.kv_indices = mla_indices_.data();
  ATTNKIT_RETURN_IF_ERROR(cuda::build_token_indices(idx, stream));

  const int group = ctx_.num_q_heads / ctx_.num_kv_heads;
  const int tile = triton::simt::gqa_tile(ctx_.qk_head_dim, ctx_.v_head_dim);
  const int head_blocks = ctx_.num_kv_heads * ((group + tile - 1) / tile);
  mla_max_splits_ = triton::plan_max_splits(sm_count_, head_blocks);
  mla_grid_splits_ = 1;
  mla_max_q_len_ = 0;
  plan_.partial_out = nullptr;
  plan_.partial_lse = nullptr;
  if (decode) {
    for (int32_t n : batch.seq_lens_host) {
      mla_grid_splits_ =
          std::max(mla_grid_splits_, triton::split_count(n, mla_max_splits_, triton::kMinChunk));
    }
    if (mla_grid_splits_ > 1) {
      const int64_t rows =
          static_cast<int64_t>(mla_grid_splits_) * batch.num_tokens * ctx_.num_q_heads;
      ATTNKIT_RETURN_IF_ERROR(partial_out_.reserve(ctx_.device, rows * ctx_.v_head_dim));
      ATTNKIT_RETURN_IF_ERROR(partial_lse_.reserve(ctx_.device, rows));
      plan_.partial_out = partial_out_.data();
      plan_.partial_lse = partial_lse_.data();
    }
  } else {
    mla_q_layout_host_.assign(2 * static_cast<size_t>(bs), 0);
    int32_t start = 0;
    for (int r = 0; r < bs; ++r) {
      const int32_t n = batch.extend_seq_lens_host.empty()
                            ? batch.spec.draft_token_num
                            : batch.extend_seq_lens_host[static_cast<size_t>(r)];
      mla_q_layout_host_[static_cast<size_t>(r)] = start;
      mla_q_layout_host_[static_cast<size_t>(bs + r)] = n;
      mla_max_q_len_ = std::max(mla_max_q_len_, static_cast<int>(n));
      start += n;
    }
    ATTNKIT_RETURN_IF_ERROR(mla_q_layout_.reserve(ctx_.device, 2 * static_cast<int64_t>(bs)));
    ATTNKIT_CUDA_TRY(cudaMemcpyAsync(mla_q_layout_.data(), mla_q_layout_host_.data(),
                                     mla_q_layout_host_.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, cuda::to_stream(stream)));
    // The new tokens' slots from the req_to_token columns after each prefix (the triton
    // backend's plan does the same): only req_to_token is checked against the pool.
    ATTNKIT_RETURN_IF_ERROR(
        mla_new_slots_.reserve(ctx_.device, std::max<int64_t>(batch.num_tokens, 1)));
    ATTNKIT_RETURN_IF_ERROR(cuda::build_new_token_slots(batch, mla_new_slots_.data(), stream));
  }
  plan_.mla_quantized = true;
  plan_.valid = true;
  return Status::ok();
}

Status FlashInferBackend::run_mla_quantized(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const TensorView& out,
                                            const AttentionLayer& layer, const ForwardBatch& batch,
                                            bool save_kv, const TensorView& lse, bool decode) {
  if (!layer.is_mla || layer.qk_head_dim != triton::kMlaHeadDimQK ||
      layer.v_head_dim != triton::kMlaHeadDimV || !batch.kv_pool->is_mla()) {
    return Status::unsupported(name_ + ": quantised-KV MLA needs the absorbed head dims " +
                               str(triton::kMlaHeadDimQK) + "/" + str(triton::kMlaHeadDimV) +
                               " and an MLA pool, got " + str(layer.qk_head_dim) + "/" +
                               str(layer.v_head_dim));
  }
  if (lse.defined() && lse.stride(1) != 1) {
    return Status::unsupported(name_ + ": quantised-KV MLA needs lse with a unit head stride");
  }
  auto& pool = static_cast<MLAKVPool&>(*batch.kv_pool);
  const StreamHandle stream = stream_for(batch);
  if (save_kv && k.defined()) {
    ATTNKIT_RETURN_IF_ERROR(pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v, layer.k_scale,
                                        layer.v_scale, stream));
  }
  const TensorView kbuf = pool.kv_buffer(layer.layer_id);
  const TensorView vbuf = pool.v_view(layer.layer_id);
  triton::AttentionParams p;
  detail::set_io_params(p, q, out, lse);
  detail::set_kv_pool_params(p, kbuf, vbuf);
  const DType kv_dtype = pool.dtype();
  if (kv_dtype == DType::kFP4E2M1) {
    const TensorView scales = pool.scale_buffer(layer.layer_id);
    p.k_scales = scales.data_as<const uint8_t>();
    p.v_scales = p.k_scales;  // V is the first kv_lora_rank columns of the K row
    p.ks_stride_row = p.vs_stride_row = scales.stride(0);
    p.ks_stride_head = p.vs_stride_head = scales.stride(1);
  }
  p.kv_indptr = mla_indptr_.data();
  p.kv_indices = mla_indices_.data();
  p.bs = batch.batch_size;
  p.num_tokens = batch.num_tokens;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.group_size = layer.num_q_heads / layer.num_kv_heads;
  p.causal = layer.type == AttentionType::kEncoderOnly ? 0 : 1;
  p.is_decode = decode ? 1 : 0;
  p.sliding_window = detail::kernel_sliding_window(layer.sliding_window, batch);
  p.logit_cap = layer.logit_cap;
  // The stored row is x / k_scale for both K and its V columns.
  p.sm_scale = layer.scaling * layer.k_scale;
  p.v_scale = layer.k_scale;
  if (layer.sinks.defined()) p.sinks = layer.sinks.data_as<const float>();
  int grid_splits = 1;
  if (decode) {
    p.max_splits = mla_grid_splits_ > 1 ? mla_max_splits_ : 1;
    p.min_chunk = triton::kMinChunk;
    p.partial_out = plan_.partial_out;
    p.partial_lse = plan_.partial_lse;
    grid_splits = p.max_splits > 1 ? mla_grid_splits_ : 1;
  } else {
    const int bs = batch.batch_size;
    p.q_start = mla_q_layout_.data();
    p.q_len = mla_q_layout_.data() + bs;
    p.has_new_keys = 1;
    p.new_slots = mla_new_slots_.data();
    if (batch.mode == ForwardMode::kTargetVerify && batch.spec.custom_mask.defined()) {
      p.custom_mask = batch.spec.custom_mask.data_as<const uint8_t>();
      p.mask_indptr = batch.spec.mask_indptr.data_as<const int64_t>();
    }
  }
  return flashinfer::run_mla_quantized_portable(p, q.dtype, kv_dtype, !decode, grid_splits, stream);
}

// ---- CUDA graphs (decode and target verify) ----

Status FlashInferBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx_.stream, ctx_.device, "BackendContext.stream"));
  if (max_bs < 1 || max_num_tokens < max_bs) {
    return Status::invalid_argument(name_ + ": init_cuda_graph_state(max_bs " + str(max_bs) +
                                    ", max_num_tokens " + str(max_num_tokens) +
                                    ") needs max_bs >= 1 and max_num_tokens >= max_bs");
  }
  if (!ctx_portable_reason_.empty()) {
    ATTNKIT_RETURN_IF_ERROR(portable_or_error(ctx_portable_reason_.c_str()));
    if (mla_engine_ != nullptr) {
      ATTNKIT_RETURN_IF_ERROR(mla_engine_->init_graph(max_bs, max_num_tokens));
    }
    graph_portable_ = true;
    graph_ready_ = true;
    return portable_->init_cuda_graph_state(max_bs, max_num_tokens);
  }
  const PlanConfig cfg = plan_config(TileShape::kDecode, true);
  graph_items_ = flashinfer::max_decode_items(max_bs, cfg);
  // Target verify (N = speculative_num_draft_tokens, or max_num_tokens / max_bs when unset).
  const int n = ctx_.speculative_num_draft_tokens > 0 ? ctx_.speculative_num_draft_tokens
                                                      : max_num_tokens / max_bs;
  graph_items_ = std::max(graph_items_, verify_items(max_bs, n));
  graph_verify_drafts_ = n;
  graph_captures_.clear();
  int64_t words = WorkPlan::words_for(max_bs, graph_items_);
  // WorkItem plans: decode partial rows <= items, each Hq entries wide; verify's split plans
  // verify_partial_entries.
  int64_t partial_entries = std::max(graph_items_ * ctx_.num_q_heads, verify_partial_entries(n));
  if (balanced_kernel()) {  // the balanced decode plan's bounds (balanced_plan.h)
    // The slots grow with bs (balanced_kernel_slots), and so do the bounds.
    const flashinfer::BalanceConfig bc = balance_config(max_bs);
    const flashinfer::BalancedBounds b = flashinfer::balanced_plan_bounds(max_bs, bc);
    words = std::max(words, b.words);
    partial_entries =
        std::max(partial_entries, flashinfer::balanced_graph_partial_entries(graph_items_, bc, b));
    if (balance_ == Balance::kAuto) {  // the default plan in the balanced format
      words = std::max(words, flashinfer::encoded_plan_words(max_bs, graph_items_, bc));
    }
  }
  ATTNKIT_RETURN_IF_ERROR(graph_words_.reserve(ctx_.device, words));
  if (balance_ == Balance::kAuto) {
    ATTNKIT_RETURN_IF_ERROR(
        graph_work_words_.reserve(ctx_.device, WorkPlan::words_for(max_bs, graph_items_)));
  }
  // An all-zero plan (no work items) until the first replay writes one.
  ATTNKIT_CUDA_TRY(
      cudaMemset(graph_words_.data(), 0, static_cast<size_t>(words) * sizeof(int32_t)));
  graph_partial_entries_ = partial_entries;
  ATTNKIT_RETURN_IF_ERROR(
      graph_partial_out_.reserve(ctx_.device, partial_entries * ctx_.v_head_dim));
  ATTNKIT_RETURN_IF_ERROR(graph_partial_lse_.reserve(ctx_.device, partial_entries));
  stats_.graph_partial_bytes =
      partial_entries * (ctx_.v_head_dim + 1) * static_cast<int64_t>(sizeof(float));
  // Decode's counters, or a decode-tile verify's (its q tiles per request).
  graph_split_counter_count_ =
      max_bs * std::max(decode_counters_per_request(),
                        decode_counters_per_request(verify_decode_tiles(n), std::max(n, 1)));
  ATTNKIT_RETURN_IF_ERROR(cuda::reserve_zeroed_counters(graph_split_counters_, ctx_.device,
                                                        graph_split_counter_count_, nullptr));
  ATTNKIT_CUDA_TRY(cudaDeviceSynchronize());  // the counters are zero before any capture
  graph_max_bs_ = max_bs;
  graph_ready_ = true;
  graph_portable_ = false;
  return Status::ok();
}

Status FlashInferBackend::init_forward_metadata_capture_cuda_graph(
    int bs, int num_tokens, const TensorView& req_pool_indices, const TensorView& seq_lens,
    const TensorView& encoder_lens, ForwardMode mode, const SpecInfo* spec) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx_.stream, ctx_.device, "BackendContext.stream"));
  if (!graph_ready_)
    return Status::invalid_argument(name_ + ": init_cuda_graph_state was not called");
  ATTNKIT_RETURN_IF_ERROR(
      check_graph_inputs(name_, bs, req_pool_indices, seq_lens, encoder_lens, ctx_.device));
  prefix_cache_.drop_plan();  // graphs capture no prefix mode (mla_prefix_cache.h)
  // Nor a non-absorbed MLA prefill layer (before the early returns: MLA contexts take them).
  if (sm90_mla_prefill_ != nullptr) sm90_mla_prefill_->drop_plan();
  if (graph_mla_native(encoder_lens, mode, spec)) {
    plan_ = Plan{};
    plan_.valid = true;
    plan_.mla_native = true;
    plan_.mode = mode;
    plan_.bs = bs;
    return mla_engine_->plan_graph(bs, seq_lens, mode, spec, ctx_.stream, /*capture=*/true);
  }
  if (graph_portable_) {
    ATTNKIT_RETURN_IF_ERROR(portable_->init_forward_metadata_capture_cuda_graph(
        bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, mode, spec));
    plan_ = Plan{};
    plan_.valid = true;
    plan_.portable = true;
    plan_.mode = mode;
    plan_.bs = bs;
    return Status::ok();
  }
  if (mode != ForwardMode::kDecode && mode != ForwardMode::kTargetVerify) {
    return Status::unsupported((name_ + ": CUDA graphs cover decode and target_verify, not ") +
                               forward_mode_name(mode));
  }
  if (encoder_lens.defined()) {
    return Status::unsupported(name_ + ": CUDA graphs with encoder lengths are not supported");
  }
  if (bs < 1 || bs > graph_max_bs_) {
    return Status::invalid_argument(name_ + ": graph batch size " + str(bs) + " is outside [1, " +
                                    str(graph_max_bs_) + "]");
  }
  cascade_.reset();  // graphs run the plain plan
  if (sm90_prefill_ != nullptr) sm90_prefill_->drop_plan();
  // Nothing is copied here (this may run inside the capture): the kernels read the plan from
  // the fixed workspace, which every replay rewrites before the graph launches.
  plan_ = Plan{};
  plan_.valid = true;
  plan_.mode = mode;
  plan_.bs = bs;
  plan_.shape = TileShape::kDecode;
  if (mode == ForwardMode::kTargetVerify) {
    // Verify runs the tiles and split plan eager verify runs (verify_decode_tiles,
    // verify_plan_config): up to verify_items CTAs per kv head (the unsplit bs x q tiles, or the
    // split target); on prefill tiles the merge after the kernel is captured too (it leaves the
    // tokens of requests a replay's plan keeps whole), on decode tiles the kernel merges, so a
    // replay computes what eager computes.
    const int n = draft_tokens(spec);
    if (n < 1 || static_cast<int64_t>(bs) * n > num_tokens) {
      return Status::invalid_argument(
          name_ + ": target_verify graph of bs " + str(bs) +
          " needs spec.draft_token_num >= 1 with bs * N <= num_tokens " + str(num_tokens) +
          ", got N " + str(n));
    }
    const int64_t items = verify_items(bs, n);
    if (items > graph_items_) {
      return Status::invalid_argument(
          name_ + ": target_verify graph of bs " + str(bs) + " x " + str(n) + " drafts needs " +
          str(items) + " work items, above the " + str(graph_items_) +
          " init_cuda_graph_state sized (set speculative_num_draft_tokens or max_num_tokens)");
    }
    // The split replays' partial rows (splits x N): refused here rather than at a replay.
    if (verify_partial_entries(n) > graph_partial_entries_) {
      return Status::invalid_argument(
          name_ + ": target_verify graph of bs " + str(bs) + " x " + str(n) + " drafts needs " +
          str(verify_partial_entries(n)) + " split partial entries, above the " +
          str(graph_partial_entries_) +
          " init_cuda_graph_state sized for its draft count (set speculative_num_draft_tokens or "
          "max_num_tokens)");
    }
    // A decode-tile verify's split counters: within those init_cuda_graph_state reserved.
    const int64_t counters = static_cast<int64_t>(bs) * decode_counters_per_request(true, n);
    if (verify_decode_tiles(n) && counters > graph_split_counter_count_) {
      return Status::invalid_argument(
          name_ + ": target_verify graph of bs " + str(bs) + " x " + str(n) + " drafts needs " +
          str(counters) + " split counters, above the " + str(graph_split_counter_count_) +
          " init_cuda_graph_state sized for " + str(graph_verify_drafts_) +
          " drafts (set speculative_num_draft_tokens or max_num_tokens)");
    }
    if (verify_decode_tiles(n)) {
      plan_verify_on_decode_tiles(n);
    } else {
      plan_.shape = TileShape::kPrefill;
      plan_.split = true;
    }
    plan_.grid_items = static_cast<int>(items);
  } else if (balanced_kernel()) {
    // One CTA per slot, every replay (the replay's cut or encoded plan has the same slots).
    plan_.balance_slots = balance_config(bs).slots;
    // =auto: counted as encoded (each replay picks its plan).
    plan_.balance_cut = balance_ == Balance::kAlways;
    plan_.grid_items = plan_.balance_slots;
  } else {
    // The bound of a plan of this graph's bs requests, not of init_cuda_graph_state's max_bs: a
    // grid sized for max_bs (an engine passes e.g. 256) would launch mostly padding CTAs at small
    // bs (bs 16: 2048 CTAs, 1920 of them exiting at once), and padded graph grids were measured
    // slower (H200 15:34Z: b12-b15 kv4k graph replays 25-30% slower than eager with 8-32 padding
    // CTAs).
    plan_.grid_items = static_cast<int>(std::min<int64_t>(
        graph_items_, flashinfer::max_decode_items(bs, plan_config(TileShape::kDecode, true))));
  }
  plan_.words = graph_words_.data();
  plan_.partial_out = graph_partial_out_.data();
  plan_.partial_lse = graph_partial_lse_.data();
  plan_.split_counters = graph_split_counters_.data();
  plan_.graph = true;
  plan_.num_tokens = num_tokens;
  graph_captures_.record(mode, bs, mode == ForwardMode::kTargetVerify ? draft_tokens(spec) : 1,
                         plan_.grid_items);
  return Status::ok();
}

Status FlashInferBackend::replay_device_plan(int bs, int slots) {
  const WorkPlan& wp = work_plan_;
  const flashinfer::BalanceConfig bc = balance_config(bs);
  const int64_t entries = balanced_partial_entries(flashinfer::encoded_plan_partials(wp, bc));
  if (entries > graph_partial_entries_) {  // bounded at init (balanced_graph_partial_entries)
    return Status::internal(name_ + ": replay's encoded plan needs " + str(entries) +
                            " partial entries, above the graph workspace's " +
                            str(graph_partial_entries_));
  }
  const int64_t words =
      flashinfer::encoded_plan_words(bs, static_cast<int64_t>(wp.items.size()), bc);
  if (words > graph_words_.capacity || wp.serialized_words() > graph_work_words_.capacity) {
    return Status::internal(name_ + ": replay's encoded plan needs " + str(words) + " + " +
                            str(wp.serialized_words()) + " words, above the graph workspace's " +
                            str(graph_words_.capacity) + " + " + str(graph_work_words_.capacity));
  }
  ATTNKIT_RETURN_IF_ERROR(staging_.upload(wp, graph_work_words_.data(), ctx_.stream));
  flashinfer::PlanExpandParams p;
  p.work_words = graph_work_words_.data();
  p.bs = bs;
  p.items = static_cast<int>(wp.items.size());
  p.heads = ctx_.num_kv_heads;
  p.q_tiles = decode_q_tiles();
  p.slots = slots;
  p.out = graph_words_.data();
  ATTNKIT_RETURN_IF_ERROR(flashinfer::expand_encoded_plan(p, ctx_.stream));
  ++stats_.graph_device_plans;
  return Status::ok();
}

Status FlashInferBackend::replay_plan_from_lengths(int bs, const int32_t* seq_lens_host,
                                                   int captured_slots, bool* done) {
  *done = false;
  const PlanConfig pc = plan_config(TileShape::kDecode, true);
  if (balance_ != Balance::kAuto || device_plan_ == 0 || pc.split_long || bs < 1 ||
      bs > flashinfer::kPlanLengthsMax) {
    return Status::ok();
  }
  const int heads = ctx_.num_kv_heads;
  const int q_tiles = decode_q_tiles();
  const int64_t items = static_cast<int64_t>(bs) * q_tiles;
  const int64_t ctas = items * heads;
  const flashinfer::BalanceConfig bc = balance_config(bs);
  const int slots = bc.slots;
  if (slots != captured_slots) return Status::ok();  // the host path says why
  // Too small for either GPU path (below, by the plan's kind): the host plans, and decides, alone.
  if (device_plan_ == 1 && ctas < kLengthPlanMinCtas && slots < kDeviceCutMinSlots) {
    return Status::ok();
  }
  flashinfer::PlanFromLengthsParams& p = lengths_params_;
  int64_t keys = 0;
  int32_t longest = 0, shortest = seq_lens_host[0];
  for (int r = 0; r < bs; ++r) {
    const int32_t len = seq_lens_host[r];
    p.kv_len[r] = len;
    keys += len;
    longest = std::max(longest, len);
    shortest = std::min(shortest, len);
  }
  // build_work_plan splits only below its per-head CTA target with a request longer than
  // kMinSplitChunk; a length < 1 is refused by the host planner, by name.
  if (shortest < 1 || (items < pc.target_ctas / heads && longest > flashinfer::kMinSplitChunk)) {
    return Status::ok();
  }
  const flashinfer::AutoPlanChoice choice = flashinfer::choose_auto_plan(
      flashinfer::judge_balance(items, keys * q_tiles, longest, heads, pc.target_ctas), slots);
  p.bs = bs;
  p.heads = heads;
  p.q_tiles = q_tiles;
  p.slots = slots;
  p.granule = bc.granule;
  p.out = graph_words_.data();
  if (choice.cut) {
    // The cut plan on one CTA (kernels/plan_expand.h cut_plan_from_lengths), where the host's would
    // cost more than the launch and its chunks hold >= granule keys (the rule cuts only with >=
    // kMinSplitChunk per slot).
    if ((device_plan_ == 1 && slots < kDeviceCutMinSlots) ||
        keys * q_tiles * heads / slots < p.granule ||
        flashinfer::cut_plan_smem_bytes(bs, heads, q_tiles, slots) >
            flashinfer::cut_plan_max_smem()) {
      return Status::ok();
    }
    // The plan's bounds (the graph workspace is sized by those of max_bs at init).
    const flashinfer::BalancedBounds bounds = flashinfer::balanced_plan_bounds(bs, bc);
    const int64_t entries = balanced_partial_entries(bounds.partials);
    if (bounds.words > graph_words_.capacity || entries > graph_partial_entries_) {
      return Status::internal(name_ + ": replay's cut plan may need " + str(bounds.words) +
                              " words and " + str(entries) +
                              " partial entries, above the graph workspace's " +
                              str(graph_words_.capacity) + " and " + str(graph_partial_entries_));
    }
    ATTNKIT_RETURN_IF_ERROR(flashinfer::cut_plan_from_lengths(p, ctx_.stream));
    ++stats_.graph_device_cut_plans;
  } else {
    // The encoded default plan (one CTA per slot, or several past the slot cap), from
    // kLengthPlanMinCtas CTAs.
    if (device_plan_ == 1 && ctas < kLengthPlanMinCtas) return Status::ok();
    const int64_t words = flashinfer::encoded_plan_words(bs, items, bc);
    if (words > graph_words_.capacity) {
      return Status::internal(name_ + ": replay's encoded plan needs " + str(words) +
                              " words, above the graph workspace's " + str(graph_words_.capacity));
    }
    ATTNKIT_RETURN_IF_ERROR(flashinfer::expand_plan_from_lengths(p, ctx_.stream));
    ++stats_.graph_device_plans;
    ++stats_.graph_length_plans;
  }
  *done = true;
  return Status::ok();
}

Status FlashInferBackend::init_forward_metadata_replay_cuda_graph(
    int bs, const TensorView& req_pool_indices, const TensorView& seq_lens, int64_t seq_lens_sum,
    const TensorView& encoder_lens, ForwardMode mode, const SpecInfo* spec,
    const int32_t* seq_lens_host) {
  const DeviceScope scope(ctx_.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  if (!graph_ready_)
    return Status::invalid_argument(name_ + ": init_cuda_graph_state was not called");
  ATTNKIT_RETURN_IF_ERROR(
      check_graph_inputs(name_, bs, req_pool_indices, seq_lens, encoder_lens, ctx_.device));
  // Verify: the drafts follow seq_lens in the rows. Their count as the paths below take it (this
  // backend's draft_tokens, the MLA engine's s_q: 1 without a spec), the larger of the two.
  const int replay_drafts =
      mode == ForwardMode::kTargetVerify
          ? std::max({draft_tokens(spec), spec != nullptr ? spec->draft_token_num : 0, 1})
          : 0;
  ATTNKIT_RETURN_IF_ERROR(check_graph_table_slots(name_, ctx_.req_to_token_pool, ctx_.kv_pool, bs,
                                                  req_pool_indices, seq_lens_host, replay_drafts,
                                                  ctx_.stream));
  prefix_cache_.drop_plan();
  if (sm90_mla_prefill_ != nullptr) sm90_mla_prefill_->drop_plan();
  plan_.replay = true;  // from here the plan's buffers are the replayed batch's
  if (graph_mla_native(encoder_lens, mode, spec)) {
    ATTNKIT_RETURN_IF_ERROR(check_graph_lengths(
        name_, bs, seq_lens_host,
        mode == ForwardMode::kTargetVerify && spec != nullptr ? spec->draft_token_num : 0,
        graph_rows()));
    return mla_engine_->plan_graph(bs, seq_lens, mode, spec, ctx_.stream, /*capture=*/false);
  }
  if (graph_portable_) {
    return portable_->init_forward_metadata_replay_cuda_graph(
        bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, spec, seq_lens_host);
  }
  const bool verify = mode == ForwardMode::kTargetVerify;
  const int n = verify ? draft_tokens(spec) : 1;
  // The grid captured for this (mode, bs) (init_forward_metadata_capture_cuda_graph).
  ATTNKIT_ASSIGN_OR_RETURN(const int grid, graph_captures_.check_replay(name_, mode, bs, n));
  if (seq_lens_host == nullptr) {
    return Status::invalid_argument(
        name_ + ": replay needs seq_lens_host (the split plan is computed on the host)");
  }
  // The same requests and planner as eager init_forward_metadata, so every CTA does the same work.
  ATTNKIT_RETURN_IF_ERROR(
      check_graph_lengths(name_, bs, seq_lens_host, verify ? n : 0, graph_rows()));
  std::vector<PlanRequest>& reqs = plan_requests_;
  reqs.resize(static_cast<size_t>(bs));
  for (int r = 0; r < bs; ++r) {
    // verify: seq_lens counts the cached prefix, the N drafts follow it.
    reqs[static_cast<size_t>(r)] = PlanRequest{r * n, n, seq_lens_host[r] + (verify ? n : 0)};
  }
  if (!verify && balanced_kernel()) {
    bool from_lengths = false;
    ATTNKIT_RETURN_IF_ERROR(replay_plan_from_lengths(bs, seq_lens_host, grid, &from_lengths));
    if (from_lengths) return Status::ok();
    bool cut = false;
    bool split_long = false;
    bool padded = false;
    ATTNKIT_RETURN_IF_ERROR(choose_balanced_plan(reqs, &cut, &split_long, &padded));
    // The encoded default plan (split plans of small batches; plans of more than 1000 requests;
    // replay_plan_from_lengths serves the rest), large enough: the work plan goes up (16 KB at bs
    // 256 instead of 80 KB) and the GPU writes the balanced plan from it, word for word the
    // host's.
    if (balance_ == Balance::kAuto && !cut && !padded) {  // work_plan_ is this forward's
      const int slots = balance_config(bs).slots;
      const int64_t ctas = static_cast<int64_t>(work_plan_.items.size()) * ctx_.num_kv_heads;
      const bool device_plan =
          device_plan_ == 2 || (device_plan_ == 1 && ctas >= kDevicePlanMinCtas);
      if (device_plan && slots == grid) {
        return replay_device_plan(bs, slots);
      }
    }
    ATTNKIT_RETURN_IF_ERROR(build_chosen_balanced_plan(reqs, cut));
    const flashinfer::BalancedPlan& bp = balanced_plan_;
    if (bp.slots() != grid) {  // the same function of bs: cannot happen
      return Status::internal(name_ + ": replay's balanced plan has " + str(bp.slots()) +
                              " slots, its graph was captured with " + str(grid));
    }
    const int64_t entries = balanced_partial_entries(bp.num_partials);
    if (entries > graph_partial_entries_) {  // bounded at init (balanced_graph_partial_entries)
      return Status::internal(name_ + ": replay's balanced plan needs " + str(entries) +
                              " partial entries, above the graph workspace's " +
                              str(graph_partial_entries_));
    }
    if (bp.serialized_words() > graph_words_.capacity) {
      return Status::internal(name_ + ": replay's balanced plan needs " +
                              str(bp.serialized_words()) + " words, above the graph workspace's " +
                              str(graph_words_.capacity));
    }
    return staging_.upload(bp, graph_words_.data(), ctx_.stream);
  }
  ATTNKIT_RETURN_IF_ERROR(flashinfer::build_work_plan(
      reqs, verify ? verify_plan_config(n) : plan_config(TileShape::kDecode, true), &work_plan_));
  const WorkPlan& wp = work_plan_;
  if (static_cast<int64_t>(wp.num_partials) * ctx_.num_q_heads > graph_partial_entries_) {
    return Status::internal(name_ + ": replay plan needs " + str(wp.num_partials) +
                            " partial rows of " + str(ctx_.num_q_heads) +
                            " heads, above the graph workspace's " + str(graph_partial_entries_) +
                            " entries");
  }
  // A plan with more items than the captured grid would have CTAs missing.
  if (static_cast<int64_t>(wp.items.size()) > grid) {
    return Status::invalid_argument(
        name_ + ": " + std::string(forward_mode_name(mode)) + " replay of bs " + str(bs) +
        (verify ? " x " + str(n) + " drafts" : std::string()) + " plans " + str(wp.items.size()) +
        " work items, above the " + str(grid) + " CTAs per kv head its graph was captured with");
  }
  if (wp.serialized_words() > graph_words_.capacity) {
    return Status::internal(name_ + ": replay plan needs " + str(wp.serialized_words()) +
                            " words, above the graph workspace's " + str(graph_words_.capacity));
  }
  return staging_.upload(wp, graph_words_.data(), ctx_.stream);
}

// "" when a prefill tile fits the device's opt-in shared memory per block (prefill_fit) for the
// context's pool dtype, or, without a pool, for KV of the q dtype and fp8 alike; else the reason
// (d 256 on sm_86 / sm_89: the whole context then runs the portable path, decode included, so that
// a verify graph captures the path its eager forward runs).
std::string prefill_smem_reason(const BackendContext& ctx, int optin) {
  const int d = ctx.qk_head_dim;
  const bool pool_fp8 = ctx.kv_pool != nullptr && dtype_is_fp8(ctx.kv_pool->dtype());
  const bool pool_native = ctx.kv_pool != nullptr && !pool_fp8;
  for (const bool quant : {false, true}) {
    if ((quant && pool_native) || (!quant && pool_fp8)) continue;
    if (flashinfer::prefill_fit(d, quant, optin) != flashinfer::PrefillFit::kNone) continue;
    const int need = flashinfer::prefill_smem_bytes(
        d, quant, flashinfer::prefill_tile_compact(d, /*native_kv=*/!quant));
    return "head_dim " + str(d) + (quant ? " with fp8 KV" : "") +
           ": the tensor-core prefill tile needs " + str(need) +
           " bytes of shared memory per block, this device allows " + str(optin);
  }
  return "";
}

}  // namespace

const FlashInferStats* flashinfer_stats(const AttentionBackend& backend) {
  const auto* fi = dynamic_cast<const FlashInferBackend*>(&backend);
  return fi != nullptr ? &fi->stats() : nullptr;
}

Status set_flashinfer_cascade(AttentionBackend& backend, const FlashInferCascadeOptions& options) {
  auto* fi = dynamic_cast<FlashInferBackend*>(&backend);
  if (fi == nullptr) {
    return Status::invalid_argument("set_flashinfer_cascade: backend " +
                                    std::string(backend.descriptor().name) +
                                    " is not a flashinfer backend");
  }
  if (options.min_batch < 0 || options.min_shared_prefix < 0) {
    return Status::invalid_argument("set_flashinfer_cascade: min_batch " + str(options.min_batch) +
                                    " and min_shared_prefix " + str(options.min_shared_prefix) +
                                    " must be >= 0");
  }
  fi->cascade_options = options;
  return Status::ok();
}

Result<std::unique_ptr<AttentionBackend>> create_flashinfer_backend(const BackendContext& ctx) {
  return create_flashinfer_backend_with(ctx, FlashInferOptions{});
}

Result<std::unique_ptr<AttentionBackend>> create_flashinfer_backend_with(
    const BackendContext& ctx, const FlashInferOptions& options) {
  if (!ctx.device.is_cuda()) {
    return Status::invalid_argument(options.name + ": BackendContext.device " +
                                    ctx.device.to_string() + " is not a CUDA device");
  }
  if (ctx.num_kv_heads < 1 || ctx.num_q_heads < 1 || ctx.num_q_heads % ctx.num_kv_heads != 0) {
    return Status::invalid_argument(options.name + ": num_q_heads " + str(ctx.num_q_heads) +
                                    " must be a positive multiple of num_kv_heads " +
                                    str(ctx.num_kv_heads));
  }
  cuda::DeviceAttributes attrs;
  ATTNKIT_RETURN_IF_ERROR(cuda::query_device_attributes(ctx.device.ordinal, &attrs));
  const int sm_count = attrs.sm_count;
  const int cc = attrs.compute_capability;

  // Context-level reasons for the portable path (per-forward ones: portable_reason()).
  std::string reason;
  if (cc < kMinComputeCapability) {
    reason = "compute capability " + str(cc) + " < " + str(kMinComputeCapability);
  } else if (ctx.is_mla) {
    reason = "MLA";
  } else if (ctx.q_dtype != DType::kBF16 && ctx.q_dtype != DType::kF16) {
    reason = std::string("q dtype ") + dtype_name(ctx.q_dtype);
  } else if (ctx.qk_head_dim != ctx.v_head_dim) {
    reason = "qk_head_dim " + str(ctx.qk_head_dim) + " != v_head_dim " + str(ctx.v_head_dim);
  } else if (!flashinfer::NativeHeadDims::contains(ctx.qk_head_dim) ||
             !flashinfer::head_dim_compiled(ctx.qk_head_dim)) {
    reason = "head_dim " + str(ctx.qk_head_dim) + " (tensor-core head dims built: " +
             head_dims_built<flashinfer::NativeHeadDims>(
                 [](int d) { return flashinfer::head_dim_compiled(d); }) +
             ")";
  } else if (std::string fit = prefill_smem_reason(ctx, attrs.max_smem_per_block_optin);
             !fit.empty()) {
    reason = std::move(fit);
  }
  // The portable path serves those contexts, encoder batches and non-fp8 KV of another dtype.
  std::unique_ptr<AttentionBackend> portable;
  Result<std::unique_ptr<AttentionBackend>> made = create_triton_backend(ctx);
  if (made.is_ok()) {
    portable = std::move(made).value();
  } else if (!reason.empty()) {
    return Status(made.status().code(),
                  options.name + ": " + reason +
                      " needs the portable path, which failed: " + made.status().message());
  }
  // MLA decode on the shared tensor-core kernels where the device can run them.
  std::unique_ptr<mla::MlaDecodeEngine> mla_engine;
  if (ctx.is_mla) {
    constexpr int kTokenPage = 1;
    Result<std::unique_ptr<mla::MlaDecodeEngine>> engine =
        mla::MlaDecodeEngine::create(ctx, options.name, kTokenPage, /*allow_fp8=*/false);
    if (engine.is_ok()) mla_engine = std::move(engine).value();
  }
  // SM90 prefill on the wgmma kernel (nullptr elsewhere; ATTNKIT_FLASHINFER_SM90_PREFILL=0: off).
  std::unique_ptr<fa3::PrefillSm90Engine> sm90_prefill;
  if (reason.empty() && options.sm90_prefill && env_flag("ATTNKIT_FLASHINFER_SM90_PREFILL", true)) {
    sm90_prefill = fa3::PrefillSm90Engine::create(ctx, sm_count, cc, nullptr);
  }
  // MLA on SM90: the non-absorbed prefill layers (and the prefix cache's passes) on the wgmma
  // MLA kernel (same switches).
  std::unique_ptr<fa3::PrefillSm90Engine> sm90_mla_prefill;
  if (ctx.is_mla && options.sm90_prefill && env_flag("ATTNKIT_FLASHINFER_SM90_PREFILL", true)) {
    sm90_mla_prefill = fa3::PrefillSm90Engine::create_mla_prefill(ctx, sm_count, cc, nullptr);
  }
  auto* fi =
      new FlashInferBackend(ctx, options.name, sm_count, cc, std::move(portable), std::move(reason),
                            std::move(mla_engine), std::move(sm90_prefill),
                            std::move(sm90_mla_prefill), options.mla_prefix_passes);
  fi->set_wgmma_partner(options.wgmma_partner);
  // ATTNKIT_FLASHINFER_CASCADE (for processes that cannot call set_flashinfer_cascade: the bench's
  // cascade A/B): 0 = off; 1 = on for fp8 KV and every forward mode too (the size thresholds of
  // FlashInferCascadeOptions stay); unset = FlashInferCascadeOptions{}.
  if (const std::string e =
          env_choice("ATTNKIT_FLASHINFER_CASCADE", {"0", "1"}, "FlashInferCascadeOptions{}");
      e == "0" || e == "1") {
    const bool on = e == "1";
    fi->cascade_options.enabled = on;
    fi->cascade_options.fp8_kv = on;
    fi->cascade_options.all_modes = on;
  }
  return std::unique_ptr<AttentionBackend>(fi);
}

}  // namespace attnkit

#endif  // ATTNKIT_WITH_CUDA
