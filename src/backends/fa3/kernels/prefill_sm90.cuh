// The fa3 backend's SM90 prefill/extend kernel: warp-specialised, one CTA per SM (persistent).
//
//   warpgroup 0 (producer, 40 registers): loads the K/V tiles of every key block into a
//     kStages-deep shared-memory ring laid out in the 128-byte swizzle that the wgmma descriptors
//     read, by TMA page boxes (full blocks of pages >= 8 rows) or by a 16-byte cp.async gather
//     through the page table (partial blocks, small pages); the Q tile by one TMA box per 64
//     columns (Fa3Params::q_tma; else the cp.async gather), with the unit's decoded TileInfo in
//     shared memory for the consumers (Fa3Params::unit_smem); completion is published on
//     mbarriers (full), and a stage is refilled only after the consumers release it (empty).
//   warpgroups 1, 2 (consumers, 232 registers): 64 query rows each. Per key block:
//     S = Q K^T (wgmma m64nNk16, f32 accumulators; A = Q from shared memory, at d 128 from
//     registers loaded once per tile, ConsumerCtx::kQRegs; B = K from shared memory), causal /
//     length mask, online softmax in registers (exp2 domain), P converted in registers to the A
//     fragment, O += P V (wgmma with A from registers, V read MN-major through the transposing
//     descriptor).
//   Key blocks run from the last (the only ones that need the causal mask) down to the first.
//   Tail split (Fa3Params::split_units): the units of the persistent schedule's last, partial
//   round run as pieces over key-block ranges, written as f32 partials (store_o_piece) and
//   combined by merge_tail_splits_kernel.
//
// Layout of shared memory (dynamic, aligned to 1024 bytes in the kernel):
//   Q [kBlockM x D] | K [kStages][kBlockN x D] | V [kStages][kBlockN x D] | mbarriers | TileInfo
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/fa3/kernels/fa3_params.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/sm90/sm90_primitives.cuh"
#include "cuda/sm90/wgmma_sm90.cuh"

namespace attnkit::fa3 {

// kWG consumer warpgroups of 64 query rows (2: 128-row tiles; 3: 192-row tiles with 128-key
// blocks at d 64, as FlashAttention-3 runs d 64, and at d 128 on the serial loop: more softmax
// warps per GEMM stream where the GEMMs are short; no ping-pong, 160 consumer / 32 producer
// registers).
// kVariant: the instantiations for layers with a sliding window or attention sinks (kWindowSinks)
// and, beside those, a soft-cap (kSoftcap; Fa3Params::sliding_window / sinks / logit_cap are read
// at run time there); the default ones (kPlain) compile none of it. The soft-cap has its own
// instantiation because its pass over S costs registers: ptxas sm_90a spills 8 bytes in the
// two-warpgroup d 128 kernel with it (tanh.approx; 40 with session 55's exp2 + reciprocal), none
// without; the three-warpgroup kernels spill 20 bytes with or without it, as the plain one.
// kDV_: the V / O head dim, kD (Q / K) unless the MLA prefill kernel (kD 192, kDV_ 128: the
// non-absorbed MLA layer, qk = nope 128 + rope 64, v 128): its K / V rows are the layer's
// contiguous new-token k / v (kContigKV; fa3_kernels.h run_prefill_sm90_mla), 128-row tiles,
// 128-key blocks, two stages (Q 48 KB + 2 x (K 48 + V 32 KB)), S from Q in shared memory (12
// k-steps), O as d 128. kSplitEmpty_ (MLA prefill only; Fa3Params::split_empty picks it): a stage's
// K and V are released by their own barriers (k_empty after the block's S, empty after its P V), so
// that with two stages the producer loads the next block's K while the P V of the current one still
// reads V.
enum PrefillVariant : int { kPlain = 0, kWindowSinks = 1, kSoftcap = 2 };
template <int kD, int kN, bool kBf16, int kWG = 2, int kVariant_ = kPlain, int kDV_ = kD,
          bool kSplitEmpty_ = false>
struct PrefillTraits {
  static constexpr bool kContigKV = kD != kDV_;
  static_assert(kContigKV ? kD == 192 && kDV_ == 128 && kN == 128 && kWG == 2 && kVariant_ == kPlain
                          : kD == 64 || kD == 128 || kD == 256,
                "fa3 wgmma head dims: 64, 128, 256; MLA prefill 192 / 128 (plain, 2 warpgroups, "
                "128-key blocks)");
  static constexpr int kVariant = kVariant_;
  static constexpr bool kSplitEmpty = kSplitEmpty_;
  static_assert(!kSplitEmpty || kContigKV, "split K / V release: the MLA prefill kernel");
  static_assert(kContigKV || block_n_supported(kD, kN),
                "fa3 wgmma key block not instantiated for this d");
  static constexpr int kHeadDim = kD;     // Q, K
  static constexpr int kHeadDimV = kDV_;  // V, O
  static_assert(kWG == 2 || (kWG == 3 && (kD == 64 || kD == 128) && kN == 128),
                "3 consumer warpgroups: d 64 / 128, N 128");
  static constexpr int kBlockM = 64 * kWG;
  // Keys per block. Registers per consumer thread: O kD/2 + S kBlockN/2 + P kBlockN/4 words.
  static constexpr int kBlockN = kN;
  static constexpr int kConsumerWarpgroups = kWG;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kProducerRegs = kWG == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kWG == 2 ? 232 : 160;
  static_assert(128 * kProducerRegs + 128 * kConsumerWarpgroups * kConsumerRegs <= 65536,
                "register budget of one CTA per SM");
  static constexpr int kChunksPerRow = kD / 8;     // 16-byte chunks of a Q / K row
  static constexpr int kChunksPerRowV = kDV_ / 8;  // of a V row
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kKBytes = kBlockN * kD * 2;  // one K stage
  static constexpr int kVBytes = kBlockN * kDV_ * 2;
  static constexpr int kAlign = 1024;
  // As many stages as fit in the 227 KB a block may opt into (at most 3): d 128 / N 128: Q 32 KB
  // + 3 x 64 KB; d 256 / N 80: Q 64 KB + 2 x 80 KB; MLA 192 / 128: Q 48 KB + 2 x 80 KB.
  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kStagesFit = (kSmemLimit - kAlign - 256 - kQBytes) / (kKBytes + kVBytes);
  static constexpr int kStages = kStagesFit > 3 ? 3 : kStagesFit;
  static_assert(kStages >= 2, "two K/V stages must fit");
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKBytes;
  static constexpr int kBarOffset = kVOffset + kStages * kVBytes;
  // q_full, q_empty, then per stage k_full, v_full, empty; kSplitEmpty: then per stage k_empty.
  static constexpr int kNumBarriers = 2 + 3 * kStages + (kSplitEmpty ? kStages : 0);
  static constexpr int kKEmptyOffset = 16 + 24 * kStages;  // from the first barrier
  // The unit's TileInfo as the producer decoded it (Fa3Params::unit_smem), after the barriers.
  static constexpr int kInfoOffset = kBarOffset + kNumBarriers * 8;
  static constexpr int kInfoBytes = 48;
  static constexpr int kSmemBytes = kInfoOffset + kInfoBytes + kAlign;
  static_assert(kSmemBytes <= kSmemLimit, "shared memory");
  static_assert(kQBytes % kAlign == 0 && kKBytes % kAlign == 0 && kVBytes % kAlign == 0 &&
                    kBlockN % 16 == 0,
                "1024-byte swizzle atoms, 16-key wgmma k-steps");
  // Producer rows: thread t of the producer warpgroup owns rows t, t + 128 (< kBlockN) of a key
  // block (kSlots page-table slots); a warp copies its own rows.
  static constexpr int kSlots = (kBlockN + 127) / 128;
};

// Traits Tr's PrefillVariant (kPlain for traits without the member).
template <typename Tr>
inline constexpr int kVariantOf = [] {
  if constexpr (requires { Tr::kVariant; }) {
    return Tr::kVariant;
  } else {
    return static_cast<int>(kPlain);
  }
}();
// Whether traits Tr read K / V from contiguous rows (the MLA prefill kernel; false for traits
// without the member: the FP8 kernel's).
template <typename Tr>
inline constexpr bool kContigKVOf = [] {
  if constexpr (requires { Tr::kContigKV; }) {
    return Tr::kContigKV;
  } else {
    return false;
  }
}();

// Timeline builds (-DATTNKIT_FA3_TIMELINE): the SM clock (or `value`) as event e of round
// `round` of this CTA, written by the calling thread when `who`; nothing in other builds.
__device__ __forceinline__ void stamp(const Fa3Params& p, int round, int e, bool who,
                                      long long value = -1) {
#if defined(ATTNKIT_FA3_TIMELINE)
  if (who && p.timeline != nullptr && round < kTimelineRounds) {
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
    p.timeline[(static_cast<int64_t>(blockIdx.x) * kTimelineRounds + round) * kTimelineEvents + e] =
        value >= 0 ? static_cast<unsigned long long>(value) : c;
  }
#else
  (void)p, (void)round, (void)e, (void)who, (void)value;
#endif
}

// This CTA's work unit in `round` (schedule_unit in fa3_params.h; p.sched 1: zigzag).
__device__ __forceinline__ int unit_at(const Fa3Params& p, int round) {
  return schedule_unit(round, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                       p.sched == 1);
}

// One work unit's geometry, decoded identically by producer and consumers. Key blocks
// [nb_begin, n_blocks) are this unit's (nb_begin > 0 only for a piece of a tail-split unit).
struct TileInfo {
  int request, q_start, q_len, kv_len, m0, head, n_blocks, causal_limit, nb_begin;
};
static_assert(sizeof(TileInfo) == 9 * 4, "TileInfo: nine words (the shared-memory copy)");

// Fa3Params::unit_smem: the producer's copy of a unit's TileInfo into shared memory at `info`, and
// the consumers' read of it (after q_full, whose arrival by the writing thread releases it).
__device__ __forceinline__ void store_tile_info(uint32_t info, const TileInfo& t) {
  const int w[9] = {t.request, t.q_start,  t.q_len,        t.kv_len,  t.m0,
                    t.head,    t.n_blocks, t.causal_limit, t.nb_begin};
#pragma unroll
  for (int i = 0; i < 9; ++i) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(info + 4 * i), "r"(w[i]) : "memory");
  }
}
__device__ __forceinline__ TileInfo load_tile_info(uint32_t info) {
  int w[9];
#pragma unroll
  for (int i = 0; i < 9; ++i) {
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w[i]) : "r"(info + 4 * i) : "memory");
  }
  return TileInfo{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]};
}

template <typename Tr>
__device__ __forceinline__ TileInfo decode_tile(const Fa3Params& p, int unit) {
  TileInfo t;
  const TileHead th = unit_tile_head(unit, p.num_tiles, p.section_heads);
  const int tile = th.tile;
  t.head = th.head;
  const int32_t* tw = p.plan + kPlanHeaderWords + p.bs * kRequestWords + tile * kTileWords;
  t.request = tw[0];
  t.m0 = tw[1];  // may be negative (fa3_params.h)
  const int32_t* rw = p.plan + kPlanHeaderWords + t.request * kRequestWords;
  t.q_start = rw[0];
  t.q_len = rw[1];
  t.kv_len = rw[2];
  t.causal_limit = t.kv_len - t.q_len + t.m0;  // position of the tile's first row
  // Last key any row of the tile may see (+1).
  const int n_end = tile_key_end(t.kv_len, t.q_len, t.m0, Tr::kBlockM, p.causal != 0);
  t.n_blocks = (n_end + Tr::kBlockN - 1) / Tr::kBlockN;
  t.nb_begin = 0;
  if constexpr (kContigKVOf<Tr>) {
    // A tile of a request without keys (kv_len 0): one all-masked block (zero-filled rows), so
    // that its rows are written as O 0, LSE -inf (Fa3Params::part_o). The host plans none (a
    // chunk pass leaves such a request out: mla_pass_requests); this keeps the tile defined.
    t.n_blocks = max(t.n_blocks, 1);
  }
  if constexpr (kVariantOf<Tr> != kPlain) {
    // Sliding window: the blocks wholly before the first row's window are no row's, and without
    // the causal mask (where the window bounds both sides, |q - k| <= window) those wholly after
    // the last row's. The tile's rows see their own keys, so n_blocks > nb_begin. (Variant layers
    // run without a tail split: decode_unit's pieces would override nb_begin.) E.g. window 100,
    // first row at position 1000, 128-key blocks: keys 900.. are visible, blocks 7.. are loaded.
    if (p.sliding_window >= 0) {
      if (!p.causal) {
        const int key_end = t.causal_limit + Tr::kBlockM + p.sliding_window;  // last row + w + 1
        if (key_end < n_end) t.n_blocks = (key_end + Tr::kBlockN - 1) / Tr::kBlockN;
      }
      const int first_key = t.causal_limit - p.sliding_window;
      if (first_key > 0) t.nb_begin = min(first_key / Tr::kBlockN, t.n_blocks - 1);
    }
  }
  return t;
}

// The tail-split piece that virtual unit v is (its index in Fa3Params::split_o / split_lse), or
// < 0 for a whole unit (units: the plan's num_tiles x num_q_heads).
__device__ __forceinline__ int split_piece(const Fa3Params& p, int v, int units) {
  return v - (units - p.split_units);
}

// Virtual unit v of the prefill kernels' schedule: a whole unit, or a piece of one of the last
// p.split_units units (virtual_units in fa3_params.h).
template <typename Tr>
__device__ __forceinline__ TileInfo decode_unit(const Fa3Params& p, int v, int units) {
  const int first = units - p.split_units;
  if (v < first) return decode_tile<Tr>(p, v);
  // split_piece, with `first` kept for the unit below (calling split_piece and recomputing
  // first changed the kernels' SASS, nvcc 13.0).
  const int piece = v - first;
  const int i = piece / p.num_splits;
  const int k = piece - i * p.num_splits;
  TileInfo t = decode_tile<Tr>(p, first + i);
  const int n = t.n_blocks;
  t.nb_begin = split_block_begin(n, p.num_splits, k);
  t.n_blocks = split_block_begin(n, p.num_splits, k + 1);
  return t;
}

// Fa3Params::unit_smem, both prefill kernels. The producer: thread 0 copies the unit's TileInfo
// (when on) and makes q_full's extra arrival, which releases the copy (q_full counts 129). The
// consumers, after their q_full wait: the copy, or the plan decoded again.
__device__ __forceinline__ void publish_tile_info(const Fa3Params& p, uint32_t info,
                                                  const TileInfo& t, uint32_t q_full, int tid) {
  if (tid == 0) {
    if (p.unit_smem) store_tile_info(info, t);
    sm90::mbar_arrive(q_full);
  }
}
template <typename Tr>
__device__ __forceinline__ TileInfo unit_tile_info(const Fa3Params& p, uint32_t info, int unit,
                                                   int units) {
  return p.unit_smem ? load_tile_info(info) : decode_unit<Tr>(p, unit, units);
}

// The schedule length of the prefill kernels (the tail split's pieces included).
__device__ __forceinline__ int scheduled_units(const Fa3Params& p) {
  return static_cast<int>(virtual_units(static_cast<int64_t>(p.num_tiles) * p.num_q_heads,
                                        p.split_units, p.num_splits));
}

// Whether key block nb of tile t is loaded by TMA page boxes (else by the cp.async gather): the
// producer's choice, recomputed by the consumers for their proxy fences.
template <typename Tr>
__device__ __forceinline__ bool block_uses_tma(const Fa3Params& p, const TileInfo& t, int nb) {
  return p.tma_rows > 0 && (nb + 1) * Tr::kBlockN <= t.kv_len && (p.diag & 1) == 0;
}

// Producer (128 threads): tile t's Q rows into the swizzled [kBlockM x kRowChunks x 16 B] tile at
// sQ by cp.async, one 16-byte chunk of kElemBytes-byte elements per copy. Row r = token m0 + r of
// the request; rows outside [0, q_len) are zero-filled. Both prefill producers (bf16 / f16 and
// FP8, whose e4m3 q (Fa3Params::q_fp8) takes kElemBytes 1 and 8 chunks: one 128-byte swizzle
// line per row) call it when Fa3Params::q_tma is 0 (the TMA box otherwise).
template <int kBlockM, int kRowChunks, int kElemBytes = 2>
__device__ __forceinline__ void load_q_tile(const Fa3Params& p, const TileInfo& t, uint32_t sQ,
                                            int tid) {
  constexpr int kPasses = kBlockM * kRowChunks / 128;
  static_assert(kPasses * 128 == kBlockM * kRowChunks, "whole passes of 128 threads");
  const char* q_base = static_cast<const char*>(p.q);
#pragma unroll 4
  for (int i = 0; i < kPasses; ++i) {
    const int c = tid + 128 * i;
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const int token = t.m0 + row;
    const bool valid = token >= 0 && token < t.q_len;
    const char* src =
        valid ? q_base +
                    ((static_cast<int64_t>(t.q_start + token) * p.q_stride_token +
                      static_cast<int64_t>(t.head) * p.q_stride_head + chunk * (16 / kElemBytes)) *
                     kElemBytes)
              : q_base;
    sm90::cp_async_16(sQ + sm90::swizzle_offset(kBlockM, row, chunk), src, valid ? 16 : 0);
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kBf16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// ---- producer ----

// The page-table row (req_to_token) of plan request `request`.
__device__ __forceinline__ const int32_t* page_table_row(const Fa3Params& p, int request) {
  return p.req_to_token + static_cast<int64_t>(p.req_pool_indices[request]) * p.req_to_token_stride;
}

// The producer thread's arrival on the full barrier of a TMA-loaded tile: thread 0 arms the
// transaction count (bytes), every other thread arrives once.
__device__ __forceinline__ void arrive_tma_tile(uint32_t bar, uint32_t bytes, int tid) {
  if (tid == 0) {
    sm90::mbar_arrive_expect_tx(bar, bytes);
  } else {
    sm90::mbar_arrive(bar);
  }
}

// Producer (128 threads; Fa3Params::q_tma): tile t's Q rows into the swizzled Q tile by TMA, one
// box of 64 columns x kBlockM rows per 64 columns, issued by thread 0 and completing on q_full
// (armed by thread 0 for the tile's bytes; every thread arrives once). kDiag: diagnostics bit 8 of
// Fa3Params::diag skips the copies and keeps the arrivals. Both prefill producers call it.
template <int kBlockM, int kD, bool kDiag>
__device__ __forceinline__ void load_q_tile_tma(const Fa3Params& p, const TileInfo& t, uint32_t sQ,
                                                uint32_t q_full, int tid) {
  if (tid == 0 && (!kDiag || (p.diag & 8) == 0)) {
#pragma unroll
    for (int cb = 0; cb < kD / 64; ++cb) {
      sm90::tma_load_3d(sQ + cb * kBlockM * 128, &p.tma_q, cb * 64, t.head, t.q_start + t.m0,
                        q_full);
    }
  }
  arrive_tma_tile(q_full, (!kDiag || (p.diag & 8) == 0) ? kBlockM * kD * 2 : 0, tid);
}

// One 16-byte cp.async of chunk `chunk` of tile row `row` from pool slot `slot` (elements of
// kElemBytes; -1: zero-fill) into the swizzled tile at shared address `tile`.
template <typename Tr, int kElemBytes>
__device__ __forceinline__ void cp_async_row_chunk(uint32_t tile, const char* pool, int slot,
                                                   int row, int chunk, int64_t stride_row,
                                                   int64_t head_off) {
  const char* src = slot >= 0 ? pool + (static_cast<int64_t>(slot) * stride_row + head_off +
                                        chunk * (16 / kElemBytes)) *
                                           kElemBytes
                              : pool;
  sm90::cp_async_16(tile + sm90::swizzle_offset(Tr::kBlockN, row, chunk), src, slot >= 0 ? 16 : 0);
}

// Producer warp `warp`: the key block's rows 128 s + 32 warp + r (r < 32, below kBlockN), C
// 16-byte chunks each, from the pool slots that lane r holds in my_slot[s] (-1: zero-filled)
// into the swizzled tile. C dividing 32: 32 / C rows per pass, a row's chunks on consecutive
// lanes; otherwise (the MLA prefill's 192-column K rows: 24 chunks) copy i of a lane is chunk
// (32 i + lane) % C of row (32 i + lane) / C. (The second form covers both, but for the V rows
// ptxas then scheduled the MLA kernel differently from the one the H200 tested: kept as is.)
template <typename Tr, int C>
__device__ __forceinline__ void gather_rows(uint32_t tile, const char* pool,
                                            const int (&my_slot)[Tr::kSlots], int64_t stride_row,
                                            int64_t head_off, int warp, int lane) {
#pragma unroll
  for (int s = 0; s < Tr::kSlots; ++s) {
    const int warp_row0 = 128 * s + 32 * warp;  // warp-uniform
    if (warp_row0 >= Tr::kBlockN) continue;
    if constexpr (32 % C == 0) {
      constexpr int kRowsPerPass = 32 / C;
      constexpr int kPassesPerWarp = 32 / kRowsPerPass;
#pragma unroll 4
      for (int pass = 0; pass < kPassesPerWarp; ++pass) {
        const int r_in_warp = pass * kRowsPerPass + lane / C;
        const int chunk = lane % C;
        const int slot = __shfl_sync(0xffffffffu, my_slot[s], r_in_warp);
        const int row = warp_row0 + r_in_warp;
        if (row < Tr::kBlockN) {
          cp_async_row_chunk<Tr, 2>(tile, pool, slot, row, chunk, stride_row, head_off);
        }
      }
    } else {
#pragma unroll 4
      for (int i = 0; i < C; ++i) {
        const int c = 32 * i + lane;
        const int r_in_warp = c / C, chunk = c % C;
        const int slot = __shfl_sync(0xffffffffu, my_slot[s], r_in_warp);
        const int row = warp_row0 + r_in_warp;
        if (row < Tr::kBlockN) {
          cp_async_row_chunk<Tr, 2>(tile, pool, slot, row, chunk, stride_row, head_off);
        }
      }
    }
  }
}

template <typename Tr>
__device__ __forceinline__ void producer(const Fa3Params& p, uint8_t* smem) {
  using namespace sm90;
  constexpr int kD = Tr::kHeadDim;
  constexpr int C = Tr::kChunksPerRow;
  // The paged gather (a row's C chunks on consecutive lanes, 32 / C rows per pass; the MLA kernel's
  // branch gathers with gather_rows).
  constexpr int kRowsPerPass = 32 / C;
  constexpr int kPassesPerWarp = 32 / kRowsPerPass;
  const int tid = threadIdx.x;  // 0..127
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t base = smem_addr(smem);
  const uint32_t sQ = base + Tr::kQOffset;
  const uint32_t bars = base + Tr::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8;
  auto k_full = [&](int s) { return bars + 16 + 24 * s; };
  auto v_full = [&](int s) { return bars + 16 + 24 * s + 8; };
  auto empty = [&](int s) { return bars + 16 + 24 * s + 16; };
  const char* k_base = static_cast<const char*>(p.k_pool);
  const char* v_base = static_cast<const char*>(p.v_pool);

  // Each thread's cp.asyncs of a tile arrive on the tile's full barrier when they land
  // (cp.async.mbarrier.arrive.noinc: counts as one of the barrier's 128 expected arrivals), so the
  // producer never waits for its own copies: it runs ahead of the consumers by up to kStages key
  // blocks, gated only by the empty barriers.
  int it = 0;
  int tcount = 0;
  const int units = p.num_tiles * p.num_q_heads;
  const int vunits = scheduled_units(p);
  for (int round = 0, unit = unit_at(p, 0); unit < vunits; unit = unit_at(p, ++round), ++tcount) {
    const TileInfo t = decode_unit<Tr>(p, unit, units);
    stamp(p, round, 16, tid == 0);
    stamp(p, round, 22, tid == 0, t.n_blocks - t.nb_begin);
    stamp(p, round, 23, tid == 0, unit);
    const int kvh = t.head / p.group;
    // (The MLA kernel reads no page table: Fa3Params::req_pool_indices is not set for it.)
    const int32_t* pt = Tr::kContigKV ? nullptr : page_table_row(p, t.request);
    // The MLA kernel's row of key 0 in p.k_pool / p.v_pool (request word 3: kv_row).
    const int kv_row = Tr::kContigKV ? p.plan[kPlanHeaderWords + t.request * kRequestWords + 3] : 0;
    // The pool slot of row 128 s + tid of key block nb (-1: past kv_len or past the block; the row
    // is zero-filled). Loaded one block ahead so the page-table latency hides behind the empty
    // wait.
    int my_slot[Tr::kSlots];
    auto load_slots = [&](int nb) {
#pragma unroll
      for (int s = 0; s < Tr::kSlots; ++s) {
        const int row = 128 * s + tid;
        const int key = nb * Tr::kBlockN + row;
        if (nb < 0 || row >= Tr::kBlockN || key >= t.kv_len) {
          my_slot[s] = -1;
        } else if constexpr (Tr::kContigKV) {
          my_slot[s] = kv_row + key;  // MLA prefill: rows of the layer's k / v (or a chunk's)
        } else {
          const int in_page = key % p.page_size;
          my_slot[s] = pt[key - in_page] + in_page;
        }
      }
    };
    load_slots(t.n_blocks - 1);

    // Q tile: row r = token m0 + r of the request. Rows outside [0, q_len) are zero-filled by the
    // cp.async gather; by TMA they hold the neighbouring requests' tokens, or zeros outside q.
    mbar_wait(q_empty, (tcount & 1) ^ 1);
    stamp(p, round, 17, tid == 0);
    publish_tile_info(p, base + Tr::kInfoOffset, t, q_full, tid);
    if (p.q_tma) {
      static_assert(Tr::kQBytes == Tr::kBlockM * kD * 2);
      load_q_tile_tma<Tr::kBlockM, kD, /*kDiag=*/true>(p, t, sQ, q_full, tid);
    } else {
      if ((p.diag & 8) == 0) load_q_tile<Tr::kBlockM, C>(p, t, sQ, tid);
      cp_async_arrive_noinc(q_full);
    }
    stamp(p, round, 18, tid == 0);

    for (int nb = t.n_blocks - 1; nb >= t.nb_begin; --nb, ++it) {
      const int stage = it % Tr::kStages;
      const uint32_t phase = (it / Tr::kStages) & 1;
      if constexpr (Tr::kContigKV) {
        // The MLA prefill kernel: K after the stage's k_empty (kSplitEmpty; else its empty), V
        // after its empty; full blocks by one 128-row TMA box per 64 columns, the last partial
        // block by the cp.async gather (24 chunks per K row, 16 per V row; rows past kv_len
        // zero-filled). (Its own branch: folding it into the paged code below changed ptxas's
        // register allocation of the d 128 / d 256 kernels; docs/PERF.md "Session 67".)
        const uint32_t k_empty =
            Tr::kSplitEmpty ? bars + Tr::kKEmptyOffset + 8 * stage : empty(stage);
        mbar_wait(k_empty, phase ^ 1);
        stamp(p, round, nb == t.n_blocks - 1 ? 19 : 20,
              tid == 0 && (nb == t.n_blocks - 1 || nb == t.nb_begin));
        const uint32_t sK = base + Tr::kKOffset + stage * Tr::kKBytes;
        const uint32_t sV = base + Tr::kVOffset + stage * Tr::kVBytes;
        if (p.diag & 1) {
          if (Tr::kSplitEmpty) mbar_wait(empty(stage), phase ^ 1);
          mbar_arrive(k_full(stage));
          mbar_arrive(v_full(stage));
        } else if (block_uses_tma<Tr>(p, t, nb)) {
#pragma unroll
          for (int kv = 0; kv < 2; ++kv) {
            if (Tr::kSplitEmpty && kv == 1) mbar_wait(empty(stage), phase ^ 1);
            const uint32_t tile = kv == 0 ? sK : sV;
            const uint32_t bar = kv == 0 ? k_full(stage) : v_full(stage);
            constexpr int kCols[2] = {kD, Tr::kHeadDimV};
#pragma unroll
            for (int s = 0; s < Tr::kSlots; ++s) {
              const int row = 128 * s + tid;
              if (row < Tr::kBlockN && row % p.tma_rows == 0) {
#pragma unroll
                for (int cb = 0; cb < kCols[kv] / 64; ++cb) {
                  tma_load_3d(tile + cb * Tr::kBlockN * 128 + row * 128,
                              kv == 0 ? &p.tma_k : &p.tma_v, cb * 64, kvh, my_slot[s], bar);
                }
              }
            }
            arrive_tma_tile(bar, kv == 0 ? Tr::kKBytes : Tr::kVBytes, tid);
          }
        } else {
#pragma unroll
          for (int kv = 0; kv < 2; ++kv) {
            if (Tr::kSplitEmpty && kv == 1) mbar_wait(empty(stage), phase ^ 1);
            const char* pool = kv == 0 ? k_base : v_base;
            const int64_t stride_row = kv == 0 ? p.k_stride_row : p.v_stride_row;
            const int64_t head_off =
                static_cast<int64_t>(kvh) * (kv == 0 ? p.k_stride_head : p.v_stride_head);
            const uint32_t tile = kv == 0 ? sK : sV;
            if (kv == 0) {
              gather_rows<Tr, C>(tile, pool, my_slot, stride_row, head_off, warp, lane);
            } else {
              gather_rows<Tr, Tr::kChunksPerRowV>(tile, pool, my_slot, stride_row, head_off, warp,
                                                  lane);
            }
            cp_async_arrive_noinc(kv == 0 ? k_full(stage) : v_full(stage));
          }
        }
      } else {
        mbar_wait(empty(stage), phase ^ 1);
        stamp(p, round, nb == t.n_blocks - 1 ? 19 : 20,
              tid == 0 && (nb == t.n_blocks - 1 || nb == t.nb_begin));
        const uint32_t sK = base + Tr::kKOffset + stage * Tr::kKBytes;
        const uint32_t sV = base + Tr::kVOffset + stage * Tr::kVBytes;
        if (p.diag & 1) {
          mbar_arrive(k_full(stage));
          mbar_arrive(v_full(stage));
        } else if (block_uses_tma<Tr>(p, t, nb)) {
          // Full block, boxes of tma_rows rows (contiguous in one page): the thread owning the
          // first row of each box issues its TMA copies; thread 0 arms the transaction count,
          // every thread arrives once.
#pragma unroll
          for (int kv = 0; kv < 2; ++kv) {
            const uint32_t tile = kv == 0 ? sK : sV;
            const uint32_t bar = kv == 0 ? k_full(stage) : v_full(stage);
#pragma unroll
            for (int s = 0; s < Tr::kSlots; ++s) {
              const int row = 128 * s + tid;
              if (row < Tr::kBlockN && row % p.tma_rows == 0) {
#pragma unroll
                for (int cb = 0; cb < kD / 64; ++cb) {
                  tma_load_3d(tile + cb * Tr::kBlockN * 128 + row * 128,
                              kv == 0 ? &p.tma_k : &p.tma_v, cb * 64, kvh, my_slot[s], bar);
                }
              }
            }
            arrive_tma_tile(bar, Tr::kKBytes, tid);
          }
        } else {
#pragma unroll
          for (int kv = 0; kv < 2; ++kv) {
            const char* pool = kv == 0 ? k_base : v_base;
            const int64_t stride_row = kv == 0 ? p.k_stride_row : p.v_stride_row;
            const int64_t head_off =
                static_cast<int64_t>(kvh) * (kv == 0 ? p.k_stride_head : p.v_stride_head);
            const uint32_t tile = kv == 0 ? sK : sV;
#pragma unroll
            for (int s = 0; s < Tr::kSlots; ++s) {
              const int warp_row0 = 128 * s + 32 * warp;  // warp-uniform
              if (warp_row0 >= Tr::kBlockN) continue;
#pragma unroll 4
              for (int pass = 0; pass < kPassesPerWarp; ++pass) {
                const int r_in_warp = pass * kRowsPerPass + lane / C;
                const int chunk = lane % C;
                const int slot = __shfl_sync(0xffffffffu, my_slot[s], r_in_warp);
                const int row = warp_row0 + r_in_warp;
                if (row < Tr::kBlockN) {
                  cp_async_row_chunk<Tr, 2>(tile, pool, slot, row, chunk, stride_row, head_off);
                }
              }
            }
            cp_async_arrive_noinc(kv == 0 ? k_full(stage) : v_full(stage));
          }
        }
      }
      load_slots(nb - 1);
    }
    stamp(p, round, 21, tid == 0);
  }
  cp_async_wait<0>();
}

// ---- consumers ----

// One consumer warpgroup's view of the pipeline: barriers, tiles, the ping-pong turn.
template <typename Tr, bool kBf16>
struct ConsumerCtx {
  static constexpr int kD = Tr::kHeadDim;
  static constexpr int kN = Tr::kBlockN;
  static constexpr int kS = kN / 2;  // S accumulators per thread
  static constexpr int kDV = Tr::kHeadDimV;
  static constexpr int kO = kDV / 2;  // O accumulators per thread
  // d 128: the warpgroup's 64 Q rows are loaded once per tile into registers (the wgmma A
  // fragments, 32 registers) and S = Q K^T is issued from them (wgmma RS), so the Q buffer is
  // released at the start of a tile (q_empty) and the producer loads the next tile's Q during this
  // one (and the producer, no longer held at q_empty until the tile's last S, prefetches the next
  // tile's first K / V blocks). Otherwise (d 64 / 256: registers) S reads Q from shared memory and
  // the Q buffer is released after the tile's last S. H200 2026-11-24 02:17Z, three alternated
  // rounds against the shared-memory Q: causal 16k +1.9%, bidirectional 4k +0.9%, 8k +0.3%, 4k
  // +-0 (docs/perf/fa3_notes.md, session 16; the DIAG 8 / 16 timings that suggested up to 5.7% at
  // 4k run the GEMMs on stale or constant Q, which is no measure of the loads).
  static constexpr bool kQRegs =
      kD == 128 && (kN == 64 || kN == 128 || kN == 256) && Tr::kConsumerWarpgroups == 2;
  // d 128 on three warpgroups (160 registers): the serial loop only (S 64 + O 64, then P 32).
  static constexpr bool kSerialOnly = kD == 128 && Tr::kConsumerWarpgroups == 3;
  uint32_t base, sQ, bars;
  uint64_t q_desc;                       // this warpgroup's 64 Q rows, k-step 0
  uint32_t qa[kQRegs ? kD / 16 : 1][4];  // kQRegs: Q A fragment of k-step kk
  int g, warp, lane;
  bool pingpong;  // two consumer warpgroups only

  // kQRegs: this thread's Q fragments of the tile (after q_full): ldmatrix.x4 of rows 16 warp +
  // (lane % 16), 16-byte chunks 2 kk + lane / 16 of the warpgroup's rows in the swizzled Q tile
  // (matrices: rows 0-7 / 8-15 x k 0-7, then the same x k 8-15: the m16n8k16 A fragment order the
  // wgmma RS form takes per warp).
  __device__ __forceinline__ void load_q_frags() {
    if constexpr (kQRegs) {
      const int r = warp * 16 + (lane & 15);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int chunk = 2 * kk + (lane >> 4);
        const uint32_t addr =
            sQ + (chunk / 8) * Tr::kBlockM * 128 + r * 128 + (((chunk % 8) ^ (r % 8)) << 4);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(qa[kk][0]), "=r"(qa[kk][1]), "=r"(qa[kk][2]), "=r"(qa[kk][3])
                     : "r"(addr)
                     : "memory");
      }
    }
  }

  // The Q buffer's release after the S of key block nb: at the unit's last S (nb == nb_begin) when
  // S reads Q from shared memory; with kQRegs the consumer released it at the start of the tile.
  __device__ __forceinline__ void release_q_after_s(int nb, int nb_begin) const {
    if (!kQRegs && nb == nb_begin) sm90::mbar_arrive(bars + 8);
  }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 16 + 24 * s; }
  __device__ __forceinline__ uint32_t v_full(int s) const { return bars + 16 + 24 * s + 8; }
  __device__ __forceinline__ uint32_t empty(int s) const { return bars + 16 + 24 * s + 16; }
  // kSplitEmpty: the stage's K is released after its S (release_k), V after its P V (empty).
  __device__ __forceinline__ void release_k(int s) const {
    if constexpr (Tr::kSplitEmpty) sm90::mbar_arrive(bars + Tr::kKEmptyOffset + 8 * s);
  }
  __device__ __forceinline__ uint32_t sK(int s) const {
    return base + Tr::kKOffset + s * Tr::kKBytes;
  }
  __device__ __forceinline__ uint32_t sV(int s) const {
    return base + Tr::kVOffset + s * Tr::kVBytes;
  }
  // Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 1 and 2,
  // 256 threads: 128 arrive from the other warpgroup, 128 sync here), so one's softmax runs while
  // the other's wgmmas keep the tensor cores busy. Warpgroup 1 opens with a pass to warpgroup 0
  // and skips its very last pass, so every sync has exactly one matching arrive.
  __device__ __forceinline__ void turn_wait() const {
    if (pingpong) asm volatile("bar.sync %0, 256;" ::"r"(1 + g) : "memory");
  }
  __device__ __forceinline__ void turn_pass() const {
    if (pingpong) asm volatile("bar.arrive %0, 256;" ::"r"(2 - g) : "memory");
  }

  // Waits for block `it`'s K (or V); `fence`: make cp.async (generic proxy) data visible to the
  // wgmma (async proxy) reads.
  __device__ __forceinline__ void wait_full(uint32_t bar, int it, bool fence) const {
    sm90::mbar_wait(bar, (it / Tr::kStages) & 1);
    if (fence) sm90::fence_proxy_async();
  }
  // No branch may guard a wgmma: ptxas then serialises every wgmma of the kernel (C7520: a
  // compiler-inserted warpgroup.arrive on a divergent path), which removes all GEMM overlap.
  // Descriptors: one base per tile and stage, then compile-time byte offsets (k-step kk of a
  // K-major tile: 64-column block kk / 4, 32 bytes per step; of V: 16 key lines per step).
  __device__ __forceinline__ void issue_qk(float (&s)[kS], int stage) const {
    const uint64_t k_desc = sm90::make_desc(sK(stage), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t qd = sm90::desc_advance(q_desc, (kk / 4) * Tr::kBlockM * 128 + (kk % 4) * 32);
      const int koff = (kk / 4) * kN * 128 + (kk % 4) * 32;
      if constexpr (kQRegs) {
        sm90::wgmma_rs<kN, kBf16, 0>(s, qa[kk], sm90::desc_advance(k_desc, koff), kk > 0 ? 1 : 0);
      } else if constexpr (kN == 192) {
        // Keys 0..127 then 128..191 (row 128 of the K-major tile: 128 x 128 bytes on): the
        // accumulator fragments of the two are s[0..63] and s[64..95] (columns 8j.. per 4 words).
        sm90::wgmma_ss<128, kBf16, 0>(*reinterpret_cast<float(*)[64]>(&s[0]), qd,
                                      sm90::desc_advance(k_desc, koff), kk > 0 ? 1 : 0);
        sm90::wgmma_ss<64, kBf16, 0>(*reinterpret_cast<float(*)[32]>(&s[64]), qd,
                                     sm90::desc_advance(k_desc, koff + 128 * 128), kk > 0 ? 1 : 0);
      } else {
        sm90::wgmma_ss<kN, kBf16, 0>(s, qd, sm90::desc_advance(k_desc, koff), kk > 0 ? 1 : 0);
      }
    }
  }
  __device__ __forceinline__ void issue_pv(float (&o)[kO], const uint32_t (&pa)[kN / 16][4],
                                           int stage) const {
    const uint64_t v_desc = sm90::make_desc(sV(stage), kN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      sm90::wgmma_rs<kDV, kBf16, 1>(o, pa[kk], sm90::desc_advance(v_desc, kk * 16 * 128), 1);
    }
  }
};

// Lazy rescale threshold (log2 units): the running maximum is raised only when a block's maximum
// exceeds it by more than this (FlashAttention-4's conditional rescaling).
inline constexpr float kLazyRescaleLog2 = 8.f;

// O *= corr, skipped with p.lazy_rescale when no row of the warp changed its maximum (corr == 1
// for all: exact; a warp-uniform branch, no wgmma inside).
template <int kD>
__device__ __forceinline__ void rescale_o_if_needed(float (&o)[kD / 2], const float (&corr)[2],
                                                    int lazy);

// This thread's partial maxima of one block of S (f32 accumulator layout, rows r and r + 8 =
// h 0 / 1) in two independent chains per row (mx[h][0]: even 8-key groups, mx[h][1]: odd), so the
// dependent FMNMX chains stay short; the caller combines them and reduces over the quad.
template <int kN>
__device__ __forceinline__ void block_row_max(const float (&s)[kN / 2], float (&mx)[2][2]) {
  constexpr int kJ = kN / 8;
  static_assert(kJ % 2 == 0, "key block: a multiple of 16");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h][0] = fmaxf(s[2 * h], s[2 * h + 1]);
    mx[h][1] = fmaxf(s[4 + 2 * h], s[4 + 2 * h + 1]);
  }
#pragma unroll
  for (int j = 2; j < kJ; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h][j & 1] = fmaxf(mx[h][j & 1], fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    }
  }
}

// Online-softmax state of this thread's two rows (r, r + 8), exp2 domain.
template <typename Tr, bool kBf16>
struct RowSoftmax {
  static constexpr int kN = Tr::kBlockN;
  float m[2], l[2];

  // Masks block nb of S (keys past kv_len; causal: keys after the row's position), turns it into
  // P = exp2(S * scale_log2 - m_new) in place, updates m and l, returns the O rescale factors.
  __device__ __forceinline__ void step(float (&s)[kN / 2], const Fa3Params& p, const TileInfo& t,
                                       int nb, int g, int lane, int qpos0, float (&corr)[2]) {
    if constexpr (kVariantOf<Tr> == kSoftcap) {
      if (p.logit_cap > 0.f) {
        // Soft-cap: the log2-domain logits cap tanh(x scale / cap) log2(e), before the mask (which
        // then sets the invisible ones to -inf), scaled by 1 below. One tanh.approx per score
        // (sm90::tanh_approx; a NaN stays NaN). The exp2 + fast-reciprocal formula of
        // cuda::soft_capped_log2_logit costs two MUFU ops per score and more registers here:
        // session 56 measured this kernel 1.21x faster at d 128 (soft-cap 50, 2 x 8192) with
        // tanh.approx, its output errors against the fp64 reference unchanged (bf16 rounding
        // dominates; LSE 6e-6 -> 2e-5).
        const float pre = p.scale_log2 * cuda::kLn2 / p.logit_cap;
        const float post = p.logit_cap * cuda::kLog2e;
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) s[i] = post * sm90::tanh_approx(s[i] * pre);
        const float one[2] = {1.f, 1.f};
        step_scaled<true, kN, true>(s, one, p, t, nb, g, lane, qpos0, corr);
        return;
      }
    }
    const float sc[2] = {p.scale_log2, p.scale_log2};
    step_scaled<true, kN, kVariantOf<Tr> != kPlain>(s, sc, p, t, nb, g, lane, qpos0, corr);
  }
  // The same with a softmax scale per row (sc[h]: row r + 8 h, exp2 domain; > 0). kSum false: l
  // is left alone (the FP8 kernel's row sum through the P V GEMM). kW < kN: the block's first kW
  // keys only (the FP8 kernel's half diagonal block; the caller vouches that the block's other keys
  // are masked for every row). kWindow: Fa3Params::sliding_window masks too (the variant
  // kernels; the window's first blocks are masked like the diagonal ones).
  template <bool kSum = true, int kW = kN, bool kWindow = false>
  __device__ __forceinline__ void step_scaled(float (&s)[kW / 2], const float (&sc)[2],
                                              const Fa3Params& p, const TileInfo& t, int nb, int g,
                                              int lane, int qpos0, float (&corr)[2]) {
    static_assert(kW <= kN && kW % 16 == 0, "softmax width");
    if (p.diag & 2) {
      corr[0] = corr[1] = 1.f;
      return;
    }
    const float kNegInf = -__int_as_float(0x7f800000);
    const int n0 = nb * kN;
    bool need_mask = n0 + kN > t.kv_len || (p.causal && n0 + kN - 1 > t.causal_limit + g * 64);
    if constexpr (kWindow) {
      // The block's first key lies before the window of this warpgroup's last row, or (without
      // the causal mask) its last key after the window of the first row.
      need_mask =
          need_mask || (p.sliding_window >= 0 &&
                        (n0 < t.causal_limit + g * 64 + 63 - p.sliding_window ||
                         (!p.causal && n0 + kN - 1 > t.causal_limit + g * 64 + p.sliding_window)));
    }
    if (need_mask) {
      if constexpr (kWindow) {
        // Each row's visible keys as one range [lo, hi] relative to this lane's first key, so
        // that an element's test is two compares against its compile-time offset.
        const int k0 = n0 + 2 * (lane % 4);
        int lo[2], hi[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qpos = qpos0 + 8 * h;
          const int last = p.causal                ? min(qpos, t.kv_len - 1)
                           : p.sliding_window >= 0 ? min(qpos + p.sliding_window, t.kv_len - 1)
                                                   : t.kv_len - 1;
          hi[h] = last - k0;
          lo[h] = p.sliding_window >= 0 ? qpos - p.sliding_window - k0 : -k0;
        }
#pragma unroll
        for (int j = 0; j < kW / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int off = 8 * j + (e & 1);
            if (off < lo[e >> 1] || off > hi[e >> 1]) s[4 * j + e] = kNegInf;
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kW / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + 8 * j + 2 * (lane % 4) + (e & 1);
            const int qpos = qpos0 + 8 * (e >> 1);
            const bool visible = key < t.kv_len && (!p.causal || key <= qpos);
            if (!visible) s[4 * j + e] = kNegInf;
          }
        }
      }
    }
    // Both rows at once with independent partial chains (max: 2 per row, sum: 4 per row): the
    // softmax is one warp's latency-bound sequence on its scheduler while the other warpgroup's
    // GEMMs run, so the dependent FMNMX / FADD chains are kept short.
    constexpr int kJ = kW / 8;
    static_assert(kJ % 2 == 0, "key block: a multiple of 16");
    float mx[2][2];
    block_row_max<kW>(s, mx);
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float r = fmaxf(mx[h][0], mx[h][1]);
      r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 1));
      r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 2));
      const float m_cand = fmaxf(m[h], r * sc[h]);
      // Lazy rescale (p.lazy_rescale): keep the running maximum while the block's maximum exceeds
      // it by at most kLazyRescaleLog2 (P <= 2^8 then; O, l and the LSE use the same maximum, so
      // the result is exact after the final normalisation).
      const bool keep = p.lazy_rescale != 0 && m[h] != kNegInf && m_cand - m[h] <= kLazyRescaleLog2;
      const float m_new = keep ? m[h] : m_cand;
      m_use[h] = m_new == kNegInf ? 0.f : m_new;
      corr[h] = keep ? 1.f : sm90::exp2_approx(m[h] - m_use[h]);  // m = -inf -> 0
      m[h] = m_new;
    }
    float sum[2][4] = {};
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float v = sm90::exp2_approx(fmaf(s[4 * j + e], sc[h], -m_use[h]));
        s[4 * j + e] = v;
        if constexpr (kSum) sum[h][(j & 1) * 2 + (e & 1)] += v;
      }
    }
    if constexpr (kSum) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] = l[h] * corr[h] + ((sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]));
      }
    }
  }
};

// P (f32 accumulator layout) -> the wgmma A fragment (k-step kk: keys 16kk .. 16kk + 15).
template <int kN, bool kBf16>
__device__ __forceinline__ void pack_p(const float (&s)[kN / 2], uint32_t (&pa)[kN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    pa[kk][0] = pack2<kBf16>(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack2<kBf16>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2<kBf16>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2<kBf16>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

template <int kD>
__device__ __forceinline__ void rescale_o(float (&o)[kD / 2], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

template <int kD>
__device__ __forceinline__ void rescale_o_if_needed(float (&o)[kD / 2], const float (&corr)[2],
                                                    int lazy) {
  if (lazy != 0 && __all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) return;
  rescale_o<kD>(o, corr);
}

// A row's sum from the partial sums of the 4 threads of a quad (the accumulator layout's row
// owners; every lane must call it).
__device__ __forceinline__ float quad_row_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  return l;
}

// The natural-log LSE of a row with exp2-domain maximum m and sum `sum` (-inf: no visible key).
__device__ __forceinline__ float row_lse(float m, float sum) {
  const float kNegInf = -__int_as_float(0x7f800000);
  constexpr float kLn2 = 0.693147180559945309f;
  const float m_use = m == kNegInf ? 0.f : m;
  return cuda::row_has_keys(sum) ? (m_use + __log2f(sum)) * kLn2 : kNegInf;
}

// Attention sinks (the variant kernels, whole units): sink_log2 (the head's sink logit x
// log2(e); -inf: none on this head) joins the denominator of this thread's two rows. With M =
// max(m, sink): O is rescaled by 2^(m - M), the row sum becomes L 2^(m - M) + 2^(sink - M), a
// quarter of it on each lane of the quad (store_o_tile sums the four exactly), and m becomes M,
// so that the store's O / sum and LSE M + log2(sum) hold the sink with nothing overflowing. A row
// without visible keys (m = -inf) gets O = 0 and the sink as its LSE.
template <int kD>
__device__ __forceinline__ void add_sink(float (&o)[kD / 2], float (&m)[2], float (&l)[2],
                                         float sink_log2) {
  if (sink_log2 == -__int_as_float(0x7f800000)) return;
  float f[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_row_sum(l[h]);
    const float mx = fmaxf(m[h], sink_log2);
    f[h] = sm90::exp2_approx(m[h] - mx);
    l[h] = (sum * f[h] + sm90::exp2_approx(sink_log2 - mx)) * 0.25f;
    m[h] = mx;
  }
  rescale_o<kD>(o, f);
}

// Epilogue of one consumer thread's two rows (row0, row0 + 8 of tile t): O * out_scale / l and
// the natural-log LSE (m: exp2-domain maxima, l: this thread's partial row sums). With p.epi_wide,
// 16-byte stores after a 4x4 word transpose within each quad (two shfl.xor rounds: 8-byte, then
// 16-byte units), so lane q of a quad writes columns 8j .. 8j + 7 of j = 4a + q; otherwise one
// 4-byte store per column pair. The shuffles run on every lane (rows differ within the warp); only
// the stores are guarded. Shared by the bf16 / f16 and the FP8 kernels.
template <int kD, bool kBf16>
__device__ __forceinline__ void store_o_tile(const Fa3Params& p, const TileInfo& t,
                                             const float (&o)[kD / 2], const float (&m)[2],
                                             const float (&l)[2], float out_scale, int row0,
                                             int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_row_sum(l[h]);
    const float inv = cuda::row_inv(sum, out_scale);
    const int token = t.m0 + row0 + 8 * h;
    const int64_t trow = t.q_start + token;
    // One base address per row (even element offsets: 16-byte aligned rows where p.epi_wide), then
    // compile-time offsets. For a row before the request's first token (token < 0) the address
    // lies before the row and is never dereferenced: `store` is false.
    uint32_t* rowp =
        static_cast<uint32_t*>(p.out) +
        ((trow * p.o_stride_token + static_cast<int64_t>(t.head) * p.o_stride_head) >> 1);
    const bool store = token >= 0 && token < t.q_len && !(p.diag & 16);
    if (p.epi_wide) {
      const int qt = lane % 4;
      const bool b1 = (qt & 1) != 0, c1 = (qt & 2) != 0;
#pragma unroll
      for (int a = 0; a < kD / 32; ++a) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int j = 4 * a + k;
          w[k] = pack2<kBf16>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        }
        const uint32_t r01 = __shfl_xor_sync(0xffffffffu, b1 ? w[0] : w[1], 1);
        const uint32_t r23 = __shfl_xor_sync(0xffffffffu, b1 ? w[2] : w[3], 1);
        const uint32_t lo0 = b1 ? r01 : w[0], lo1 = b1 ? w[1] : r01;  // j = 4a + b, 8 bytes
        const uint32_t hi0 = b1 ? r23 : w[2], hi1 = b1 ? w[3] : r23;  // j = 4a + 2 + b
        const uint32_t s0 = __shfl_xor_sync(0xffffffffu, c1 ? lo0 : hi0, 2);
        const uint32_t s1 = __shfl_xor_sync(0xffffffffu, c1 ? lo1 : hi1, 2);
        const uint4 v = c1 ? make_uint4(s0, s1, hi0, hi1) : make_uint4(lo0, lo1, s0, s1);
        if (store) *reinterpret_cast<uint4*>(rowp + 4 * (4 * a + qt)) = v;
      }
    } else if (store) {
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        rowp[4 * j + lane % 4] = pack2<kBf16>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      }
    }
    if (store && p.lse != nullptr && lane % 4 == 0) {
      p.lse[trow * p.lse_stride_token + static_cast<int64_t>(t.head) * p.lse_stride_head] =
          row_lse(m[h], sum);
    }
  }
}

// Epilogue of tail-split piece `piece` (virtual unit units - split_units + piece): this thread's
// two rows normalised (O * out_scale / l; the FP8 kernel's v_scale) in f32 to p.split_o and their
// natural-log LSE (-inf where the piece holds no visible key of the row) to p.split_lse, for
// merge_tail_splits_kernel. Rows outside [0, q_len) are not written (nor read back).
template <int kD>
__device__ __forceinline__ void store_o_piece(const Fa3Params& p, const TileInfo& t, int piece,
                                              const float (&o)[kD / 2], const float (&m)[2],
                                              const float (&l)[2], float out_scale, int row0,
                                              int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_row_sum(l[h]);
    const float inv = cuda::row_inv(sum, out_scale);
    const int row = row0 + 8 * h;
    const int token = t.m0 + row;
    if (token < 0 || token >= t.q_len) continue;
    const int64_t prow = static_cast<int64_t>(piece) * p.block_m + row;
    float* rowp = p.split_o + prow * kD + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<float2*>(rowp + 8 * j) =
          make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    }
    if (lane % 4 == 0) p.split_lse[prow] = row_lse(m[h], sum);
  }
}

// Epilogue of the MLA kernel's prefix-cache passes (Fa3Params::part_o): this thread's two rows
// normalised in f32 to part_o and their log2-domain LSE (-inf: no visible key) to part_lse, at
// row (q_start + token) x num_q_heads + head; with p.part_merge, merged by LSE into the running
// partial those rows hold (in place: each lane rewrites the columns it read; the quad's lanes read
// the old LSE before its lane 0 rewrites it). Rows outside [0, q_len) are not written.
template <int kD>
__device__ __forceinline__ void store_o_part(const Fa3Params& p, const TileInfo& t,
                                             const float (&o)[kD / 2], const float (&m)[2],
                                             const float (&l)[2], int row0, int lane) {
  const float kNegInf = -__int_as_float(0x7f800000);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_row_sum(l[h]);
    const int token = t.m0 + row0 + 8 * h;
    const bool store = token >= 0 && token < t.q_len;
    const int64_t prow =
        (static_cast<int64_t>(t.q_start) + token) * p.num_q_heads + static_cast<int64_t>(t.head);
    const float m_use = m[h] == kNegInf ? 0.f : m[h];
    float lse = cuda::row_has_keys(sum) ? m_use + __log2f(sum) : kNegInf;
    float a = 0.f;                 // weight of the running partial
    float b = cuda::row_inv(sum);  // of this pass's unnormalised O
    if (p.part_merge) {
      const float lse_old = store ? p.part_lse[prow] : kNegInf;
      __syncwarp();
      const float mx = fmaxf(lse_old, lse);
      if (mx != kNegInf) {
        const float w_old = exp2f(lse_old - mx), w_new = exp2f(lse - mx);
        const float den = w_old + w_new;
        a = w_old / den;
        b *= w_new / den;
        lse = mx + __log2f(den);
      }
    }
    if (!store) continue;
    float* rowp = p.part_o + prow * kD + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      float2 v = make_float2(o[4 * j + 2 * h] * b, o[4 * j + 2 * h + 1] * b);
      if (p.part_merge) {
        const float2 old = *reinterpret_cast<const float2*>(rowp + 8 * j);
        v.x = fmaf(a, old.x, v.x);
        v.y = fmaf(a, old.y, v.y);
      }
      *reinterpret_cast<float2*>(rowp + 8 * j) = v;
    }
    if (lane % 4 == 0) p.part_lse[prow] = lse;
  }
}

template <typename Tr, bool kBf16>
__device__ __forceinline__ void consumer(const Fa3Params& p, uint8_t* smem, int g) {
  using namespace sm90;
  using Ctx = ConsumerCtx<Tr, kBf16>;
  constexpr int kDV = Tr::kHeadDimV;
  constexpr int kN = Tr::kBlockN;
  const int tid = threadIdx.x - 128 * (g + 1);
  Ctx c;
  c.base = smem_addr(smem);
  c.sQ = c.base + Tr::kQOffset + g * 64 * 128;  // this warpgroup's 64 rows
  c.q_desc = make_desc(c.sQ, 16, 1024);
  c.bars = c.base + Tr::kBarOffset;
  c.g = g;
  c.warp = tid / 32;
  c.lane = tid % 32;
  c.pingpong = Tr::kConsumerWarpgroups == 2 && p.pingpong != 0;
  const int lane = c.lane;
  const uint32_t q_full = c.bars, q_empty = c.bars + 8;
  const float kNegInf = -__int_as_float(0x7f800000);
  if (g == 1) c.turn_pass();

  int it = 0;
  int tcount = 0;
  const int units = p.num_tiles * p.num_q_heads;
  const int vunits = scheduled_units(p);
  for (int round = 0, unit = unit_at(p, 0); unit < vunits; unit = unit_at(p, ++round), ++tcount) {
    const bool who = tid == 0;  // timeline builds: the warpgroup's first thread stamps
    stamp(p, round, 8 * g + 0, who);
    mbar_wait(q_full, tcount & 1);
    const TileInfo t = unit_tile_info<Tr>(p, c.base + Tr::kInfoOffset, unit, units);
    const bool last_unit = unit_at(p, round + 1) >= vunits;
    // This thread's two rows (r, r + 8) within the tile and their query positions.
    const int row0 = g * 64 + c.warp * 16 + lane / 4;
    const int qpos0 = t.causal_limit + row0;
    float o[Ctx::kO];
#pragma unroll
    for (int i = 0; i < Ctx::kO; ++i) o[i] = 0.f;
    RowSoftmax<Tr, kBf16> sm;
    sm.m[0] = sm.m[1] = kNegInf;
    sm.l[0] = sm.l[1] = 0.f;
    float corr[2];
    float s[Ctx::kS];
    uint32_t pa[kN / 16][4];

    if (!p.q_tma) fence_proxy_async();  // cp.async Q (generic proxy) before wgmma reads it
    if constexpr (Ctx::kQRegs) {
      c.load_q_frags();
      mbar_arrive(q_empty);  // Q is in registers: the producer may load the next tile's
    }
    stamp(p, round, 8 * g + 1, who);
    auto fence_for = [&](int nb) { return p.fence_tma != 0 || !block_uses_tma<Tr>(p, t, nb); };
    if (!Ctx::kSerialOnly && p.overlap) {
      // Intra-warpgroup overlap: S(next) = Q K(next)^T and O += P(cur) V(cur) are issued
      // together; the softmax of S(next) runs while the P V GEMM is in flight.
      // Three warpgroups (d 64), causal: the first blocks wholly after this warpgroup's last row
      // are released unworked, as in the serial loop below, but one block is always left to the
      // loop (a branch around its GEMMs would serialise every wgmma of the kernel): a dead last
      // block still runs, all masked, as before.
      int nb = t.n_blocks - 1;
      if (Tr::kConsumerWarpgroups == 3 && p.causal) {
        const int last_row = t.causal_limit + g * 64 + 63;
        for (; nb > t.nb_begin && nb * kN > last_row; --nb, ++it) {
          c.wait_full(c.k_full(it % Tr::kStages), it, false);
          c.release_k(it % Tr::kStages);
          mbar_arrive(c.empty(it % Tr::kStages));
        }
      }
      int it_c = it;
      c.wait_full(c.k_full(it_c % Tr::kStages), it_c, fence_for(nb));
      stamp(p, round, 8 * g + 2, who);
      c.turn_wait();
      wgmma_fence();
      c.issue_qk(s, it_c % Tr::kStages);
      wgmma_commit();
      c.turn_pass();
      wgmma_wait<0>();
      fence_regs(s);
      stamp(p, round, 8 * g + 3, who);
      c.release_k(it_c % Tr::kStages);
      c.release_q_after_s(nb, t.nb_begin);
      sm.step(s, p, t, nb, g, lane, qpos0, corr);
      pack_p<kN, kBf16>(s, pa);
      stamp(p, round, 8 * g + 4, who);
      for (--nb; nb >= t.nb_begin; --nb) {
        const int it_n = it_c + 1;
        const int stage_c = it_c % Tr::kStages, stage_n = it_n % Tr::kStages;
        c.wait_full(c.k_full(stage_n), it_n, fence_for(nb));
        c.wait_full(c.v_full(stage_c), it_c, fence_for(nb + 1));
        fence_regs(o);
        c.turn_wait();
        wgmma_fence();
        c.issue_qk(s, stage_n);
        wgmma_commit();
        c.issue_pv(o, pa, stage_c);
        wgmma_commit();
        c.turn_pass();
        wgmma_wait<1>();  // S(next) ready; P(cur) V still in flight
        fence_regs(s);
        c.release_k(stage_n);
        c.release_q_after_s(nb, t.nb_begin);
        sm.step(s, p, t, nb, g, lane, qpos0, corr);
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(c.empty(stage_c));
        pack_p<kN, kBf16>(s, pa);
        rescale_o_if_needed<kDV>(o, corr, p.lazy_rescale);
        it_c = it_n;
      }
      stamp(p, round, 8 * g + 5, who);
      const int stage_c = it_c % Tr::kStages;
      c.wait_full(c.v_full(stage_c), it_c, fence_for(t.nb_begin));
      fence_regs(o);
      c.turn_wait();
      wgmma_fence();
      c.issue_pv(o, pa, stage_c);
      wgmma_commit();
      if (g == 0 || !last_unit) c.turn_pass();
      wgmma_wait<0>();
      fence_regs(o);
      stamp(p, round, 8 * g + 6, who);
      mbar_arrive(c.empty(stage_c));
      it = it_c + 1;
    } else {
      // Serial: S = Q K^T, softmax, O += P V, one block at a time.
      // Three warpgroups, causal: the first blocks (the loop runs from the last) may lie wholly
      // after this warpgroup's last row, while the tile's later warpgroups still see them: they
      // add nothing here. Each one's K is waited for, so that the release counts toward that
      // load's phase of the stage's empty barrier, then its stage (and, at the last block, Q) is
      // released. Before the loop, so that the loop's code is unchanged. This relies on the last
      // warpgroup never skipping (n_blocks ends at the tile's last row, tile_key_end): it waits
      // for every block's V and releases it after its P V, so no stage is reloaded while a
      // skipped block's V still lands. Two warpgroups take turns: never skipped.
      int nb_top = t.n_blocks - 1;
      if (Tr::kConsumerWarpgroups == 3 && p.causal) {
        const int last_row = t.causal_limit + g * 64 + 63;
        for (; nb_top >= t.nb_begin && nb_top * kN > last_row; --nb_top, ++it) {
          c.wait_full(c.k_full(it % Tr::kStages), it, false);
          c.release_k(it % Tr::kStages);
          c.release_q_after_s(nb_top, t.nb_begin);
          mbar_arrive(c.empty(it % Tr::kStages));
        }
      }
      for (int nb = nb_top; nb >= t.nb_begin; --nb, ++it) {
        const int stage = it % Tr::kStages;
        c.wait_full(c.k_full(stage), it, fence_for(nb));
        c.turn_wait();
        wgmma_fence();
        c.issue_qk(s, stage);
        wgmma_commit();
        c.turn_pass();
        wgmma_wait<0>();
        fence_regs(s);
        c.release_k(stage);
        c.release_q_after_s(nb, t.nb_begin);
        sm.step(s, p, t, nb, g, lane, qpos0, corr);
        pack_p<kN, kBf16>(s, pa);
        rescale_o_if_needed<kDV>(o, corr, p.lazy_rescale);
        c.wait_full(c.v_full(stage), it, fence_for(nb));
        fence_regs(o);
        c.turn_wait();
        wgmma_fence();
        c.issue_pv(o, pa, stage);
        wgmma_commit();
        if (g == 0 || nb > t.nb_begin || !last_unit) c.turn_pass();
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(c.empty(stage));
      }
    }

    const int piece = split_piece(p, unit, units);
    if constexpr (Tr::kVariant != kPlain) {  // run without a tail split (the engine's rule)
      if (p.sinks != nullptr) add_sink<kDV>(o, sm.m, sm.l, p.sinks[t.head] * cuda::kLog2e);
    }
    if constexpr (Tr::kContigKV) {  // (pieces never: no tail split with part_o)
      if (p.part_o != nullptr) {
        store_o_part<kDV>(p, t, o, sm.m, sm.l, row0, lane);
      } else if (piece < 0) {
        store_o_tile<kDV, kBf16>(p, t, o, sm.m, sm.l, 1.f, row0, lane);
      } else {
        store_o_piece<kDV>(p, t, piece, o, sm.m, sm.l, 1.f, row0, lane);
      }
    } else if (piece < 0) {
      store_o_tile<kDV, kBf16>(p, t, o, sm.m, sm.l, 1.f, row0, lane);
    } else {
      store_o_piece<kDV>(p, t, piece, o, sm.m, sm.l, 1.f, row0, lane);
    }
    stamp(p, round, 8 * g + 7, who);
  }
}

// ---- tail-split merge ----

// Writes out (and lse, when requested) of the tail-split units from their pieces
// (Fa3Params::split_units > 0, after prefill_sm90_kernel): one warp per (split unit, tile row),
// lane l owning columns l kD / 32 .. (l + 1) kD / 32 - 1. O = sum_k w_k O_k / sum_k w_k with
// w_k = exp(lse_k - max_k lse_k) over the unit's num_splits pieces (the pieces' O_k are already
// normalised by their own row sums); pieces without a visible key of the row (lse_k = -inf) weigh
// 0. A fixed order of pieces: the same inputs give the same bits. grid: ceil(split_units x
// block_m / 4), block: 128.
template <int kD, bool kBf16>
__global__ void __launch_bounds__(128)
    merge_tail_splits_kernel(const __grid_constant__ Fa3Params p) {
  constexpr int kWarps = 4;
  constexpr int kPerLane = kD / 32;  // 2, 4 or 8 columns
  const float kNegInf = -__int_as_float(0x7f800000);
  const int w = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int i = w / p.block_m;  // split unit
  const int row = w - i * p.block_m;
  if (i >= p.split_units) return;
  const int unit = p.num_tiles * p.num_q_heads - p.split_units + i;
  const TileHead th = unit_tile_head(unit, p.num_tiles, p.section_heads);
  const int tile = th.tile;
  const int head = th.head;
  const int32_t* tw = p.plan + kPlanHeaderWords + p.bs * kRequestWords + tile * kTileWords;
  const int32_t* rw = p.plan + kPlanHeaderWords + tw[0] * kRequestWords;
  const int token = tw[1] + row;  // among the request's new tokens (tw[1]: the tile's m0)
  if (token < 0 || token >= rw[1]) return;
  const int64_t piece0 = static_cast<int64_t>(i) * p.num_splits;
  float mx = kNegInf;
  for (int k = 0; k < p.num_splits; ++k)
    mx = fmaxf(mx, p.split_lse[(piece0 + k) * p.block_m + row]);
  float acc[kPerLane] = {};
  float den = 0.f;
  for (int k = 0; k < p.num_splits; ++k) {
    const int64_t prow = (piece0 + k) * p.block_m + row;
    const float lse_k = p.split_lse[prow];
    const float wk = lse_k == kNegInf ? 0.f : expf(lse_k - mx);
    den += wk;
    const float* src = p.split_o + prow * kD + lane * kPerLane;
#pragma unroll
    for (int c = 0; c < kPerLane; c += 2) {
      const float2 v = *reinterpret_cast<const float2*>(src + c);
      acc[c] = fmaf(wk, v.x, acc[c]);
      acc[c + 1] = fmaf(wk, v.y, acc[c + 1]);
    }
  }
  const float inv = cuda::row_inv(den);
  const int64_t trow = rw[0] + token;
  uint32_t* dst =
      static_cast<uint32_t*>(p.out) +
      ((trow * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + lane * kPerLane) >>
       1);
#pragma unroll
  for (int c = 0; c < kPerLane; c += 2) dst[c / 2] = pack2<kBf16>(acc[c] * inv, acc[c + 1] * inv);
  if (p.lse != nullptr && lane == 0) {
    p.lse[trow * p.lse_stride_token + static_cast<int64_t>(head) * p.lse_stride_head] =
        cuda::row_has_keys(den) ? mx + logf(den) : kNegInf;
  }
}

// ---- kernel entry (shared with prefill_sm90_fp8_kernel) ----

// The bytes from the dynamic shared memory at smem_raw to its first Tr::kAlign boundary. (A
// helper that returns the aligned pointer itself changes the FP8 kernels' SASS and made one spill
// 8 bytes (nvcc 13.0); this form leaves every kernel's .text identical.)
template <typename Tr>
__device__ __forceinline__ uint32_t smem_align_pad(const uint8_t* smem_raw) {
  const uint32_t raw = sm90::smem_addr(smem_raw);
  return (Tr::kAlign - raw % Tr::kAlign) % Tr::kAlign;
}

// This thread's warpgroup (0: the producer). kUniformWg (Fa3Params::uniform_wg picks the
// instantiation at launch): broadcast from lane 0 (CUTLASS's canonical_warp_group_idx), so the
// compiler sees the role branch as warp-uniform control flow and keeps loop counters, stages and
// wgmma descriptors in uniform registers (d 64 SASS: 25 instead of 115 R2UR; 734 instead of 788
// instructions per key block).
template <bool kUniformWg>
__device__ __forceinline__ int warpgroup_index() {
  if constexpr (kUniformWg) {
    return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  } else {
    return threadIdx.x / 128;  // the kernel before session 7
  }
}

// grid: (min(work units, SMs)) persistent; block: producer warpgroup + kWG consumers (384 / 512
// threads). kUniformWg: see warpgroup_index. kWG: consumer warpgroups (PrefillTraits; 3 with
// p.block_m 192: d 64, and d 128 on the serial loop).
// kDV, kSplitEmpty: the MLA prefill kernel's V / O head dim and K / V release (PrefillTraits).
template <int kD, int kN, bool kBf16, bool kUniformWg = true, int kWG = 2, int kVariant = kPlain,
          int kDV = kD, bool kSplitEmpty = false>
__global__ void __launch_bounds__(
    PrefillTraits<kD, kN, kBf16, kWG, kVariant, kDV, kSplitEmpty>::kThreads, 1)
    prefill_sm90_kernel(const __grid_constant__ Fa3Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = PrefillTraits<kD, kN, kBf16, kWG, kVariant, kDV, kSplitEmpty>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + smem_align_pad<Tr>(smem_raw);
  const uint32_t bars = sm90::smem_addr(smem) + Tr::kBarOffset;
  if (threadIdx.x == 0) {
    sm90::mbar_init(bars, 129);  // q_full: producer threads + thread 0's TileInfo arrival
    sm90::mbar_init(bars + 8, 128 * Tr::kConsumerWarpgroups);  // q_empty: consumer threads
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbar_init(bars + 16 + 24 * s, 128);                                 // k_full
      sm90::mbar_init(bars + 16 + 24 * s + 8, 128);                             // v_full
      sm90::mbar_init(bars + 16 + 24 * s + 16, 128 * Tr::kConsumerWarpgroups);  // empty
      if constexpr (Tr::kSplitEmpty) {
        sm90::mbar_init(bars + Tr::kKEmptyOffset + 8 * s,
                        128 * Tr::kConsumerWarpgroups);  // k_empty
      }
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();
  if (p.trigger_dependents != 0) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int wg = warpgroup_index<kUniformWg>();
  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    producer<Tr>(p, smem);
  } else {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    consumer<Tr, kBf16>(p, smem, wg - 1);
  }
#endif
}

}  // namespace attnkit::fa3
