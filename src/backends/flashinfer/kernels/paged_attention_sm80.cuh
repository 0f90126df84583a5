// Tensor-core paged attention (SM80+): the prefill/extend kernel template, the launch helper and
// the dtype dispatch of both tile shapes (decode runs paged_decode_sm80.cuh).
//
// A CTA serves one WorkItem (a tile of packed GQA rows of one request, a key range) for one kv
// head. Keys stream through a cp.async multi-stage pipeline straight from the paged pool (slot of
// key k = req_to_token[row, k - k % page] + k % page); S = Q K^T and O += P V run on mma.sync
// m16n8k16 with ldmatrix fragments; softmax is online in the exp2 domain. fp8 KV tiles land raw in
// shared memory and are dequantised (through registers) into a bf16/f16 tile before the MMAs;
// k_scale is folded into the logit scale and v_scale into the output.
//
// Warp layout: kWarpsM warps along the rows x kWarpsN warps along the keys of a tile; prefill uses
// 4 x 1 (64 rows, every warp sees all keys). Each warp keeps its own (m, d, O); the epilogue merges
// the kWarpsN states in shared memory, then either writes out/lse (the request is not split) or a
// normalised partial + log2 LSE (plain split plans are decode-only and decode runs
// paged_decode_sm80.cuh, which merges them in its last split CTA; the flashinfer cascade runs its
// passes here with split plans and merges them itself, see ../cascade.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "backends/flashinfer/kernels/paged_decode_sm80.cuh"
#include "backends/flashinfer/kernels/paged_params.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::flashinfer {

using cuda::kLn2;
using cuda::kLog2e;
using cuda::kMmaK;
using cuda::kMmaN;
using cuda::kNoKeyMax;

inline constexpr int kWarpSize = 32;
inline constexpr int kCopyBytes = 16;  // one cp.async / ldmatrix row
inline constexpr int kSmemPadElems =
    8;  // one 16-byte chunk per row: ldmatrix rows hit distinct banks
// Pipeline budget: at d 128 three bf16 decode stages (3 x 34 KB) keep 2 CTAs per SM (2 x 109 KB).
inline constexpr int kTargetStageBytes = 108 * 1024;
inline constexpr int kFp8PerChunk = kCopyBytes;  // fp8 values in one 16-byte chunk

// ---- Traits: every tile size, stage count and shared-memory offset, all constexpr ----
template <int kHeadDim_, typename QT_, DType kKvDType_, int kWarpsM_, int kWarpsN_,
          int kKeysPerWarp_, int kMaxStages_, int kMinBlocks_>
struct PagedTraits {
  static constexpr int kHeadDim = kHeadDim_;
  using QT = QT_;  // __nv_bfloat16 or __half: activations and MMA operands
  static constexpr DType kKvDType = kKvDType_;
  static constexpr bool kQuant = kKvDType == DType::kFP8E4M3 || kKvDType == DType::kFP8E5M2;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kKeysPerWarp = kKeysPerWarp_;
  static constexpr int kWarps = kWarpsM * kWarpsN;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kTileM = kWarpsM * kMmaRows;
  static constexpr int kTileN = kWarpsN * kKeysPerWarp;

  static constexpr int kRowElems = kHeadDim + kSmemPadElems;  // padded smem row of QT
  static constexpr int kRowBytes = kRowElems * static_cast<int>(sizeof(QT));
  static constexpr int kChunks = kHeadDim * static_cast<int>(sizeof(QT)) / kCopyBytes;
  static constexpr int kKvElemBytes = kQuant ? 1 : static_cast<int>(sizeof(QT));
  static constexpr int kRawRowBytes =
      kQuant ? kHeadDim : kRowBytes;  // staged row (raw fp8 unpadded)
  static constexpr int kRawChunks = kHeadDim * kKvElemBytes / kCopyBytes;

  static constexpr int kQBytes = kTileM * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileN * kRawRowBytes;  // K + V
  static constexpr int kStagesBudget = kTargetStageBytes / kStageBytes;
  static constexpr int kStages =
      kStagesBudget < 2 ? 2 : (kStagesBudget > kMaxStages_ ? kMaxStages_ : kStagesBudget);
  static constexpr int kConvBytes = kQuant ? 2 * kTileN * kRowBytes : 0;  // dequantised K + V
  static constexpr int kMainBytes = kStages * kStageBytes + kConvBytes;
  // Epilogue (reuses the pipeline region): per key-warp O [kTileM, kHeadDim] f32 + (m, d).
  static constexpr int kEpiBytes = kWarpsN * kTileM * kHeadDim * static_cast<int>(sizeof(float)) +
                                   2 * kWarpsN * kTileM * static_cast<int>(sizeof(float));
  static constexpr int kSmemBytes = kQBytes + (kMainBytes > kEpiBytes ? kMainBytes : kEpiBytes);

  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__ occupancy target
  static constexpr bool kRingDecode = false;      // launched as paged_attention_kernel
  // Q's A fragments stay in registers (4 per k-step) unless the head dim makes that too costly.
  static constexpr bool kQInRegisters = kHeadDim <= 128;
  static constexpr int kKSteps = kHeadDim / kMmaK;        // QK^T steps over the head dim
  static constexpr int kKeyTiles = kKeysPerWarp / kMmaN;  // S n-tiles per warp
  static constexpr int kPvSteps = kKeysPerWarp / kMmaK;   // PV steps over the warp's keys
  static constexpr int kDimTiles = kHeadDim / kMmaN;      // O n-tiles

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim <= 256, "head dim: a multiple of 16, <= 256");
  static_assert(kKeysPerWarp % kMmaK == 0, "keys per warp: whole PV k-steps");
  static_assert(kRowBytes % kCopyBytes == 0, "smem rows stay 16-byte aligned");
  static_assert(kHeadDim % kCopyBytes == 0, "raw fp8 rows are whole 16-byte chunks");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the SM90 opt-in limit");
};

// Prefill: 64 rows, 4 warps along the rows, 2 stages (2 CTAs per SM at d 128: 17 KB Q + 2 x 34 KB).
// Decode has its own kernel (paged_decode_sm80.cuh).
inline constexpr int kPrefillMaxStages = 2;
inline constexpr int kPrefillMinBlocks = 1;
inline constexpr int kPrefillKeysPerWarpLargeD = 32;  // d > 128: keeps O + S within the registers
inline constexpr int kPrefillKeysPerWarp = 64;
template <int kD, typename QT, DType kKv>
using PrefillTraits = PagedTraits<kD, QT, kKv, kPrefillWarpsM, 1,
                                  (kD > 128 ? kPrefillKeysPerWarpLargeD : kPrefillKeysPerWarp),
                                  kPrefillMaxStages, kPrefillMinBlocks>;

// ---- small device helpers ----
__device__ __forceinline__ const RequestPlan& plan_request(const int32_t* plan, int r) {
  return reinterpret_cast<const RequestPlan*>(plan + kPlanHeaderWords)[r];
}
__device__ __forceinline__ const WorkItem& plan_item(const int32_t* plan, int bs, int i) {
  return reinterpret_cast<const WorkItem*>(plan + kPlanHeaderWords + bs * kRequestWords)[i];
}

// Pool slot of key `k` through the in-place page table req_to_token[row, ::page_size].
__device__ __forceinline__ int64_t key_slot(const int32_t* row, int k, int page_size,
                                            int page_shift) {
  const int off = page_shift >= 0 ? (k & (page_size - 1)) : k % page_size;
  return static_cast<int64_t>(row[k - off]) + off;
}

// 16 fp8 values -> 16 QT values (exact: e4m3 and e5m2 embed in f16 and bf16).
template <typename QT, DType kKv>
__device__ __forceinline__ void dequant16(const uint4& raw, uint4 (&out)[2]) {
  constexpr __nv_fp8_interpretation_t kInterp = kKv == DType::kFP8E4M3 ? __NV_E4M3 : __NV_E5M2;
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

template <typename QT>
__device__ __forceinline__ void store_out8(QT* dst, const float (&v)[8]) {
  uint4 raw;
  uint32_t* w = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = cuda::pack2<QT>(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = raw;
}

// ---- the kernel ----
template <typename Tr>
struct PagedAttention {
  using QT = typename Tr::QT;

  // Which keys and queries one CTA sees; derived once from the plan and the layer's mask.
  struct Tile {
    int request, kv_head, q_row_begin, rows, q_start, q_len, kv_len, prefix, kv_begin, kv_end;
    const int32_t* table_row;  // req_to_token row of the request
  };

  __device__ static bool make_tile(const PagedParams& p, Tile* t) {
    if (static_cast<int>(blockIdx.x) >= p.plan[0]) return false;
    const WorkItem& w = plan_item(p.plan, p.bs, blockIdx.x);
    if (w.request < 0) return false;
    const RequestPlan& r = plan_request(p.plan, w.request);
    t->request = w.request;
    t->kv_head = blockIdx.y;
    t->q_row_begin = w.q_row_begin;
    t->rows = min(Tr::kTileM, r.q_len * p.group - w.q_row_begin);
    t->q_start = r.q_start;
    t->q_len = r.q_len;
    t->kv_len = r.kv_len;
    t->prefix = r.kv_len - r.q_len;
    int kv_begin = w.kv_begin;
    int kv_end = min(w.kv_end, r.kv_len);
    const int first_token = w.q_row_begin / p.group;
    const int last_token = (w.q_row_begin + t->rows - 1) / p.group;
    if (p.custom_mask == nullptr && p.causal) kv_end = min(kv_end, t->prefix + last_token + 1);
    if (p.sliding_window >= 0) {
      kv_begin = max(kv_begin, t->prefix + first_token - p.sliding_window);
      // Bidirectional attention: the window also bounds keys after the query.
      if (!p.causal) kv_end = min(kv_end, t->prefix + last_token + p.sliding_window + 1);
    }
    t->kv_begin = kv_begin;
    t->kv_end = kv_end;
    t->table_row = p.req_to_token +
                   static_cast<int64_t>(p.req_pool_indices[w.request]) * p.req_to_token_stride;
    return true;
  }

  // Q tile [kTileM packed rows, kHeadDim] -> smem (rows past the request are zero-filled).
  __device__ static void load_q(const PagedParams& p, const Tile& t, QT* sq) {
    const QT* q = static_cast<const QT*>(p.q);
    for (int c = threadIdx.x; c < Tr::kTileM * Tr::kChunks; c += Tr::kThreads) {
      const int r = c / Tr::kChunks;
      const int ch = c % Tr::kChunks;
      const bool valid = r < t.rows;
      const int prow = t.q_row_begin + r;
      const int token = t.q_start + prow / p.group;
      const int head = t.kv_head * p.group + prow % p.group;
      const QT* src = valid ? q + token * p.q_stride_token + head * p.q_stride_head +
                                  ch * (kCopyBytes / sizeof(QT))
                            : q;
      cuda::cp_async_16(cuda::smem_addr(sq + r * Tr::kRowElems + ch * (kCopyBytes / sizeof(QT))),
                        src, valid ? kCopyBytes : 0);
    }
  }

  // Address generation of one K/V tile: thread `tid` copies chunk tid % kRawChunks of rows
  // tid / kRawChunks + i * kRowsPerPass. When the split is even and short enough, the pool slots of
  // a tile are looked up one tile ahead (SlotBatch) so the page-table loads overlap the MMAs of the
  // current tile instead of sitting in front of every cp.async.
  static constexpr int kRowsPerPass = Tr::kThreads / Tr::kRawChunks;
  static constexpr int kPasses = kRowsPerPass > 0 ? Tr::kTileN / kRowsPerPass : 0;
  static constexpr int kMaxBatchedPasses = 8;  // registers spent on prefetched slots
  static constexpr bool kBatchedSlots = Tr::kThreads % Tr::kRawChunks == 0 && kRowsPerPass > 0 &&
                                        Tr::kTileN % kRowsPerPass == 0 &&
                                        kPasses <= kMaxBatchedPasses;
  struct SlotBatch {
    int32_t slot[kBatchedSlots ? kPasses : 1];  // -1: key past kv_end (zero-fill)
  };

  __device__ static void fetch_slots(const PagedParams& p, const Tile& t, int key0, SlotBatch* b) {
    if constexpr (kBatchedSlots) {
      const int r0 = threadIdx.x / Tr::kRawChunks;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int key = key0 + r0 + i * kRowsPerPass;
        b->slot[i] =
            key < t.kv_end
                ? static_cast<int32_t>(key_slot(t.table_row, key, p.page_size, p.page_shift))
                : -1;
      }
    }
  }

  __device__ static void copy_row(const PagedParams& p, const Tile& t, int r, int ch, int32_t slot,
                                  uint8_t* stage) {
    const uint8_t* kp = static_cast<const uint8_t*>(p.k_pool);
    const uint8_t* vp = static_cast<const uint8_t*>(p.v_pool);
    const bool valid = slot >= 0;
    const uint8_t* ks = kp;
    const uint8_t* vs = vp;
    if (valid) {
      ks = kp + (slot * p.k_stride_row + t.kv_head * p.k_stride_head) * Tr::kKvElemBytes +
           ch * kCopyBytes;
      vs = vp + (slot * p.v_stride_row + t.kv_head * p.v_stride_head) * Tr::kKvElemBytes +
           ch * kCopyBytes;
    }
    const int dst = r * Tr::kRawRowBytes + ch * kCopyBytes;
    cuda::cp_async_16(cuda::smem_addr(stage + dst), ks, valid ? kCopyBytes : 0);
    cuda::cp_async_16(cuda::smem_addr(stage + Tr::kTileN * Tr::kRawRowBytes + dst), vs,
                      valid ? kCopyBytes : 0);
  }

  // K and V of keys [key0, key0 + kTileN) -> one pipeline stage (keys past kv_end zero-filled).
  // `b` holds the tile's slots when kBatchedSlots (fetch_slots), else they are looked up here.
  __device__ static void load_kv(const PagedParams& p, const Tile& t, int key0, const SlotBatch& b,
                                 uint8_t* stage) {
    if constexpr (kBatchedSlots) {
      const int r0 = threadIdx.x / Tr::kRawChunks;
      const int ch = threadIdx.x % Tr::kRawChunks;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) copy_row(p, t, r0 + i * kRowsPerPass, ch, b.slot[i], stage);
    } else {
      for (int c = threadIdx.x; c < Tr::kTileN * Tr::kRawChunks; c += Tr::kThreads) {
        const int r = c / Tr::kRawChunks;
        const int key = key0 + r;
        const int32_t slot =
            key < t.kv_end
                ? static_cast<int32_t>(key_slot(t.table_row, key, p.page_size, p.page_shift))
                : -1;
        copy_row(p, t, r, c % Tr::kRawChunks, slot, stage);
      }
    }
  }

  // A fragment of Q rows [wm * 16, +16), head dims [kk * 16, +16).
  __device__ static void load_q_fragment(const QT* sq, int wm, int lane, int kk, uint32_t (&a)[4]) {
    cuda::ldmatrix_x4(a, cuda::smem_addr(sq + (wm * kMmaRows + lane % 16) * Tr::kRowElems +
                                         kk * kMmaK + (lane / 16) * 8));
  }

  // Raw fp8 stage -> dequantised K/V tile (padded rows of QT).
  __device__ static void dequant_stage(const uint8_t* stage, QT* conv) {
    constexpr int kChunks16 = Tr::kHeadDim / kFp8PerChunk;
    for (int c = threadIdx.x; c < 2 * Tr::kTileN * kChunks16; c += Tr::kThreads) {
      const int r = c / kChunks16;  // rows 0..kTileN-1: K, kTileN..2 kTileN-1: V
      const int ch = c % kChunks16;
      const uint4 raw =
          *reinterpret_cast<const uint4*>(stage + r * Tr::kRawRowBytes + ch * kCopyBytes);
      uint4 vals[2];
      dequant16<QT, Tr::kKvDType>(raw, vals);
      uint4* dst = reinterpret_cast<uint4*>(conv + r * Tr::kRowElems + ch * kFp8PerChunk);
      dst[0] = vals[0];
      dst[1] = vals[1];
    }
  }

  __device__ static void run(const PagedParams& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    Tile t;
    if (!make_tile(p, &t)) return;
    QT* sq = reinterpret_cast<QT*>(smem);
    uint8_t* main = smem + Tr::kQBytes;
    QT* conv = reinterpret_cast<QT*>(main + Tr::kStages * Tr::kStageBytes);

    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int wm = warp % Tr::kWarpsM;
    const int wn = warp / Tr::kWarpsM;
    const int g = lane / 4;   // fragment row group
    const int tq = lane % 4;  // thread in group
    const int warp_key0 = wn * Tr::kKeysPerWarp;

    // Tokens of this thread's two fragment rows (g and g + 8 of the warp's 16).
    int row_token[2];
    bool row_valid[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * kMmaRows + g + h * 8;
      row_valid[h] = r < t.rows;
      row_token[h] = (t.q_row_begin + r) / p.group;
    }
    const int first_token = t.q_row_begin / p.group;  // earliest query token of the tile
    const uint8_t* mask =
        p.custom_mask != nullptr ? p.custom_mask + p.mask_indptr[t.request] : nullptr;

    uint32_t qf[Tr::kQInRegisters ? Tr::kKSteps : 1][4];  // Q A-fragments (kQInRegisters)
    float o[Tr::kDimTiles][4];
#pragma unroll
    for (int i = 0; i < Tr::kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {kNoKeyMax, kNoKeyMax};
    float d[2] = {0.f, 0.f};

    const int num_tiles =
        t.kv_end > t.kv_begin ? (t.kv_end - t.kv_begin + Tr::kTileN - 1) / Tr::kTileN : 0;

    // Prologue: Q with stage 0, then the other stages; `pending` holds the slots of the next
    // tile to load.
    load_q(p, t, sq);
    SlotBatch pending;
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) {
      if (s < num_tiles) {
        fetch_slots(p, t, t.kv_begin + s * Tr::kTileN, &pending);
        load_kv(p, t, t.kv_begin + s * Tr::kTileN, pending, main + s * Tr::kStageBytes);
      }
      cuda::cp_async_commit();
    }
    if (Tr::kStages - 1 < num_tiles) {
      fetch_slots(p, t, t.kv_begin + (Tr::kStages - 1) * Tr::kTileN, &pending);
    }

    for (int j = 0; j < num_tiles; ++j) {
      cuda::cp_async_wait<Tr::kStages - 2>();
      __syncthreads();  // tile j landed for everyone; everyone is done with tile j - 1
      {
        const int next = j + Tr::kStages - 1;
        if (next < num_tiles) {
          load_kv(p, t, t.kv_begin + next * Tr::kTileN, pending,
                  main + (next % Tr::kStages) * Tr::kStageBytes);
        }
        cuda::cp_async_commit();
        // Look the following tile's slots up now: the loads complete behind this tile's MMAs.
        if (next + 1 < num_tiles) fetch_slots(p, t, t.kv_begin + (next + 1) * Tr::kTileN, &pending);
      }
      const uint8_t* stage = main + (j % Tr::kStages) * Tr::kStageBytes;
      const QT* sk;
      const QT* sv;
      if constexpr (Tr::kQuant) {
        dequant_stage(stage, conv);
        __syncthreads();
        sk = conv;
        sv = conv + Tr::kTileN * Tr::kRowElems;
      } else {
        sk = reinterpret_cast<const QT*>(stage);
        sv = reinterpret_cast<const QT*>(stage + Tr::kTileN * Tr::kRawRowBytes);
      }
      const int key0 = t.kv_begin + j * Tr::kTileN;

      if constexpr (Tr::kQInRegisters) {
        if (j == 0) {  // Q landed with tile 0
#pragma unroll
          for (int kk = 0; kk < Tr::kKSteps; ++kk) load_q_fragment(sq, wm, lane, kk, qf[kk]);
        }
      }

      // S = Q K^T over this warp's keys.
      float s[Tr::kKeyTiles][4];
#pragma unroll
      for (int i = 0; i < Tr::kKeyTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        uint32_t a[4];
        if constexpr (Tr::kQInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = qf[kk][i];
        } else {
          load_q_fragment(sq, wm, lane, kk, a);
        }
#pragma unroll
        for (int n2 = 0; n2 < Tr::kKeyTiles / 2; ++n2) {
          uint32_t b[4];
          const int key = warp_key0 + n2 * 16 + (lane / 16) * 8 + lane % 8;
          cuda::ldmatrix_x4(
              b, cuda::smem_addr(sk + key * Tr::kRowElems + kk * kMmaK + ((lane / 8) % 2) * 8));
          const uint32_t b0[2] = {b[0], b[1]};
          const uint32_t b1[2] = {b[2], b[3]};
          cuda::mma_m16n8k16<QT>(s[2 * n2], a, b0);
          cuda::mma_m16n8k16<QT>(s[2 * n2 + 1], a, b1);
        }
      }

      // Scale (soft-cap), mask, online softmax. A tile wholly inside every row's visible range
      // (all keys < kv_end, below the causal diagonal of the tile's first token, no window or
      // tree mask) skips the per-key mask; rows past the request only feed their own state.
      const bool full_tile = key0 + Tr::kTileN <= t.kv_end && mask == nullptr &&
                             p.sliding_window < 0 &&
                             (!p.causal || key0 + Tr::kTileN - 1 <= t.prefix + first_token);
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < Tr::kKeyTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          float x = s[nt][e];
          if (p.logit_cap > 0.f) {
            x = p.logit_cap * tanhf(x * p.scale / p.logit_cap) * kLog2e;
          } else {
            x *= p.scale_log2;
          }
          if (full_tile) {
            s[nt][e] = x;
            tile_max[h] = fmaxf(tile_max[h], x);
            continue;
          }
          const int key = key0 + warp_key0 + nt * kMmaN + 2 * tq + (e & 1);
          const int qpos = t.prefix + row_token[h];
          bool visible = row_valid[h] && key < t.kv_end && key >= t.kv_begin;
          if (mask != nullptr) {
            visible = visible && mask[static_cast<int64_t>(row_token[h]) * t.kv_len + key] != 0;
          } else if (p.causal) {
            visible = visible && key <= qpos;
          }
          if (p.sliding_window >= 0) {
            visible = visible && qpos - key <= p.sliding_window &&
                      (p.causal || key - qpos <= p.sliding_window);
          }
          x = visible ? x : -INFINITY;
          s[nt][e] = x;
          tile_max[h] = fmaxf(tile_max[h], x);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        // Rescale only when the running max grows (skipping a factor of exactly 1 changes
        // nothing).
        if (tile_max[h] > m[h]) {
          const float factor = exp2f(m[h] - tile_max[h]);
          m[h] = tile_max[h];
          d[h] *= factor;
#pragma unroll
          for (int i = 0; i < Tr::kDimTiles; ++i) {
            o[i][2 * h] *= factor;
            o[i][2 * h + 1] *= factor;
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < Tr::kKeyTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pr = exp2f(s[nt][e] - m[e / 2]);
          s[nt][e] = pr;
          d[e / 2] += pr;
        }
      }

      // O += P V: the S accumulators of two key n-tiles form one A fragment.
#pragma unroll
      for (int ks = 0; ks < Tr::kPvSteps; ++ks) {
        const uint32_t a[4] = {cuda::pack2<QT>(s[2 * ks][0], s[2 * ks][1]),
                               cuda::pack2<QT>(s[2 * ks][2], s[2 * ks][3]),
                               cuda::pack2<QT>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                               cuda::pack2<QT>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
        const int key = warp_key0 + ks * kMmaK + ((lane / 8) % 2) * 8 + lane % 8;
#pragma unroll
        for (int d2 = 0; d2 < Tr::kDimTiles / 2; ++d2) {
          uint32_t b[4];
          cuda::ldmatrix_x4_trans(
              b, cuda::smem_addr(sv + key * Tr::kRowElems + d2 * 16 + (lane / 16) * 8));
          const uint32_t b0[2] = {b[0], b[1]};
          const uint32_t b1[2] = {b[2], b[3]};
          cuda::mma_m16n8k16<QT>(o[2 * d2], a, b0);
          cuda::mma_m16n8k16<QT>(o[2 * d2 + 1], a, b1);
        }
      }
    }
    cuda::cp_async_wait<0>();
    __syncthreads();  // the pipeline region becomes the epilogue region

    // Epilogue 1: every warp's (m, d, O) to shared memory.
    float* epi_o = reinterpret_cast<float*>(main);                   // [kWarpsN, kTileM, kHeadDim]
    float* epi_m = epi_o + Tr::kWarpsN * Tr::kTileM * Tr::kHeadDim;  // [kWarpsN, kTileM]
    float* epi_d = epi_m + Tr::kWarpsN * Tr::kTileM;                 // [kWarpsN, kTileM]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
      const int r = wm * kMmaRows + g + h * 8;
      float* orow = epi_o + (wn * Tr::kTileM + r) * Tr::kHeadDim;
#pragma unroll
      for (int i = 0; i < Tr::kDimTiles; ++i) {
        *reinterpret_cast<float2*>(orow + i * kMmaN + 2 * tq) =
            make_float2(o[i][2 * h], o[i][2 * h + 1]);
      }
      if (tq == 0) {
        epi_m[wn * Tr::kTileM + r] = m[h];
        epi_d[wn * Tr::kTileM + r] = d[h];
      }
    }
    __syncthreads();

    // Epilogue 2: merge the key-warps' states per row and write out/lse or the partial.
    const RequestPlan& req = plan_request(p.plan, t.request);
    const bool split = req.num_splits > 1;
    const int split_index = plan_item(p.plan, p.bs, blockIdx.x).split;
    constexpr int kVec = 8;
    constexpr int kVecsPerRow = Tr::kHeadDim / kVec;
    for (int c = threadIdx.x; c < t.rows * kVecsPerRow; c += Tr::kThreads) {
      const int r = c / kVecsPerRow;
      const int col = (c % kVecsPerRow) * kVec;
      float mx = kNoKeyMax;
#pragma unroll
      for (int w = 0; w < Tr::kWarpsN; ++w) mx = fmaxf(mx, epi_m[w * Tr::kTileM + r]);
      float dsum = 0.f;
      float acc[kVec] = {};
#pragma unroll
      for (int w = 0; w < Tr::kWarpsN; ++w) {
        const float f = exp2f(epi_m[w * Tr::kTileM + r] - mx);
        dsum += epi_d[w * Tr::kTileM + r] * f;
        const float* src = epi_o + (w * Tr::kTileM + r) * Tr::kHeadDim + col;
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += src[i] * f;
      }
      const int prow = t.q_row_begin + r;
      const int token = t.q_start + prow / p.group;
      const int head = t.kv_head * p.group + prow % p.group;
      if (split) {
        // Partial row of (split, token): partial_base + split * q_len + token offset (decode:
        // q_len 1; cascade passes write every token of a multi-token request).
        const int64_t prow_index =
            static_cast<int64_t>(req.partial_base + split_index * req.q_len + (token - t.q_start)) *
                p.num_q_heads +
            head;
        const float inv = dsum > 0.f ? 1.f / dsum : 0.f;
        float* dst = p.partial_out + prow_index * Tr::kHeadDim + col;
#pragma unroll
        for (int i = 0; i < kVec; i += 4) {
          *reinterpret_cast<float4*>(dst + i) =
              make_float4(acc[i] * inv, acc[i + 1] * inv, acc[i + 2] * inv, acc[i + 3] * inv);
        }
        if (col == 0) p.partial_lse[prow_index] = dsum > 0.f ? mx + log2f(dsum) : -INFINITY;
        continue;
      }
      if (p.sinks != nullptr) {  // the sink joins the denominator only
        const float sink = p.sinks[head] * kLog2e;
        const float m2 = fmaxf(mx, sink);
        const float f = exp2f(mx - m2);
        dsum = dsum * f + exp2f(sink - m2);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] *= f;
        mx = m2;
      }
      const float inv = dsum > 0.f ? p.v_scale / dsum : 0.f;
      float vals[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) vals[i] = acc[i] * inv;
      store_out8<QT>(
          static_cast<QT*>(p.out) + token * p.o_stride_token + head * p.o_stride_head + col, vals);
      if (col == 0 && p.lse != nullptr) {
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] =
            dsum > 0.f ? (mx + log2f(dsum)) * kLn2 : -INFINITY;
      }
    }
  }
};

// grid: (work items, num_kv_heads) block: (Tr::kThreads); dynamic smem Tr::kSmemBytes
template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    paged_attention_kernel(const __grid_constant__ PagedParams p) {
  PagedAttention<Tr>::run(p);
}

// ---- launch ----
template <typename Tr>
Status launch_paged(const PagedParams& p, int grid_items, StreamHandle stream) {
  if (grid_items <= 0) return Status::ok();
  const auto kernel = [] {
    if constexpr (Tr::kRingDecode) {
      return paged_decode_ring_kernel<Tr>;
    } else {
      return paged_attention_kernel<Tr>;
    }
  }();
  // Per-function attributes, set once per instantiation (not stream operations): the dynamic
  // shared memory and all of the unified L1/shared storage as shared memory (two decode CTAs per
  // SM need 2 x 107 KB).
  static const cudaError_t attr = [&] {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    }
    return e;
  }();
  ATTNKIT_CUDA_TRY(attr);
  const auto items = static_cast<unsigned>(grid_items);
  const auto heads = static_cast<unsigned>(p.num_kv_heads);
  const dim3 grid = Tr::kRingDecode ? dim3(heads, items) : dim3(items, heads);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// Picks the instantiation for (q dtype, kv dtype, tile shape); the default branches name the value.
template <int kD, TileShape kShape>
Status run_paged_impl(const PagedParams& p, DType q_dtype, DType kv_dtype, int grid_items,
                      StreamHandle stream) {
  const auto with_q = [&]<typename QT>() -> Status {
    const auto with_kv = [&]<DType kKv>() -> Status {
      using Tr = std::conditional_t<kShape == TileShape::kDecode, RingDecodeTraits<kD, QT, kKv>,
                                    PrefillTraits<kD, QT, kKv>>;
      return launch_paged<Tr>(p, grid_items, stream);
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
        return with_kv.template operator() < std::is_same_v<QT, __half> ? DType::kF16
                                                                        : DType::kBF16 > ();
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
