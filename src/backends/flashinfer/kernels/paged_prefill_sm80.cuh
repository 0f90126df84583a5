// The flashinfer backend's tensor-core paged prefill/extend kernel (SM80+): FlashAttention-2
// structure over the paged pool, GQA heads packed into the MMA M dimension.
//
// A block serves one WorkItem of the plan (kPrefillTileRows packed rows of one request, a key
// range) for one kv head. Packed row i of a request is token i / group, q head
// kv_head * group + i % group, so the K/V tile in shared memory feeds the whole head group.
//
//  * Warps: d <= 128: 4 warps x 32 rows (two 16-row MMA tiles per warp, so every K/V fragment
//    loaded from shared memory feeds two MMAs); d 256: 8 warps x 16 rows (the O accumulators fill
//    the registers).
//  * Keys stream in tiles of kTileN (computed in steps of kSubN) through a 2- or 3-stage cp.async
//    ring (prefill_tile) straight from the pool. The pool slot of key k is req_to_token[row, k -
//    k % page] + k % page, read in place from the page table (no per-token index list); the slots
//    of a tile are looked up an iteration before its copies are issued (the page-table loads are
//    issued before the current tile's MMAs and published after them), so a copy never waits on a
//    page-table load. fp8 tiles arrive raw by cp.async into a ring of their own (kRawStageBytes per
//    stage) and are converted to QT in shared memory when their turn comes (convert_kv: one pass
//    and a barrier per tile) into one QT stage (the tile being computed: the next conversion comes
//    after the next iteration's first barrier), so an fp8 instantiation needs less shared memory
//    than a QT one (k_scale folded into the logit scale, v_scale into the output). Before, each
//    thread loaded its fp8 chunks with plain global loads and converted them in registers at the
//    prefetch: every prefetch waited for its loads before the tile's MMAs (H200, session 57: 2 x
//    8192 causal d 128 6.81 ms, 5.95 with the raw ring).
//  * Shared rows are padded by 16 bytes: the 8 row addresses of an ldmatrix hit 8 distinct bank
//    groups. S = Q K^T and O += P V on mma.sync m16n8k16, f32 accumulators; S stays in registers
//    and becomes the A operand of P V; exp2 with log2(e) folded into the scale; O is rescaled
//    only when a row's running max grows.
//  * Causal work: the block's key range stops at its last token's diagonal (token_range); tiles
//    inside every row's visible range skip the per-element mask, and a warp skips the tiles none
//    of its rows sees. Blocks run heaviest first: the plan lists a request's tiles from the first
//    query rows on, and the kernel walks the items backwards (kv head fastest).
//  * Epilogue straight from the registers: out + lse (sinks joining the denominator), or for a
//    split item the normalised partial output and its log2 LSE for the merge kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "backends/flashinfer/kernels/paged_attention_sm80.cuh"
#include "backends/flashinfer/kernels/paged_params.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/smem_fit.h"

namespace attnkit::flashinfer {

// kTileN_ / kSubN_ / kStages_: the key tile (flashinfer_kernels.h prefill_tile: the default of
// the head dim and KV dtype; prefill_tile_compact where the device cannot opt in to it).
template <int kHeadDim_, typename QT_, DType kKvDType_,
          int kTileN_ =
              prefill_tile(kHeadDim_, kKvDType_ == DType::kBF16 || kKvDType_ == DType::kF16).tile_n,
          int kSubN_ =
              prefill_tile(kHeadDim_, kKvDType_ == DType::kBF16 || kKvDType_ == DType::kF16).sub_n,
          int kStages_ =
              prefill_tile(kHeadDim_, kKvDType_ == DType::kBF16 || kKvDType_ == DType::kF16).stages>
struct PrefillSm80Traits {
  static constexpr int kHeadDim = kHeadDim_;
  using QT = QT_;
  static constexpr DType kKvDType = kKvDType_;
  static constexpr bool kQuant = kKvDType == DType::kFP8E4M3 || kKvDType == DType::kFP8E5M2;
  static constexpr int kMTiles = kHeadDim <= 128 ? 2 : 1;  // 16-row MMA tiles per warp
  static constexpr int kWarpRows = kMTiles * cuda::kMmaM;
  static constexpr int kWarps = kPrefillTileRows / kWarpRows;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileM = kPrefillTileRows;
  static constexpr int kTileN = kTileN_;  // keys per shared-memory tile (one barrier pair)
  static constexpr int kSubN = kSubN_;    // keys per compute step: S + O fit the 255 registers
  static constexpr int kRowElems = kHeadDim + 8;  // padded smem row (QT elements)
  static constexpr int kRowBytes = kRowElems * static_cast<int>(sizeof(QT));
  static constexpr int kKSteps = kHeadDim / cuda::kMmaK;
  static constexpr int kKeyTiles = kSubN / cuda::kMmaN;
  static constexpr int kPvSteps = kSubN / cuda::kMmaK;
  static constexpr int kDimTiles = kHeadDim / cuda::kMmaN;
  // Copy granule: 16 bytes of the pool (8 QT values, or 16 fp8 values -> 32 bytes in smem).
  static constexpr int kPoolElemBytes = kQuant ? 1 : static_cast<int>(sizeof(QT));
  static constexpr int kElemsPerChunk = 16 / kPoolElemBytes;
  static constexpr int kChunksPerRow = kHeadDim / kElemsPerChunk;
  static constexpr int kQChunksPerRow = kHeadDim * static_cast<int>(sizeof(QT)) / 16;
  static constexpr bool kQInRegisters = kMTiles * kKSteps * 4 <= 32;
  static constexpr int kStages = kStages_;  // cp.async ring depth
  static constexpr int kQBytes = kTileM * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileN * kRowBytes;  // K + V
  static constexpr int kSlotBytes = kStages * kTileN * static_cast<int>(sizeof(int32_t));
  // fp8: the raw K + V bytes of a tile (rows of kHeadDim bytes, unpadded: each thread converts
  // whole 16-byte chunks, so no ldmatrix reads them).
  static constexpr int kRawStageBytes = kQuant ? 2 * kTileN * kHeadDim : 0;
  // QT stages: the ring's (cp.async lands there), or one for fp8 (convert_kv writes it).
  static constexpr int kQtStages = kQuant ? 1 : kStages;
  static constexpr int kSmemBytes =
      kQBytes + kQtStages * kStageBytes + kSlotBytes + kStages * kRawStageBytes;

  static_assert(kHeadDim % cuda::kMmaK == 0 && kHeadDim <= 256, "head dim: multiple of 16, <= 256");
  static_assert(kTileM % kWarpRows == 0 && kWarps >= 1, "tile rows: whole warps");
  static_assert(kDimTiles % 2 == 0 && kKeyTiles % 2 == 0, "ldmatrix_x4 loads n-tile pairs");
  static_assert(kTileN <= kThreads, "one thread looks up each key slot of a tile");
  static_assert(kTileN % kSubN == 0 && kStages >= 2, "whole key steps per tile, >= 2 stages");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the SM90 opt-in limit");
  static_assert(kSmemBytes == prefill_smem_bytes(kHeadDim, kQuant, {kTileN, kSubN, kStages}),
                "the host's fit rule (flashinfer_kernels.h) counts this block's bytes");
};

// The compact tile's traits (prefill_tile_compact; Tr's own type where its default fits).
template <int kD, typename QT, DType kKv>
using PrefillSm80Compact =
    PrefillSm80Traits<kD, QT, kKv,
                      prefill_tile_compact(kD, kKv == DType::kBF16 || kKv == DType::kF16).tile_n,
                      prefill_tile_compact(kD, kKv == DType::kBF16 || kKv == DType::kF16).sub_n,
                      prefill_tile_compact(kD, kKv == DType::kBF16 || kKv == DType::kF16).stages>;

template <typename Tr>
struct PagedPrefill {
  using QT = typename Tr::QT;
  static constexpr int kD = Tr::kHeadDim;
  static constexpr int kBN = Tr::kTileN;
  static constexpr int kSN = Tr::kSubN;
  static constexpr int kRE = Tr::kRowElems;
  static constexpr int kMT = Tr::kMTiles;

  struct Tile {
    int request, kv_head, q_row_begin, rows, q_start, q_len, kv_len, prefix, kv_begin, kv_end;
    int item;
    const int32_t* table_row;  // req_to_token row of the request
  };

  // Visible keys [lo, hi) of a packed row's token (tree mask checked separately), within the
  // item's key range.
  __device__ __forceinline__ static void token_range(const PagedParams& p, const Tile& t, int token,
                                                     int& lo, int& hi) {
    const int qpos = t.prefix + token;
    lo = t.kv_begin;
    hi = t.kv_end;
    if (p.custom_mask == nullptr && p.causal) hi = min(hi, qpos + 1);
    if (p.sliding_window >= 0) {
      lo = max(lo, qpos - p.sliding_window);
      if (!p.causal) hi = min(hi, qpos + p.sliding_window + 1);
    }
  }

  __device__ static bool make_tile(const PagedParams& p, Tile* t) {
    const int items = p.plan[0];
    const int linear = static_cast<int>(blockIdx.x);
    const int rev = linear / p.num_kv_heads;
    if (rev >= items) return false;  // padding of a CUDA-graph grid
    t->item = items - 1 - rev;
    const WorkItem& w = plan_item_ref(p, t->item);
    if (w.request < 0) return false;
    const RequestPlan& r =
        reinterpret_cast<const RequestPlan*>(p.plan + kPlanHeaderWords)[w.request];
    t->request = w.request;
    t->kv_head = linear % p.num_kv_heads;
    t->q_row_begin = w.q_row_begin;
    t->rows = min(Tr::kTileM, r.q_len * p.group - w.q_row_begin);
    t->q_start = r.q_start;
    t->q_len = r.q_len;
    t->kv_len = r.kv_len;
    t->prefix = r.kv_len - r.q_len;
    t->kv_begin = w.kv_begin;
    t->kv_end = min(w.kv_end, r.kv_len);
    t->table_row = p.req_to_token +
                   static_cast<int64_t>(p.req_pool_indices[w.request]) * p.req_to_token_stride;
    return t->rows > 0;
  }

  __device__ __forceinline__ static const WorkItem& plan_item_ref(const PagedParams& p, int i) {
    return reinterpret_cast<const WorkItem*>(p.plan + kPlanHeaderWords + p.bs * kRequestWords)[i];
  }

  // Pool slot of key k (-1: outside [0, kv_end)), for thread tid < kBN owning key key0 + tid.
  __device__ __forceinline__ static int32_t fetch_slot(const PagedParams& p, const Tile& t,
                                                       int key0) {
    if (static_cast<int>(threadIdx.x) >= kBN) return -1;
    const int k = key0 + static_cast<int>(threadIdx.x);
    if (k >= t.kv_end || k < 0) return -1;
    const int off = p.page_shift >= 0 ? (k & (p.page_size - 1)) : k % p.page_size;
    return t.table_row[k - off] + off;
  }

  // K and V of the keys whose slots are in `slots` -> one stage (zero rows for slot -1) by
  // cp.async, one commit group; fp8: into the raw stage `raw` (convert_kv makes the QT stage).
  __device__ __forceinline__ static void load_kv(const PagedParams& p, const Tile& t,
                                                 const int32_t* slots, uint8_t* stage,
                                                 uint8_t* raw) {
    const uint8_t* kp = static_cast<const uint8_t*>(p.k_pool);
    const uint8_t* vp = static_cast<const uint8_t*>(p.v_pool);
    constexpr int kChunks = kBN * Tr::kChunksPerRow;
#pragma unroll 4
    for (int c = threadIdx.x; c < 2 * kChunks; c += Tr::kThreads) {
      const bool is_v = c >= kChunks;
      const int local = is_v ? c - kChunks : c;
      const int r = local / Tr::kChunksPerRow;
      const int ch = local % Tr::kChunksPerRow;
      const int32_t slot = slots[r];
      uint8_t* dst = stage + (is_v ? kBN * Tr::kRowBytes : 0) + r * Tr::kRowBytes +
                     ch * Tr::kElemsPerChunk * static_cast<int>(sizeof(QT));
      const int64_t elem = is_v ? slot * p.v_stride_row + t.kv_head * p.v_stride_head
                                : slot * p.k_stride_row + t.kv_head * p.k_stride_head;
      const uint8_t* src = (is_v ? vp : kp) + (elem + ch * Tr::kElemsPerChunk) * Tr::kPoolElemBytes;
      if constexpr (!Tr::kQuant) {
        cuda::cp_async_16(cuda::smem_addr(dst), slot >= 0 ? src : kp, slot >= 0 ? 16 : 0);
      } else {
        (void)dst;
        cuda::cp_async_16(cuda::smem_addr(raw + c * 16), slot >= 0 ? src : kp, slot >= 0 ? 16 : 0);
      }
    }
    cuda::cp_async_commit();
  }

  // fp8: the raw stage (landed for every thread: after the wait and the barrier) -> the QT stage,
  // chunk c of the raw stage to the place load_kv's chunk c has in the QT layout.
  __device__ __forceinline__ static void convert_kv(const uint8_t* raw, uint8_t* stage) {
    constexpr int kChunks = kBN * Tr::kChunksPerRow;
#pragma unroll 4
    for (int c = threadIdx.x; c < 2 * kChunks; c += Tr::kThreads) {
      const bool is_v = c >= kChunks;
      const int local = is_v ? c - kChunks : c;
      const int r = local / Tr::kChunksPerRow;
      const int ch = local % Tr::kChunksPerRow;
      uint8_t* dst = stage + (is_v ? kBN * Tr::kRowBytes : 0) + r * Tr::kRowBytes +
                     ch * Tr::kElemsPerChunk * static_cast<int>(sizeof(QT));
      uint4 out[2];
      dequant16(*reinterpret_cast<const uint4*>(raw + c * 16), out);
      reinterpret_cast<uint4*>(dst)[0] = out[0];
      reinterpret_cast<uint4*>(dst)[1] = out[1];
    }
  }

  // 16 fp8 values -> 16 QT values (exact: e4m3 and e5m2 embed in f16 and bf16).
  __device__ __forceinline__ static void dequant16(const uint4& raw, uint4 (&out)[2]) {
    constexpr __nv_fp8_interpretation_t kInterp =
        Tr::kKvDType == DType::kFP8E4M3 ? __NV_E4M3 : __NV_E5M2;
    const __nv_fp8x2_storage_t* src = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
    uint32_t* dst = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const __half2 h(__nv_cvt_fp8x2_to_halfraw2(src[i], kInterp));
      if constexpr (std::is_same_v<QT, __half>) {
        dst[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
        dst[i] = *reinterpret_cast<const uint32_t*>(&b);
      }
    }
  }

  // 2^x in one MUFU instruction (ex2.approx.ftz: ~2 ulp, -inf -> 0), as FlashAttention's
  // fast-math build gets from exp2f; the softmax weights are rounded to 16 bits right after.
  __device__ __forceinline__ static float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }

  // Soft-capped log2-domain logit (cuda::soft_capped_log2_logit).
  __device__ __forceinline__ static float capped_logit(const PagedParams& p, float dot) {
    return cuda::soft_capped_log2_logit(dot, p.scale, p.logit_cap);
  }

  __device__ static void run(const PagedParams& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    Tile t;
    if (!make_tile(p, &t)) return;
    QT* sq = reinterpret_cast<QT*>(smem);
    uint8_t* kv = smem + Tr::kQBytes;
    int32_t* slots = reinterpret_cast<int32_t*>(kv + Tr::kQtStages * Tr::kStageBytes);
    // The QT stage of ring stage s (fp8: the one stage).
    const auto qt = [&](int s) { return kv + (Tr::kQuant ? 0 : s) * Tr::kStageBytes; };
    uint8_t* raw = reinterpret_cast<uint8_t*>(slots) + Tr::kSlotBytes;  // fp8 only

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t4 = lane % 4;
    const int warp_row0 = warp * Tr::kWarpRows;
    const int group = p.group;

    // Key range of the block: the union of its rows' ranges.
    const int first_token = t.q_row_begin / group;
    const int last_token = (t.q_row_begin + t.rows - 1) / group;
    int k_lo, k_hi;
    {
      int lo0, hi0, lo1, hi1;
      token_range(p, t, first_token, lo0, hi0);
      token_range(p, t, last_token, lo1, hi1);
      k_lo = lo0;
      k_hi = max(hi0, hi1);
    }
    const int n_begin = k_lo > 0 ? (k_lo / kBN) * kBN : 0;

    // Q tile (packed rows; rows past the request zero-filled).
    {
      const QT* q = static_cast<const QT*>(p.q);
      for (int c = threadIdx.x; c < Tr::kTileM * Tr::kQChunksPerRow; c += Tr::kThreads) {
        const int r = c / Tr::kQChunksPerRow;
        const int ch = c % Tr::kQChunksPerRow;
        const bool valid = r < t.rows;
        const int prow = t.q_row_begin + r;
        const int token = t.q_start + prow / group;
        const int head = t.kv_head * group + prow % group;
        const QT* src = valid ? q + token * p.q_stride_token + head * p.q_stride_head + ch * 8 : q;
        cuda::cp_async_16(cuda::smem_addr(sq + r * kRE + ch * 8), src, valid ? 16 : 0);
      }
    }
    // Prologue: slots of tiles 0 .. kStages - 1 published, tiles 0 .. kStages - 2 (with Q) in
    // flight, one commit group per tile (empty past the keys).
    constexpr int kS = Tr::kStages;
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int32_t si = fetch_slot(p, t, n_begin + i * kBN);
      if (static_cast<int>(threadIdx.x) < kBN) slots[i * kBN + threadIdx.x] = si;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kS - 1; ++i) {
      if (n_begin + i * kBN < k_hi) {
        load_kv(p, t, slots + i * kBN, qt(i), raw + i * Tr::kRawStageBytes);
      } else {
        cuda::cp_async_commit();
      }
    }

    // Shared addresses of this lane's ldmatrix rows (i = lane / 8, r = lane % 8): Q A operand
    // (rows r + 8 (i & 1), columns 8 (i >> 1)); K B operand for two n-tiles (keys r + 8 (i >> 1),
    // columns 8 (i & 1)); V B operand via .trans (keys r + 8 (i & 1), columns 8 (i >> 1)).
    const int li = lane / 8, lr = lane % 8;
    const uint32_t q_lane =
        cuda::smem_addr(sq + (warp_row0 + lr + (li & 1) * 8) * kRE + (li >> 1) * 8);
    const uint32_t k_lane0 =
        cuda::smem_addr(kv + ((lr + (li >> 1) * 8) * kRE + (li & 1) * 8) * sizeof(QT));
    const uint32_t v_lane0 = cuda::smem_addr(
        kv + kBN * Tr::kRowBytes + ((lr + (li & 1) * 8) * kRE + (li >> 1) * 8) * sizeof(QT));

    // This warp's rows: union [w_lo, w_hi) of their ranges (empty without rows) and the
    // intersection [w_lo_max, w_hi_min) (empty when every tile needs the per-element check: rows
    // past the request without a tree mask). A verify tree mask leaves the cached prefix [0,
    // prefix) visible to every draft (SpecInfo::custom_mask: its prefix columns are all 1), so
    // the intersection there stops at the prefix: only the tiles over the drafts' keys read mask
    // bytes (before, every tile of the prefix did, byte by byte), and rows past the request (zero
    // Q rows, never stored) ride along.
    const bool warp_active = warp_row0 < t.rows;
    const bool warp_full = warp_row0 + Tr::kWarpRows <= t.rows;
    int w_lo, w_hi, w_lo_max, w_hi_min;
    {
      const int wt0 = (t.q_row_begin + warp_row0) / group;
      const int wt1 = (t.q_row_begin + min(warp_row0 + Tr::kWarpRows, t.rows) - 1) / group;
      int lo0, hi0, lo1, hi1;
      token_range(p, t, wt0, lo0, hi0);
      token_range(p, t, wt1, lo1, hi1);
      w_lo = lo0;
      w_hi = warp_active ? max(hi0, hi1) : 0;
      w_lo_max = lo1;
      w_hi_min = p.custom_mask != nullptr ? min(min(hi0, hi1), t.prefix)
                 : warp_full              ? min(hi0, hi1)
                                          : -1;
    }
    const float scale_log2 = p.scale_log2;

    float o[kMT][Tr::kDimTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int n = 0; n < Tr::kDimTiles; ++n)
        o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    float m_run[2 * kMT], d_run[2 * kMT];
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) m_run[h] = cuda::kNoKeyMax, d_run[h] = 0.f;
    uint32_t qf[Tr::kQInRegisters ? kMT : 1][Tr::kQInRegisters ? Tr::kKSteps : 1][4];

    int stage = 0;
    for (int n0 = n_begin; n0 < k_hi; n0 += kBN, stage = stage == kS - 1 ? 0 : stage + 1) {
      // Page-table loads of tile n0 + kS kBN go out now; the slots are published after the MMAs.
      const int32_t next_slot = fetch_slot(p, t, n0 + kS * kBN);
      cuda::cp_async_wait<kS - 2>();  // this tile (and Q) landed for this thread
      __syncthreads();                // ... for every thread; the previous tile is done with
      if constexpr (Tr::kQuant) {
        // Its raw fp8 bytes -> the QT stage, visible to every warp after the barrier. (The raw
        // stage is refilled only after the next iteration's first barrier.)
        convert_kv(raw + stage * Tr::kRawStageBytes, qt(stage));
        __syncthreads();
      }
      if constexpr (Tr::kQInRegisters) {
        if (n0 == n_begin) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int kk = 0; kk < Tr::kKSteps; ++kk)
              cuda::ldmatrix_x4(qf[mt][kk], q_lane + (mt * 16 * kRE + kk * 16) * sizeof(QT));
        }
      }
      // Prefetch tile n0 + (kS - 1) kBN into the stage the previous tile used.
      {
        const int pf = stage == 0 ? kS - 1 : stage - 1;
        if (n0 + (kS - 1) * kBN < k_hi) {
          load_kv(p, t, slots + pf * kBN, qt(pf), raw + pf * Tr::kRawStageBytes);
        } else {
          cuda::cp_async_commit();
        }
      }

#pragma unroll
      for (int sub = 0; sub < kBN / kSN; ++sub) {
        const int ns = n0 + sub * kSN;                 // first key of this compute step
        if (ns >= w_hi || ns + kSN <= w_lo) continue;  // none of the warp's rows sees it
        float s[kMT][Tr::kKeyTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < Tr::kKeyTiles; ++n)
            s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
        const uint32_t k_lane =
            k_lane0 + (Tr::kQuant ? 0 : stage) * Tr::kStageBytes + sub * kSN * Tr::kRowBytes;
#pragma unroll(Tr::kQInRegisters ? Tr::kKSteps : 1)
        for (int kk = 0; kk < Tr::kKSteps; ++kk) {
          uint32_t a[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            if constexpr (Tr::kQInRegisters) {
#pragma unroll
              for (int x = 0; x < 4; ++x) a[mt][x] = qf[mt][kk][x];
            } else {
              cuda::ldmatrix_x4(a[mt], q_lane + (mt * 16 * kRE + kk * 16) * sizeof(QT));
            }
          }
#pragma unroll
          for (int n = 0; n < Tr::kKeyTiles; n += 2) {
            uint32_t bf[4];
            cuda::ldmatrix_x4(bf, k_lane + (n * 8 * kRE + kk * 16) * sizeof(QT));
            const uint32_t b0[2] = {bf[0], bf[1]};
            const uint32_t b1[2] = {bf[2], bf[3]};
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              cuda::mma_m16n8k16<QT>(s[mt][n], a[mt], b0);
              cuda::mma_m16n8k16<QT>(s[mt][n + 1], a[mt], b1);
            }
          }
        }
        // Logits in the log2 domain (soft-cap in its own pass), then the per-element mask unless
        // the tile is inside every row's visible range.
        if (p.logit_cap > 0.f) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int n = 0; n < Tr::kKeyTiles; ++n)
#pragma unroll
              for (int x = 0; x < 4; ++x) s[mt][n][x] = capped_logit(p, s[mt][n][x]);
        } else {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int n = 0; n < Tr::kKeyTiles; ++n)
#pragma unroll
              for (int x = 0; x < 4; ++x) s[mt][n][x] *= scale_log2;
        }
        const bool full_tile = ns >= w_lo_max && ns + kSN <= w_hi_min;
        if (!full_tile) {
#pragma unroll
          for (int h = 0; h < 2 * kMT; ++h) {
            const int mt = h / 2;
            const int r = warp_row0 + mt * 16 + (h % 2) * 8 + g;
            const int token = (t.q_row_begin + min(r, t.rows - 1)) / group;
            int lo, hi;
            token_range(p, t, token, lo, hi);
            if (r >= t.rows) hi = lo;  // rows past the request see nothing
            const uint8_t* mrow = p.custom_mask != nullptr
                                      ? p.custom_mask + p.mask_indptr[t.request] +
                                            static_cast<int64_t>(token) * t.kv_len
                                      : nullptr;
#pragma unroll
            for (int n = 0; n < Tr::kKeyTiles; ++n)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int x = 2 * (h % 2) + e;
                const int key = ns + n * 8 + 2 * t4 + e;
                bool ok = key >= lo && key < hi;
                if (mrow != nullptr && ok && key >= t.prefix) ok = mrow[key] != 0;
                if (!ok) s[mt][n][x] = -INFINITY;
              }
          }
        }
        float mx[2 * kMT];
#pragma unroll
        for (int h = 0; h < 2 * kMT; ++h) mx[h] = -INFINITY;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < Tr::kKeyTiles; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) mx[2 * mt + x / 2] = fmaxf(mx[2 * mt + x / 2], s[mt][n][x]);
        float f[2 * kMT];
        bool grew = false;
#pragma unroll
        for (int h = 0; h < 2 * kMT; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          const float m_new = fmaxf(m_run[h], mx[h]);
          f[h] = exp2_fast(m_run[h] - m_new);
          grew = grew || m_new > m_run[h];
          m_run[h] = m_new;
          d_run[h] *= f[h];
        }
        // O is rescaled only when some row's max grew (else every factor is exactly 1).
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int n = 0; n < Tr::kDimTiles; ++n) {
              o[mt][n][0] *= f[2 * mt], o[mt][n][1] *= f[2 * mt];
              o[mt][n][2] *= f[2 * mt + 1], o[mt][n][3] *= f[2 * mt + 1];
            }
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < Tr::kKeyTiles; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              const int h = 2 * mt + x / 2;
              const float pr = exp2_fast(s[mt][n][x] - m_run[h]);
              s[mt][n][x] = pr;
              d_run[h] += pr;  // per-thread partial sums; reduced across the quad at the end
            }
        // O += P V (the S accumulators of two key n-tiles form one A fragment).
        const uint32_t v_lane =
            v_lane0 + (Tr::kQuant ? 0 : stage) * Tr::kStageBytes + sub * kSN * Tr::kRowBytes;
#pragma unroll
        for (int kk = 0; kk < Tr::kPvSteps; ++kk) {
          uint32_t pa[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            pa[mt][0] = cuda::pack2<QT>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            pa[mt][1] = cuda::pack2<QT>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            pa[mt][2] = cuda::pack2<QT>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            pa[mt][3] = cuda::pack2<QT>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
          }
#pragma unroll
          for (int n = 0; n < Tr::kDimTiles; n += 2) {
            uint32_t bf[4];
            cuda::ldmatrix_x4_trans(bf, v_lane + (kk * 16 * kRE + n * 8) * sizeof(QT));
            const uint32_t b0[2] = {bf[0], bf[1]};
            const uint32_t b1[2] = {bf[2], bf[3]};
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              cuda::mma_m16n8k16<QT>(o[mt][n], pa[mt], b0);
              cuda::mma_m16n8k16<QT>(o[mt][n + 1], pa[mt], b1);
            }
          }
        }
      }
      // Slots of tile n0 + kS kBN into the table this tile's copies were issued from (every
      // thread issued them before an earlier barrier).
      if (static_cast<int>(threadIdx.x) < kBN) slots[stage * kBN + threadIdx.x] = next_slot;
      __syncthreads();  // everyone is done with this stage and sees the published slots
    }
    cuda::cp_async_wait<0>();

    // Epilogue from the registers.
    const RequestPlan& req =
        reinterpret_cast<const RequestPlan*>(p.plan + kPlanHeaderWords)[t.request];
    const bool split = req.num_splits > 1;
    const int split_index = plan_item_ref(p, t.item).split;
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) {
      float d = d_run[h];
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      const int r = warp_row0 + (h / 2) * 16 + (h % 2) * 8 + g;
      if (r >= t.rows) continue;
      const int prow = t.q_row_begin + r;
      const int token = t.q_start + prow / group;
      const int head = t.kv_head * group + prow % group;
      float mx = m_run[h];
      float(&acc)[Tr::kDimTiles][4] = o[h / 2];
      const int c0 = 2 * (h % 2);
      if (split) {
        // Partial row of (split, token): partial_base + split * q_len + token offset (the
        // flashinfer cascade's passes write every token of a multi-token request).
        const int64_t prow_index =
            static_cast<int64_t>(req.partial_base + split_index * req.q_len + (token - t.q_start)) *
                p.num_q_heads +
            head;
        const float inv = cuda::row_inv(d);
        float* dst = p.partial_out + prow_index * kD;
#pragma unroll
        for (int n = 0; n < Tr::kDimTiles; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8 + 2 * t4) =
              make_float2(acc[n][c0] * inv, acc[n][c0 + 1] * inv);
        }
        if (t4 == 0) p.partial_lse[prow_index] = cuda::row_log2_lse(mx, d);
        continue;
      }
      float fs = 1.f;
      if (p.sinks != nullptr) {  // the sink joins the denominator only
        const float sink = p.sinks[head] * cuda::kLog2e;
        const float m2 = fmaxf(mx, sink);
        fs = exp2f(mx - m2);
        d = d * fs + exp2f(sink - m2);
        mx = m2;
      }
      // (Not cuda::row_inv(d, p.v_scale * fs): that form added 8 instructions to this kernel.)
      const float inv = cuda::row_has_keys(d) ? p.v_scale * fs / d : 0.f;
      QT* dst = static_cast<QT*>(p.out) + token * p.o_stride_token + head * p.o_stride_head;
#pragma unroll
      for (int n = 0; n < Tr::kDimTiles; ++n) {
        *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * t4) =
            cuda::pack2<QT>(acc[n][c0] * inv, acc[n][c0 + 1] * inv);
      }
      if (t4 == 0 && p.lse != nullptr) {
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = cuda::row_ln_lse(mx, d);
      }
    }
  }
};

// grid: (plan items x num_kv_heads), kv head fastest, items walked from the last one; block:
// (Tr::kThreads); dynamic smem Tr::kSmemBytes
template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    paged_prefill_sm80_kernel(const __grid_constant__ PagedParams p) {
  PagedPrefill<Tr>::run(p);
}

template <typename Tr>
Status launch_paged_prefill(const PagedParams& p, int grid_items, StreamHandle stream) {
  if (grid_items <= 0 || p.num_kv_heads <= 0) return Status::ok();
  const auto kernel = paged_prefill_sm80_kernel<Tr>;
  ATTNKIT_RETURN_IF_ERROR(cuda::check_smem_fits(Tr::kSmemBytes, "flashinfer: the prefill tile"));
  ATTNKIT_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  ATTNKIT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  ATTNKIT_RETURN_IF_ERROR(check_prefill_grid(grid_items, p.num_kv_heads));
  const int64_t blocks = static_cast<int64_t>(grid_items) * p.num_kv_heads;
  kernel<<<static_cast<unsigned>(blocks), Tr::kThreads, Tr::kSmemBytes, cuda::to_stream(stream)>>>(
      p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// Picks the instantiation for (q dtype, kv dtype); the default branches name the value. Split
// items (target-verify plans, eager and graph replays, work_plan.cpp; the cascade's passes) leave
// normalised partials to the caller's merge (cascade_merge).
template <int kD>
Status run_paged_prefill_sm80(const PagedParams& p, DType q_dtype, DType kv_dtype, int grid_items,
                              StreamHandle stream) {
  const auto with_q = [&]<typename QT>() -> Status {
    const auto with_kv = [&]<DType kKv>() -> Status {
      // The default tile, or the compact one where the device cannot opt in to it (smem_fit.h;
      // the backend takes its portable path where neither fits: prefill_fit).
      using Tr = PrefillSm80Traits<kD, QT, kKv>;
      return cuda::launch_fitting<Tr, PrefillSm80Compact<kD, QT, kKv>>(
          Tr::kSmemBytes, [&]<typename Shape>() -> Status {
            return launch_paged_prefill<Shape>(p, grid_items, stream);
          });
    };
    switch (kv_dtype) {
      case DType::kFP8E4M3:
        return with_kv.template operator()<DType::kFP8E4M3>();
      case DType::kFP8E5M2:
        return with_kv.template operator()<DType::kFP8E5M2>();
      default:
        if (kv_dtype != q_dtype) {
          return Status::unsupported(std::string("flashinfer: KV dtype ") + dtype_name(kv_dtype) +
                                     " with q dtype " + dtype_name(q_dtype) +
                                     " (tensor-core path: KV = q dtype, fp8_e4m3 or fp8_e5m2)");
        }
        if constexpr (std::is_same_v<QT, __half>) {
          return with_kv.template operator()<DType::kF16>();
        } else {
          return with_kv.template operator()<DType::kBF16>();
        }
    }
  };
  switch (q_dtype) {
    case DType::kBF16:
      return with_q.template operator()<__nv_bfloat16>();
    case DType::kF16:
      return with_q.template operator()<__half>();
    default:
      return Status::unsupported(std::string("flashinfer: q dtype ") + dtype_name(q_dtype) +
                                 " (tensor-core path: bf16, f16)");
  }
}

}  // namespace attnkit::flashinfer
