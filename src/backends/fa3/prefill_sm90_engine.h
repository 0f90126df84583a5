// The SM90 wgmma prefill/extend kernel (kernels/prefill_sm90.cuh) behind a small plan/run
// interface, shared by the backends that route their SM90 prefill to it: `fa3` and `flashinfer`
// (as upstream FlashInfer runs its FA3-based templates for SM90 prefill). One engine per backend
// instance; the owning backend keeps its own kernels for everything the engine declines.
//
// What it covers (anything else: why_not / why_not_layer return the reason, non-empty):
// (create; create_mla_prefill makes the engine of an MLA context's non-absorbed prefill layers,
// described at it)
//  * context: SM90 with sm_90a code in the binary, MHA, q bf16 / f16, qk_head_dim == v_head_dim in
//    {64, 128, 256} (and in ATTNKIT_HEAD_DIMS);
//  * forward: extend / mixed / draft-extend (queries = the last q_len keys of each request), no
//    encoder (cross-attention) tokens, an MHA pool holding the q dtype (or fp8_e4m3 with bf16 q at
//    d 128 when created with allow_fp8_kv: the FP8 kernel), any page size;
//  * layer: not MLA / cross-attention, the context's shape, q / out / K / V rows 16-byte aligned.
//    Causal, or bidirectional for encoder-only layers. A sliding window, soft-cap or sinks run the
//    kernels' variant instantiations (PrefillTraits::kVariant; the FP8 kernel's on its
//    three-warpgroup plan and the two-warpgroup one of few queries per key,
//    fp8_plan_takes_variants), without the tail split.
//
// Protocol: plan() once per forward (host tile plan, sorted longest-first, uploaded into a
// grow-only device workspace); run() per layer after the caller has written the layer's new K/V
// into the pool (save_kv). drop_plan() forgets the plan (CUDA-graph capture: graphs never run it).
//
// The ATTNKIT_FA3_* experiment variables (PINGPONG, TMA, FENCE_TMA, OVERLAP, SCHED, LAZY_RESCALE,
// BLOCK_N, WG3, SPLIT, L2_SECTION, DIAG, and for the MLA engine SPLIT_EMPTY; read by create /
// create_mla_prefill (read_kernel_knobs), docs/perf/fa3_notes.md) steer this one
// kernel, so they apply to `flashinfer`'s SM90 prefill as well as to `fa3`. They are not API; DIAG
// gives wrong results on purpose (timing diagnostics) and must never be set outside a measurement.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "backend/device_array.h"
#include "backends/fa3/kernels/fa3_params.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "backends/mla/mla_prefix_cache.h"

namespace attnkit::fa3 {

class PrefillSm90Engine final : public mla::MlaPrefixPassKernel {
 public:
  // The engine for ctx on a device of compute capability cc with sm_count SMs, or nullptr with the
  // reason in *why_not when the context can never use it.
  // allow_fp8_kv: forwards over an fp8_e4m3 pool with bf16 q at head dim 128 run the FP8 kernel
  // (kernels/prefill_sm90_fp8.cuh: e4m3 Q per row, e4m3 P, both GEMMs on e4m3 wgmma; the fa3
  // backend; ATTNKIT_FA3_FP8=0 turns it off); false: such forwards are declined.
  static std::unique_ptr<PrefillSm90Engine> create(const BackendContext& ctx, int sm_count, int cc,
                                                   std::string* why_not, bool allow_fp8_kv = false);
  // The engine of an MLA context's non-absorbed prefill layers (qk 192 = nope 128 + rope 64, v 128,
  // kv heads = q heads, bf16 / f16; the kernel of fa3_kernels.h's run_prefill_sm90_mla): the new
  // tokens attend each other, causal (decoder layers only), K / V read from the layer's k / v
  // inputs (the pool is neither read nor written), as the portable kernels run such a layer without
  // AttentionLayer::mla_prefix. Forwards: extend / draft-extend over an MLA pool of any
  // dtype, no encoder tokens (mixed batches refuse such layers: validate_forward_inputs). Layers:
  // run_mla (why_not_mla_layer); the other entry points decline every layer. nullptr with *why_not
  // when the context can never use it.
  static std::unique_ptr<PrefillSm90Engine> create_mla_prefill(const BackendContext& ctx,
                                                               int sm_count, int cc,
                                                               std::string* why_not);

  // "" when the forward qualifies (mode, pool, encoder tokens).
  std::string why_not(const ForwardBatch& batch) const;
  // Plans the forward when it qualifies, else drops any previous plan; planned() says which.
  Status plan(const ForwardBatch& batch, StreamHandle stream);
  void drop_plan() {
    planned_ = false;
    planned_small_extend_ = false;
    partition_.clear();
    overlap_reserve_ = 0;
    last_run_overlapped_ = false;
  }
  bool planned() const { return planned_; }
  // The planned forward's partition (backend/small_extend.h extend_partition): one flag per
  // request, 1 for those left to flashinfer's decode tiles (this plan gives them no rows); empty
  // when the plan holds every request. A flashinfer backend that runs the flagged requests reads it
  // after plan() (FlashInferOptions::wgmma_partner for fa3's inner one).
  const std::vector<uint8_t>& partition() const { return partition_; }
  bool partitioned() const { return planned_ && !partition_.empty(); }
  // The SMs the planned partitioned forward leaves to the decode tiles while its wgmma kernel
  // runs (backend/small_extend.h partition_overlap_reserve; 0: the two kernels run one after the
  // other). The kernel's grid is then min(units, sm_count - reserve), without the tail split.
  int planned_overlap_reserve() const { return partitioned() ? overlap_reserve_ : 0; }
  // Whether the last run() launched the wgmma kernel with its dependents released at its start
  // (Fa3Params::trigger_dependents): the decode tiles that follow it in the stream may then start
  // beside it (PagedParams::decode_overlap), and must wait for it before they complete.
  bool last_run_overlapped() const { return last_run_overlapped_; }

  // "" when this layer of the planned forward can run on the kernel.
  std::string why_not_layer(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                            const ForwardBatch& batch) const;
  // "" when this layer of a forward with few new tokens per request (backend/small_extend.h: the
  // engine planned nothing, flashinfer's tiles run it) has an e4m3 q that the caller may widen to
  // bf16 for those tiles (kernels/q_widen.h): the inputs the FP8 kernel took (an fp8_e4m3 pool,
  // allow_fp8_kv, the context's shape, bf16 out, 16-byte q rows).
  std::string why_not_small_extend_e4m3_q(const TensorView& q, const TensorView& out,
                                          const AttentionLayer& layer,
                                          const ForwardBatch& batch) const;
  // Whether the planned forward has few new tokens per request (small_extend.h; planned() false).
  bool planned_small_extend() const { return planned_small_extend_; }
  // Runs one layer (why_not_layer must be ""): the pool already holds every key.
  Status run(const TensorView& q, const TensorView& out, const TensorView& lse,
             const AttentionLayer& layer, const ForwardBatch& batch, StreamHandle stream);
  // create_mla_prefill engines: "" when this non-absorbed MLA layer of the planned forward runs
  // on the kernel (192 / 128 dims, the context's q heads, q / out in the q dtype, k / v
  // [T, H, 192 / 128] with unit innermost stride and 16-byte rows, no window / soft-cap / sinks,
  // no AttentionLayer::mla_prefix), and the run.
  std::string why_not_mla_layer(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const AttentionLayer& layer,
                                const ForwardBatch& batch) const;
  Status run_mla(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const TensorView& lse, const AttentionLayer& layer,
                 const ForwardBatch& batch, StreamHandle stream);
  bool mla_prefill() const { return mla_; }
  // create_mla_prefill engines: the MLA chunked prefix cache's passes (mla_prefix_cache.h; the
  // fa3 backend hands the engine to the flashinfer backend it owns). Pass 0 is the plan above with
  // the layer's mask; chunk passes are bidirectional over the chunk's rows (request word kv_row),
  // every row written to the runner's f32 slot (Fa3Params::part_o), no tail split. Layers as
  // why_not_mla_layer takes them, encoder-only included (no tail split to test at v 128);
  // ATTNKIT_FA3_MLA_PREFIX=0 leaves the passes to the SIMT kernel.
  Status plan_prefix_passes(const ForwardBatch& batch, const mla::PrefixChunkLayout& layout,
                            StreamHandle stream) override;
  void drop_prefix_passes() override { passes_.planned = false; }
  std::string why_not_prefix_passes(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const AttentionLayer& layer,
                                    const ForwardBatch& batch) const override;
  Status run_prefix_pass(int pass, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const AttentionLayer& layer,
                         const ForwardBatch& batch, float* part_o, float* part_lse, bool merge,
                         StreamHandle stream) override;
  // Prefix passes run on the kernel since the engine was made (the fa3 backend's counters).
  int64_t prefix_passes_run() const { return prefix_passes_run_; }
  // Keys per block of the kernel this engine launches (default_block_n of the head dim, or
  // ATTNKIT_FA3_BLOCK_N where block_n_supported).
  int block_n() const { return block_n_; }
  // Query rows per tile of the planned forward (Fa3Params::block_m).
  int planned_block_m() const { return planned_block_m_; }
  // Whether the planned forward runs the FP8 kernel (an fp8_e4m3 pool, allow_fp8_kv).
  bool planned_fp8() const { return planned_ && planned_fp8_; }
  // The variant of the planned FP8 forward (choose_fp8_variant: 192-key blocks by default for a
  // request of 8192+ keys with the V^T pre-transpose and the speculative softmax).
  const Fp8Variant& planned_fp8_variant() const { return fp8_variant_; }
  int planned_fp8_block_n() const { return fp8_variant_.block_n; }
  // The tail split a layer of the planned forward runs with (choose_tail_split; causal: the
  // layer's mask), for the bf16 / f16 and the FP8 kernel alike.
  int planned_section_heads() const { return planned_ ? section_heads_ : 0; }
  TailSplit planned_tail_split(bool causal) const {
    return planned_ ? (causal ? split_causal_ : split_bidir_) : TailSplit{};
  }

 private:
  PrefillSm90Engine(const BackendContext& ctx, int sm_count) : ctx_(ctx), sm_count_(sm_count) {}
  // The ATTNKIT_FA3_* knobs every kernel of head dim d takes (the defaults of d), and dqk_ = dv_ =
  // d.
  void read_kernel_knobs(int d);
  // The launch parameters both run paths share (q / out / lse, plan, schedule knobs, Q by TMA,
  // tail split of the layer's mask); block_m: rows per tile (0: the planned forward's).
  Fa3Params base_params(const TensorView& q, const TensorView& out, const TensorView& lse,
                        const AttentionLayer& layer, const ForwardBatch& batch, int block_m = 0);
  // Why a non-absorbed MLA layer cannot run on the MLA kernel whatever the plan ("" = it can):
  // dims, heads, window / soft-cap / sinks, q / k / v dtype, k / v [num_tokens, heads, d] with
  // unit innermost stride and 16-byte rows, q rows aligned. why_not_mla_layer and
  // why_not_prefix_passes add their plans' conditions.
  std::string why_not_mla_shape(const TensorView& q, const TensorView& k, const TensorView& v,
                                const AttentionLayer& layer, const ForwardBatch& batch) const;
  // The MLA kernel's K / V parameters from the tensors k / v (their rows; TMA maps where they
  // encode).
  void set_mla_kv(Fa3Params& p, const TensorView& k, const TensorView& v) const;
  // Fa3Params::section_heads of a forward whose longest request with new tokens has max_kv_len
  // keys of elem_bytes (choose_section_heads; the MLA engine's one-head rule).
  int section_heads_for(int64_t max_kv_len, int elem_bytes) const;
  // The reserve of a partitioned forward (partition_ set): ATTNKIT_PARTITION_RESERVE, else
  // small_extend.h's model over the batch's lengths (fp8: the FP8 kernel's faster tiles).
  int choose_overlap_reserve(const ForwardBatch& batch, bool fp8) const;

  BackendContext ctx_;
  int sm_count_ = 0;
  // A/B knobs (environment, read once per engine): ATTNKIT_FA3_PINGPONG=0 (no GEMM alternation of
  // the consumer warpgroups), ATTNKIT_FA3_TMA=0 (cp.async gathers for every key block),
  // ATTNKIT_FA3_FENCE_TMA=0 (no proxy fence after TMA blocks), ATTNKIT_FA3_OVERLAP=0 (serial
  // schedule), ATTNKIT_FA3_SCHED=0 (plain-stride persistent schedule instead of the zigzag),
  // ATTNKIT_FA3_LAZY_RESCALE=0 (no lazy O rescale, Fa3Params::lazy_rescale; on by default),
  // ATTNKIT_FA3_EPI_WIDE=0 (4-byte O stores, Fa3Params::epi_wide),
  // ATTNKIT_FA3_UNIFORM_WG=0 (the kernel without the lane-0 warpgroup broadcast),
  // the FP8 kernel's ATTNKIT_FA3_FP8_GEMM_SUM / _VT_PRE / _SPEC / _BLOCK_N (fp8_knobs_,
  // tile_plan.h: Fp8Knobs, choose_fp8_variant; a forced value a forward cannot follow is reported
  // once on stderr),
  // ATTNKIT_FA3_BLOCK_N=<keys> (key block where instantiated for the head dim),
  // ATTNKIT_FA3_WG3=1 (d 64 with 128-key blocks: three consumer warpgroups, 192-row tiles),
  // ATTNKIT_FA3_DIAG=<bits> (diagnostics, wrong results; see Fa3Params::diag),
  // ATTNKIT_FA3_SPLIT=0 (no tail split) / =<n >= 2> (split the last round's units into up to n
  // pieces whenever they have the key blocks; choose_tail_split's `forced`),
  // ATTNKIT_FA3_L2_SECTION=auto (choose_section_heads' 32 MiB rule) / =<n> (n kv heads per
  // section); unset or 0: one section (units in tile-major order over all q heads).
  bool pingpong_ = true;
  bool tma_ = true;
  bool fence_tma_ = true;
  bool overlap_ = true;
  bool zigzag_ = true;
  bool lazy_rescale_ = true;
  bool epi_wide_ = true;
  bool uniform_wg_ = true;
  bool o_tma_ = true;      // ATTNKIT_FA3_O_TMA=0: register O stores only (Fa3Params::o_tma)
  bool q_tma_ = true;      // ATTNKIT_FA3_Q_TMA=0: Q by the cp.async gather (Fa3Params::q_tma)
  bool unit_smem_ = true;  // ATTNKIT_FA3_UNIT_SMEM=0: consumers decode the plan (::unit_smem)
  // ATTNKIT_FA3_FP8_HALF_DIAG=0: whole diagonal blocks (Fa3Params::fp8_half_diag).
  bool fp8_half_diag_ = true;
  // FP8 knobs (the speculative softmax: H200 09:38Z +5.5-7% over the exact step at causal 4k-16k
  // and bidir 8k).
  Fp8Knobs fp8_knobs_;
  bool warned_fp8_knob_ = false;  // a not-followed knob is reported once per engine
  int block_n_ = 128;
  // Query rows per tile of bf16 / f16 forwards (Fa3Params::block_m; 192: three consumer
  // warpgroups), ATTNKIT_FA3_WG3: d 64 with 128-key blocks 192 unless =0; d 128 with 128-key
  // blocks 192 with =1, 128 with =0, else 0: per forward by choose_block_m_d128; otherwise 128.
  int block_m_ = 128;
  int planned_block_m_ = 128;  // of the planned forward (FP8: Fp8Variant::block_m)
  // Where a request's tiles sit (tile_plan.h; ATTNKIT_FA3_TILE_ANCHOR, default kEnd).
  TileAnchor tile_anchor_ = TileAnchor::kEnd;
  int diag_ = 0;
  int split_forced_ = -1;     // ATTNKIT_FA3_SPLIT (-1: unset, the model decides)
  int section_forced_ = 0;    // ATTNKIT_FA3_L2_SECTION (0: unset, one section; -1: "auto")
  bool section_set_ = false;  // ATTNKIT_FA3_L2_SECTION is set (the MLA rule applies when not)

  bool fp8_kv_ = false;  // allow_fp8_kv and the context fits the FP8 kernel
  // create_mla_prefill: the MLA prefill engine (dims 192 / 128, kv heads = q heads, K / V from
  // the layer's inputs); dqk_ / dv_ / kv_heads_: the kernel's dims and kv heads (the context's
  // for the other engines).
  bool mla_ = false;
  bool split_empty_ = true;  // ATTNKIT_FA3_SPLIT_EMPTY=0: Fa3Params::split_empty off (MLA)
  int dqk_ = 0;
  int dv_ = 0;
  int kv_heads_ = 0;
  // why_not_layer's and why_not_small_extend_e4m3_q's shared checks ("" when they pass): the
  // layer's heads and head dims are the context's; an e4m3 q's rows are what the FP8 kernel reads
  // (3-dim, innermost stride 1, 16-byte rows) and out is in the context's q dtype.
  std::string why_not_layer_shape(const AttentionLayer& layer) const;
  std::string why_not_e4m3_q_rows(const TensorView& q, const TensorView& out) const;

  bool planned_ = false;
  bool planned_fp8_ = false;
  // The planned forward has few new tokens per request (backend/small_extend.h): why_not_layer
  // leaves its layers to flashinfer's decode / prefill tiles, an e4m3 q widened for them by the
  // caller (why_not_small_extend_e4m3_q); planned_ stays false. The bounds:
  // ATTNKIT_EXTEND_DECODE_ROWS and ATTNKIT_FA3_MIN_Q_LEN (read when the engine is created).
  bool planned_small_extend_ = false;
  int extend_decode_rows_ = 0;
  int min_q_len_ = 0;
  // ATTNKIT_EXTEND_PARTITION (read when the engine is created) and the planned forward's
  // partition (partition()): pools of the q dtype, and fp8_e4m3 pools on the FP8 kernel whose
  // plan takes a window / sinks / soft-cap (fp8_plan_takes_variants; else the forward stays
  // whole), so that every layer the kernel declines would be refused by the flashinfer kernels
  // as well.
  bool partition_on_ = true;
  std::vector<uint8_t> partition_;
  // ATTNKIT_PARTITION_OVERLAP / _RESERVE (read when the engine is created; small_extend.h) and
  // the planned forward's reserve (planned_overlap_reserve), the last run's launch
  // (last_run_overlapped).
  bool overlap_on_ = true;
  int reserve_forced_ = -1;
  int overlap_reserve_ = 0;
  bool last_run_overlapped_ = false;
  int plan_bs_ = 0;
  int plan_tokens_ = 0;  // batch.num_tokens: the tiles' query rows index q / out by the plan
  int num_tiles_ = 0;
  std::vector<int32_t> words_;
  DeviceArray<int32_t> plan_words_;
  // FP8 variant of the planned forward (default: the 128-key exact kernel) and the grow-only V^T
  // workspace of Fa3Params::vt_pre (kv heads x V^T units x 16 KB, rewritten by every layer).
  Fp8Variant fp8_variant_;
  DeviceArray<uint8_t> vt_ws_;
  // Tail split of the planned forward's causal and bidirectional layers, and the grow-only f32
  // workspace of their pieces (Fa3Params::split_o, then split_lse).
  TailSplit split_causal_, split_bidir_;
  int section_heads_ = 0;  // Fa3Params::section_heads of the planned forward
  DeviceArray<float> split_ws_;
  // The MLA chunked prefix cache's passes of the planned forward: plan words of every pass back to
  // back (host and device), each pass's first word, tiles and L2 section.
  struct PrefixPasses {
    bool planned = false;
    int bs = 0;
    int tokens = 0;
    std::vector<int32_t> words;
    std::vector<int64_t> offset;
    std::vector<int> tiles, sections;
    DeviceArray<int32_t> device;
  } passes_;
  bool prefix_passes_on_ = true;  // ATTNKIT_FA3_MLA_PREFIX=0: off
  // ATTNKIT_FA3_MLA_PREFIX_SKIP=0: the chunk passes also plan the requests without keys in their
  // chunk (mla_pass_requests' skip_empty; an all-masked tile per 128 rows, merged as a no-op).
  bool prefix_skip_empty_ = true;
  int64_t prefix_passes_run_ = 0;
};

}  // namespace attnkit::fa3
