// Shared device core of the tensor-core paged decode used by the flashinfer backend (its plan
// items, page table in place) and by the triton backend on SM80+ (its split-KV heuristic, flattened
// token indices). Each backend keeps its own planning, key addressing and epilogue; this file only
// streams one CTA's keys and runs the math. Decode: one query token, the GQA rows of one kv head
// (<= 16) packed into the M dimension of mma.sync m16n8k16. Target verify (flashinfer): the
// (draft, q head) rows of a request, 16, or 32 in two M tiles per warp (Traits::kMTiles; every K /
// V fragment then feeds two MMAs), with a per-row mask over the drafts' keys (attend's kRowMask).
//
// Why this shape: decode reads every K/V byte once and does ~4 FLOP per byte, so it is bound by
// the bytes each SM keeps in flight, not by math. A CTA's kWarps warps take the key range's 16-key
// tiles round robin (warp w: tiles w, w + kWarps, ...); every warp owns kStages ring slots of K + V
// filled by cp.async and never waits for another warp until the epilogue (only __syncwarp in the
// main loop), keeping kStages - 1 tiles in flight while it computes one. At d 128 bf16: 3 stages
// of 8.5 KB per warp, 110 KB per CTA, 2 CTAs (8 warps) per SM -> ~140 KB in flight per SM.
// Pool slots (page-table entries or token indices) reach shared memory by cp.async kS tiles
// before their tile is issued, so no warp waits on a dependent index load. S = Q K^T and O += P V
// run on mma.sync with ldmatrix fragments, Q in registers (d <= 128), softmax online in the exp2
// domain. fp8 tiles land raw in the ring and are converted in registers as their fragments are
// loaded (f16 MMAs; the scales are the caller's: folded into the logit scale and the output). The
// epilogue merges the warps' (m, d, O) in shared memory and hands every (row, 8 columns) to the
// caller's writer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attnkit/dtype.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/ring_shape.h"
#include "cuda/common/smem_fit.h"

namespace attnkit::cuda::ring {

// kWarps_ / kCtaSmemBudget_ / kCtasPerSm_: the CTA shape (defaults: 2 CTAs of 4 warps,
// ring_shape.h; a backend may instead run one CTA of 8 warps per SM90 multiprocessor, same rings,
// fewer CTAs).
// kMTiles_: M tiles of kRows rows per CTA (ring_shape.h kMaxMTiles; Q then in shared memory).
template <int kHeadDim_, typename QT_, DType kKvDType_, int kWarps_ = kWarps,
          int kCtaSmemBudget_ = kCtaSmemBudget, int kCtasPerSm_ = kCtasPerSm, int kMTiles_ = 1>
struct Traits {
  static constexpr int kWarps = kWarps_;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kCtaRows = kMTiles * kRows;  // packed q rows of the CTA
  static constexpr int kCtaSmemBudget = kCtaSmemBudget_;
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static constexpr int kHeadDim = kHeadDim_;
  using QT = QT_;  // __nv_bfloat16 or __half: activations and MMA operands
  static constexpr DType kQDType = std::is_same_v<QT, __half> ? DType::kF16 : DType::kBF16;
  static constexpr DType kKvDType = kKvDType_;
  static constexpr bool kQuant = kKvDType == DType::kFP8E4M3 || kKvDType == DType::kFP8E5M2;
  static constexpr int kThreads = kWarps * 32;

  // MMA operand type: the activation type, or f16 for fp8 KV (fp8 -> f16x2 is one instruction
  // and exact; Q is converted to f16 once, exact for |q| in [6.1e-5, 65504]).
  using CT = std::conditional_t<kQuant, __half, QT>;
  static constexpr int kRowElems = kHeadDim + 8;  // padded Q / K / V row of 16-bit elements
  static constexpr int kRowBytes = kRowElems * 2;
  static constexpr int kKvElemBytes = kQuant ? 1 : 2;
  // Staged K/V row: 16-bit rows padded by 16 bytes, raw fp8 rows too (ldmatrix rows of one 8x8
  // matrix then hit distinct banks).
  static constexpr int kRawRowBytes = kQuant ? kHeadDim + 16 : kRowBytes;
  static constexpr int kRawChunks = kHeadDim * kKvElemBytes / 16;  // 16-byte chunks of a row
  static constexpr int kQChunks = kHeadDim * 2 / 16;

  static constexpr int kQBytes = kCtaRows * kRowBytes;
  static constexpr int kStageBytes = 2 * kKeys * kRawRowBytes;  // K + V of one warp tile
  static constexpr int kSlotBytesPerStage = 2 * kKeys * 4;      // slot ring: 2 entries per stage
  // As many stages as the budget left after Q holds per warp, 2 to kMaxStages (ring_shape.h).
  static constexpr int kStages = cta_stages(kHeadDim, kQuant, kWarps, kCtaSmemBudget, kMTiles);
  static constexpr int kWarpBytes = kStages * (kStageBytes + kSlotBytesPerStage);
  static constexpr int kEpiBytes = kWarps * kCtaRows * kHeadDim * 4 + 2 * kWarps * kCtaRows * 4;
  static constexpr int kMainBytes = kWarps * kWarpBytes;
  static constexpr int kSmemBytes = kQBytes + (kMainBytes > kEpiBytes ? kMainBytes : kEpiBytes);
  static constexpr int kMinBlocks = kSmemBytes <= kCtaSmemBudget ? kCtasPerSm : 1;
  // 16-key ring stages a warp consumes per softmax step (its warp tile): 1, or 2 (32-key warp
  // tiles: one max / rescale / wait per 32 keys; a backend's derived traits may set 2 where
  // kStages >= 3).
  static constexpr int kTileSubs = 1;
  // exp2 of the softmax as one ex2.approx.ftz instruction instead of exp2f (which adds a range
  // fix-up around it); a backend's derived traits may set it.
  static constexpr bool kFastExp2 = false;
  // Copy issue with each lane owning kCopiesPerLane adjacent rows of a tile, their slot words read
  // with 16-byte shared loads (2 per lane instead of 8 dependent 4-byte ones at d 128 bf16); a
  // backend's derived traits may set it (used where the row layout allows, see attend).
  static constexpr bool kWideSlotLoads = false;
  // Programmatic dependent launch: attend waits on the previous grid of the stream
  // (griddepcontrol.wait) after its first slot words (page-table reads) and before the first K/V,
  // Q or output access, so a PDL-launched CTA may fetch its plan and page-table words while the
  // previous kernel finishes; a backend's derived traits may set it (the wait is a no-op for a
  // launch without a programmatic dependency).
  static constexpr bool kGridDepWait = false;
  // fp8 KV: four fp8 values per 32-bit word converted with two cvt.f16x2 of its halves (the high
  // half read in place, no shift), and the V fragments' byte transposition done with one
  // two-source byte permute per two f16x2 instead of one per f16x2 (SM89+; 64 fewer instructions
  // per 32 keys at d 128). The results are the same bits; a backend's derived traits may set it.
  static constexpr bool kFp8PairCvt = false;

  static constexpr bool kQInRegisters = kHeadDim <= 128 && kMTiles == 1;
  static constexpr int kKSteps = kHeadDim / kMmaK;  // also the 16-column chunks of a row
  static constexpr int kDimTiles = kHeadDim / kMmaN;
  static constexpr int kCopies = kKeys * kRawChunks;  // 16-byte copies per K (or V) tile
  static constexpr int kCopiesPerLane = (kCopies + 31) / 32;

  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim: a multiple of 16, <= 256");
  static_assert(kMTiles >= 1 && kMTiles <= kMaxMTiles, "1 or 2 M tiles per CTA");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the SM90 opt-in limit");
  static_assert(kCtaSmemBudget != kCompactCtaSmemBudget ||
                    kSmemBytes <= kSmallestTensorCoreSmemOptin,
                "the compact CTA fits every tensor-core device");
  static_assert(kQBytes == cta_q_bytes(kHeadDim, kMTiles) &&
                    kStageBytes + kSlotBytesPerStage == cta_stage_bytes(kHeadDim, kQuant) &&
                    kSmemBytes == cta_smem_bytes(kHeadDim, kQuant, kWarps, kCtaSmemBudget, kMTiles),
                "the host's CTA sizes (ring_shape.h) are this CTA's");
};

// The ring shape a backend launches on a device that cannot opt in to Tr's shared memory: Compact
// (Tr's traits at kCompactCtaSmemBudget, compact_warps, kCompactCtasPerSm), or Tr itself where it
// fits every tensor-core device already (no second instantiation).
template <typename Tr, typename Compact>
using CompactShape =
    std::conditional_t<(Tr::kSmemBytes <= kSmallestTensorCoreSmemOptin), Tr, Compact>;

// Where a key's pool row comes from: *word + add (a page-table entry plus the offset in the page,
// or a flattened token index plus 0).
struct SlotRef {
  const int32_t* word;
  int add;
};

// 4-byte asynchronous global->shared copy (cp.async.ca: 4 and 8 bytes go through L1).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
#endif
}

// One CTA's problem.
struct Work {
  int rows = 0;  // valid q rows (<= Tr::kCtaRows); the others are zero and never written
  int kv_begin = 0, kv_end = 0;
  const uint8_t* k_base = nullptr;  // K of this kv head at pool row 0 (bytes)
  const uint8_t* v_base = nullptr;
  // Bytes between pool rows, < 2^32 (the backends check it): a slot's row offset is one 32 x 32
  // -> 64-bit multiply (IMAD.WIDE.U32) instead of a 64-bit one per copied row.
  uint32_t k_row_bytes = 0, v_row_bytes = 0;
  // Tr::kGridDepWait: griddepcontrol.launch_dependents right after the wait (the next PDL-launched
  // grid may then start while this one streams).
  bool dependents_after_wait = false;
  // Where Tr::kGridDepWait: false skips attend's wait for the previous grid (a launch whose
  // previous grid writes nothing this CTA reads, e.g. PagedParams::decode_overlap).
  bool grid_dep_wait = true;
  float scale_log2 = 0.f;  // logit scale (k_scale folded in) * log2(e)
  float scale = 0.f;       // soft-cap path
  float logit_cap = 0.f;   // 0 = off
  // attend's kRowMask: the keys below mask_head_end and from mask_tail_begin on are visible per
  // row (the caller's `visible(row, key)`, asked only in the softmax steps that overlap them);
  // every other key of the range is visible to every row. Target verify: the drafts' keys at the
  // end (chain or tree), the window's first keys at the start.
  int mask_head_end = 0;
  int mask_tail_begin = 0x7fffffff;
};

// attend's default: no per-row mask (kRowMask false never calls it).
struct NoRowMask {
  __device__ bool operator()(int, int) const { return true; }
};

// 2^x: exp2f, or (kFast) the bare ex2.approx.ftz.f32 (relative error ~2^-22; 2^-inf = 0, results
// below 2^-126 flush to 0, which a softmax weight may).
template <bool kFast>
__device__ __forceinline__ float exp2_of(float x) {
  if constexpr (kFast) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2f(x);
  }
}

// fp8 -> f16x2 conversions: fp8x2_to_f16x2 / fp8x4_to_f16x2x2 (cuda/common/dtype_convert.cuh).

// griddepcontrol (SM90+; no-ops where the launch had no programmatic dependency).
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
#endif
}

// fp8 K and V are used straight from the raw staged rows (no dequantised copy):
//  * K: ldmatrix (b16) of 8 keys x 16 fp8 columns gives lane (g, t) the 4 bytes of columns
//    4t..4t+3 of key g; they become the B fragment of QK^T under a column permutation inside each
//    16-column k-step (logical k 2t, 2t+1 <-> columns 4t, 4t+1; 2t+8, 2t+9 <-> 4t+2, 4t+3). Q's A
//    fragments are built with the same permutation, so the dot products are unchanged.
//  * V: ldmatrix.trans gives lane (g, t) keys 2t, 2t+1 x columns 2g, 2g+1; a byte permute splits
//    them into the B fragments of an "even columns" and an "odd columns" n-tile (FlashInfer's
//    trick); the epilogue puts the output columns back in order.
// Streams keys [w.kv_begin, w.kv_end) for the w.rows q rows. q_row(r) -> const QT* of row r's
// query (r < rows); slot_of(key) -> SlotRef of a key in range; write(r, col, acc, m, d)
// receives row r's unnormalised output columns [col, col + 8), its log2-domain max m and
// denominator d (d == 0: no visible key). Every thread of the CTA must call it (it has CTA
// barriers). kMayCap = false compiles the soft-cap out of the loop (the caller guarantees
// w.logit_cap == 0): the tanh code of every logit otherwise sits between the hot instructions.
// kRowMask: visible(r, key) -> bool decides the keys of Work's mask regions per row (r < kCtaRows,
// padding rows included: it must not read memory for r >= w.rows); the steps outside them run
// the decode's code.
template <typename Tr, bool kMayCap = true, bool kRowMask = false, typename QRowFn, typename SlotFn,
          typename WriteFn, typename MaskFn = NoRowMask>
__device__ __forceinline__ void attend(const Work& w, uint8_t* smem, QRowFn q_row, SlotFn slot_of,
                                       WriteFn write, MaskFn visible = {}) {
  using QT = typename Tr::QT;
  using CT = typename Tr::CT;
  constexpr int kS = Tr::kStages;
  CT* sq = reinterpret_cast<CT*>(smem);
  uint8_t* main = smem + Tr::kQBytes;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  uint8_t* ring = main + warp * Tr::kWarpBytes;
  const int kv_begin = w.kv_begin;
  const int kv_end = w.kv_end;

  // A warp tile (one softmax step) is kSub consecutive 16-key sub-tiles, each one ring stage;
  // warps take the range's warp tiles round robin. Sub-tile i of this warp: step i / kSub, part
  // i % kSub. With kSub = 1 a sub-tile is a warp tile.
  constexpr int kSub = Tr::kTileSubs;
  constexpr int kCtaWarps = Tr::kWarps;
  constexpr int kStepKeys = kSub * kKeys;
  static_assert(kSub == 1 || kSub == 2, "a warp tile is 1 or 2 ring stages");
  static_assert(kS >= kSub + 1, "the ring keeps at least one stage in flight during a step");
  const int num_steps = kv_end > kv_begin ? (kv_end - kv_begin + kStepKeys - 1) / kStepKeys : 0;
  const int my_tiles =
      kSub * (num_steps > warp ? (num_steps - warp + kCtaWarps - 1) / kCtaWarps : 0);

  // Slot words of local sub-tile i (lanes 0-15, key tile_key0(i) + lane) -> slots[i % (2 kS)],
  // fetched with cp.async kS sub-tiles before the sub-tile's data is issued: no warp ever waits on
  // a page-table / index load (a dependent load per tile would cost one loaded memory round trip
  // per tile).
  int32_t* slots = reinterpret_cast<int32_t*>(ring + kS * Tr::kStageBytes);  // [2 kS][kKeys]
  const auto tile_key0 = [&](int i) {
    return kv_begin + ((warp + (i / kSub) * kCtaWarps) * kSub + i % kSub) * kKeys;
  };
  const auto fetch_slots = [&](int i) {
    const int key = tile_key0(i) + lane;
    if (lane < kKeys && key < kv_end) {
      cp_async_4(smem_addr(slots + (i % (2 * kS)) * kKeys + lane), slot_of(key).word);
    }
  };
  // K and V of local tile i -> ring stage i % kS (keys past kv_end zero-filled).
  constexpr bool kWideSlots = Tr::kWideSlotLoads && Tr::kCopies % 32 == 0 &&
                              32 % Tr::kRawChunks == 0 && Tr::kCopiesPerLane % 4 == 0;
  const auto issue = [&](int i) {
    uint8_t* stage = ring + (i % kS) * Tr::kStageBytes;
    const int key0 = tile_key0(i);
    const int32_t* sl = slots + (i % (2 * kS)) * kKeys;
    // 16 bytes of row r's K and V (chunk ch) from the pool slot word + the slot's offset.
    const auto copy_row = [&](int r, int ch, int32_t word) {
      const bool valid = key0 + r < kv_end;
      const uint32_t s = valid ? static_cast<uint32_t>(word + slot_of(key0 + r).add) : 0u;
      const uint8_t* ks = w.k_base + static_cast<uint64_t>(s) * w.k_row_bytes + ch * 16;
      const uint8_t* vs = w.v_base + static_cast<uint64_t>(s) * w.v_row_bytes + ch * 16;
      const int dst = r * Tr::kRawRowBytes + ch * 16;
      cp_async_16(smem_addr(stage + dst), ks, valid ? 16 : 0);
      cp_async_16(smem_addr(stage + kKeys * Tr::kRawRowBytes + dst), vs, valid ? 16 : 0);
    };
    if constexpr (kWideSlots) {
      // Lane owns rows rbase .. rbase + kCopiesPerLane - 1, chunk lane % kRawChunks of each; the
      // words of keys past kv_end are read but not used.
      const int rbase = (lane / Tr::kRawChunks) * Tr::kCopiesPerLane;
      const int ch = lane % Tr::kRawChunks;
      int32_t wv[Tr::kCopiesPerLane];
#pragma unroll
      for (int x = 0; x < Tr::kCopiesPerLane / 4; ++x) {
        const int4 v4 = *reinterpret_cast<const int4*>(sl + rbase + 4 * x);
        wv[4 * x] = v4.x, wv[4 * x + 1] = v4.y, wv[4 * x + 2] = v4.z, wv[4 * x + 3] = v4.w;
      }
#pragma unroll
      for (int c0 = 0; c0 < Tr::kCopiesPerLane; ++c0) {
        copy_row(rbase + c0, ch, wv[c0]);
      }
    } else {
#pragma unroll
      for (int c0 = 0; c0 < Tr::kCopiesPerLane; ++c0) {
        const int c = c0 * 32 + lane;
        const int r = c / Tr::kRawChunks;
        const int ch = c % Tr::kRawChunks;
        if (Tr::kCopies % 32 == 0 || c < Tr::kCopies) {
          copy_row(r, ch, sl[r]);
        }
      }
    }
  };

  // Prologue: the slots of sub-tiles 0..kS-1, then kS - kSub sub-tiles in flight per warp (group
  // g: data of sub-tile g + slots of sub-tile g + kS), then Q (plain loads overlapping them).
#pragma unroll
  for (int i = 0; i < kS; ++i) fetch_slots(i);
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  if constexpr (Tr::kGridDepWait) {
    if (w.grid_dep_wait) {
      grid_dep_wait();
      if (w.dependents_after_wait) grid_dep_launch_dependents();
    }
  }
#pragma unroll
  for (int i = 0; i < kS - kSub; ++i) {
    if (i < my_tiles) {
      issue(i);
      fetch_slots(i + kS);
    }
    cp_async_commit();
  }
  constexpr int kMT = Tr::kMTiles;
  constexpr int kR = Tr::kCtaRows;
  for (int c = threadIdx.x; c < kR * Tr::kQChunks; c += Tr::kThreads) {
    const int r = c / Tr::kQChunks;
    const int ch = c % Tr::kQChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < w.rows) v = *reinterpret_cast<const uint4*>(q_row(r) + ch * 8);
    if constexpr (!std::is_same_v<CT, QT>) {  // bf16 q, f16 MMAs (fp8 KV)
      uint32_t* u = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[x]));
        const __half2 h = __floats2half2_rn(f.x, f.y);
        u[x] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    *reinterpret_cast<uint4*>(sq + r * Tr::kRowElems + ch * 8) = v;
  }
  __syncthreads();

  const int g = lane / 4;
  const int tq = lane % 4;
  // A fragment of M tile mt (rows 16 mt ..), k-step kk.
  const auto load_q_fragment = [&](int mt, int kk, uint32_t(&a)[4]) {
    const CT* sqm = sq + mt * kRows * Tr::kRowElems;
    if constexpr (Tr::kQuant) {  // the permuted columns of the fp8 K fragments (see above)
      const CT* r0 = sqm + g * Tr::kRowElems + kk * kMmaK + 4 * tq;
      const CT* r1 = r0 + 8 * Tr::kRowElems;
      a[0] = *reinterpret_cast<const uint32_t*>(r0);
      a[1] = *reinterpret_cast<const uint32_t*>(r1);
      a[2] = *reinterpret_cast<const uint32_t*>(r0 + 2);
      a[3] = *reinterpret_cast<const uint32_t*>(r1 + 2);
    } else {
      ldmatrix_x4(a, smem_addr(sqm + (lane % 16) * Tr::kRowElems + kk * kMmaK + (lane / 16) * 8));
    }
  };
  uint32_t qf[Tr::kQInRegisters ? Tr::kKSteps : 1][4];
  if constexpr (Tr::kQInRegisters) {  // (one M tile)
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) load_q_fragment(0, kk, qf[kk]);
  }
  // Per M tile: O, the running max and denominator of rows g and g + 8.
  float o[kMT][Tr::kDimTiles][4];
  float m[kMT][2];
  float d[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < Tr::kDimTiles; ++i)
      o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    m[mt][0] = m[mt][1] = kNoKeyMax;
    d[mt][0] = d[mt][1] = 0.f;
  }

  const auto q_frag = [&](int mt, int kk, uint32_t(&a)[4]) {
    if constexpr (Tr::kQInRegisters) {
#pragma unroll
      for (int x = 0; x < 4; ++x) a[x] = qf[kk][x];
    } else {
      load_q_fragment(mt, kk, a);
    }
  };
  // S = Q K^T over the 16 keys of one staged sub-tile (two n-tiles of 8). Even and odd k-steps
  // accumulate into separate registers (s, s2), summed by the caller: the dependent MMA chain of
  // each n-tile is half as long (a warp's tile time is latency-bound at 2 warps per scheduler).
  // With kMT M tiles every K fragment feeds kMT MMAs (s[mt], s2[mt]).
  const auto qk = [&](const uint8_t* sk, float(&s)[kMT][2][4], float(&s2)[kMT][2][4]) {
    if constexpr (Tr::kQuant) {
      // Lane l addresses row (l / 16) * 8 + l % 8 (key), 16-byte chunk 2 kp + (l / 8) % 2.
      const int key = (lane / 16) * 8 + lane % 8;
#pragma unroll
      for (int kp = 0; kp < Tr::kKSteps / 2; ++kp) {
        uint32_t r[4];  // (keys 0-7, k-step 2kp), (0-7, 2kp+1), (8-15, 2kp), (8-15, 2kp+1)
        ldmatrix_x4(r, smem_addr(sk + key * Tr::kRawRowBytes + (2 * kp + (lane / 8) % 2) * 16));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t b[2][2];
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            fp8x4_to_f16x2x2<Tr::kKvDType, Tr::kFp8PairCvt>(r[2 * n + h], b[n][0], b[n][1]);
          }
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            uint32_t a[4];
            q_frag(mt, 2 * kp + h, a);
#pragma unroll
            for (int n = 0; n < 2; ++n) mma_m16n8k16<CT>(h == 0 ? s[mt][n] : s2[mt][n], a, b[n]);
          }
        }
      }
      if constexpr (Tr::kKSteps % 2 == 1) {  // last k-step alone (d 80)
        constexpr int kk = Tr::kKSteps - 1;
        uint32_t r[2];  // (keys 0-7, kk), (keys 8-15, kk); lanes 0-15 address
        ldmatrix_x2(r,
                    smem_addr(sk + ((lane / 8) % 2 * 8 + lane % 8) * Tr::kRawRowBytes + kk * 16));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          uint32_t a[4];
          q_frag(mt, kk, a);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const uint32_t b[2] = {fp8x2_to_f16x2<Tr::kKvDType>(r[n]),
                                   fp8x2_to_f16x2<Tr::kKvDType>(r[n] >> 16)};
            mma_m16n8k16<CT>(s[mt][n], a, b);
          }
        }
      }
    } else {
      const CT* k16 = reinterpret_cast<const CT*>(sk);
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        uint32_t b[4];
        const int key = (lane / 16) * 8 + lane % 8;
        ldmatrix_x4(b, smem_addr(k16 + key * Tr::kRowElems + kk * kMmaK + ((lane / 8) % 2) * 8));
        const uint32_t b0[2] = {b[0], b[1]};
        const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          uint32_t a[4];
          q_frag(mt, kk, a);
          mma_m16n8k16<CT>(kk % 2 == 0 ? s[mt][0] : s2[mt][0], a, b0);
          mma_m16n8k16<CT>(kk % 2 == 0 ? s[mt][1] : s2[mt][1], a, b1);
        }
      }
    }
  };
  // O += P V over one staged sub-tile: a = its 16 probabilities per row (one k-step).
  const int vkey = ((lane / 8) % 2) * 8 + lane % 8;
  // a[mt]: M tile mt's probabilities; every V fragment feeds kMT MMAs.
  const auto pv = [&](const uint8_t* sv, const uint32_t(&a)[kMT][4]) {
    if constexpr (Tr::kQuant) {
      // o[mt][2c] / o[mt][2c + 1]: the even / odd columns of 16-column chunk c (see above).
      const auto pv_chunk = [&](int c, uint32_t lo, uint32_t hi) {
        uint32_t be[2], bo[2];
        if constexpr (Tr::kFp8PairCvt) {
          // [lo.b0, lo.b2, hi.b0, hi.b2] and [lo.b1, lo.b3, hi.b1, hi.b3]: the same f16x2 as
          // below, two per permute.
          fp8x4_to_f16x2x2<Tr::kKvDType>(__byte_perm(lo, hi, 0x6420), be[0], be[1]);
          fp8x4_to_f16x2x2<Tr::kKvDType>(__byte_perm(lo, hi, 0x7531), bo[0], bo[1]);
        } else {
          be[0] = fp8x2_to_f16x2<Tr::kKvDType>(__byte_perm(lo, 0, 0x0020));
          be[1] = fp8x2_to_f16x2<Tr::kKvDType>(__byte_perm(hi, 0, 0x0020));
          bo[0] = fp8x2_to_f16x2<Tr::kKvDType>(__byte_perm(lo, 0, 0x0031));
          bo[1] = fp8x2_to_f16x2<Tr::kKvDType>(__byte_perm(hi, 0, 0x0031));
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_m16n8k16<CT>(o[mt][2 * c], a[mt], be);
          mma_m16n8k16<CT>(o[mt][2 * c + 1], a[mt], bo);
        }
      };
#pragma unroll
      for (int cp = 0; cp < Tr::kKSteps / 2; ++cp) {
        uint32_t r[4];  // (keys 0-7, chunk 2cp), (8-15, 2cp), (0-7, 2cp+1), (8-15, 2cp+1)
        ldmatrix_x4_trans(r, smem_addr(sv + vkey * Tr::kRawRowBytes + (2 * cp + lane / 16) * 16));
        pv_chunk(2 * cp, r[0], r[1]);
        pv_chunk(2 * cp + 1, r[2], r[3]);
      }
      if constexpr (Tr::kKSteps % 2 == 1) {
        constexpr int c = Tr::kKSteps - 1;
        uint32_t r[2];
        ldmatrix_x2_trans(r, smem_addr(sv + vkey * Tr::kRawRowBytes + c * 16));
        pv_chunk(c, r[0], r[1]);
      }
    } else {
      const CT* v16 = reinterpret_cast<const CT*>(sv);
#pragma unroll
      for (int d2 = 0; d2 < Tr::kDimTiles / 2; ++d2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_addr(v16 + vkey * Tr::kRowElems + d2 * 16 + (lane / 16) * 8));
        const uint32_t b0[2] = {b[0], b[1]};
        const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_m16n8k16<CT>(o[mt][2 * d2], a[mt], b0);
          mma_m16n8k16<CT>(o[mt][2 * d2 + 1], a[mt], b1);
        }
      }
    }
  };

  for (int i = 0; i < my_tiles; i += kSub) {
    // Refill the stages freed by the previous step (every lane passed the __syncwarp after it);
    // their slots came with groups <= i - 1, complete since the last step's wait.
#pragma unroll
    for (int h = 0; h < kSub; ++h) {
      const int j = i + kS - kSub + h;
      if (j < my_tiles) {
        issue(j);
        fetch_slots(j + kS);
      }
      cp_async_commit();
    }
    cp_async_wait<kS - kSub>();
    __syncwarp();
    const int key0 = tile_key0(i);  // the step's kSub sub-tiles are consecutive keys

    float s[kSub][kMT][2][4];
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      float s2[kMT][2][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          s[u][mt][n][0] = s[u][mt][n][1] = s[u][mt][n][2] = s[u][mt][n][3] = 0.f;
          s2[mt][n][0] = s2[mt][n][1] = s2[mt][n][2] = s2[mt][n][3] = 0.f;
        }
      }
      qk(ring + ((i + u) % kS) * Tr::kStageBytes, s[u], s2);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[u][mt][n][e] += s2[mt][n][e];
        }
      }
    }

    // Logits (soft-cap), the tail mask (and the rows' masks), online softmax (rescale only when
    // the max grows).
    const bool full = key0 + kStepKeys <= kv_end;
    const bool row_masked =
        kRowMask && (key0 < w.mask_head_end || key0 + kStepKeys > w.mask_tail_begin);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[u][mt][n][e];
            if (kMayCap && w.logit_cap > 0.f) {
              x = w.logit_cap * tanhf(x * w.scale / w.logit_cap) * kLog2e;
            } else {
              x *= w.scale_log2;
            }
            const int key = key0 + u * kKeys + n * 8 + 2 * tq + (e & 1);
            if (!full && key >= kv_end) x = -INFINITY;
            if constexpr (kRowMask) {
              if (row_masked && !visible(mt * kRows + g + (e / 2) * 8, key)) x = -INFINITY;
            }
            s[u][mt][n][e] = x;
            tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        if (tile_max[h] > m[mt][h]) {
          const float factor = exp2_of<Tr::kFastExp2>(m[mt][h] - tile_max[h]);
          m[mt][h] = tile_max[h];
          d[mt][h] *= factor;
#pragma unroll
          for (int x = 0; x < Tr::kDimTiles; ++x) {
            o[mt][x][2 * h] *= factor;
            o[mt][x][2 * h + 1] *= factor;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float pr = exp2_of<Tr::kFastExp2>(s[u][mt][n][e] - m[mt][e / 2]);
            s[u][mt][n][e] = pr;
            d[mt][e / 2] += pr;
          }
        }
      }
    }

    // O += P V: the two S n-tiles of a sub-tile form the A fragment of one k-step (per M tile).
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pack2<CT>(s[u][mt][0][0], s[u][mt][0][1]);
        a[mt][1] = pack2<CT>(s[u][mt][0][2], s[u][mt][0][3]);
        a[mt][2] = pack2<CT>(s[u][mt][1][0], s[u][mt][1][1]);
        a[mt][3] = pack2<CT>(s[u][mt][1][2], s[u][mt][1][3]);
      }
      pv(ring + ((i + u) % kS) * Tr::kStageBytes + kKeys * Tr::kRawRowBytes, a);
    }
    __syncwarp();  // every lane is done with the step's stages before the next step refills them
  }
  cp_async_wait<0>();
  __syncthreads();  // the rings become the epilogue region

  // Epilogue 1: every warp's (m, d, O) to shared memory.
  float* epi_o = reinterpret_cast<float*>(main);          // [Tr::kWarps, kR, kHeadDim]
  float* epi_m = epi_o + Tr::kWarps * kR * Tr::kHeadDim;  // [Tr::kWarps, kR]
  float* epi_d = epi_m + Tr::kWarps * kR;                 // [Tr::kWarps, kR]
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[mt][h] += __shfl_xor_sync(0xffffffffu, d[mt][h], 1);
      d[mt][h] += __shfl_xor_sync(0xffffffffu, d[mt][h], 2);
      const int r = mt * kRows + g + h * 8;
      if (r >= w.rows) continue;  // padding rows: epilogue 2 reads rows < w.rows only
      float* orow = epi_o + (warp * kR + r) * Tr::kHeadDim;
      if constexpr (Tr::kQuant) {  // chunk c: columns 16c + 4t + {0, 1, 2, 3} = even, odd, ...
#pragma unroll
        for (int c = 0; c < Tr::kKSteps; ++c) {
          *reinterpret_cast<float4*>(orow + c * 16 + 4 * tq) =
              make_float4(o[mt][2 * c][2 * h], o[mt][2 * c + 1][2 * h], o[mt][2 * c][2 * h + 1],
                          o[mt][2 * c + 1][2 * h + 1]);
        }
      } else {
#pragma unroll
        for (int x = 0; x < Tr::kDimTiles; ++x) {
          *reinterpret_cast<float2*>(orow + x * kMmaN + 2 * tq) =
              make_float2(o[mt][x][2 * h], o[mt][x][2 * h + 1]);
        }
      }
      if (tq == 0) {
        epi_m[warp * kR + r] = m[mt][h];
        epi_d[warp * kR + r] = d[mt][h];
      }
    }
  }
  __syncthreads();

  // Epilogue 2: merge the warps per row, hand 8 columns at a time to the writer.
  constexpr int kVecsPerRow = Tr::kHeadDim / 8;
  for (int c = threadIdx.x; c < w.rows * kVecsPerRow; c += Tr::kThreads) {
    const int r = c / kVecsPerRow;
    const int col = (c % kVecsPerRow) * 8;
    float mx = kNoKeyMax;
#pragma unroll
    for (int x = 0; x < Tr::kWarps; ++x) mx = fmaxf(mx, epi_m[x * kR + r]);
    float dsum = 0.f;
    float acc[8] = {};
#pragma unroll
    for (int x = 0; x < Tr::kWarps; ++x) {
      const float f = exp2f(epi_m[x * kR + r] - mx);
      dsum += epi_d[x * kR + r] * f;
      const float4* src =
          reinterpret_cast<const float4*>(epi_o + (x * kR + r) * Tr::kHeadDim + col);
      const float4 x0 = src[0], x1 = src[1];
      acc[0] += x0.x * f, acc[1] += x0.y * f, acc[2] += x0.z * f, acc[3] += x0.w * f;
      acc[4] += x1.x * f, acc[5] += x1.y * f, acc[6] += x1.z * f, acc[7] += x1.w * f;
    }
    write(r, col, acc, mx, dsum);
  }
}

// Fused split-KV merge: called by every thread of a split CTA after its partial is written; true
// in the CTA that finished last among the num_splits CTAs sharing `counter` (it then merges). The
// last CTA resets the counter to 0, so the workspace is ready for the next launch (CUDA-graph
// replays included). Partials must be read with ld.global.cg (__ldcg) after this.
__device__ __forceinline__ bool last_split_cta(int* counter, int num_splits) {
  __shared__ int last;
  __threadfence();  // this CTA's partial is visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(counter, 1);
    last = prev == num_splits - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// The same answer as last_split_cta with one fence-free atomic: every thread's partial stores come
// before the CTA barrier; thread 0's atom.acq_rel.gpu then releases them at GPU scope and acquires
// the other CTAs' (the barrier after it orders this CTA's merge loads behind it), instead of a
// sequentially consistent fence by every thread before the atomic and another after (the
// release/acquire pattern of CUTLASS's generic barrier; the triton and flashinfer decodes use
// it). Partials must be read with ld.global.cg (__ldcg) or cp.async.cg after this.
__device__ __forceinline__ bool last_split_cta_acq_rel(int* counter, int num_splits) {
  __shared__ int last_acq;
  __syncthreads();
  if (threadIdx.x == 0) {
    int prev = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                 : "=r"(prev)
                 : "l"(counter)
                 : "memory");
#endif
    last_acq = prev == num_splits - 1;
    if (last_acq) *counter = 0;
  }
  __syncthreads();
  return last_acq != 0;
}

// One (row, 4 columns) of a split-KV merge, the fused merges' common core (the flashinfer decode's
// merge_splits_one_trip, the triton decode's merge_head_block): sum over the splits of w_s O_s and
// of w_s, w_s = 2^(lse_s - max) (0 for a split that saw no key, lse -inf), the max taken over the
// splits and `init_max` (a sink's log2 logit, or -inf), online over chunks of kMergeChunk splits
// with one L2 round trip each: the thread loads the chunk's partial LSEs into registers and
// cp.async-copies its 4 columns of every partial of the chunk into its own slots of `stage`
// ([kMergeChunk][Tr::kThreads] float4 of the CTA's shared memory, free at the call: no bank
// conflicts on the read back, no registers held for them), all in flight at once, then weighs
// them. The loads are unpredicated (slots past num_splits repeat the last split, L2 hits, with
// weight 0): predicated loads, or the partials in registers, moved the flashinfer balanced decode
// from 206 to 222-255 registers and cost its fp8 decode 0.5% (session 18). The partials were
// written by other CTAs of the launch: lse_at reads with ld.global.cg, the columns come by
// cp.async.cg. lse_at(s) -> split s's LSE (log2 domain); cols_at(s) -> its 4 columns (16-byte
// aligned), 0 <= s < num_splits (>= 1). No cp.async of the thread may be in flight on entry. For
// one chunk (num_splits <= kMergeChunk) flashinfer's staged three-step merge gives the same bits.
inline constexpr int kMergeChunk = 16;
struct Merged4 {
  float max;
  float sum;
  float acc[4];
};
template <typename Tr, typename LseFn, typename ColsFn>
__device__ __forceinline__ Merged4 merge_partials4(int num_splits, float init_max, LseFn lse_at,
                                                   ColsFn cols_at, float4* stage) {
  constexpr int kChunk = kMergeChunk;
  constexpr int kThreads = Tr::kThreads;
  static_assert(kChunk * kThreads * sizeof(float4) <= Tr::kSmemBytes,
                "the merge stage fits the CTA's shared memory");
  float mx = init_max;
  float dsum = 0.f;
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 1
  for (int s0 = 0; s0 < num_splits; s0 += kChunk) {
    float lse[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int s = min(s0 + j, num_splits - 1);
      lse[j] = lse_at(s);
      cp_async_16(smem_addr(stage + j * kThreads + threadIdx.x), cols_at(s), 16);
    }
    // This thread's copies have landed (it reads only its own slots; "memory": no shared load
    // moves above the wait).
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    float m_new = mx;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) m_new = fmaxf(m_new, lse[j]);
    const float scale = m_new == mx ? 1.f : exp2f(mx - m_new);  // mx -inf: 0
    mx = m_new;
    dsum *= scale, a0 *= scale, a1 *= scale, a2 *= scale, a3 *= scale;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      // 0: all-invisible split, or a slot past num_splits
      const float x = s0 + j >= num_splits || lse[j] == -INFINITY ? 0.f : exp2f(lse[j] - mx);
      const float4 v = stage[j * kThreads + threadIdx.x];
      dsum += x;
      a0 += x * v.x, a1 += x * v.y, a2 += x * v.z, a3 += x * v.w;
    }
  }
  return {mx, dsum, {a0, a1, a2, a3}};
}

// Packs 8 floats into 8 QT values and stores them (16 bytes).
template <typename QT>
__device__ __forceinline__ void store8(QT* dst, const float (&v)[8], float mul) {
  uint4 raw;
  uint32_t* u = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
  for (int x = 0; x < 4; ++x) u[x] = pack2<QT>(v[2 * x] * mul, v[2 * x + 1] * mul);
  *reinterpret_cast<uint4*>(dst) = raw;
}

}  // namespace attnkit::cuda::ring
