// The flashinfer backend's tensor-core paged decode (SM80+): one CTA per plan WorkItem (<= 16
// packed GQA rows of one request, a key range of the load-balanced split) and kv head. The key
// streaming and the math are the shared ring core (cuda/common/ring_decode.cuh: per-warp cp.async
// rings, mma.sync); this file adds what is flashinfer's own: the plan items, pool slots read in
// place from the page table (slot(k) = req_to_token[row, k - k % page] + k % page, no per-token
// index list), the sliding-window clip, and the epilogue (out/lse with sinks and v_scale, or the
// split's normalised partial + log2 LSE, merged by the request's last split CTA: no second
// launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/dtype.h"
#include "backends/flashinfer/kernels/balanced_plan.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/ring_decode.cuh"

namespace attnkit::flashinfer {

static_assert(kDecodeRingWarps == cuda::ring::kWarps && kDecodeRingKeys == cuda::ring::kKeys &&
                  kDecodeTileRows == cuda::ring::kRows &&
                  kDecodeCtasPerSm == cuda::ring::kCtasPerSm,
              "the planner's decode tile is the ring core's");

// The decode's ring traits: the ring core's default CTA shape (2 CTAs of 4 warps per SM, 110 KB
// each; sessions 5-7 measured one CTA of 8 warps, or of 4 warps with twice the ring depth, per
// SM90 multiprocessor: no faster); RingDecodeCompact on devices that cannot opt in to it.
template <int kD, typename QT, DType kKv, int kWarps = cuda::ring::kWarps,
          int kBudget = cuda::ring::kCtaSmemBudget, int kCtas = cuda::ring::kCtasPerSm,
          int kMTiles = 1>
struct RingDecodeTraits : cuda::ring::Traits<kD, QT, kKv, kWarps, kBudget, kCtas, kMTiles> {
  using Base = cuda::ring::Traits<kD, QT, kKv, kWarps, kBudget, kCtas, kMTiles>;
  static constexpr bool kRingDecode = true;  // launched as paged_decode_ring_kernel
  // fp8 KV streams 32-key warp tiles (two 16-key ring stages per softmax step) where the ring has
  // >= 4 stages (d <= 128): a 16-key fp8 tile carries half the bytes of a bf16 one for the same
  // wait / max / rescale / loop work, so fp8 decode was bound by per-tile work, not bytes. 16-bit
  // KV keeps 16-key tiles (3 stages: a pair would leave one in flight).
  static constexpr int kTileSubs = Base::kQuant && Base::kStages >= 4 ? 2 : 1;
  static constexpr bool kFastExp2 = true;
  // Copy rows owned in adjacent groups, slot words read 16 bytes at a time (ring_decode.cuh).
  static constexpr bool kWideSlotLoads = true;
  // attend waits for the previous grid after the first page-table words (a no-op unless the launch
  // was programmatic; with PagedParams::decode_pdl 1 the kernel has waited at its start already).
  static constexpr bool kGridDepWait = true;
  // Paired fp8 -> f16 conversions (ring_decode.cuh): H200 2026-11-23 06:52Z, b16 kv 4k fp8
  // --launches 10 39.1-39.4 vs 39.6-40.3 us without, --graph 41.6-41.9 vs 42.2-42.3 us.
  static constexpr bool kFp8PairCvt = true;
};

// The compact CTA of the ring core (cuda::ring::CompactShape) for sm_86 / sm_89-class limits.
template <int kD, typename QT, DType kKv>
using RingDecodeCompact = cuda::ring::CompactShape<
    RingDecodeTraits<kD, QT, kKv>,
    RingDecodeTraits<kD, QT, kKv, cuda::ring::compact_warps(kD), cuda::ring::kCompactCtaSmemBudget,
                     cuda::ring::kCompactCtasPerSm>>;

// Target verify's 32-row CTA (head dims <= 128; PagedParams::decode_tile_rows 32): two M tiles
// per warp, so each K / V fragment feeds two MMAs and a request's 32 (draft, q head) rows stream
// the keys once instead of twice. Q (17 KB at d 128) lives in shared memory; the budget, 112 KB,
// keeps three bf16 stages per warp at d 128 and two CTAs per SM90 multiprocessor (2 x (112 + 1)
// KB of its 228). The compact form: the 96 KB budget, one CTA per SM.
inline constexpr int kVerify32CtaSmemBudget = 112 * 1024;
template <int kD, typename QT, DType kKv>
using RingVerify32Traits = RingDecodeTraits<kD, QT, kKv, cuda::ring::kWarps, kVerify32CtaSmemBudget,
                                            cuda::ring::kCtasPerSm, 2>;
template <int kD, typename QT, DType kKv>
using RingVerify32Compact = cuda::ring::CompactShape<
    RingVerify32Traits<kD, QT, kKv>,
    RingDecodeTraits<kD, QT, kKv, cuda::ring::kWarps, cuda::ring::kCompactCtaSmemBudget,
                     cuda::ring::kCompactCtasPerSm, 2>>;

// A merged row's 4 columns (col .. col + 3 of q head `head` of token `token`): out = a * v_scale /
// dsum, and the natural-log LSE from the exp2-domain max `mx` and the sum (column 0 only).
template <typename QT>
__device__ __forceinline__ void store_merged(const PagedParams& p, int token, int head, int col,
                                             float a0, float a1, float a2, float a3, float mx,
                                             float dsum) {
  const float mul = cuda::row_inv(dsum, p.v_scale);
  const uint2 packed =
      make_uint2(cuda::pack2<QT>(a0 * mul, a1 * mul), cuda::pack2<QT>(a2 * mul, a3 * mul));
  *reinterpret_cast<uint2*>(static_cast<QT*>(p.out) + token * p.o_stride_token +
                            head * p.o_stride_head + col) = packed;
  if (col == 0 && p.lse != nullptr) {
    p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = cuda::row_ln_lse(mx, dsum);
  }
}

// Splits merged in one round trip per cuda::ring::kMergeChunk of them (merge_splits' path for
// num_splits <= kMergeOneTrip; a batch-1 kv 32k forward has 16 splits, a balanced cut plan's item
// up to ~slots / (kv heads x q tiles) + 1 parts): one thread per (row, 4 columns) runs the shared
// core cuda::ring::merge_partials4 (LSEs in registers, the columns staged by cp.async, online
// across chunks; a warp's 32 threads share a row at d 128, so a warp's LSE loads are one broadcast
// request), the running max starting at the sink. Its unpredicated loads leave every decode
// kernel's register count as it was (ptxas sm_90a / sm_80). With one chunk the formulas and their
// order are the staged path's (max with the sink, weights 0 for a split that saw no key, the sum,
// then the sink; the weighted sum in split order), so both give the same bits; the staged path's
// three dependent steps (LSEs to shared memory, per-row weights, partial loads) become one. H200
// 2026-11-24 07:06Z (--graph --launches 32, three alternated rounds, docs/perf/s18): b1 kv 32k
// 41.2-41.3 -> 38.6-38.8 us (76.3-77.0 -> 81.4-81.9% of copy), kv 16k 25.1-25.2 -> 22.3, kv 32k
// fp8 27.5-27.6 -> 24.6; b16 / b64 (no splits) unchanged.
inline constexpr int kMergeOneTrip = 3 * cuda::ring::kMergeChunk;

template <typename Tr, typename HeadFn, typename TokenFn, typename EntryFn>
__device__ __forceinline__ void merge_splits_one_trip(const PagedParams& p, int num_splits,
                                                      int64_t stride, EntryFn entry0, int rows,
                                                      HeadFn head_of, TokenFn token_of,
                                                      float4* stage) {
  using QT = typename Tr::QT;
  constexpr int kVec4 = Tr::kHeadDim / 4;
#pragma unroll 1
  for (int c = threadIdx.x; c < rows * kVec4; c += Tr::kThreads) {
    const int r = c / kVec4;
    const int col = (c % kVec4) * 4;
    const int head = head_of(r);
    const int64_t e0 = entry0(r);
    // The running max starts at the sink; with one chunk the result is the staged path's bits.
    const float sink = p.sinks != nullptr ? p.sinks[head] * cuda::kLog2e : -INFINITY;
    const cuda::ring::Merged4 m = cuda::ring::merge_partials4<Tr>(
        num_splits, sink, [&](int s) { return __ldcg(p.partial_lse + e0 + s * stride); },
        [&](int s) { return p.partial_out + (e0 + s * stride) * Tr::kHeadDim + col; }, stage);
    float dsum = m.sum;
    if (p.sinks != nullptr && m.max != -INFINITY) dsum += exp2f(sink - m.max);
    store_merged<QT>(p, token_of(r), head, col, m.acc[0], m.acc[1], m.acc[2], m.acc[3], m.max,
                     dsum);
  }
}

// The fused split-KV merge of one (request, q tile, kv head), by every thread of the CTA that
// counted itself last: out = sum_s w_s O_s / (sum_s w_s + sink), w_s = 2^(lse_s - max). Up to
// kMergeOneTrip splits at head dims <= 128: one round trip per 16 (merge_splits_one_trip). More,
// or head dim 256: three dependent steps
// instead of one L2 round trip per few splits per thread: (1) every partial LSE of the tile to
// shared memory, all loads in flight at once; (2) per row the max, the weights (0 for a split that
// saw no key) and their sum with the sink; (3) per (row, 4 columns) the weighted sum of the
// partials (ld.global.cg: written by other CTAs of this launch), up to 16 partial loads in flight
// per thread. `scratch`: the CTA's shared memory (Tr::kSmemBytes), free after attend; it holds the
// weights of up to ~1700 splits (~1170 in the compact CTA of smem_fit.h; the default planner makes
// at most one wave of CTAs; a balanced cut plan's item can have up to ~slots / (kv heads x q tiles)
// + 1 parts, past 1700 only with one kv head and ~1700+ requests at the 2112-slot cap); past that
// the weights are recomputed from the LSEs in global memory (slower, correct). `head_of(r)` /
// `token_of(r)`: q head / token of packed row r. `num_splits`: the request's (RequestPlan) or, in
// the balanced plan, the item's (Segment::parts); split s of packed row r is partial entry
// entry0(r) + s x `stride` (the WorkItem kernel: (partial_base + s) x Hq + head; the balanced
// kernel: (partial_base + s) x W + r, balanced_partial_width).
template <typename Tr, typename HeadFn, typename TokenFn, typename EntryFn>
__device__ __forceinline__ void merge_splits(const PagedParams& p, int num_splits, int64_t stride,
                                             EntryFn entry0, int rows, HeadFn head_of,
                                             TokenFn token_of, float* scratch) {
  using QT = typename Tr::QT;
  constexpr int kR = Tr::kCtaRows;
  constexpr int kVec4 = Tr::kHeadDim / 4;
  // Head dims <= 128: at 256 the balanced kernel (255 registers already) spilled 12 B with it.
  if constexpr (Tr::kHeadDim <= 128) {
    if (num_splits <= kMergeOneTrip) {
      merge_splits_one_trip<Tr>(p, num_splits, stride, entry0, rows, head_of, token_of,
                                reinterpret_cast<float4*>(scratch));
      return;
    }
  }
  const bool stored = (num_splits + 2) * kR * static_cast<int>(sizeof(float)) <= Tr::kSmemBytes;
  float* row_m = scratch;     // [kR]
  float* row_d = row_m + kR;  // [kR]
  float* wgt = row_d + kR;    // [num_splits][kR] when stored: LSE, then weight
  const auto global_lse = [&](int s, int r) {
    return __ldcg(p.partial_lse + entry0(r) + s * stride);
  };
  if (stored) {
    for (int i = threadIdx.x; i < num_splits * kR; i += Tr::kThreads) {
      const int r = i % kR;
      wgt[i] = r < rows ? global_lse(i / kR, r) : -INFINITY;
    }
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < num_splits; ++s) {
      mx = fmaxf(mx, stored ? wgt[s * kR + r] : global_lse(s, r));
    }
    const float sink = p.sinks != nullptr ? p.sinks[head_of(r)] * cuda::kLog2e : -INFINITY;
    mx = fmaxf(mx, sink);
    float dsum = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      const float lse = stored ? wgt[s * kR + r] : global_lse(s, r);
      const float x = lse == -INFINITY ? 0.f : exp2f(lse - mx);  // 0: all-invisible split
      if (stored) wgt[s * kR + r] = x;
      dsum += x;
    }
    if (p.sinks != nullptr && mx != -INFINITY) dsum += exp2f(sink - mx);
    row_m[r] = mx;
    row_d[r] = dsum;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < rows * kVec4; c += Tr::kThreads) {
    const int r = c / kVec4;
    const int col = (c % kVec4) * 4;
    const int head = head_of(r);
    const float* src = p.partial_out + entry0(r) * Tr::kHeadDim + col;
    const int64_t step = stride * Tr::kHeadDim;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    // kBatch partial loads in flight per thread (a batch-1 forward at d 256, which does not take
    // the one-trip path, has 16 splits: one L2 round trip, not two), issued before any weight is
    // used.
    constexpr int kBatch = 16;
    for (int s0 = 0; s0 < num_splits; s0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        v[j] = s0 + j < num_splits ? __ldcg(reinterpret_cast<const float4*>(src + (s0 + j) * step))
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int s = s0 + j;
        if (s >= num_splits) break;
        float x;
        if (stored) {
          x = wgt[s * kR + r];
        } else {
          const float lse = global_lse(s, r);
          x = lse == -INFINITY ? 0.f : exp2f(lse - row_m[r]);
        }
        a0 += x * v[j].x, a1 += x * v[j].y, a2 += x * v[j].z, a3 += x * v[j].w;
      }
    }
    store_merged<QT>(p, token_of(r), head, col, a0, a1, a2, a3, row_m[r], row_d[r]);
  }
}

// One item's stream and epilogue, shared by paged_decode_ring_kernel and
// paged_decode_balanced_kernel: the query rows of `w` (token_of / head_of map a row to its token
// and q head) against the keys behind the page-table row `table`, then either a partial
// (normalised O and log2 LSE in partial entry partial_entry(r) of packed row r, when `partial`;
// a callable, so that the row is read at the epilogue as the kernels did before they shared this)
// or out / lse with the sink.
// Instantiations of the streaming loop, chosen once per item: power-of-two pages (a mask per copied
// row) and any other page size (a division). One loop with the choice inside carried the division
// and a branch region per copied row (+300 SASS instructions per tile). The hot instantiation
// (power-of-two pages, no soft-cap) carries neither the division nor the tanh code; the others
// check the cap per logit.
// kRowMask (target verify): `visible` decides the keys of w's mask regions per row (ring::attend),
// in the same three loops.
template <typename Tr, bool kRowMask = false, typename TokenFn, typename HeadFn,
          typename PartialEntryFn, typename MaskFn = cuda::ring::NoRowMask>
__device__ __forceinline__ void attend_item(const PagedParams& p, const cuda::ring::Work& w,
                                            uint8_t* smem, const typename Tr::QT* q,
                                            const int32_t* table, TokenFn token_of, HeadFn head_of,
                                            bool partial, PartialEntryFn partial_entry,
                                            MaskFn visible = {}) {
  using QT = typename Tr::QT;
  const auto q_row = [&](int r) {
    return q + token_of(r) * p.q_stride_token + head_of(r) * p.q_stride_head;
  };
  const int page_mask = p.page_size - 1;
  const auto slot_pow2 = [&](int key) -> cuda::ring::SlotRef {
    const int off = key & page_mask;
    return {table + (key - off), off};
  };
  const auto slot_any = [&](int key) -> cuda::ring::SlotRef {
    const int off = key % p.page_size;
    return {table + (key - off), off};
  };
  const auto write = [&](int r, int col, float(&acc)[8], float mx, float dsum) {
    const int head = head_of(r);
    if (partial) {
      const int64_t prow = partial_entry(r);
      const float inv = cuda::row_inv(dsum);
      float4* dst = reinterpret_cast<float4*>(p.partial_out + prow * Tr::kHeadDim + col);
      dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
      if (col == 0) p.partial_lse[prow] = cuda::row_log2_lse(mx, dsum);
      return;
    }
    if (p.sinks != nullptr) {  // the sink joins the denominator only
      const float sink = p.sinks[head] * cuda::kLog2e;
      const float m2 = fmaxf(mx, sink);
      const float f = exp2f(mx - m2);
      dsum = dsum * f + exp2f(sink - m2);
#pragma unroll
      for (int x = 0; x < 8; ++x) acc[x] *= f;
      mx = m2;
    }
    const int token = token_of(r);
    cuda::ring::store8<QT>(
        static_cast<QT*>(p.out) + token * p.o_stride_token + head * p.o_stride_head + col, acc,
        cuda::row_inv(dsum, p.v_scale));
    if (col == 0 && p.lse != nullptr) {
      p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = cuda::row_ln_lse(mx, dsum);
    }
  };
  if (p.page_shift >= 0 && p.logit_cap == 0.f && p.decode_generic_loop == 0) {
    cuda::ring::attend<Tr, /*kMayCap=*/false, kRowMask>(w, smem, q_row, slot_pow2, write, visible);
  } else if (p.page_shift >= 0) {
    cuda::ring::attend<Tr, true, kRowMask>(w, smem, q_row, slot_pow2, write, visible);
  } else {
    cuda::ring::attend<Tr, true, kRowMask>(w, smem, q_row, slot_any, write, visible);
  }
}

// grid: (num_kv_heads, work items) block: (Tr::kThreads); dynamic smem Tr::kSmemBytes. The kv heads
// of one item are adjacent in launch order, so they stream the same pool rows (one slot holds all
// heads) at about the same time: DRAM pages are opened once, not once per head.
// kVerify (target verify on decode tiles, PagedParams::decode_verify): an item's packed rows are
// (draft token, q head) pairs of one request, token-major (row i: token i / group), <= 16 per
// CTA (32 with RingVerify32Traits); draft t sits at position prefix + t (prefix = kv_len - q_len)
// and sees the cached prefix (within its window) and, of the drafts' keys, itself and the earlier
// drafts (a chain) or the tree mask's row (SpecInfo::custom_mask: [q_len, kv_len] bytes per
// request). A split's partial rows are per (split, draft token): entry ((partial_base + split *
// q_len + t) * Hq + head, the prefill tiles' row order), its counters per (request, q tile of
// decode_q_tiles, kv head).
template <typename Tr, bool kVerify = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    paged_decode_ring_kernel(const __grid_constant__ PagedParams p) {
  using QT = typename Tr::QT;
  extern __shared__ __align__(16) uint8_t smem[];
  if (p.decode_pdl == 1) {  // PDL mode 1: nothing read before the wait
    cuda::ring::grid_dep_wait();
    if (p.decode_pdl_early != 0) cuda::ring::grid_dep_launch_dependents();
  }
  // The item count and the item are independent loads (one memory round trip, not two): the
  // grid never exceeds the workspace's items, so the item is in bounds even past the count.
  const int num_items = p.plan[0];
  const WorkItem item = *reinterpret_cast<const WorkItem*>(
      p.plan + kPlanHeaderWords + p.bs * kRequestWords + blockIdx.y * kItemWords);
  // decode_overlap: the grid's last CTA waits for the previous grid (the wgmma kernel running
  // beside this one) before it exits, so this grid completes after it (paged_params.h).
  const bool overlap_waiter =
      p.decode_overlap != 0 && blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1;
  if (static_cast<int>(blockIdx.y) >= num_items || item.request < 0) {
    if (overlap_waiter) cuda::ring::grid_dep_wait();
    return;
  }
  // The page-table row: the only load between the item and the first slot words (the item
  // carries the request's lengths; the RequestPlan is read for the split fields only).
  const int32_t* table = p.req_to_token + static_cast<int64_t>(p.req_pool_indices[item.request]) *
                                              p.req_to_token_stride;
  const RequestPlan& req =
      reinterpret_cast<const RequestPlan*>(p.plan + kPlanHeaderWords)[item.request];
  const int kv_head = blockIdx.x;

  cuda::ring::Work w;
  w.rows = min(Tr::kCtaRows, item.req_q_len * p.group - item.q_row_begin);
  w.kv_begin = item.kv_begin;
  w.kv_end = min(item.kv_end, item.req_kv_len);
  // Verify: the item's tokens t_lo..t_hi at positions prefix + t (decode: one, the last key).
  [[maybe_unused]] const int prefix = item.req_kv_len - item.req_q_len;
  [[maybe_unused]] const int t_lo = item.q_row_begin / p.group;
  [[maybe_unused]] const int t_hi = (item.q_row_begin + w.rows - 1) / p.group;
  if constexpr (kVerify) {
    // The keys before every row's window are skipped; up to the last row's window start the rows
    // differ (the head mask region). The drafts' keys are the tail region: a tree mask's row, or
    // (a chain) the drafts up to the row's own.
    if (p.sliding_window >= 0) {
      w.kv_begin = max(w.kv_begin, prefix + t_lo - p.sliding_window);
      w.mask_head_end = prefix + t_hi - p.sliding_window;
    }
    if (p.custom_mask != nullptr) {
      w.mask_tail_begin = prefix;
    } else if (p.causal != 0) {
      w.mask_tail_begin = prefix + t_lo + 1;
    }
    // Bidirectional layers with a window (the prefill kernel's rule): keys past position + window
    // are hidden too.
    if (p.causal == 0 && p.sliding_window >= 0) {
      w.mask_tail_begin = min(w.mask_tail_begin, prefix + t_lo + p.sliding_window + 1);
    }
  } else if (p.sliding_window >= 0) {
    // Decode: the query is the last key (causal keeps every key); the window clips the start.
    w.kv_begin = max(w.kv_begin, item.req_kv_len - 1 - p.sliding_window);
  }
  w.k_base = static_cast<const uint8_t*>(p.k_pool) +
             static_cast<int64_t>(kv_head) * p.k_stride_head * Tr::kKvElemBytes;
  w.v_base = static_cast<const uint8_t*>(p.v_pool) +
             static_cast<int64_t>(kv_head) * p.v_stride_head * Tr::kKvElemBytes;
  w.k_row_bytes = static_cast<uint32_t>(p.k_stride_row * Tr::kKvElemBytes);  // < 2^32: host check
  w.v_row_bytes = static_cast<uint32_t>(p.v_stride_row * Tr::kKvElemBytes);
  w.dependents_after_wait = p.decode_pdl == 2 && p.decode_pdl_early != 0;
  w.grid_dep_wait = p.decode_overlap == 0;
  w.scale_log2 = p.scale_log2;
  w.scale = p.scale;
  w.logit_cap = p.logit_cap;

  const QT* q = static_cast<const QT*>(p.q);
  const auto token_of = [&](int r) { return item.req_q_start + (item.q_row_begin + r) / p.group; };
  const auto head_of = [&](int r) { return kv_head * p.group + (item.q_row_begin + r) % p.group; };
  const bool split = req.num_splits > 1;
  // Split 0's entry of packed row r (Hq-wide rows; verify: one row per draft token) and the
  // entries between splits.
  const int q_len = kVerify ? item.req_q_len : 1;
  const auto entry0 = [&](int r) {
    const int t = kVerify ? (item.q_row_begin + r) / p.group : 0;
    return static_cast<int64_t>(req.partial_base + t) * p.num_q_heads + head_of(r);
  };
  const int64_t split_stride = static_cast<int64_t>(q_len) * p.num_q_heads;
  const auto partial_entry = [&](int r) { return entry0(r) + item.split * split_stride; };
  if constexpr (kVerify) {
    // The mask is read in the masked steps only, after attend's wait for the previous grid (with
    // PDL mode 2 the previous kernel may still be running at the kernel's start: an engine may
    // write the tree mask right before).
    const int kv_len = item.req_kv_len;
    // Keys at or past kv_len (a step's padding, already -inf) read no mask byte: the request's
    // block ends at its last key.
    const auto visible = [&](int r, int key) {
      if (r >= w.rows) return true;  // padding rows: never written, no mask row to read
      if (key >= kv_len) return false;
      const int t = (item.q_row_begin + r) / p.group;
      if (p.sliding_window >= 0) {
        if (key < prefix + t - p.sliding_window) return false;
        if (p.causal == 0 && key > prefix + t + p.sliding_window) return false;
      }
      if (key >= prefix) {
        if (p.custom_mask != nullptr) {
          return p.custom_mask[p.mask_indptr[item.request] + static_cast<int64_t>(t) * kv_len +
                               key] != 0;
        }
        if (p.causal != 0) return key <= prefix + t;
      }
      return true;
    };
    attend_item<Tr, true>(p, w, smem, q, table, token_of, head_of, split, partial_entry, visible);
  } else {
    attend_item<Tr>(p, w, smem, q, table, token_of, head_of, split, partial_entry);
  }
  if (overlap_waiter) cuda::ring::grid_dep_wait();
  // This CTA's streaming is done: the next PDL-launched kernel may start its prologue (it waits
  // for this whole grid before touching anything this grid writes). The fallback trigger: by
  // default (decode_pdl 1 or 2 with decode_pdl_early) each CTA triggered right after its wait
  // already; this one counts for ATTNKIT_FLASHINFER_PDL_TRIGGER=end and for launches without PDL.
  cuda::ring::grid_dep_launch_dependents();
  if (!split) return;

  // Fused split-KV merge: the request's last split CTA of this (q tile, kv head) merges the
  // partials (out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max), plus the sink).
  const int q_tiles =  // decode: q_len 1
      kVerify ? p.decode_q_tiles : (p.group + cuda::ring::kRows - 1) / cuda::ring::kRows;
  int* counter = p.split_counters +
                 (static_cast<int64_t>(item.request) * q_tiles + item.q_row_begin / Tr::kCtaRows) *
                     p.num_kv_heads +
                 kv_head;
  const bool last = p.split_sync_fence_all != 0
                        ? cuda::ring::last_split_cta(counter, req.num_splits)
                        : cuda::ring::last_split_cta_acq_rel(counter, req.num_splits);
  if (!last) return;
  merge_splits<Tr>(p, req.num_splits, split_stride, entry0, w.rows, head_of, token_of,
                   reinterpret_cast<float*>(smem));
}

// Balanced decode (the default since session 12, ATTNKIT_FLASHINFER_DECODE_BALANCE=auto; the
// plans: balanced_plan.h):
// grid: p.balance_slots CTAs (an eager launch stops at the plan's last slot with segments), CTA c
// streams the segments [cta_begin[c], cta_begin[c + 1]) of the plan,
// one after the other, each as one `attend` over the keys of one (request, q tile, kv head) item.
// A whole item (parts 1) writes out / lse as paged_decode_ring_kernel does; a part writes its
// normalised partial and log2 LSE to partial row partial_base + part (W entries, one per packed
// row: balanced_partial_width) and counts itself on the
// item's split counter; the item's last part merges (merge_splits with the item's part count).
// No CTA waits for another, so any residency is deadlock-free. The next segment's prologue
// (segment, page-table row, first slot words) starts after this one's epilogue: not prefetched
// (the first segment is, where it is segment blockIdx.x).
template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    paged_decode_balanced_kernel(const __grid_constant__ PagedParams p) {
  using QT = typename Tr::QT;
  extern __shared__ __align__(16) uint8_t smem[];
  if (p.decode_pdl == 1) {  // PDL mode 1: nothing read before the wait
    cuda::ring::grid_dep_wait();
    if (p.decode_pdl_early != 0) cuda::ring::grid_dep_launch_dependents();
  }
  // Layout (balanced_plan.h): header, bs RequestPlan, cta_begin [slots + 1] padded to 8 words,
  // segments. The grid is the plan's slot count (eager and graphs alike).
  const int32_t* cta_begin = p.plan + kPlanHeaderWords + p.bs * kRequestWords;
  const Segment* segments = reinterpret_cast<const Segment*>(
      cta_begin + BalancedPlan::cta_begin_words_for(p.balance_slots));
  // Segment blockIdx.x is loaded beside cta_begin, before the range is known (the plan holds at
  // least one segment per slot, BalancedPlan::serialize): where the slot's first segment is that
  // one (every encoded default plan with one CTA per slot), its loads wait one round trip less.
  // Head dim 128 only, where it was measured (H200 2026-11-23 19:42Z, docs/PERF.md Session 13):
  // the copy costs registers (ptxas sm_90a, d 128: 196 -> 204 bf16 KV, 219 -> 227 fp8; d 80 / 96
  // +23-38, up to 250-254 of 255 at d 96 on sm_80), and the d 256 kernel, at 255 already, spilled
  // 12 B with it.
  constexpr bool kSpeculate = Tr::kHeadDim == 128;
  Segment first{};
  if constexpr (kSpeculate) first = segments[blockIdx.x];
  const int seg_lo = cta_begin[blockIdx.x];
  const int seg_hi = cta_begin[blockIdx.x + 1];
  const QT* q = static_cast<const QT*>(p.q);
  const int q_tiles = (p.group + cuda::ring::kRows - 1) / cuda::ring::kRows;  // decode: q_len 1
  const int width = balanced_partial_width(p.group);
  for (int i = seg_lo; i < seg_hi; ++i) {
    Segment seg;
    if (kSpeculate && i == static_cast<int>(blockIdx.x)) {
      seg = first;
    } else {
      seg = segments[i];
    }
    const int32_t* table = p.req_to_token + static_cast<int64_t>(p.req_pool_indices[seg.request]) *
                                                p.req_to_token_stride;
    const int kv_head = seg.kv_head;
    const int q_row_begin = seg.q_row_begin;
    cuda::ring::Work w;
    w.rows = min(cuda::ring::kRows, p.group - q_row_begin);
    w.kv_begin = seg.kv_begin;
    w.kv_end = min(seg.kv_end, seg.req_kv_len);
    if (p.sliding_window >= 0) {  // a part wholly before the window streams nothing (LSE -inf)
      w.kv_begin = max(w.kv_begin, seg.req_kv_len - 1 - p.sliding_window);
    }
    w.k_base = static_cast<const uint8_t*>(p.k_pool) +
               static_cast<int64_t>(kv_head) * p.k_stride_head * Tr::kKvElemBytes;
    w.v_base = static_cast<const uint8_t*>(p.v_pool) +
               static_cast<int64_t>(kv_head) * p.v_stride_head * Tr::kKvElemBytes;
    w.k_row_bytes = static_cast<uint32_t>(p.k_stride_row * Tr::kKvElemBytes);
    w.v_row_bytes = static_cast<uint32_t>(p.v_stride_row * Tr::kKvElemBytes);
    w.dependents_after_wait = i == seg_lo && p.decode_pdl == 2 && p.decode_pdl_early != 0;
    w.scale_log2 = p.scale_log2;
    w.scale = p.scale;
    w.logit_cap = p.logit_cap;
    const auto token_of = [&](int r) { return seg.req_q_start + (q_row_begin + r) / p.group; };
    const auto head_of = [&](int r) { return kv_head * p.group + (q_row_begin + r) % p.group; };
    const bool part = seg.parts > 1;
    // The item's own partial rows, W entries wide (balanced_plan.h balanced_partial_width; the
    // plans keep partials x W below 2^31, so the index is 32-bit arithmetic).
    const auto entry0 = [&](int r) { return static_cast<int64_t>(seg.partial_base * width + r); };
    attend_item<Tr>(p, w, smem, q, table, token_of, head_of, part, [&](int r) {
      return static_cast<int64_t>((seg.partial_base + seg.part) * width + r);
    });
    if (part) {
      int* counter =
          p.split_counters +
          (static_cast<int64_t>(seg.request) * q_tiles + q_row_begin / cuda::ring::kRows) *
              p.num_kv_heads +
          kv_head;
      const bool last = p.split_sync_fence_all != 0
                            ? cuda::ring::last_split_cta(counter, seg.parts)
                            : cuda::ring::last_split_cta_acq_rel(counter, seg.parts);
      if (last) {
        merge_splits<Tr>(p, seg.parts, int64_t{width}, entry0, w.rows, head_of, token_of,
                         reinterpret_cast<float*>(smem));
      }
    }
    __syncthreads();  // the epilogue / merge is done with the shared memory the next prologue fills
  }
  // Fallback trigger (ATTNKIT_FLASHINFER_PDL_TRIGGER=end, launches without PDL), as in
  // paged_decode_ring_kernel; by default each CTA triggered right after its first wait.
  cuda::ring::grid_dep_launch_dependents();
}

}  // namespace attnkit::flashinfer
