// The data the fa3 backend's SM90 prefill kernel reads: the per-forward plan (requests and
// query tiles, written by the host planner into a device workspace) and the per-layer Params POD
// passed as `const __grid_constant__`. Plain C++ (no CUDA types), shared by host and device.
//
// Vocabulary:
//  * tile: block_m (kBlockM = 128, or 192) consecutive rows m0 .. m0 + block_m - 1 of one request
//    and one q head (64 rows per consumer warpgroup); only the rows in [0, q_len) are stored. Work
//    unit u = tile * num_q_heads + q head, so the q heads of one kv head are neighbours in the
//    schedule (their K/V reads share L2).
//  * key k of a request is decoder token k of its req_to_token row; its pool slot comes from the
//    page table read in place: slot(k) = req_to_token[row, k - k % page_size] + k % page_size.
//  * query i (0-based among the request's q_len new tokens) sits at position kv_len - q_len + i.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/common/tma_map.h"

namespace attnkit::fa3 {

inline constexpr int kBlockM = 128;  // query rows per tile (2 consumer warpgroups x 64)
// Keys per block of the pipeline (kBlockN), per head dim: the instantiated kernels are
//   d 64: 192 (default) and 128;  d 128: 128;  d 256: 80 (default) and 64.
// The O accumulators (d / 2 per thread), S (kBlockN / 2) and P (kBlockN / 4) share the consumers'
// 232 registers. d 256: 80 keys (2 shared-memory stages, FlashAttention-3's choice) measured 1.14x
// the 64-key block (docs/perf/fa3_notes.md, 2026-11-22 05:31Z). A 176-key block for
// bidirectional d 128 (2 stages) measured 0.66-0.77x the 128-key block (3 stages) and was dropped.
constexpr bool block_n_supported(int head_dim, int block_n) {
  switch (head_dim) {
    case 64:
      // 192 (default): Q K^T issued as an N=128 and an N=64 wgmma per k-step;
      // amortises the per-block fixed instructions over 1.5x the keys (session 7).
      return block_n == 128 || block_n == 192;
    case 128:
      return block_n == 128;
    case 256:
      return block_n == 64 || block_n == 80;
    default:
      return false;
  }
}
// The default key block of head dim d. d 64: 128 keys with three consumer warpgroups (192-row
// tiles, ATTNKIT_FA3_WG3, on by default), measured 1.09-1.25x the two-warpgroup 192-key kernel
// (H200 2026-11-23 10:38Z, causal B2 S8k 1.190 / 1.185 vs 1.384 / 1.378 ms; docs/perf/fa3_notes.md
// session 9); ATTNKIT_FA3_BLOCK_N=192 restores the session-7 default (192 keys beat 128 keys on
// two warpgroups 1.05-1.06x, H200 00:44Z).
constexpr int default_block_n(int head_dim) { return head_dim == 256 ? 80 : 128; }

// Consumer schedule (Fa3Params::overlap) when ATTNKIT_FA3_OVERLAP is unset: the intra-warpgroup
// overlap at d 64 / 128; the serial schedule at d 256, where it measured 1.31x faster (H200
// 2026-11-22 16:42Z, causal B2 S8k: 3.58 vs 4.70 ms; docs/perf/fa3_notes.md session 6).
constexpr bool default_overlap(int head_dim) { return head_dim != 256; }
// Ping-pong of the consumer warpgroups (Fa3Params::pingpong) when ATTNKIT_FA3_PINGPONG is unset:
// off at d 64, where it measured 1.2-2.7% slower in three A/B pairs (H200 16:42-16:44Z, causal
// B2 S8k 1.55-1.56 vs 1.57-1.60 ms), on elsewhere.
constexpr bool default_pingpong(int head_dim) { return head_dim != 64; }

// Rows per TMA box for a pool of `page_size` and key blocks of `block_n` (0: gather every block
// with cp.async). A box is one page, or the largest power of two dividing the key block when that
// is smaller (128-key blocks: one block of a larger page; 80-key blocks: 16 rows), so that a box
// never crosses a page; pages of fewer than 8 rows (or not a power of two) would break the
// 1024-byte alignment of the swizzled destination.
constexpr int tma_rows_for(int page_size, int block_n) {
  constexpr int kMinRows = 8;
  const bool pow2 = page_size > 0 && (page_size & (page_size - 1)) == 0;
  if (!pow2 || page_size < kMinRows) return 0;
  const int block_pow2 = block_n & -block_n;
  const int rows = page_size < block_pow2 ? page_size : block_pow2;
  return rows >= kMinRows ? rows : 0;
}

// The persistent schedule: the work unit CTA `cta` of `grid` takes in round `round` (units are
// sorted longest-first by the planner). zigzag: even rounds go 0..grid-1, odd rounds back, so the
// CTA that got a round's longest unit gets the next round's shortest; else a plain stride. A CTA
// stops at its first unit >= the unit count (later rounds only hold larger indices).
constexpr int schedule_unit(int round, int cta, int grid, bool zigzag) {
  return round * grid + ((zigzag && (round & 1)) ? grid - 1 - cta : cta);
}

// One past the last key a tile's rows may see: the tile whose first row is new token m0 (< 0 for
// a first tile anchored at the request's end) of a request with q_len new tokens and kv_len keys,
// block_m rows; causal: up to its last row's position (clipped to kv_len), else every key. The
// kernels' decode_tile, build_tile_plan's longest-first order and choose_tail_split's block counts
// all take it from here.
constexpr int tile_key_end(int kv_len, int q_len, int m0, int block_m, bool causal) {
  return causal ? std::min(kv_len, kv_len - q_len + m0 + block_m) : kv_len;
}

// L2 sections (Fa3Params::section_heads; FlashAttention-3's L2 swizzle): the q heads are taken
// section_heads at a time (whole kv-head groups), all tiles of one section before the next
// section, so that the K / V a round of CTAs reads (the section's kv heads) stays in L2. Unit u:
// section s = u / (num_tiles x section_heads), r = u - s x num_tiles x section_heads, tile =
// r / section_heads, head = s x section_heads + r % section_heads. With section_heads =
// num_q_heads (one section): tile = u / num_q_heads, head = u % num_q_heads.
struct TileHead {
  int tile, head;
};
// (int: the kernels' unit counts are int.)
constexpr TileHead unit_tile_head(int unit, int num_tiles, int section_heads) {
  const int per_section = num_tiles * section_heads;
  const int s = unit / per_section;
  const int r = unit - s * per_section;
  const int tile = r / section_heads;
  return {tile, s * section_heads + (r - tile * section_heads)};
}

// Tail split (Fa3Params::split_units / num_splits; the planner's choose_tail_split): the last
// split_units units of the unit list, those of the persistent schedule's last, partial round, each
// run as num_splits pieces over consecutive ranges of their key blocks, so that the round's idle
// CTAs share them; a merge kernel combines a unit's pieces by their LSE. Piece j of the split
// units (unit units - split_units + j / num_splits, part j % num_splits) is virtual unit
// units - split_units + j, so a schedule of virtual_units(...) units puts the pieces in the last
// round. num_splits never exceeds the key blocks of a split unit: every piece has >= 1 block.
constexpr int64_t virtual_units(int64_t units, int split_units, int num_splits) {
  return units + static_cast<int64_t>(split_units) * (num_splits - 1);
}
// First key block of part k (0 <= k <= num_splits; k = num_splits: n_blocks) of n_blocks blocks.
constexpr int split_block_begin(int n_blocks, int num_splits, int k) {
  return static_cast<int>(static_cast<int64_t>(k) * n_blocks / num_splits);
}

// Opaque copy of a CUtensorMap (cuda/common/tma_map.h).
using TmaDesc = cuda::TmaDesc;

// Plan layout (int32 words): [kPlanHeaderWords][bs x kRequestWords][tiles x kTileWords].
// Header: tile count, V^T units (the sum of vt_units(kv_len) over the requests with new tokens),
// 0, 0.
// Request: q_start, q_len, kv_len, vt_block (its first 16 KB unit in the FP8 kernel's V^T
// workspace: the V^T units of the requests before it; the MLA prefill kernel: kv_row, the row of
// p.k_pool / p.v_pool that holds the request's key 0, build_tile_plan's kv_rows). Tile: request, m0
// (its first new token; negative for a request's first tile when the tiles end at its last token
// (tile_plan.h, TileAnchor::kEnd): rows before token 0 are computed and never stored). Tiles are
// sorted by descending key count, so a persistent CTA's static stride over the list takes the
// longest work first.
inline constexpr int kPlanHeaderWords = 4;
// Keys per unit of the FP8 kernel's pre-transposed V^T workspace (one 128 d x 128 keys image).
inline constexpr int kVtBlockKeys = 128;
// Units a request of kv_len keys reserves: two per 192 keys, enough for either FP8 key block
// (128 keys: one unit per block; 192 keys: two units per block, the second half-filled).
constexpr int vt_units(int kv_len) { return 2 * ((kv_len + 191) / 192); }
inline constexpr int kRequestWords = 4;
inline constexpr int kTileWords = 2;

#if defined(ATTNKIT_FA3_TIMELINE)
// Fa3Params::timeline: rounds recorded per CTA and stamps per round. Events (prefill_sm90.cuh):
// consumer warpgroup g at 8 g + 0..7 (unit start, Q in registers, first K full, first S done,
// first P packed, key-block loop done, last P V done, O stored); producer at 16..21 (unit start,
// q_empty passed, Q issued, first stage empty, last stage empty, last block issued); 22: the
// unit's key blocks, 23: the unit index (values, not clocks).
inline constexpr int kTimelineRounds = 64;
inline constexpr int kTimelineEvents = 24;
// The FP8 kernel's three-warpgroup loop writes the same buffer in another layout (per CTA: the
// first kFp8TlUnits units x 3 warpgroups x the first kFp8TlBlocks key blocks x kFp8TlEvents;
// prefill_sm90_fp8.cuh fp8_stamp, scripts/device/fa3_fp8_timeline.py).
inline constexpr int kFp8TlUnits = 4;
inline constexpr int kFp8TlBlocks = 16;
inline constexpr int kFp8TlEvents = 8;
static_assert(kFp8TlUnits * 3 * kFp8TlBlocks * kFp8TlEvents == kTimelineRounds * kTimelineEvents,
              "one timeline buffer");
#endif

struct Fa3Params {
  // TMA descriptors of this layer's K / V buffers as 3D tensors {D, Hkv, rows} with boxes of
  // {64, 1, tma_rows} in the 128-byte swizzle; tma_rows = 0: every key block is gathered with
  // cp.async. With tma_rows > 0 (power-of-two pages of >= 8 rows: min(page_size, the largest power
  // of two dividing the key block), so that every box lies in one page), full key blocks are
  // loaded one box at a time, the last partial block by cp.async (its rows past kv_len are
  // zero-filled, never read from the pool).
  TmaDesc tma_k, tma_v;
  int tma_rows = 0;
  // Both kernels, 1 (the engine's default where the map encodes; ATTNKIT_FA3_Q_TMA=0: off):
  // the (bf16 / f16) Q tile arrives by TMA, boxes {64, 1, block_m} of tma_q ({D, Hq, tokens} over
  // q), one thread issuing; rows outside the request's [0, q_len) then hold the neighbouring
  // requests' tokens (or zeros before the first / past the last token: TMA fills the box's rows
  // outside the map with zeros, negative coordinates included), whose outputs are computed and
  // never stored. 0: the 16-byte cp.async gather of every producer thread, those rows zero-filled.
  TmaDesc tma_q;
  int q_tma = 0;
  // FP8 kernel: q arrives in e4m3 (AttentionLayer::q_scale, folded into scale_log2 by the engine;
  // tma_q then has boxes {128 bytes, 1, block_m}): the producer loads it into the bf16 Q tile's
  // place and each consumer warpgroup copies its 64 rows into the e4m3 tile instead of quantising
  // them (the row scales are 1).
  int q_fp8 = 0;
  // Both kernels, 1 (the engine's default; ATTNKIT_FA3_UNIT_SMEM=0: off): the producer,
  // which decodes every unit anyway, writes its TileInfo into shared memory before q_full
  // completes and the consumers read it there instead of decoding the plan again (two dependent
  // global reads on their path from one unit's stores to the next unit's first S).
  int unit_smem = 0;
  // 1: the consumers fence (fence.proxy.async) after every full-barrier wait, TMA blocks too; 0:
  // only after blocks gathered by cp.async (TMA writes are async-proxy writes made visible by the
  // mbarrier's completion, which is what wgmma reads; CUTLASS / FlashAttention-3 fence no TMA
  // tile). Both are correct; 1 measured 1-6% faster at 3 of 4 shapes in one run (cause not
  // understood, see docs/perf/fa3_notes.md), so it is the default; ATTNKIT_FA3_FENCE_TMA=0 is the
  // A/B knob.
  int fence_tma = 1;
  // Persistent schedule (see unit_at in prefill_sm90.cuh): 1 zigzag (default), 0 plain stride
  // (ATTNKIT_FA3_SCHED=0).
  int sched = 1;
  // bf16 / f16 and FP8 kernels: 1 = every CTA releases the next programmatic dependent launch of
  // the stream at its start (griddepcontrol.launch_dependents): a partitioned forward's decode
  // tiles (backend/small_extend.h, PrefillSm90Engine::planned_overlap_reserve) then start on the
  // SMs this grid leaves free. 0: released as the CTAs exit (the default launch).
  int trigger_dependents = 0;
  // Diagnostics only (wrong results; timing decomposition): bit 1 = the producer loads nothing,
  // 2 = no softmax (P = raw S), 4 = (FP8 kernel) no V transpose, 8 = (bf16 / f16 kernel) no Q
  // tile loads (the consumers multiply whatever the Q buffer holds), 16 = (bf16 / f16 kernel) no O
  // / LSE stores, 32 = (FP8 kernel) Q quantised in each CTA's first unit only (later units reuse
  // its e4m3 tile and row scales: the time an e4m3 Q input would save). (GEMM-off bits are not
  // offered: a branch around a wgmma makes ptxas serialise every wgmma of the kernel.)
  int diag = 0;
#if defined(ATTNKIT_FA3_TIMELINE)
  // Timeline builds only (-DATTNKIT_FA3_TIMELINE in the C++ and CUDA flags; never the default):
  // clock64 stamps of the bf16 / f16 kernel's unit boundaries, [grid][kTimelineRounds]
  // [kTimelineEvents] (prefill_sm90.cuh: stamp); the engine fills it when ATTNKIT_FA3_TIMELINE
  // names an output file (scripts/device/fa3_timeline.sh).
  unsigned long long* timeline = nullptr;
#endif

  const void* q = nullptr;  // [T, Hq, D] bf16/f16
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;  // [T, Hq, D] q dtype
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;  // [T, Hq] f32 natural-log LSE; nullptr = not requested
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  // [rows, Hkv, D] q dtype (FP8 kernel: e4m3); the MLA prefill kernel: the layer's k [T, H, 192]
  // and v [T, H, 128] (row q_start + key of each request; no page table).
  const void* k_pool = nullptr;
  const void* v_pool = nullptr;
  int64_t k_stride_row = 0, k_stride_head = 0;
  int64_t v_stride_row = 0, v_stride_head = 0;

  const int32_t* req_to_token = nullptr;  // [max_reqs + 1, req_to_token_stride]
  int64_t req_to_token_stride = 0;
  const int32_t* req_pool_indices = nullptr;  // [bs] row of each request
  int page_size = 1;

  const int32_t* plan = nullptr;  // header + [bs] requests + [num_tiles] tiles (see above)
  int bs = 0;
  int num_tiles = 0;

  int num_q_heads = 0;
  int group = 1;           // num_q_heads / num_kv_heads
  float scale_log2 = 0.f;  // scaling * log2(e): logits straight to the exp2 domain
  int causal = 1;          // 1: key k visible when k <= query position; 0: every key
  int pingpong = 1;        // 1: the consumer warpgroups alternate their GEMMs (named barriers)
  int overlap = 1;         // 1: softmax of block n overlaps the P V GEMM of block n + 1
  // 1 (the engine's default; ATTNKIT_FA3_LAZY_RESCALE=0: off): lazy O rescale: the row maximum
  // is raised only when it grows by more than 8 (log2), and O *= corr is skipped when no row of
  // the warp changed it. Exact after the final normalisation; measured +3.5% at causal and
  // bidirectional 8k d 128, bf16 and FP8 (H200, 2026-11-22 08:26Z, docs/perf/fa3_notes.md).
  int lazy_rescale = 0;
  // Both kernels (bf16 / f16 and FP8): 1 (the engine's default when out and its strides are 16-byte
  // aligned; ATTNKIT_FA3_EPI_WIDE=0: off): the epilogue writes O with 16-byte stores after a quad
  // shuffle transpose; 0: 4-byte stores straight from the accumulator layout.
  int epi_wide = 0;
  // FP8 three-warpgroup kernel, 1 (the engine's default where the map encodes;
  // ATTNKIT_FA3_O_TMA=0: off): a warpgroup whose 64 rows all lie in the request's [0, q_len)
  // writes its normalised O tile into shared memory (stmatrix) and stores it with two TMA boxes
  // {64, 1, 64} of tma_o ({D, Hq, tokens} over out, 128-byte swizzle) instead of the shuffled
  // 16-byte stores; other tiles and tail-split pieces keep the register stores.
  TmaDesc tma_o;
  int o_tma = 0;
  // Both kernels: 1 (the engine's default; ATTNKIT_FA3_UNIFORM_WG=0: off) launches the
  // instantiation whose warpgroup index is broadcast from lane 0, so the consumer loop's counters
  // and wgmma descriptors live in uniform registers (prefill_sm90_kernel's kUniformWg). Measured
  // bf16 +3.8-11.8% (all d 128 / 64 / 256 cases), FP8 +2.0-3.5% (H200 2026-11-23 00:44Z / 00:50Z).
  int uniform_wg = 0;
  // FP8 kernel (prefill_sm90_fp8.cuh) only: the pool holds e4m3 rows (x / scale); k_scale is
  // folded into scale_log2 on the host, v_scale multiplies O in the epilogue.
  float v_scale = 1.f;
  // FP8 kernel only: 1 (the engine's default; ATTNKIT_FA3_FP8_GEMM_SUM=0: off): the softmax row
  // sum l comes from the P V GEMM (N = 136 against 8 rows of e4m3 ones under V^T) instead of one
  // FADD per element (prefill_sm90_fp8.cuh, consumer_fp8<kGemmSum>).
  int fp8_gemm_sum = 0;
  // FP8 kernel only: 1: V^T comes pre-transposed from vt_ws (written in the same forward, per
  // layer, by fp8_vt_pre_kernel before the attention kernel: [kv head][plan V^T block][128 d rows
  // x 128 key bytes, the shared-memory V^T stage image: 128-byte swizzle, key columns in the P
  // fragment order, keys past kv_len zero]) and the producer copies each block with one bulk copy;
  // 0: the producer transposes every loaded V tile itself. The engine picks 1 when the forward
  // has enough queries per key (prefill / long extend) unless ATTNKIT_FA3_FP8_VT_PRE says
  // otherwise (tile_plan.h: choose_fp8_variant). Any page size: the pre-transpose gathers V
  // through the page table.
  int vt_pre = 0;
  // FP8 kernel with vt_pre only: 1 (the engine's default; ATTNKIT_FA3_FP8_SPEC=0: off):
  // speculative softmax in the overlapped loop (prefill_sm90_fp8.cuh, consumer_fp8's kSpec,
  // spec_softmax_fp8): exps against the running maximum of the blocks before while the block
  // maximum is reduced alongside; S recomputed and the exact step run when a row's maximum rose
  // past the lazy-rescale threshold. 0: the exact step every block.
  int fp8_spec = 0;
  // FP8 kernel with vt_pre and fp8_spec only: key block, 128 or 192 (Q K^T at N = 192, P V over
  // two V^T halves; amortises the per-block fixed instructions over 1.5x the keys,
  // FlashAttention-3's FP8 causal d 128 tile). The engine picks 192 for forwards with a request of
  // >= 8192 keys (choose_fp8_variant; ATTNKIT_FA3_FP8_BLOCK_N=128 / 192 forces).
  int fp8_block_n = 128;
  // FP8 kernel, 128-key blocks only: 1: promotion (prefill_sm90_fp8.cuh, kPromote): each key
  // block's P V (and its ones-row sums) accumulates from zero in the wgmma and is added to the
  // running O / l in f32 registers, instead of accumulating the whole row in the e4m3 wgmma's
  // limited-precision accumulator (docs/PERF.md "FP8 accuracy at long rows"). The engine sets it
  // from choose_fp8_variant (by default 2 for forwards with a request past 2048 keys, else 0;
  // ATTNKIT_FA3_FP8_PROMOTE forces).
  // 2: the same promotion with the other order of its two column chunks (prefill_sm90_fp8.cuh,
  // consumer_fp8: chunk 0 behind Q K^T, chunk 1 after the softmax), to measure which is faster.
  int fp8_promote = 0;
  // FP8 kernel, three consumer warpgroups, causal, 128-key blocks: 1 (the engine's default;
  // ATTNKIT_FA3_FP8_HALF_DIAG=0 off): a warpgroup whose last row ends in the first half of its
  // diagonal key block computes S (and, with e4m3 q, the softmax) of that block over its first 64
  // keys only (the rest are after each of its rows; prefill_sm90_fp8.cuh, half_top).
  int fp8_half_diag = 0;
  // Query rows per tile of p.plan (the plan is built with the same count): kBlockM (128, two
  // consumer warpgroups) or 192 (three consumer warpgroups): the bf16 / f16 kernel at d 64 and
  // d 128 with 128-key blocks (ATTNKIT_FA3_WG3, prefill_sm90_engine.cpp; at d 128 per forward by
  // choose_block_m_d128), the FP8 kernel with the V^T
  // pre-transpose and the speculative softmax (ATTNKIT_FA3_FP8_WG3, choose_fp8_variant).
  int block_m = kBlockM;
  // Both kernels: the tail split (virtual_units above; split_units 0: none). Piece j writes its
  // rows normalised (O / l, f32; the FP8 kernel's times v_scale) to split_o [j][block_m][D] and
  // their natural-log LSE (-inf: no visible key in the piece) to split_lse [j][block_m];
  // merge_tail_splits_kernel (prefill_sm90.cuh, launched by prefill_sm90_launch.cuh's
  // launch_tail_merge) writes out / lse of the split units from them.
  int split_units = 0;
  int num_splits = 1;
  // Both kernels: q heads per L2 section (unit_tile_head above): a multiple of group dividing
  // num_q_heads; the engine sets it (choose_section_heads in tile_plan.h).
  int section_heads = 0;
  float* split_o = nullptr;
  float* split_lse = nullptr;
  uint8_t* vt_ws = nullptr;    // [kv_heads][plan V^T units][128 d][128 key bytes]
  int64_t vt_head_stride = 0;  // bytes per kv head of vt_ws (V^T units x kVtBlockKeys x 128)
  // The variant instantiations only (PrefillTraits::kVariant, and the FP8 kernel's on the plans
  // fp8_plan_takes_variants names, PrefillFp8Traits::kVariant; the engine runs them for layers that
  // set any of these, without a tail split):
  // sliding window (AttentionLayer::sliding_window: key k is visible from the row at position q
  // when q - k <= sliding_window, and without the causal mask also k - q <= sliding_window; -1 off;
  // decode_tile skips the key blocks outside every row's window), soft-cap (logit_cap: cap * tanh(x
  // / cap) of the scaled logit; 0 off) and attention sinks (sinks: [num_q_heads] f32 logits joining
  // each row's denominator; null off).
  int sliding_window = -1;
  float logit_cap = 0.f;
  const float* sinks = nullptr;  // [num_q_heads]
  // MLA prefill kernel only (run_prefill_sm90_mla; its K / V stages are two): 1 (the engine's
  // default; ATTNKIT_FA3_SPLIT_EMPTY=0: off): a stage's K is released after its block's S and V
  // after its P V (PrefillTraits::kSplitEmpty), so that the overlapped loop's next K loads while
  // the current P V runs; 0: one release after the P V, as every other kernel.
  int split_empty = 0;
  // MLA prefill kernel only: the passes of the MLA chunked prefix cache
  // (mla::MlaPrefixCacheRunner; PrefillSm90Engine::run_prefix_pass). Non-null: every row of the
  // plan's tiles is written normalised in f32 to part_o [(q_start + token) x num_q_heads + head]
  // [128] and its log2-domain LSE (-inf: no visible key) to part_lse [same row], the runner's
  // partial slot layout (flashinfer::CascadeMergeParams), instead of out / lse. A chunk pass's
  // plan leaves out the requests without keys in its chunk (mla_pass_requests: their rows keep
  // the running partial); a tile with kv_len 0 would get one all-masked key block: O 0, LSE
  // -inf. No tail split.
  float* part_o = nullptr;
  float* part_lse = nullptr;
  // With part_o: 1: part_o / part_lse hold the running partial of the earlier passes (every row
  // written), which each row merges this pass into by LSE, in place (the runner's merge folded
  // into the epilogue); 0: the rows are overwritten.
  int part_merge = 0;
};

// Whether p's layer needs the kernels' variant instantiations (a sliding window, a soft-cap or
// sinks): the engine then runs it without a tail split and the launcher picks the variant (the
// FP8 kernel has them on the plans fp8_plan_takes_variants names: it refuses the other plans' such
// layers, which why_not_layer sends to the mma.sync kernels).
constexpr bool uses_variant_features(const Fa3Params& p) {
  return p.sliding_window >= 0 || p.logit_cap > 0.f || p.sinks != nullptr;
}

}  // namespace attnkit::fa3
