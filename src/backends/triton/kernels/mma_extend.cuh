// The triton backend's tensor-core extend kernel (SM80+, bf16/f16 activations): FlashAttention-2
// structure over token indices.
//
// One block = kBlockM query rows of one request x one q head; 4 warps, each owning kMTiles x 16
// consecutive rows (d <= 128: 32 rows, so every K/V fragment loaded from shared memory feeds two
// MMAs; d 256: 16 rows, the O accumulators fill the registers). The mainloop walks key tiles of
// kBlockN keys over the request's key index space (pool prefix through kv_indices, then the new
// tokens from the contiguous inputs or the pool), in a kStages-deep cp.async ring in shared memory
// (rows padded by 16 bytes, so the 8 row addresses of an ldmatrix hit 8 distinct bank groups):
// native-dtype tiles arrive by cp.async while the previous tile is computed; fp8/fp4 tiles are
// dequantised in registers on the way in. The global row addresses of a tile are resolved an
// iteration before their copies are issued (the kv_indices loads are issued before the current
// tile's MMAs and consumed after them), so the copy issue never waits on a page-table load. S = Q
// K^T and O += P V run on mma.sync m16n8k16 with f32 accumulators; S stays in registers and becomes
// the A operand of P V; exp2 with log2(e) folded into the scale (native KV: the scale is applied
// inside the exponent, exp2(s * scale - m), by one FFMA per logit, and the max is taken on the raw
// logits); O is rescaled only when a row's running max grows. A key tile may be computed in
// several steps of kSubN keys; the QK^T k-loop is fully unrolled for native KV (MmaExtendTile).
//
// Causal work: a block's key range stops at its last row's diagonal; tiles inside every row's
// visible range skip the per-element mask, and a warp skips a tile that none of its rows sees.
// Blocks are numbered heaviest first (last query tiles of every request and head before the
// first ones), so the long rows start early and the light ones fill the tail of the grid.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/attention_variant.cuh"
#include "backends/triton/kernels/triton_kernels.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::triton {

// Tile configuration of a head dim: keys per shared-memory tile (one barrier pair), keys per
// compute step (S registers: kMTiles x kSubN / 2), the cp.async ring depth (mma_extend_tile,
// triton_kernels.h, with the measurements), the unroll of the QK^T k-loop (when Q is re-read from
// shared memory) and whether the scale is folded into exp2.
template <int kHeadDim, bool kNativeKV>
struct MmaExtendTile {
  static constexpr int kBlockN = mma_extend_tile(kHeadDim, kNativeKV).block_n;
  static constexpr int kSubN = mma_extend_tile(kHeadDim, kNativeKV).sub_n;
  static constexpr int kStages = mma_extend_tile(kHeadDim, kNativeKV).stages;
  // Native KV: QK^T loop fully unrolled (the ldmatrix of the next k-step overlaps this one's
  // MMAs) and the softmax scale folded into the exponent: causal prefill +7-8% at d 128, +12% at
  // d 256, +2% at d 64 (H200, docs/perf/extend_notes.md, Session 4); fp8/fp4 KV keep the rolled
  // loop and the multiplied scale (not measured; the unroll adds spills at some of them).
  static constexpr int kQKUnroll = kNativeKV ? kHeadDim / 16 : 1;
  static constexpr bool kFoldScale = kNativeKV;
};

template <int kHeadDim, DType kQ, DType kKV,
          int kTileN = MmaExtendTile<kHeadDim, kQ == kKV>::kBlockN,
          int kSubTileN = MmaExtendTile<kHeadDim, kQ == kKV>::kSubN,
          int kRingStages = MmaExtendTile<kHeadDim, kQ == kKV>::kStages,
          int kQKUnrollSteps = MmaExtendTile<kHeadDim, kQ == kKV>::kQKUnroll,
          bool kFoldScale = MmaExtendTile<kHeadDim, kQ == kKV>::kFoldScale>
struct MmaExtendTraits {
  static constexpr int kD = kHeadDim;
  static constexpr DType kQDType = kQ;
  static constexpr DType kKVDType = kKV;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kD <= 128 ? 2 : 1;  // 16-row MMA tiles per warp
  static constexpr int kWarpRows = kMTiles * cuda::kMmaM;
  static constexpr int kBlockM = kWarps * kWarpRows;  // 128 query rows (d 256: 64)
  static_assert(kBlockM == mma_extend_block_m(kD), "the host's grid check sizes tiles alike");
  static constexpr int kQKUnroll = kQKUnrollSteps;  // unroll of the QK^T loop (Q from smem)
  // The softmax scale is applied inside the exponent (one FFMA per logit) instead of a
  // multiplication pass over the logits, when it is positive and there is no soft-cap.
  static constexpr bool kFoldScaleIntoExp = kFoldScale;
  static constexpr int kBlockN = kTileN;   // keys per shared-memory tile (one barrier pair)
  static constexpr int kSubN = kSubTileN;  // keys per compute step: S + O fit the 255 registers
  static constexpr int kPad = 8;           // elements: conflict-free ldmatrix rows
  static constexpr int kRowStride = kD + kPad;  // smem row stride (elements)
  static constexpr int kNTilesS = kSubN / cuda::kMmaN;
  static constexpr int kNTilesO = kD / cuda::kMmaN;
  static constexpr int kKStepsQK = kD / cuda::kMmaK;
  static constexpr int kKStepsPV = kSubN / cuda::kMmaK;
  static constexpr int kChunksPerRow = kD / cuda::kVecElems;  // 16-byte chunks
  static constexpr bool kNativeKV = kKV == kQ;
  // Q's A fragments stay in registers when they are few; else they are re-read by ldmatrix.
  static constexpr bool kQInRegisters = kMTiles * kKStepsQK * 4 <= 32;
  static constexpr int kStages = kRingStages;  // cp.async ring depth
  static constexpr int kSmemElems = (kBlockM + 2 * kStages * kBlockN) * kRowStride;

  static_assert(kQ == DType::kBF16 || kQ == DType::kF16, "tensor cores take bf16/f16");
  static_assert(kD % cuda::kMmaK == 0, "head dim must be a multiple of 16");
  static_assert(kSubN % (2 * cuda::kMmaN) == 0, "key step must hold whole ldmatrix_x4 pairs");
  static_assert(kBlockN % kSubN == 0 && kStages >= 2, "whole key steps per tile, >= 2 stages");
  static_assert(kNTilesO % 2 == 0, "P.V loads V fragments in pairs of n-tiles");
  static_assert(2 * kBlockN <= kThreads, "one thread resolves each K/V row address of a tile");
};

template <typename Traits>
struct MmaExtendKernel {
  using T = typename cuda::ActivationType<Traits::kQDType>::type;
  using PoolElem = cuda::ElemTraits<Traits::kKVDType>;
  using Variant = AttentionVariant<true>;
  static constexpr int kD = Traits::kD;
  static constexpr int kBM = Traits::kBlockM;
  static constexpr int kBN = Traits::kBlockN;
  static constexpr int kSN = Traits::kSubN;
  static constexpr int kRS = Traits::kRowStride;
  static constexpr int kMT = Traits::kMTiles;
  static constexpr uint32_t kStageBytes = 2 * kBN * kRS * sizeof(T);  // K + V of one stage

  // Where the rows of one key tile live (one entry per K/V row, written an iteration before use).
  struct TileRows {
    const char* row[2][kBN];       // [K | V][key] global row address; nullptr = outside the keys
    const uint8_t* scale[2][kBN];  // fp4 block scales of the row (pool rows only)
    bool pool[2][kBN];             // row in the pool dtype (else the activation dtype)
  };

  static constexpr size_t smem_bytes() {
    return Traits::kSmemElems * sizeof(T) + Traits::kStages * sizeof(TileRows);
  }

  struct Ctx {
    const AttentionParams* p;
    int b, q_begin, num_q, num_prefix, num_new, kv_head;
    const int32_t* indices;  // this request's pool-key slots
  };

  // Row resolution in two halves so the index load can be issued early: `fetch` reads the pool
  // slot of key j (or -1 for a new-token row read from the contiguous inputs, -2 outside the
  // keys); `publish` turns it into the row address and writes this thread's TileRows entry.
  // Thread tid < 2 * kBN owns row tid % kBN of K (tid < kBN) or V.
  __device__ __forceinline__ static int32_t fetch_slot(const Ctx& c, int n0, int total) {
    if (threadIdx.x >= 2 * kBN) return -2;
    const int j = n0 + static_cast<int>(threadIdx.x) % kBN;
    if (j >= total || j < 0) return -2;
    if (j < c.num_prefix) return c.indices[j];
    if (c.p->k_new != nullptr) return -1;
    return c.p->new_slots[c.q_begin + j - c.num_prefix];
  }

  __device__ __forceinline__ static void publish_row(const Ctx& c, int n0, int32_t slot_in,
                                                     TileRows& rows) {
    if (threadIdx.x >= 2 * kBN) return;
    const int64_t slot = slot_in;
    const AttentionParams& p = *c.p;
    const bool is_v = threadIdx.x >= kBN;
    const int r = threadIdx.x % kBN;
    const char* row = nullptr;
    const uint8_t* scale = nullptr;
    bool from_pool = true;
    if (slot == -1) {
      from_pool = false;
      const int t = c.q_begin + n0 + r - c.num_prefix;
      const T* base = static_cast<const T*>(is_v ? p.v_new : p.k_new);
      row =
          reinterpret_cast<const char*>(base + t * (is_v ? p.vn_stride_token : p.kn_stride_token) +
                                        c.kv_head * (is_v ? p.vn_stride_head : p.kn_stride_head));
    } else if (slot >= 0) {
      const int64_t elems = slot * (is_v ? p.v_stride_row : p.k_stride_row) +
                            c.kv_head * (is_v ? p.v_stride_head : p.k_stride_head);
      const char* base = static_cast<const char*>(is_v ? p.v_pool : p.k_pool);
      if constexpr (Traits::kKVDType == DType::kFP4E2M1) {
        row = base + elems / 2;
        scale = is_v ? p.v_scales + slot * p.vs_stride_row + c.kv_head * p.vs_stride_head
                     : p.k_scales + slot * p.ks_stride_row + c.kv_head * p.ks_stride_head;
      } else {
        row = base + elems * static_cast<int64_t>(sizeof(typename PoolElem::Storage));
      }
    }
    rows.row[is_v][r] = row;
    rows.scale[is_v][r] = scale;
    rows.pool[is_v][r] = from_pool;
  }

  // Loads the K and V rows listed in `rows` into smem (zero rows outside the keys).
  __device__ __forceinline__ static void load_kv_tile(T* ks, T* vs, const TileRows& rows) {
    constexpr int kChunks = kBN * Traits::kChunksPerRow;
#pragma unroll 4
    for (int idx = threadIdx.x; idx < 2 * kChunks; idx += Traits::kThreads) {
      const int is_v = idx >= kChunks;
      const int local = is_v ? idx - kChunks : idx;
      const int r = local / Traits::kChunksPerRow;
      const int e = (local % Traits::kChunksPerRow) * cuda::kVecElems;
      T* dst = (is_v ? vs : ks) + r * kRS + e;
      const char* row = rows.row[is_v][r];
      if (row == nullptr) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      } else if (Traits::kNativeKV || !rows.pool[is_v][r]) {
        cuda::cp_async_16(cuda::smem_addr(dst), row + e * sizeof(T), 16);
      } else {
        float f[cuda::kVecElems];
        PoolElem::convert(PoolElem::load(row, e), rows.scale[is_v][r], e, f);
        cuda::store8(dst, f);
      }
    }
    cuda::cp_async_commit();
  }

  // Visible keys [lo, hi) of query qi (the range part of AttentionVariant::make; the tree mask
  // is checked separately).
  __device__ __forceinline__ static void row_range(const AttentionParams& p, const Ctx& c, int qi,
                                                   int& lo, int& hi) {
    const int total = c.num_prefix + c.num_new;
    const int q_pos = c.num_prefix + qi;
    lo = 0;
    hi = total;
    if (p.custom_mask == nullptr && p.causal) hi = min(total, q_pos + 1);
    if (p.sliding_window >= 0) {
      lo = max(0, q_pos - p.sliding_window);
      if (!p.causal) hi = min(hi, q_pos + p.sliding_window + 1);
    }
  }

  // 2^x in one MUFU instruction (ex2.approx.ftz: ~2 ulp, -inf -> 0), as FlashAttention's
  // fast-math build gets from exp2f; the softmax weights are rounded to 16 bits right after.
  __device__ __forceinline__ static float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }

  // Soft-capped log2-domain logit of a raw q.k dot product (as AttentionVariant::logit).
  __device__ __forceinline__ static float capped_logit(const AttentionParams& p, float dot) {
    return cuda::soft_capped_log2_logit(dot, p.sm_scale, p.logit_cap);
  }

  // A fragment of Q rows [row0, row0 + 16), head dims [kk * 16, +16).
  // q_lane: shared address of this lane's row of the warp's first Q fragment (see run()).
  __device__ __forceinline__ static void load_q_frag(uint32_t q_lane, int mt, int kk,
                                                     uint32_t (&a)[4]) {
    cuda::ldmatrix_x4(a, q_lane + (mt * cuda::kMmaM * kRS + kk * cuda::kMmaK) * sizeof(T));
  }

  __device__ static void run(const AttentionParams& p, T* smem) {
    // Block numbering: head fastest, then request, then query tile from the last one down.
    const int m_tiles = (p.num_tokens > 0 ? gridDim.x / (p.bs * p.num_q_heads) : 0);
    const int q_head = blockIdx.x % p.num_q_heads;
    const int rest = blockIdx.x / p.num_q_heads;
    const int b = rest % p.bs;
    const int m_tile = m_tiles - 1 - rest / p.bs;
    Ctx c;
    c.p = &p;
    c.b = b;
    c.q_begin = p.q_start[b];
    c.num_q = p.q_len[b];
    const int m0 = m_tile * kBM;
    if (m0 >= c.num_q) return;
    c.num_prefix = p.kv_indptr[b + 1] - p.kv_indptr[b];
    c.num_new = p.has_new_keys ? c.num_q : 0;
    c.kv_head = q_head / p.group_size;
    c.indices = p.kv_indices + p.kv_indptr[b];
    const int total = c.num_prefix + c.num_new;
    const int rows_here = min(kBM, c.num_q - m0);

    // Key range of the whole tile: union of its rows' visible ranges.
    const Variant first = Variant::make(p, b, c.num_prefix, c.num_new, m0);
    const Variant last = Variant::make(p, b, c.num_prefix, c.num_new, m0 + rows_here - 1);
    const int k_lo = first.lo;
    const int k_hi = max(first.hi, last.hi);

    T* qs = smem;
    T* kv_base = smem + kBM * kRS;
    TileRows* tile_rows = reinterpret_cast<TileRows*>(smem + Traits::kSmemElems);
    auto ks = [&](int stage) { return kv_base + stage * 2 * kBN * kRS; };
    auto vs = [&](int stage) { return kv_base + stage * 2 * kBN * kRS + kBN * kRS; };

    // Q tile.
    const T* q_base = static_cast<const T*>(p.q);
    for (int idx = threadIdx.x; idx < kBM * Traits::kChunksPerRow; idx += Traits::kThreads) {
      const int r = idx / Traits::kChunksPerRow;
      const int e = (idx % Traits::kChunksPerRow) * cuda::kVecElems;
      T* dst = qs + r * kRS + e;
      if (r < rows_here) {
        const T* src =
            q_base + (c.q_begin + m0 + r) * p.q_stride_token + q_head * p.q_stride_head + e;
        cuda::cp_async_16(cuda::smem_addr(dst), src, 16);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    const int n_begin = (k_lo / kBN) * kBN;
    // Prologue: rows of tiles 0 .. kStages - 1 resolved, tiles 0 .. kStages - 2 (with Q) in
    // flight, one commit group per tile (empty past the keys).
#pragma unroll
    for (int i = 0; i < Traits::kStages; ++i) {
      publish_row(c, n_begin + i * kBN, fetch_slot(c, n_begin + i * kBN, total), tile_rows[i]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Traits::kStages - 1; ++i) {
      if (n_begin + i * kBN < k_hi)
        load_kv_tile(ks(i), vs(i), tile_rows[i]);
      else
        cuda::cp_async_commit();
    }

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t4 = lane % 4;
    const int warp_row0 = warp * Traits::kWarpRows;  // first row of this warp within the block
    // Shared addresses of this lane's ldmatrix row: Q (A operand: rows r + 8 (i & 1), columns
    // 8 (i >> 1)), K (B operand, two n-tiles: rows r + 8 (i >> 1), columns 8 (i & 1)) and V
    // (B operand via .trans: keys r + 8 (i & 1), columns 8 (i >> 1)), i = lane / 8, r = lane % 8.
    const int li = lane / 8, lr = lane % 8;
    const uint32_t q_lane =
        cuda::smem_addr(qs + (warp_row0 + lr + (li & 1) * 8) * kRS + (li >> 1) * 8);
    const uint32_t k_lane0 = cuda::smem_addr(ks(0) + (lr + (li >> 1) * 8) * kRS + (li & 1) * 8);
    const uint32_t v_lane0 = cuda::smem_addr(vs(0) + (lr + (li & 1) * 8) * kRS + (li >> 1) * 8);
    const bool has_mask = p.custom_mask != nullptr;
    // Keys the warp's rows see: union [w_lo, w_hi) and intersection [w_lo_max, w_hi_min).
    const int w_first = min(m0 + warp_row0, c.num_q - 1);
    const int w_last = min(m0 + warp_row0 + Traits::kWarpRows - 1, c.num_q - 1);
    const Variant wf = Variant::make(p, b, c.num_prefix, c.num_new, w_first);
    const Variant wl = Variant::make(p, b, c.num_prefix, c.num_new, w_last);
    // Union of the warp rows' ranges (empty when the warp has no row), and the intersection
    // (empty when the tile check must run per element anyway: tree mask, rows past the request).
    const bool warp_active = m0 + warp_row0 < c.num_q;
    const int w_lo = wf.lo, w_hi = warp_active ? max(wf.hi, wl.hi) : 0;
    const bool warp_all_valid = m0 + warp_row0 + Traits::kWarpRows <= c.num_q;
    const int w_lo_max = wl.lo;
    const int w_hi_min = !has_mask && warp_all_valid ? min(wf.hi, wl.hi) : -1;
    const float scale_log2 = first.scale_log2;
    // Scale applied in the exponent: exp2(s * sc - m) on raw logits (max taken on raw logits, so
    // only for a positive scale); 1 when the logits are already scaled (soft-cap, other scales).
    const bool fold_scale = Traits::kFoldScaleIntoExp && p.logit_cap <= 0.f && scale_log2 > 0.f;
    const float sc = fold_scale ? scale_log2 : 1.f;

    float o[kMT][Traits::kNTilesO][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n)
        o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    float m_run[2 * kMT], d_run[2 * kMT];
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) m_run[h] = cuda::kNoKeyMax, d_run[h] = 0.f;
    uint32_t qf[Traits::kQInRegisters ? kMT : 1][Traits::kQInRegisters ? Traits::kKStepsQK : 1][4];

    constexpr int kS = Traits::kStages;
    int stage = 0;
    for (int n0 = n_begin; n0 < k_hi; n0 += kBN, stage = stage == kS - 1 ? 0 : stage + 1) {
      // Index loads of tile n0 + kS kBN go out now; their rows are published after the MMAs.
      const int32_t next_slot = fetch_slot(c, n0 + kS * kBN, total);
      cuda::cp_async_wait<kS - 2>();  // this tile (and Q) landed for this thread
      __syncthreads();                // ... for every thread; the previous tile is done with
      if constexpr (Traits::kQInRegisters) {
        if (n0 == n_begin) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int kk = 0; kk < Traits::kKStepsQK; ++kk) load_q_frag(q_lane, mt, kk, qf[mt][kk]);
        }
      }
      // Prefetch tile n0 + (kS - 1) kBN into the stage the previous tile used (its readers passed
      // the barrier above; its rows were published before it).
      {
        const int pf = stage == 0 ? kS - 1 : stage - 1;
        if (n0 + (kS - 1) * kBN < k_hi)
          load_kv_tile(ks(pf), vs(pf), tile_rows[pf]);
        else
          cuda::cp_async_commit();
      }

#pragma unroll
      for (int sub = 0; sub < kBN / kSN; ++sub) {
        const int ns = n0 + sub * kSN;                 // first key of this compute step
        if (ns >= w_hi || ns + kSN <= w_lo) continue;  // none of the warp's rows sees it
        // S = Q K^T.
        float s[kMT][Traits::kNTilesS][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < Traits::kNTilesS; ++n)
            s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
        const uint32_t k_lane = k_lane0 + stage * kStageBytes + sub * kSN * kRS * sizeof(T);
#pragma unroll(Traits::kQInRegisters ? Traits::kKStepsQK : Traits::kQKUnroll)
        for (int kk = 0; kk < Traits::kKStepsQK; ++kk) {
          uint32_t a[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            if constexpr (Traits::kQInRegisters) {
#pragma unroll
              for (int x = 0; x < 4; ++x) a[mt][x] = qf[mt][kk][x];
            } else {
              load_q_frag(q_lane, mt, kk, a[mt]);
            }
          }
#pragma unroll
          for (int n = 0; n < Traits::kNTilesS; n += 2) {
            uint32_t bf[4];
            cuda::ldmatrix_x4(bf, k_lane + (n * cuda::kMmaN * kRS + kk * cuda::kMmaK) * sizeof(T));
            const uint32_t b0[2] = {bf[0], bf[1]};
            const uint32_t b1[2] = {bf[2], bf[3]};
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              cuda::mma_m16n8k16<T>(s[mt][n], a[mt], b0);
              cuda::mma_m16n8k16<T>(s[mt][n + 1], a[mt], b1);
            }
          }
        }
        // Logits in the log2 domain (soft-cap in its own pass), then the per-element mask
        // unless the tile is inside every row's visible range (no tree mask, all rows valid).
        if (p.logit_cap > 0.f) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
              for (int x = 0; x < 4; ++x) s[mt][n][x] = capped_logit(p, s[mt][n][x]);
        } else if (!fold_scale) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
              for (int x = 0; x < 4; ++x) s[mt][n][x] *= scale_log2;
        }
        const bool full_tile = ns >= w_lo_max && ns + kSN <= w_hi_min;
        if (!full_tile) {
#pragma unroll
          for (int h = 0; h < 2 * kMT; ++h) {
            const int mt = h / 2;
            const int qi = m0 + warp_row0 + mt * cuda::kMmaM + (h % 2) * 8 + g;
            int lo, hi;
            row_range(p, c, qi, lo, hi);
            if (qi >= c.num_q) hi = lo;  // rows past the request see nothing
            if (!has_mask) {             // range only: branch-free selects
#pragma unroll
              for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int j = ns + n * cuda::kMmaN + 2 * t4 + e;
                  float& v = s[mt][n][2 * (h % 2) + e];
                  v = j >= lo && j < hi ? v : -INFINITY;
                }
              continue;
            }
            // Tree mask block of the request: [num_q, total] row-major.
            const uint8_t* mrow = p.custom_mask + p.mask_indptr[b] +
                                  static_cast<int64_t>(min(qi, c.num_q - 1)) * total;
#pragma unroll
            for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int x = 2 * (h % 2) + e;
                const int j = ns + n * cuda::kMmaN + 2 * t4 + e;
                bool ok = j >= lo && j < hi;
                if (ok) ok = mrow[j] != 0;
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
          for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) mx[2 * mt + x / 2] = fmaxf(mx[2 * mt + x / 2], s[mt][n][x]);
        float f[2 * kMT];
        bool grew = false;
#pragma unroll
        for (int h = 0; h < 2 * kMT; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          const float m_new = fmaxf(m_run[h], mx[h] * sc);
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
            for (int n = 0; n < Traits::kNTilesO; ++n) {
              o[mt][n][0] *= f[2 * mt], o[mt][n][1] *= f[2 * mt];
              o[mt][n][2] *= f[2 * mt + 1], o[mt][n][3] *= f[2 * mt + 1];
            }
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              const int h = 2 * mt + x / 2;
              const float pr = exp2_fast(fmaf(s[mt][n][x], sc, -m_run[h]));
              s[mt][n][x] = pr;
              d_run[h] += pr;  // per-thread partial sums; reduced across the quad at the end
            }
        // O += P V (the S accumulators of two key n-tiles form one A fragment).
        const uint32_t v_lane = v_lane0 + stage * kStageBytes + sub * kSN * kRS * sizeof(T);
#pragma unroll
        for (int kk = 0; kk < Traits::kKStepsPV; ++kk) {
          uint32_t pa[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            pa[mt][0] = cuda::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            pa[mt][1] = cuda::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            pa[mt][2] = cuda::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            pa[mt][3] = cuda::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
          }
#pragma unroll
          for (int n = 0; n < Traits::kNTilesO; n += 2) {
            uint32_t bf[4];
            cuda::ldmatrix_x4_trans(
                bf, v_lane + (kk * cuda::kMmaK * kRS + n * cuda::kMmaN) * sizeof(T));
            const uint32_t b0[2] = {bf[0], bf[1]};
            const uint32_t b1[2] = {bf[2], bf[3]};
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              cuda::mma_m16n8k16<T>(o[mt][n], pa[mt], b0);
              cuda::mma_m16n8k16<T>(o[mt][n + 1], pa[mt], b1);
            }
          }
        }
      }
      // Rows of tile n0 + kS kBN into the table this tile's copies were issued from (every thread
      // issued them before an earlier barrier).
      publish_row(c, n0 + kS * kBN, next_slot, tile_rows[stage]);
      __syncthreads();  // everyone is done with this stage and sees the published rows
    }
    cuda::cp_async_wait<0>();

    // Epilogue: quad-reduce the denominators, finalize (sinks, v_scale), store.
    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) {
      float d = d_run[h];
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      const Finalized fin = finalize(p, q_head, m_run[h], d);
      const int row = m0 + warp_row0 + (h / 2) * cuda::kMmaM + (h % 2) * 8 + g;
      if (row >= c.num_q) continue;
      T* dst_row = out + (c.q_begin + row) * p.o_stride_token + q_head * p.o_stride_head;
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n) {
        const int e = n * cuda::kMmaN + 2 * t4;
        *reinterpret_cast<uint32_t*>(dst_row + e) = cuda::pack2<T>(
            o[h / 2][n][2 * (h % 2)] * fin.inv, o[h / 2][n][2 * (h % 2) + 1] * fin.inv);
      }
      if (p.lse != nullptr && t4 == 0)
        p.lse[(c.q_begin + row) * p.lse_stride_token + q_head] = fin.lse;
    }
  }
};

// grid: (ceil(max_q_len / kBlockM) * bs * num_q_heads) block: (Traits::kThreads)
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    mma_extend_kernel(const __grid_constant__ AttentionParams params) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using T = typename cuda::ActivationType<Traits::kQDType>::type;
  MmaExtendKernel<Traits>::run(params, reinterpret_cast<T*>(smem_raw));
}

}  // namespace attnkit::triton
