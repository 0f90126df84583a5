// The fa3 backend's SM90 FP8 prefill/extend kernel: an e4m3 KV cache (per-layer k_scale /
// v_scale) with bf16 q, both GEMMs on the e4m3 tensor cores (wgmma m64n128k32), head dim 128.
// Same skeleton as prefill_sm90.cuh (persistent zigzag grid, producer warpgroup + 2 consumer
// warpgroups, mbarrier ring, ping-pong, softmax of S(next) overlapping P(cur) V); what differs:
//
//   * Q: the producer loads the bf16 tile as in the bf16 kernel; each consumer warpgroup quantises
//     its 64 rows to e4m3 with one scale per row (amax / 448; all-zero rows: scale 1) into a
//     second, 128-byte-swizzled K-major tile, and folds the row scale into the softmax scale
//     (scale_log2 * k_scale * q_scale[row]). An e4m3 q (Fa3Params::q_fp8, one
//     AttentionLayer::q_scale in scale_log2) lands in the bf16 tile's place already in the e4m3
//     tile's layout, and each warpgroup copies its rows over (copy_q8_rows) instead.
//   * K: e4m3 rows of 128 bytes: one 128-byte swizzle line per row, TMA boxes {128 B, 1, rows} or
//     the 16-byte cp.async gather (8 chunks per row). QK^T: A = Q e4m3, B = K (both K-major).
//   * V: 8-bit wgmma operands must be K-major, so P V needs V^T ([d][keys]) in shared memory.
//     kVtPre (Fa3Params::vt_pre, the default for prefill-like forwards, any page size):
//     fp8_vt_pre_kernel transposes every V block of the forward once per layer into a workspace
//     (the exact stage image) and the producer bulk-copies it on vt_full. Otherwise the producer
//     transposes each V tile (8x8-byte blocks, byte permutes) into a V^T stage after the load
//     lands, one key block behind its loads, fences (generic -> async proxy) and arrives on the
//     stage's vt_full barrier. Within every 16 keys the V^T columns are stored in the order
//     of the f32 accumulator layout (key 8 (b / 2) + 2 t + b % 2 at column 4 t + b), so the P
//     registers become the 8-bit A fragment by plain e4m3 packing, without shuffles.
//   * P: e4m3 (satfinite) in [0, 1] (<= 2^8 with lazy rescale). The row sum l (f32) comes from
//     the P V GEMM (default, kGemmSum: N = 136 against 8 rows of e4m3 ones below each V^T stage,
//     so l sums exactly the rounded P that multiplies V), or from one FADD per element
//     (ATTNKIT_FA3_FP8_GEMM_SUM=0).
//   * Epilogue: O * v_scale / l.
//   * Softmax (kSpec, with kVtPre and kGemmSum): speculative against the running maximum
//     (consumer_fp8).
//   * Key blocks of 128, or 192 with kVtPre (Q K^T at N = 192, P V over two V^T halves).
//   * kWG 3 (Fa3Params::block_m 192; with kVtPre, kSpec, 128-key blocks; the default wherever
//     those apply): three consumer warpgroups of 64 rows, no ping-pong, and each warpgroup runs
//     S, the softmax and P V of a key block in turn (no S(next) under P(cur) V): the other two
//     warpgroups' GEMMs run under its softmax. The e4m3 GEMMs take half the tensor time of bf16
//     while the softmax costs the same, so a third softmax stream per SM sub-partition is what
//     the 2-warpgroup schedule lacked. 32 / 160 registers (S, P and O are never all live); the
//     overlapped 2-warpgroup loop at 160 spills 192 bytes and ran 17% slower (session 46).
//   * Promotion (kPromote, Fa3Params::fp8_promote, 128-key blocks): the e4m3 wgmma adds products
//     into its f32 accumulator with ~13 bits aligned to the largest term (truncated), so a
//     running O / l kept in the accumulator over thousands of keys loses the low bits of every
//     block (docs/PERF.md "FP8 accuracy at long rows"). With kPromote each block's P V starts
//     from zero in a temporary and is added to the running O (f32 registers) by FADD: in two
//     column chunks (d 0..63, then d 64..127 + the ones columns). The two-warpgroup loop runs
//     them through one 36-register temporary, the first issued before the next block's Q K^T,
//     the second overlapping the next block's softmax; the three-warpgroup loop issues both at
//     once and adds chunk 0 while chunk 1 runs.
//   Diagnostics (Fa3Params::diag, timing only): bit 1 no K/V loads, 2 no softmax (the exact step
//   only: blocks that speculate still compute), 4 no in-kernel V transpose, 32 Q quantised in the
//   CTA's first unit only.
//
// Layout of shared memory (dynamic, aligned to 1024 bytes in the kernel):
//   Q bf16 [64 kWG x 128] | Q e4m3 [64 kWG x 128] | K [3][kN x 128] | V [3] (kN 128, kWG 2) |
//   V^T [3][kN / 128 rounded up][136 x 128] (rows 128..135: ones) | O stage [kWG][2][64 x 64] bf16
//   (kWG 3, Fa3Params::o_tma) | q scales [64 kWG] | mbarriers
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "backends/fa3/kernels/fp8_spec_check.h"
#include "backends/fa3/kernels/prefill_sm90.cuh"
#include "cuda/sm90/wgmma_fp8_sm90.cuh"

namespace attnkit::fa3 {

// kN: key block, 128 or 192 (192 only with the V^T pre-transpose: no V stage, no transpose in the
// kernel; the producer keeps 56 registers and the consumers get 224 for S 96 + O 68 + P 24: at
// 40 / 232 a session-9 speculative variant, since dropped, spilled 16 bytes; at 56 / 224 none).
// kVariant_ (PrefillVariant): kWindowSinks for layers with a sliding window or attention sinks
// (decode_tile's first key block, the window mask in the exact step and the speculation test, the
// sink in the epilogue); kSoftcap for soft-capped layers (softcap_s_fp8 after every Q K^T, and
// the window / sinks as kWindowSinks has them); 128-key blocks only (the launcher instantiates
// them for the three-warpgroup plan and for the two-warpgroup one of few queries per key).
template <int kN = 128, int kWG = 2, int kVariant_ = kPlain>
struct PrefillFp8Traits {
  static constexpr int kVariant = kVariant_;
  static_assert(kVariant_ == kPlain || kN == 128,
                "FP8 variants: window / sinks / soft-cap with 128-key blocks");
  static constexpr int kHeadDim = 128;
  static constexpr int kBlockM = 64 * kWG;
  static constexpr int kBlockN = kN;
  static_assert(kN == 128 || kN == 192, "FP8 key block");
  static_assert(kWG == 2 || (kWG == 3 && kN == 128), "3 consumer warpgroups: 128-key blocks");
  static constexpr int kConsumerWarpgroups = kWG;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kQChunksPerRow = kHeadDim / 8;  // bf16 Q: 16-byte chunks
  static constexpr int kChunksPerRow = kHeadDim / 16;  // e4m3 K / V: 16-byte chunks
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kQ8Bytes = kBlockM * kHeadDim;
  static constexpr int kKVBytes = kBlockN * kHeadDim;  // one K (and, at 128, V) stage
  static constexpr int kVStageBytes = kN == 128 && kWG == 2 ? kKVBytes : 0;
  static constexpr int kAlign = 1024;
  static constexpr int kStages = 3;
  static constexpr int kQOffset = 0;
  static constexpr int kQ8Offset = kQBytes;
  static constexpr int kKOffset = kQ8Offset + kQ8Bytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  // V^T stage: per 128 keys (kVtHalves of them) 128 d rows + 8 rows of e4m3 ones (0x38, written
  // once per CTA): with kGemmSum the P V GEMM runs at N = 136 and its last 8 accumulator columns
  // are the row sums of the e4m3 P. 192 keys: keys 128..191 in the second half's first 64 bytes
  // of each row (the rest zero).
  static constexpr int kVtHalves = (kN + 127) / 128;
  static constexpr int kVtRows = kHeadDim + 8;
  static constexpr int kVtHalfBytes = kVtRows * 128;
  static constexpr int kVtBytes = kVtHalves * kVtHalfBytes;
  static constexpr int kVtUnitBytes = kVtBlockKeys * kHeadDim;  // one half's V^T image
  static constexpr int kVtOffset = kVOffset + kStages * kVStageBytes;
  // kWG 3 (Fa3Params::o_tma): each warpgroup's O tile staged for its TMA store, [2][64 rows][64]
  // bf16 in the 128-byte swizzle (store_o_tile_tma).
  static constexpr int kOStageBytes = kWG == 3 ? 64 * kHeadDim * 2 : 0;
  static constexpr int kOStageOffset = kVtOffset + kStages * kVtBytes;
  static constexpr int kQScaleOffset = kOStageOffset + kWG * kOStageBytes;
  static constexpr int kBarOffset = kQScaleOffset + kBlockM * 4;
  // q_full, q_empty, then per stage k_full, v_full, vt_full, empty.
  static constexpr int kNumBarriers = 2 + 4 * kStages;
  // The unit's TileInfo as the producer decoded it (Fa3Params::unit_smem), after the barriers.
  static constexpr int kInfoOffset = kBarOffset + kNumBarriers * 8;
  static constexpr int kInfoBytes = 48;
  static constexpr int kSmemBytes = kInfoOffset + kInfoBytes + kAlign;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kHeadDim == 128, "one 128-byte swizzle line per K / V^T row");
  static constexpr int kSlots = 1;
  static constexpr int kRowsPerPass = 32 / kChunksPerRow;
  static constexpr int kPassesPerWarp = 32 / kRowsPerPass;
  // kPromote: the first P V column chunk (O columns 0 .. kPromoN0 - 1; the second takes the rest,
  // 64 d columns, + 8 ones columns with kGemmSum). A multiple of 8 rows of V^T, so the second
  // chunk's B descriptor starts on a 1024-byte swizzle atom.
  static constexpr int kPromoN0 = 64;
  static_assert(kPromoN0 % 8 == 0 && kPromoN0 < kHeadDim, "promotion chunk");
};

// Registers of the producer / each consumer thread (setmaxnreg) of one FP8 kernel instantiation.
// 128-key blocks: the producer may also transpose V (32 data registers per 8x8-byte block; 72
// spilled 64 bytes, 88 / 208: no spill with nvcc 13.0). 192 (V^T pre-transpose only): 56 / 224.
// Promotion (128-key blocks only) keeps a 36-register temporary live across the softmax; the
// consumers then get 224 with the V^T pre-transpose (the producer only issues TMA / bulk copies:
// 56, as at kN 192) and 208 otherwise (the producer's in-kernel transpose needs 88). Three
// consumer warpgroups (512 threads): 32 / 160 (nvcc 13.0: no spill unpromoted, 4 bytes promoted;
// a 24-register producer spills 32-36 bytes).
template <int kN, bool kVtPre, bool kPromote, int kWG = 2>
struct Fp8RegSplit {
  static_assert(!kPromote || kN == 128, "promotion: 128-key blocks only (kN 192 has no registers)");
  static_assert(kWG == 2 || kVtPre, "3 consumer warpgroups: V^T pre-transpose");
  static constexpr int kProducer = kWG == 3 ? 32 : kN == 192 || (kPromote && kVtPre) ? 56 : 88;
  static constexpr int kConsumer = kWG == 3 ? 160 : kN == 192 || (kPromote && kVtPre) ? 224 : 208;
  static_assert(128 * kProducer + 128 * kWG * kConsumer <= 65536, "register budget");
};

__device__ __forceinline__ uint32_t fp8_bar(uint32_t bars, int stage, int which) {
  return bars + 16 + 32 * stage + 8 * which;  // which: 0 k_full, 1 v_full, 2 vt_full, 3 empty
}

// Columns of a 4x4 byte block given as 4 row words (byte j of row word r = element (r, j)).
__device__ __forceinline__ void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                             uint32_t& c0, uint32_t& c1, uint32_t& c2,
                                             uint32_t& c3) {
  const uint32_t t0 = __byte_perm(a, b, 0x5140), t1 = __byte_perm(a, b, 0x7362);
  const uint32_t t2 = __byte_perm(c, d, 0x5140), t3 = __byte_perm(c, d, 0x7362);
  c0 = __byte_perm(t0, t2, 0x5410);
  c1 = __byte_perm(t0, t2, 0x7632);
  c2 = __byte_perm(t1, t3, 0x5410);
  c3 = __byte_perm(t1, t3, 0x7632);
}

// V [128 keys][128 d] (e4m3, rows 128-byte swizzled) -> V^T [128 d][128 key columns] (the same
// swizzle), key columns permuted within every 16 keys as the P fragment needs (file comment).
// Thread (warp w, lane): half-warp h = lane / 16, d-octet dq = lane % 16; pass i covers the
// 16-key group c = w + 4 i, columns 16 c + 8 h .. + 7. Loads: a half-warp reads one whole key row
// (conflict-free); stores: each thread's 8 output rows are rotated by dq % 8 (the bytes of each
// loaded row are rotated to match), so a store instruction writes 8 different swizzle chunks.
// The 8-byte rotation of each loaded row is two byte permutes with per-thread selectors (2 PRMT
// per key row; the funnel-shift form before session 8, 2 SEL + 2 SHF, measured 1.5-3% slower).
__device__ __forceinline__ void fp8_transpose_v(const uint8_t* sv, uint8_t* svt, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  const int h = lane / 16, dq = lane % 16, rot = dq % 8;
  // Byte j of lo = byte (j + rot) % 8 of (w.y:w.x); of hi: byte (j + 4 + rot) % 8.
  uint32_t sel_lo = 0, sel_hi = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sel_lo |= static_cast<uint32_t>((j + rot) & 7) << (4 * j);
    sel_hi |= static_cast<uint32_t>((j + 4 + rot) & 7) << (4 * j);
  }
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int c = warp + 4 * pass;
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      // Column 16 c + 8 h + q holds key 16 c + 8 ((q % 4) / 2) + 2 (2 h + q / 4) + q % 2.
      const int key = 16 * c + 8 * ((q % 4) >> 1) + 4 * h + 2 * (q / 4) + (q & 1);
      const uint2 w = *reinterpret_cast<const uint2*>(
          sv + key * 128 + ((((dq >> 1) ^ (key & 7))) << 4) + ((dq & 1) << 3));
      // Rotate the 8 bytes right by rot: byte j becomes d-column (j + rot) % 8 of the octet.
      lo[q] = __byte_perm(w.x, w.y, sel_lo);
      hi[q] = __byte_perm(w.x, w.y, sel_hi);
    }
    uint32_t olo[8], ohi[8];  // output row j: columns 0..3 (keys of q 0..3), 4..7
    transpose4x4(lo[0], lo[1], lo[2], lo[3], olo[0], olo[1], olo[2], olo[3]);
    transpose4x4(hi[0], hi[1], hi[2], hi[3], olo[4], olo[5], olo[6], olo[7]);
    transpose4x4(lo[4], lo[5], lo[6], lo[7], ohi[0], ohi[1], ohi[2], ohi[3]);
    transpose4x4(hi[4], hi[5], hi[6], hi[7], ohi[4], ohi[5], ohi[6], ohi[7]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = 8 * dq + ((j + rot) & 7);
      *reinterpret_cast<uint2*>(svt + d * 128 + ((c ^ (d & 7)) << 4) + (h << 3)) =
          make_uint2(olo[j], ohi[j]);
    }
  }
}

// ---- producer ----

// kVtPre (Fa3Params::vt_pre): V^T stages are bulk copies of the pre-transposed workspace
// (fp8_vt_pre_kernel) on the vt_full barrier; no V load, no transpose in this kernel.
// kQIn: which q the kernel takes (kQInBf16 / kQInE4m3: that one only, compiled without the other
// path; kQInEither: Fa3Params::q_fp8 decides at run time).
constexpr int kQInBf16 = 0, kQInE4m3 = 1, kQInEither = 2;
__host__ __device__ constexpr bool q_in_e4m3(int q_in, int q_fp8) {
  return q_in == kQInE4m3 || (q_in == kQInEither && q_fp8 != 0);
}

template <bool kVtPre, int kN = 128, int kWG = 2, int kQIn = kQInEither, int kVariant = kPlain>
__device__ __forceinline__ void producer_fp8(const Fa3Params& p, uint8_t* smem) {
  using namespace sm90;
  using Tr = PrefillFp8Traits<kN, kWG, kVariant>;
  static_assert(kVtPre || kN == 128, "192-key blocks only with the V^T pre-transpose");
  constexpr int kD = Tr::kHeadDim;
  constexpr int CQ = Tr::kQChunksPerRow;
  constexpr int C = Tr::kChunksPerRow;
  const int tid = threadIdx.x;  // 0..127
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t base = smem_addr(smem);
  const uint32_t sQ = base + Tr::kQOffset;
  const uint32_t bars = base + Tr::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8;
  const char* k_base = static_cast<const char*>(p.k_pool);
  const char* v_base = static_cast<const char*>(p.v_pool);

  // V^T of block itp (its V landed or is landing): wait, transpose, publish.
  auto transpose = [&](int itp) {
    const int stage = itp % Tr::kStages;
    mbar_wait(fp8_bar(bars, stage, 1), (itp / Tr::kStages) & 1);
    if ((p.diag & 4) == 0) {  // diag bit 4: no transpose (timing only, wrong results)
      const uint8_t* sv = smem + Tr::kVOffset + stage * Tr::kKVBytes;
      uint8_t* svt = smem + Tr::kVtOffset + stage * Tr::kVtBytes;
      fp8_transpose_v(sv, svt, tid);
    }
    fence_proxy_async();  // generic st.shared -> the consumers' wgmma reads
    mbar_arrive(fp8_bar(bars, stage, 2));
  };

  int it = 0;
  int tcount = 0;
  int pending = -1;  // the block whose V^T is still to be written
  const int units = p.num_tiles * p.num_q_heads;
  const int vunits = scheduled_units(p);
  for (int round = 0, unit = unit_at(p, 0); unit < vunits; unit = unit_at(p, ++round), ++tcount) {
    const TileInfo t = decode_unit<Tr>(p, unit, units);
    const int kvh = t.head / p.group;
    const int32_t* pt = page_table_row(p, t.request);
    int my_slot = -1, my_slot2 = -1;  // rows tid and (kN 192) 128 + tid of the block
    auto slot_of = [&](int nb, int row) {
      const int key = nb * Tr::kBlockN + row;
      if (nb < 0 || row >= Tr::kBlockN || key >= t.kv_len) return -1;
      const int in_page = key % p.page_size;
      return pt[key - in_page] + in_page;
    };
    auto load_slot = [&](int nb) {
      my_slot = slot_of(nb, tid);
      if constexpr (kN > 128) my_slot2 = slot_of(nb, 128 + tid);
    };
    load_slot(t.n_blocks - 1);
    // kVtPre: this (request, kv head)'s V^T blocks in the workspace.
    const uint8_t* vt_src =
        kVtPre
            ? p.vt_ws + kvh * p.vt_head_stride +
                  static_cast<int64_t>(p.plan[kPlanHeaderWords + t.request * kRequestWords + 3]) *
                      Tr::kVtUnitBytes
            : nullptr;

    mbar_wait(q_empty, (tcount & 1) ^ 1);
    publish_tile_info(p, base + Tr::kInfoOffset, t, q_full, tid);
    if (q_in_e4m3(kQIn, p.q_fp8)) {  // e4m3 q: one 128-byte line per row, by TMA or cp.async
      static_assert(Tr::kQ8Bytes <= Tr::kQBytes, "the e4m3 tile lands in the bf16 tile's place");
      if (p.q_tma) {
        if (tid == 0) tma_load_3d(sQ, &p.tma_q, 0, t.head, t.q_start + t.m0, q_full);
        arrive_tma_tile(q_full, Tr::kQ8Bytes, tid);
      } else {
        load_q_tile<Tr::kBlockM, Tr::kChunksPerRow, 1>(p, t, sQ, tid);
        cp_async_arrive_noinc(q_full);
      }
    } else if (p.q_tma) {  // the bf16 Q tile by TMA (Fa3Params::q_tma)
      static_assert(Tr::kQBytes == Tr::kBlockM * Tr::kHeadDim * 2);
      load_q_tile_tma<Tr::kBlockM, Tr::kHeadDim, /*kDiag=*/false>(p, t, sQ, q_full, tid);
    } else {
      load_q_tile<Tr::kBlockM, CQ>(p, t, sQ, tid);
      cp_async_arrive_noinc(q_full);
    }

    for (int nb = t.n_blocks - 1; nb >= t.nb_begin; --nb, ++it) {
      const int stage = it % Tr::kStages;
      const uint32_t phase = (it / Tr::kStages) & 1;
      mbar_wait(fp8_bar(bars, stage, 3), phase ^ 1);
      const uint32_t sK = base + Tr::kKOffset + stage * Tr::kKVBytes;
      const uint32_t sV = base + Tr::kVOffset + stage * Tr::kKVBytes;
      constexpr int kLoads = kVtPre ? 1 : 2;  // K (and V unless pre-transposed)
      if (p.diag & 1) {                       // diagnostics: no loads (timing only, wrong results)
        mbar_arrive(fp8_bar(bars, stage, 0));
        if constexpr (!kVtPre) mbar_arrive(fp8_bar(bars, stage, 1));
      } else if (block_uses_tma<Tr>(p, t, nb)) {
#pragma unroll
        for (int kv = 0; kv < kLoads; ++kv) {
          const uint32_t tile = kv == 0 ? sK : sV;
          const uint32_t bar = fp8_bar(bars, stage, kv);
          if (tid % p.tma_rows == 0) {
            tma_load_3d(tile + tid * 128, kv == 0 ? &p.tma_k : &p.tma_v, 0, kvh, my_slot, bar);
            if constexpr (kN > 128) {
              if (tid < kN - 128) {
                tma_load_3d(tile + (128 + tid) * 128, &p.tma_k, 0, kvh, my_slot2, bar);
              }
            }
          }
          arrive_tma_tile(bar, Tr::kKVBytes, tid);
        }
      } else {
#pragma unroll
        for (int kv = 0; kv < kLoads; ++kv) {
          const char* pool = kv == 0 ? k_base : v_base;
          const int64_t stride_row = kv == 0 ? p.k_stride_row : p.v_stride_row;
          const int64_t head_off =
              static_cast<int64_t>(kvh) * (kv == 0 ? p.k_stride_head : p.v_stride_head);
          const uint32_t tile = kv == 0 ? sK : sV;
          const int warp_row0 = 32 * warp;
#pragma unroll 4
          for (int pass = 0; pass < Tr::kPassesPerWarp; ++pass) {
            const int r_in_warp = pass * Tr::kRowsPerPass + lane / C;
            const int chunk = lane % C;
            const int slot = __shfl_sync(0xffffffffu, my_slot, r_in_warp);
            const int row = warp_row0 + r_in_warp;
            cp_async_row_chunk<Tr, 1>(tile, pool, slot, row, chunk, stride_row, head_off);
          }
          if constexpr (kN > 128) {  // rows 128.. (K only): warps 0 .. (kN - 128) / 32 - 1
            if (warp < (kN - 128) / 32) {
#pragma unroll 4
              for (int pass = 0; pass < Tr::kPassesPerWarp; ++pass) {
                const int r_in_warp = pass * Tr::kRowsPerPass + lane / C;
                const int chunk = lane % C;
                const int slot = __shfl_sync(0xffffffffu, my_slot2, r_in_warp);
                const int row = 128 + warp_row0 + r_in_warp;
                cp_async_row_chunk<Tr, 1>(tile, pool, slot, row, chunk, stride_row, head_off);
              }
            }
          }
          cp_async_arrive_noinc(fp8_bar(bars, stage, kv));
        }
      }
      if constexpr (kVtPre) {  // V^T after K: the consumers wait for K first
        const uint32_t vt_full = fp8_bar(bars, stage, 2);
        if (p.diag & 1) {
          mbar_arrive(vt_full);
        } else if (tid == 0) {
          mbar_arrive_expect_tx(vt_full, Tr::kVtHalves * Tr::kVtUnitBytes);
#pragma unroll
          for (int h = 0; h < Tr::kVtHalves; ++h) {
            bulk_load(base + Tr::kVtOffset + stage * Tr::kVtBytes + h * Tr::kVtHalfBytes,
                      vt_src + static_cast<int64_t>(nb * Tr::kVtHalves + h) * Tr::kVtUnitBytes,
                      Tr::kVtUnitBytes, vt_full);
          }
        } else {
          mbar_arrive(vt_full);
        }
      }
      (void)kD;
      if constexpr (!kVtPre) {
        // One block behind the loads, so this V has had a block's time to land.
        if (pending >= 0) transpose(pending);
        pending = it;
      }
      load_slot(nb - 1);
    }
  }
  if (pending >= 0) transpose(pending);
  cp_async_wait<0>();
}

// ---- consumers ----

// Timeline builds (-DATTNKIT_FA3_TIMELINE): the three-warpgroup loop's stamp e (0..kFp8TlEvents-1)
// of key block blk (loop order) of warpgroup g in unit `round` of this CTA: the SM clock, or
// `value`; written by the warpgroup's first thread through stamp() (prefill_sm90.cuh), whose
// per-CTA words this layout reuses. Nothing in other builds.
__device__ __forceinline__ void fp8_stamp(const Fa3Params& p, int round, int g, int blk, int e,
                                          bool who, long long value = -1) {
#if defined(ATTNKIT_FA3_TIMELINE)
  if (round < kFp8TlUnits && blk < kFp8TlBlocks) {
    const int word = ((round * 3 + g) * kFp8TlBlocks + blk) * kFp8TlEvents + e;
    stamp(p, word / kTimelineEvents, word % kTimelineEvents, who, value);
  }
#else
  (void)p, (void)round, (void)g, (void)blk, (void)e, (void)who, (void)value;
#endif
}

// P (f32 accumulator layout) -> the e4m3 A fragment of k-step kk (32 keys): register 0 holds
// row r, fragment columns 4 t .. 4 t + 3 = keys 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t (the V^T column
// order of fp8_transpose_v); register 1 row r + 8; registers 2, 3 the next 16 keys.
__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

template <int kN>
__device__ __forceinline__ void pack_p_fp8(const float (&s)[kN / 2], uint32_t (&pa)[kN / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 32; ++kk) {
    const float* x = s + 16 * kk;
    pa[kk][0] = fp8x4(x[0], x[1], x[4], x[5]);
    pa[kk][1] = fp8x4(x[2], x[3], x[6], x[7]);
    pa[kk][2] = fp8x4(x[8], x[9], x[12], x[13]);
    pa[kk][3] = fp8x4(x[10], x[11], x[14], x[15]);
  }
}

// This warpgroup's 64 bf16 Q rows -> e4m3 with one scale per row (thread: row tid / 2, half of
// its 128 columns); returns nothing, writes the tile and the row scales.
template <typename Tr>
__device__ __forceinline__ void quantize_q_rows(uint8_t* smem, int g, int tid) {
  // Opaque to the compiler, so that the tile addresses below are formed here, once per unit:
  // hoisted out of the unit loop, they stay live across the key-block loop and spill.
  asm volatile("" : "+r"(tid));
  const int row = g * 64 + tid / 2, half = tid & 1;
  uint4 raw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    raw[i] = *reinterpret_cast<const uint4*>(smem + Tr::kQOffset +
                                             sm90::swizzle_offset(Tr::kBlockM, row, half * 8 + i));
  }
  auto f2 = [](uint32_t w) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  };
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    for (uint32_t w : {raw[i].x, raw[i].y, raw[i].z, raw[i].w}) {
      const float2 v = f2(w);
      amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  constexpr float kE4m3Max = 448.f;
  const float inv = amax > 0.f ? kE4m3Max / amax : 0.f;
  const float qs = amax > 0.f ? amax / kE4m3Max : 1.f;
  auto q4 = [&](uint32_t w0, uint32_t w1) {
    const float2 a = f2(w0), b = f2(w1);
    return fp8x4(a.x * inv, a.y * inv, b.x * inv, b.y * inv);
  };
#pragma unroll
  for (int i2 = 0; i2 < 4; ++i2) {
    const uint4 a = raw[2 * i2], b = raw[2 * i2 + 1];
    const int c8 = half * 4 + i2;  // 16 e4m3 values per 16-byte chunk
    *reinterpret_cast<uint4*>(smem + Tr::kQ8Offset + row * 128 + ((c8 ^ (row & 7)) << 4)) =
        make_uint4(q4(a.x, a.y), q4(a.z, a.w), q4(b.x, b.y), q4(b.z, b.w));
  }
  if (half == 0) reinterpret_cast<float*>(smem + Tr::kQScaleOffset)[row] = qs;
}

// Fa3Params::q_fp8: this warpgroup's 64 e4m3 Q rows, landed in the bf16 tile's place in the
// e4m3 tile's own layout (one 128-byte swizzle line per row), copied into the e4m3 tile (8 KB:
// four 16-byte vectors per thread), with row scales of 1 (q_scale is in scale_log2).
template <typename Tr>
__device__ __forceinline__ void copy_q8_rows(uint8_t* smem, int g, int tid) {
  asm volatile("" : "+r"(tid));  // addresses formed here, as in quantize_q_rows
  const uint4* src = reinterpret_cast<const uint4*>(smem + Tr::kQOffset + g * 64 * 128);
  uint4* dst = reinterpret_cast<uint4*>(smem + Tr::kQ8Offset + g * 64 * 128);
  uint4 v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = src[tid + 128 * i];
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[tid + 128 * i] = v[i];
  if (tid < 64) reinterpret_cast<float*>(smem + Tr::kQScaleOffset)[g * 64 + tid] = 1.f;
}

// Fa3Params::o_tma: this warpgroup's normalised O tile (rows wrow0 .. wrow0 + 63 of the request,
// all in [0, q_len)) into its staging buffer by stmatrix, then two TMA boxes of 64 columns, issued
// by the warpgroup's first thread; the LSE as store_o_tile writes it. The previous tile's boxes
// must have read the buffer first (bulk_wait_read). Named barrier 3 + g (the warpgroup's).
template <typename Tr>
__device__ __forceinline__ void store_o_tile_tma(const Fa3Params& p, const TileInfo& t,
                                                 const float (&o)[Tr::kHeadDim / 2],
                                                 const float (&m)[2], const float (&l)[2],
                                                 float out_scale, uint8_t* smem, int g, int tid,
                                                 int wrow0) {
  constexpr int kD = Tr::kHeadDim;
  // Opaque, so that the stmatrix addresses are formed here (as in quantize_q_rows).
  asm volatile("" : "+r"(tid));
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t stage = sm90::smem_addr(smem) + Tr::kOStageOffset + g * Tr::kOStageBytes;
  if (tid == 0) sm90::bulk_wait_read<0>();
  asm volatile("bar.sync %0, 128;" ::"r"(3 + g) : "memory");
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_row_sum(l[h]);
    inv[h] = cuda::row_inv(sum, out_scale);
    if (p.lse != nullptr && lane % 4 == 0) {
      const int64_t trow = t.q_start + wrow0 + 16 * warp + lane / 4 + 8 * h;
      p.lse[trow * p.lse_stride_token + static_cast<int64_t>(t.head) * p.lse_stride_head] =
          row_lse(m[h], sum);
    }
  }
  // stmatrix.x4 of column groups 2 q, 2 q + 1 (8 columns each): matrix i = rows + 8 (i % 2) of
  // group 2 q + i / 2; lane gives the row address of row lane % 8 of matrix lane / 8.
  const int mi = lane / 8;
  const int row = 16 * warp + 8 * (mi & 1) + lane % 8;
#pragma unroll
  for (int q = 0; q < kD / 16; ++q) {
    uint32_t r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i & 1, j = 2 * q + (i >> 1);
      r[i] = pack2<true>(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
    }
    const int jj = 2 * q + (mi >> 1);
    // sm90::swizzle_offset(64, row, jj), written out: the helper's signed % / (row, jj >= 0
    // here) added 8-16 instructions to each three-warpgroup FP8 kernel (nvcc 13.0).
    sm90::stmatrix_x4(stage + (jj / 8) * (64 * 128) + row * 128 + (((jj % 8) ^ (row & 7)) << 4), r);
  }
  sm90::fence_proxy_async();
  asm volatile("bar.sync %0, 128;" ::"r"(3 + g) : "memory");
  if (tid == 0) {
#pragma unroll
    for (int cb = 0; cb < kD / 64; ++cb) {
      sm90::tma_store_3d(&p.tma_o, stage + cb * (64 * 128), cb * 64, t.head, t.q_start + wrow0);
    }
    sm90::bulk_commit();
  }
}

// The variant kernels' part of the speculation test: whether Fa3Params::sliding_window hides keys
// of the block at n0 from some row of warpgroup g (the first key lies before its last row's
// window, or without the causal mask the last key after its first row's; RowSoftmax::step_scaled
// masks the same keys).
template <int kN>
__device__ __forceinline__ bool window_masks_block(const Fa3Params& p, const TileInfo& t, int n0,
                                                   int g) {
  const int first_row = t.causal_limit + g * 64;
  return p.sliding_window >= 0 && (n0 < first_row + 63 - p.sliding_window ||
                                   (!p.causal && n0 + kN - 1 > first_row + p.sliding_window));
}

// Speculative softmax step (Fa3Params::fp8_spec, unmasked blocks, rows with a finite running
// maximum m): P = exp2(S sc - m) with the maximum of the blocks before, issued without waiting
// for this block's maximum, which is computed alongside only to check the speculation. Returns
// true when a row's block maximum exceeds m by more than thr (the lazy-rescale threshold, 0 without
// lazy rescale): then P is wrong (possibly inf) and the caller recomputes S and runs the exact
// step. Otherwise m stays and no O rescale is due (the exact step's `keep` case).
template <int kN>
__device__ __forceinline__ bool spec_softmax_fp8(float (&s)[kN / 2], const float (&sc)[2],
                                                 const float (&m)[2], float thr) {
  constexpr int kJ = kN / 8;
  float mx[2][2];
  block_row_max<kN>(s, mx);
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1;
      s[4 * j + e] = sm90::exp2_approx(fmaf(s[4 * j + e], sc[h], -m[h]));
    }
  }
  bool bad = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float r = fmaxf(mx[h][0], mx[h][1]);
    r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 1));
    r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 2));
    bad = bad || r * sc[h] - m[h] > thr;
  }
  return bad;
}

// The three-warpgroup loop's speculative step (Fa3Params::fp8_spec, unmasked blocks, rows with a
// finite running maximum m): P = exp2(S sc - m) against the maximum of the blocks before, with no
// block maximum. The check is made on the packed e4m3 P instead (e4m3_words_reach).
template <int kN>
__device__ __forceinline__ void spec_exps_fp8(float (&s)[kN / 2], const float (&sc)[2],
                                              const float (&m)[2]) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[4 * j + e] = sm90::exp2_approx(fmaf(s[4 * j + e], sc[e >> 1], -m[e >> 1]));
    }
  }
}

// The soft-cap (kSoftcap) on the first kCount accumulators of a block of S (f32 accumulator
// layout: element i is row r + 8 ((i >> 1) & 1)): S becomes the log2-domain logit
// post tanh(S pre[h]), pre[h] = the row's scale (exp2 domain) x ln 2 / cap, post = cap x log2(e),
// as the bf16 kernel's RowSoftmax::step does; the softmax then takes a scale of 1. One
// tanh.approx per score (sm90::tanh_approx; NaN stays NaN). Before the masks, which set the
// invisible scores to -inf afterwards.
template <int kCount>
__device__ __forceinline__ void softcap_s_fp8(float* s, const float (&pre)[2], float post) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) s[i] = post * sm90::tanh_approx(s[i] * pre[(i >> 1) & 1]);
}

// OR of `pred` over the 128 threads of named barrier `id` (one warpgroup), as a barrier.
__device__ __forceinline__ bool warpgroup_any(bool pred, int id) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n"
      " selp.u32 %0, 1, 0, q;\n}"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(pred)), "r"(id)
      : "memory");
  return r != 0;
}

// P V of one key block into the accumulators d of O columns kC0 .. kC0 + kNc - 1 (V^T rows; the
// ones rows are columns 128..135): kk-step kk reads V^T half kk / 4 of the stage at vt_stage.
// kFresh: the first k-step overwrites d (promotion: the block's P V from zero; d is write-only
// there for the compiler, so the temporary has no live range before the issue), else accumulates.
template <int kNc, int kC0, int kN, bool kFresh>
__device__ __forceinline__ void issue_pv_fp8(float (&d)[kNc / 2], const uint32_t (&pa)[kN / 32][4],
                                             uint32_t vt_stage) {
  using Tr = PrefillFp8Traits<kN>;  // V^T stage geometry (independent of the warpgroups)
  static_assert(kC0 % 8 == 0, "column chunk on a swizzle atom");
#pragma unroll
  for (int kk = 0; kk < kN / 32; ++kk) {  // 4 k-steps of 32 keys per V^T half
    const uint64_t vt_desc = sm90::desc_advance(
        sm90::make_desc(vt_stage + (kk / 4) * Tr::kVtHalfBytes + kC0 * 128, 16, 1024),
        (kk % 4) * 32);
    if constexpr (kFresh) {
      if (kk == 0) {
        sm90::wgmma_rs_e4m3_zero<kNc>(d, pa[kk], vt_desc);
        continue;
      }
    }
    sm90::wgmma_rs_e4m3<kNc>(d, pa[kk], vt_desc, 1);
  }
}

// Promotion: O columns kC0 .. kC0 + kNc - 1 += t (f32, in registers).
template <int kNc, int kC0, int kPvN>
__device__ __forceinline__ void promote_add(float (&o)[kPvN / 2], const float (&t)[kNc / 2]) {
  static_assert(kC0 + kNc <= kPvN, "promotion chunk");
#pragma unroll
  for (int i = 0; i < kNc / 2; ++i) o[kC0 / 2 + i] += t[i];
}

// kGemmSum (Fa3Params::fp8_gemm_sum): the row sum l through the P V GEMM (N = 136 against V^T's
// ones rows: O carries 4 more accumulators per thread, columns 128..135 = the sum of the e4m3 P
// of the row) instead of one FADD per element in the softmax.
// kSpec (Fa3Params::fp8_spec): the overlapped loop's softmax speculates on the running maximum
// (spec_softmax_fp8: the block maximum reduced alongside the exps, checked before the P V wait);
// when any row of the warpgroup fails, S is recomputed (one more Q K^T of the block, whose K stage
// is still held: it is released after the next block's P V) and the exact step runs. Without lazy
// rescale (ATTNKIT_FA3_LAZY_RESCALE=0) the threshold is 0, so every block whose maximum rises takes
// the recompute path (how the tests cover it). The promoted three-warpgroup kernel checks the
// packed P instead of a block maximum (kByteCheck below), which lets rises below 0.0875 pass there.
// kPromote (Fa3Params::fp8_promote; 128-key blocks): each block's P V accumulates from zero in
// the wgmma and is added to the running O in f32 registers (file comment). Per iteration of the
// overlapped loop (P(cur) V, S(next)): chunk 0 of P(cur) V (O columns 0..63) is issued before
// S(next) = Q K^T and added once both are complete; chunk 1 (the other columns) into the same
// temporary runs during the softmax of S(next) and is added before cur's V^T stage is released.
// The O rescale (lazy or not) applies to the f32 O after both adds, as it does to the accumulator
// without promotion. kPromote 1 (Fa3Params::fp8_promote 1); kPromote 2 (fp8_promote 2) orders the
// chunks the other way (chunk 0 behind S(next), during the softmax; chunk 1 after it), for the A/B
// of the two.
template <bool kGemmSum, bool kSpec = false, int kN = 128, int kPromote = 0, int kWG = 2,
          int kQIn = kQInEither, int kVariant = kPlain>
__device__ __forceinline__ void consumer_fp8(const Fa3Params& p, uint8_t* smem, int g) {
  // A speculated block adds nothing to l in the softmax: its row sum must come from the GEMM.
  static_assert(!kSpec || kGemmSum, "the speculative softmax needs the GEMM row sum");
  using namespace sm90;
  using Tr = PrefillFp8Traits<kN, kWG, kVariant>;
  constexpr bool kWindow = kVariant != kPlain;  // Fa3Params::sliding_window read at run time
  constexpr bool kCap = kVariant == kSoftcap;   // Fa3Params::logit_cap > 0 (the launcher's rule)
  constexpr int kD = Tr::kHeadDim;
  const int tid = threadIdx.x - 128 * (g + 1);
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t base = smem_addr(smem);
  const uint32_t bars = base + Tr::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8;
  const uint64_t q_desc = make_desc(base + Tr::kQ8Offset + g * 64 * 128, 16, 1024);
  const bool pingpong = kWG == 2 && p.pingpong != 0;  // two consumer warpgroups only
  auto turn_wait = [&] {
    if (pingpong) asm volatile("bar.sync %0, 256;" ::"r"(1 + g) : "memory");
  };
  auto turn_pass = [&] {
    if (pingpong) asm volatile("bar.arrive %0, 256;" ::"r"(2 - g) : "memory");
  };
  const float kNegInf = -__int_as_float(0x7f800000);
  if (g == 1) turn_pass();

  int it = 0;
  int tcount = 0;
  const int units = p.num_tiles * p.num_q_heads;
  const int vunits = scheduled_units(p);
  for (int round = 0, unit = unit_at(p, 0); unit < vunits; unit = unit_at(p, ++round), ++tcount) {
    // Timeline builds, event 7 of blocks 0..6: unit start, Q quantised, O stored, key blocks,
    // speculation failures (values), the key-block loop's end, Q landed (q_full).
    const bool who = kWG == 3 && tid == 0;
    fp8_stamp(p, round, g, 0, 7, who);
    // The unit's geometry: the producer's copy (Fa3Params::unit_smem) lands with the Q tile.
    mbar_wait(q_full, tcount & 1);
    fp8_stamp(p, round, g, 6, 7, who);
    const TileInfo t = unit_tile_info<Tr>(p, base + Tr::kInfoOffset, unit, units);
    const bool last_unit = unit_at(p, round + 1) >= vunits;
    const int row0 = g * 64 + warp * 16 + lane / 4;
    const int qpos0 = t.causal_limit + row0;
    constexpr int kPvN = kGemmSum ? kD + 8 : kD;
    // Promotion chunks (O columns 0 .. kN0 - 1, kN0 .. kPvN - 1; the sizes are unused without).
    constexpr int kN0 = Tr::kPromoN0;
    constexpr int kN1 = kPvN - kN0;
    float o[kPvN / 2];
#pragma unroll
    for (int i = 0; i < kPvN / 2; ++i) o[i] = 0.f;
    RowSoftmax<Tr, true> sm;
    sm.m[0] = sm.m[1] = kNegInf;
    sm.l[0] = sm.l[1] = 0.f;
    float corr[2];
    float s[kN / 2];
    uint32_t pa[kN / 32][4];

    // Q (landed: q_full above): quantise this warpgroup's rows (the previous tile's QK^T reads of
    // the e4m3 tile are complete: every S was waited for), publish to the async proxy, release
    // the bf16 tile and the TileInfo copy.
    if (q_in_e4m3(kQIn, p.q_fp8)) {
      copy_q8_rows<Tr>(smem, g, tid);
    } else if ((p.diag & 32) == 0 || tcount == 0) {
      quantize_q_rows<Tr>(smem, g, tid);
    }
    fence_proxy_async();
    asm volatile("bar.sync %0, 128;" ::"r"(3 + g) : "memory");
    mbar_arrive(q_empty);
    fp8_stamp(p, round, g, 1, 7, who);
    fp8_stamp(p, round, g, 3, 7, who, t.n_blocks - t.nb_begin);
    [[maybe_unused]] int tl_bad = 0;
    float rsc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rsc[h] =
          p.scale_log2 * reinterpret_cast<const float*>(smem + Tr::kQScaleOffset)[row0 + 8 * h];
    }
    // kCap: rsc becomes the soft-cap's pre factors (softcap_s_fp8, after each Q K^T) and the
    // softmax and the speculation scale by 1 (ssc); post is formed from the parameter at each use,
    // so that nothing more stays live across the loop (a register more made ptxas serialise the
    // wgmma of three of the four kSoftcap kernels).
    if constexpr (kCap) {
#pragma unroll
      for (int h = 0; h < 2; ++h) rsc[h] *= cuda::kLn2 / p.logit_cap;
    }
    const float unit_scale[2] = {1.f, 1.f};
    const float(&ssc)[2] = *(kCap ? &unit_scale : &rsc);
    // One block's softmax (P in place in s; kGemmSum: without the row sum), packed after the wait.
    auto softmax = [&](int nbx) {
      sm.template step_scaled<!kGemmSum, kN, kWindow>(s, ssc, p, t, nbx, g, lane, qpos0, corr);
    };

    // The half diagonal block's exact step (after compute_s_half): over its first 64 keys, P zero
    // past them. In the e4m3-q kernel only (kHalfSoftmax): in the bf16-q one ptxas (CUDA 13.0) then
    // serialised the wgmma for want of registers, so there the whole-width step runs (its mask
    // zeroes the same P). H200, 2026-11-28 07:49Z: the e4m3-q kernel 1.0-1.9% faster at causal
    // 4k-8k, the bf16-q one (half S only) level.
    constexpr bool kHalfSoftmax = kN == 128 && kQIn == kQInE4m3;
    auto softmax_half = [&](int nbx) {
      if constexpr (kHalfSoftmax) {
        float(&s_lo)[kN / 4] = *reinterpret_cast<float(*)[kN / 4]>(&s[0]);
        sm.template step_scaled<!kGemmSum, kN / 2, kWindow>(s_lo, ssc, p, t, nbx, g, lane, qpos0,
                                                            corr);
#pragma unroll
        for (int i = kN / 4; i < kN / 2; ++i) s[i] = 0.f;
      }
    };
    auto pack = [&] { pack_p_fp8<kN>(s, pa); };

    // Q K^T of the block in `stage` into d: all kN keys (issue_qk), or the first kNs (the half
    // diagonal block's S).
    auto issue_qk_n = [&]<int kNs>(int stage, float(&d)[kNs / 2]) {
      const uint64_t k_desc = make_desc(base + Tr::kKOffset + stage * Tr::kKVBytes, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < kD / 32; ++kk) {
        wgmma_ss_e4m3<kNs>(d, desc_advance(q_desc, kk * 32), desc_advance(k_desc, kk * 32),
                           kk > 0 ? 1 : 0);
      }
    };
    auto issue_qk = [&](int stage) { issue_qk_n.template operator()<kN>(stage, s); };
    // S = Q K^T of the block in `stage`, waited for (the three-warpgroup loop's S and every
    // speculation recompute).
    auto compute_s = [&](int stage) {
      wgmma_fence();
      issue_qk(stage);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      if constexpr (kCap) softcap_s_fp8<kN / 2>(s, rsc, p.logit_cap * cuda::kLog2e);
    };
    // The same for the block's first 64 keys only (the half diagonal block, Fa3Params::
    // fp8_half_diag): S into s[0 .. kN / 4 - 1], which hold those keys' columns in the N = kN
    // fragment order; the rest is set to -inf, as the exact step's causal mask would (every one of
    // those keys lies after the warpgroup's last row), so that no stale value stays live.
    auto compute_s_half = [&](int stage) {
      if constexpr (kN == 128) {
        float(&s_lo)[kN / 4] = *reinterpret_cast<float(*)[kN / 4]>(&s[0]);
        wgmma_fence();
        issue_qk_n.template operator()<kN / 2>(stage, s_lo);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = kN / 4; i < kN / 2; ++i) s[i] = kNegInf;
        fence_regs(s);  // before the soft-cap reads the accumulators (as in compute_s)
        if constexpr (kCap) softcap_s_fp8<kN / 4>(s, rsc, p.logit_cap * cuda::kLog2e);
      }
    };
    auto vt_stage = [&](int stage) { return base + Tr::kVtOffset + stage * Tr::kVtBytes; };
    auto issue_pv = [&](int stage) {  // without promotion: O += P V in the accumulator
      issue_pv_fp8<kPvN, 0, kN, false>(o, pa, vt_stage(stage));
    };
    // Promotion: the two chunks of the block's P V, each from zero, and their adds to O. In the
    // two-warpgroup loops t0 and t1 are never live together (chunk 1 is issued after chunk 0 is
    // added): one temporary. The three-warpgroup loop keeps both in flight (S is dead by then).
    // late (kPromote 2, an ordering to measure): chunk 0 is issued behind S(next) and runs during
    // the softmax, chunk 1 after it (exposed); kPromote 1: chunk 0 ahead of S(next).
    [[maybe_unused]] constexpr bool late = kPromote == 2;
    [[maybe_unused]] float t0[kN0 / 2], t1[kN1 / 2];
    auto issue_pv0 = [&](int stage) {
      wgmma_fence();
      issue_pv_fp8<kN0, 0, kN, true>(t0, pa, vt_stage(stage));
      wgmma_commit();
    };
    auto add_pv0 = [&] {
      fence_regs(t0);
      fence_regs(o);
      promote_add<kN0, 0, kPvN>(o, t0);
    };
    auto issue_pv1 = [&](int stage) {
      wgmma_fence();
      issue_pv_fp8<kN1, kN0, kN, true>(t1, pa, vt_stage(stage));
      wgmma_commit();
    };
    auto add_pv1 = [&] {
      fence_regs(t1);
      fence_regs(o);
      promote_add<kN1, kN0, kPvN>(o, t1);
    };
    auto wait_k = [&](int itx, int nbx) {
      mbar_wait(fp8_bar(bars, itx % Tr::kStages, 0), (itx / Tr::kStages) & 1);
      if (p.fence_tma != 0 || !block_uses_tma<Tr>(p, t, nbx)) fence_proxy_async();
    };
    auto wait_vt = [&](int itx) {
      mbar_wait(fp8_bar(bars, itx % Tr::kStages, 2), (itx / Tr::kStages) & 1);
    };
    // After wgmma_wait<0>: the block's P V added into O, then its stage released. chunk1 (a
    // std::bool_constant): a promoted P V's chunk 1 is still to be issued (after chunk 0's add).
    auto retire_pv = [&](int stage, auto chunk1) {
      if constexpr (kPromote != 0) {
        if constexpr (decltype(chunk1)::value) {
          add_pv0();
          issue_pv1(stage);
          wgmma_wait<0>();
        }
        add_pv1();
      } else {
        fence_regs(o);
      }
      mbar_arrive(fp8_bar(bars, stage, 3));
    };

    if constexpr (kWG == 3) {
      // Three consumer warpgroups: each runs S, the softmax and P V of a block in turn (no
      // ping-pong, no S(next) under P(cur) V), and the other two warpgroups' GEMMs run under its
      // softmax. S and the promoted temporaries are never live together (160 registers): both
      // P V chunks go out together once P is packed (H200 2026-11-27 20:29Z: one chunk at a
      // time +0.5 / +0.5 / +1.4% time at causal 4k / 8k / 16k; one N = 136 GEMM +1.3-3.0%).
      // The speculative step below repeats the overlapped loop's on purpose: one shared lambda
      // moved the SASS of every speculative kernel and measured level to 3% slower (session 46,
      // scripts/device/patches/fa3_s46_fp8_block_softmax_dedup.patch).
      // kByteCheck (the promoted kernel: by default the forwards with a request past 2048 keys;
      // ATTNKIT_FA3_FP8_PROMOTE=1 / 2 forces it): the speculation is checked on the packed e4m3 P
      // (e4m3_words_reach, fp8_spec_check.h) instead of by the block maximum (64 FMNMX per thread
      // and block and its shuffles): H200 2026-11-27 15:16Z, causal 4k / 8k / 16k +4.5 / +4.6 /
      // +4.4%, bidirectional 8k +3.2% (docs/PERF.md "Session 48"). A block fails when a packed byte
      // is:
      //  * >= 0x78 with lazy rescale: e4m3 256, i.e. P >= 248, a rise of the row maximum by
      //    >= log2(248) = 7.954. Slightly stricter than the exact step's keep rule (<= 8), which
      //    then keeps m;
      //  * >= 0x39 without: P > 1.0625. Looser than that mode's exact step, which rescales on any
      //    rise. A rise below 0.0875 then keeps m under the true maximum, a consistent state:
      //    O and l hold the same P, later steps rescale from m, and P <= 1.0625 packs to 1.0.
      // Saturated or NaN P (0x7e / 0x7f) fail too. The unpromoted kernel keeps the block maximum:
      // with the check on P it spilled 200 bytes.
      constexpr bool kByteCheck = kSpec && kPromote != 0;
      int it_c = it;
      // Causal: the first blocks (the loop runs from the last) may lie wholly after this
      // warpgroup's last row, while the tile's later warpgroups still see them: they add nothing
      // here. Each one's K is waited for, so that the release counts toward that load's phase of
      // the stage's empty barrier, then its stage is released. Before the loop, so that the
      // loop's code is unchanged. This relies on the last warpgroup never skipping (n_blocks
      // ends at the tile's last row, tile_key_end): it waits for every block's V^T and releases
      // it after its P V, so no stage is reloaded while a skipped block's V^T still lands.
      int nb_top = t.n_blocks - 1;
      const int last_row = t.causal_limit + g * 64 + 63;
      if (p.causal) {
        for (; nb_top >= t.nb_begin && nb_top * kN > last_row; --nb_top, ++it_c) {
          wait_k(it_c, nb_top);
          mbar_arrive(fp8_bar(bars, it_c % Tr::kStages, 3));
        }
      }
      // Fa3Params::fp8_half_diag: when this warpgroup's last row ends in the first half of its
      // diagonal block (nb_top), keys 64 .. 127 of that block are after every one of its rows:
      // S (m64n64) and, with kHalfSoftmax, the exact step run over the first 64 keys only; P V
      // stays whole (P is zero past them; the half P V made ptxas serialise the e4m3-q kernel's
      // wgmma). About half the warpgroups of a causal tile, once per unit.
      const bool half_top =
          kN == 128 && p.causal && p.fp8_half_diag != 0 && nb_top * kN + kN / 2 > last_row;
      for (int nb = nb_top; nb >= t.nb_begin; --nb, ++it_c) {
        const int stage = it_c % Tr::kStages;
        const int blk = t.n_blocks - 1 - nb;  // timeline builds: events 0..6 of this block
        fp8_stamp(p, round, g, blk, 0, who);
        wait_k(it_c, nb);
        fp8_stamp(p, round, g, blk, 1, who);
        const bool half = half_top && nb == nb_top;
        if (half) {
          compute_s_half(stage);
        } else {
          compute_s(stage);
        }
        fp8_stamp(p, round, g, blk, 2, who);
        // Some row of the warpgroup has keys of this block masked (no speculation then): past
        // kv_len, after the row (causal) or, in the variant, outside its window.
        const int n0 = nb * kN;
        bool masked = n0 + kN > t.kv_len || (p.causal && n0 + kN - 1 > t.causal_limit + g * 64);
        if constexpr (kWindow) masked = masked || window_masks_block<kN>(p, t, n0, g);
        if constexpr (kByteCheck) {
          // Each warp packs its P before the warpgroup vote, by the speculative or the exact
          // step, so that only P (16 words) and O are live across the vote; a failed vote
          // recomputes S and reruns the exact step in the warps that speculated.
          const bool spec =
              __all_sync(0xffffffffu, !masked && sm.m[0] != kNegInf && sm.m[1] != kNegInf);
          bool bad = false;
          if (spec) {
            spec_exps_fp8<kN>(s, ssc, sm.m);
            pack();
            bad = e4m3_words_reach<kN / 32>(
                pa, p.lazy_rescale != 0 ? kE4m3SpecLimitLazy : kE4m3SpecLimitEager);
            corr[0] = corr[1] = 1.f;
          } else if (kHalfSoftmax && half) {
            softmax_half(nb);
            pack();
          } else {
            softmax(nb);
            pack();
          }
          if (warpgroup_any(bad, 3 + g)) {  // rare: recompute S, then the exact step
            ++tl_bad;
            compute_s(stage);
            if (spec) {
              softmax(nb);
              pack();
            }
          }
        } else {
          bool exact = true;
          if constexpr (kSpec) {
            bool bad = false;
            if (__all_sync(0xffffffffu, !masked && sm.m[0] != kNegInf && sm.m[1] != kNegInf)) {
              bad =
                  spec_softmax_fp8<kN>(s, ssc, sm.m, p.lazy_rescale != 0 ? kLazyRescaleLog2 : 0.f);
              exact = false;
            }
            if (warpgroup_any(bad, 3 + g)) {  // rare: recompute S, then the exact step
              ++tl_bad;
              compute_s(stage);
              exact = true;
            }
          }
          if (kHalfSoftmax && exact && half) {
            softmax_half(nb);
          } else if (exact) {
            softmax(nb);
          } else {
            corr[0] = corr[1] = 1.f;
          }
          pack();
        }
        rescale_o_if_needed<kPvN>(o, corr, p.lazy_rescale);
        fp8_stamp(p, round, g, blk, 3, who);
        wait_vt(it_c);
        fence_regs(o);
        fp8_stamp(p, round, g, blk, 4, who);
        if constexpr (kPromote != 0) {  // both chunks in flight, chunk 0 added under chunk 1
          issue_pv0(stage);
          issue_pv1(stage);
          wgmma_wait<1>();
          add_pv0();
          fp8_stamp(p, round, g, blk, 5, who);
          wgmma_wait<0>();
          add_pv1();
        } else {
          wgmma_fence();
          issue_pv(stage);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(o);
        }
        fp8_stamp(p, round, g, blk, 6, who);
        mbar_arrive(fp8_bar(bars, stage, 3));
      }
      it = it_c;
      fp8_stamp(p, round, g, 5, 7, who);  // the key-block loop's end
    } else {
      int it_c = it;
      int nb = t.n_blocks - 1;
      wait_k(it_c, nb);
      turn_wait();
      wgmma_fence();
      issue_qk(it_c % Tr::kStages);
      wgmma_commit();
      turn_pass();
      wgmma_wait<0>();
      fence_regs(s);
      if constexpr (kCap) softcap_s_fp8<kN / 2>(s, rsc, p.logit_cap * cuda::kLog2e);
      softmax(nb);
      pack();
      for (--nb; nb >= t.nb_begin; --nb) {
        const int it_n = it_c + 1;
        const int stage_c = it_c % Tr::kStages, stage_n = it_n % Tr::kStages;
        wait_k(it_n, nb);
        wait_vt(it_c);
        fence_regs(o);
        if constexpr (kPromote != 0) {
          if constexpr (!late) issue_pv0(stage_c);  // runs while this warpgroup waits for its turn
        }
        turn_wait();
        wgmma_fence();
        issue_qk(stage_n);
        wgmma_commit();
        if constexpr (kPromote == 0) {
          issue_pv(stage_c);
          wgmma_commit();
        } else if constexpr (late) {
          issue_pv0(stage_c);  // behind S(next), in flight during the softmax
        }
        turn_pass();
        if constexpr (kPromote != 0) {
          if constexpr (late) {
            wgmma_wait<1>();  // S(next) ready; chunk 0 still in flight
            fence_regs(s);
          } else {
            wgmma_wait<0>();  // S(next) and chunk 0 ready
            fence_regs(s);
            add_pv0();
            issue_pv1(stage_c);  // in flight during the softmax
          }
        } else {
          wgmma_wait<1>();  // S(next) ready; P(cur) V still in flight
          fence_regs(s);
        }
        if constexpr (kCap) softcap_s_fp8<kN / 2>(s, rsc, p.logit_cap * cuda::kLog2e);
        if constexpr (kSpec) {
          const int n0 = nb * kN;
          bool masked = n0 + kN > t.kv_len || (p.causal && n0 + kN - 1 > t.causal_limit + g * 64);
          if constexpr (kWindow) masked = masked || window_masks_block<kN>(p, t, n0, g);
          bool exact = true, bad = false;
          if (__all_sync(0xffffffffu, !masked && sm.m[0] != kNegInf && sm.m[1] != kNegInf)) {
            bad = spec_softmax_fp8<kN>(s, ssc, sm.m, p.lazy_rescale != 0 ? kLazyRescaleLog2 : 0.f);
            exact = false;
          }
          if (warpgroup_any(bad, 3 + g)) {  // rare: recompute S(next), then the exact step
            compute_s(stage_n);
            exact = true;
          }
          if (exact) {
            softmax(nb);
          } else {
            corr[0] = corr[1] = 1.f;
          }
        } else {
          softmax(nb);
        }
        wgmma_wait<0>();
        retire_pv(stage_c, std::bool_constant<late>{});  // late: chunk 1 after the softmax, exposed
        pack();
        rescale_o_if_needed<kPvN>(o, corr, p.lazy_rescale);
        it_c = it_n;
      }
      const int stage_c = it_c % Tr::kStages;
      wait_vt(it_c);
      fence_regs(o);
      turn_wait();
      if constexpr (kPromote != 0) {
        issue_pv0(stage_c);
      } else {
        wgmma_fence();
        issue_pv(stage_c);
        wgmma_commit();
      }
      if (g == 0 || !last_unit) turn_pass();
      wgmma_wait<0>();
      retire_pv(stage_c, std::true_type{});
      it = it_c + 1;
    }

    // Epilogue: O * v_scale / l, natural-log LSE (the exp2-domain maximum includes every scale).
    if constexpr (kGemmSum) {
      // Row sums from the GEMM (every column 128..135 holds the whole row's sum; store_o_tile adds
      // the 4 lanes of a quad, hence / 4, exact).
      sm.l[0] = o[kD / 2] * 0.25f;
      sm.l[1] = o[kD / 2 + 2] * 0.25f;
    }
    if constexpr (kWindow) {  // the variant runs whole units (no tail split: the engine's rule)
      float(&o_w)[kD / 2] = *reinterpret_cast<float(*)[kD / 2]>(&o[0]);
      if (p.sinks != nullptr) add_sink<kD>(o_w, sm.m, sm.l, p.sinks[t.head] * cuda::kLog2e);
    }
    const float(&o_d)[kD / 2] = *reinterpret_cast<const float(*)[kD / 2]>(&o[0]);
    const int piece = split_piece(p, unit, units);
    const int wrow0 = t.m0 + g * 64;  // this warpgroup's first row (request token)
    if (kWG == 3 && piece < 0 && p.o_tma != 0 && wrow0 >= 0 && wrow0 + 64 <= t.q_len &&
        (p.diag & 16) == 0) {
      store_o_tile_tma<Tr>(p, t, o_d, sm.m, sm.l, p.v_scale, smem, g, tid, wrow0);
    } else if (piece < 0) {
      store_o_tile<Tr::kHeadDim, true>(p, t, o_d, sm.m, sm.l, p.v_scale, row0, lane);
    } else {
      store_o_piece<Tr::kHeadDim>(p, t, piece, o_d, sm.m, sm.l, p.v_scale, row0, lane);
    }
    fp8_stamp(p, round, g, 2, 7, who);
    fp8_stamp(p, round, g, 4, 7, who, tl_bad);
  }
  // Fa3Params::o_tma: the last O boxes complete before the CTA (and its shared memory) goes.
  if constexpr (kWG == 3) {
    if (tid == 0) sm90::bulk_wait<0>();
  }
}

// grid: (min(work units, SMs)) persistent; block: producer warpgroup + kWG (2 or 3) consumers.
// kUniformWg: see warpgroup_index (prefill_sm90.cuh). kQIn: the q it takes (kQInEither: bf16 or
// e4m3 by Fa3Params::q_fp8; the three-warpgroup kernels come in one of each, kQInBf16 / kQInE4m3,
// as the run-time choice there cost the bf16-q kernel 0.5-3.5%: H200, 2026-11-28 01:10Z).
template <bool kUniformWg = true, bool kGemmSum = true, bool kVtPre = false, bool kSpec = false,
          int kN = 128, int kPromote = 0, int kWG = 2, int kQIn = kQInEither, int kVariant = kPlain>
__global__ void __launch_bounds__(PrefillFp8Traits<kN, kWG, kVariant>::kThreads, 1)
    prefill_sm90_fp8_kernel(const __grid_constant__ Fa3Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = PrefillFp8Traits<kN, kWG, kVariant>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + smem_align_pad<Tr>(smem_raw);
  const uint32_t bars = sm90::smem_addr(smem) + Tr::kBarOffset;
  if (threadIdx.x == 0) {
    sm90::mbar_init(bars, 129);  // q_full: producer threads + thread 0's TileInfo arrival
    sm90::mbar_init(bars + 8, 128 * Tr::kConsumerWarpgroups);  // q_empty: consumer threads
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbar_init(fp8_bar(bars, s, 0), 128);                            // k_full
      sm90::mbar_init(fp8_bar(bars, s, 1), 128);                            // v_full
      sm90::mbar_init(fp8_bar(bars, s, 2), 128);                            // vt_full
      sm90::mbar_init(fp8_bar(bars, s, 3), 128 * Tr::kConsumerWarpgroups);  // empty
    }
    sm90::mbar_init_fence();
  }
  // The ones rows of every V^T stage (rows 128..135; one 1024-byte swizzle atom of equal bytes).
  for (int i = threadIdx.x; i < Tr::kStages * Tr::kVtHalves * 128; i += Tr::kThreads) {
    *reinterpret_cast<uint2*>(smem + Tr::kVtOffset + (i / 128) * Tr::kVtHalfBytes +
                              Tr::kHeadDim * 128 + (i % 128) * 8) =
        make_uint2(0x38383838u, 0x38383838u);  // e4m3 1.0
  }
  sm90::fence_proxy_async();
  __syncthreads();
  const int wg = warpgroup_index<kUniformWg>();
  using Regs = Fp8RegSplit<kN, kVtPre, kPromote != 0, kWG>;
  if (wg == 0) {
    sm90::setmaxnreg_dec<Regs::kProducer>();
    // A partitioned forward's overlap (Fa3Params::trigger_dependents): the decode tiles' grid may
    // launch once every CTA of this one is resident (backend/small_extend.h). The first
    // launch_dependents of any thread counts for the CTA (PTX ISA), so the producer's is enough.
    // Here, not before the warpgroup split: there it made ptxas serialise the consumers' wgmma in
    // the promoted e4m3-q kernel and two soft-cap ones (C7511; causal 4k-16k e4m3 q 8-13% slower,
    // H200 2026-12-02, docs/PERF.md "Session 78").
    if (p.trigger_dependents != 0) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    producer_fp8<kVtPre, kN, kWG, kQIn, kVariant>(p, smem);
  } else {
    sm90::setmaxnreg_inc<Regs::kConsumer>();
    consumer_fp8<kGemmSum, kSpec, kN, kPromote, kWG, kQIn, kVariant>(p, smem, wg - 1);
  }
#endif
}

// ---- V^T pre-transpose (Fa3Params::vt_pre) ----

// grid (V^T blocks of kN keys of the longest request, bs, kv heads), block 128: for each 128-key
// half h of block nb of request blockIdx.y and kv head blockIdx.z, V keys nb kN + 128 h .. + 127
// (through the page table; keys past kv_len or past the block zero) -> its V^T stage image
// (fp8_transpose_v: the bytes the attention producer would write into shared memory) at unit
// vt_block + nb kVtHalves + h of 16 KB of vt_ws + kvh * vt_head_stride (vt_block: plan request
// word 3), so that the attention kernel copies each half with one bulk copy. One read and one
// write of V per forward and layer.
template <int kN>
__global__ void __launch_bounds__(128) fp8_vt_pre_kernel(const __grid_constant__ Fa3Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = PrefillFp8Traits<kN>;
  __shared__ __align__(1024) uint8_t sv[Tr::kVtUnitBytes];
  __shared__ __align__(1024) uint8_t svt[Tr::kVtUnitBytes];
  const int nb = blockIdx.x, r = blockIdx.y, kvh = blockIdx.z, tid = threadIdx.x;
  const int32_t* rw = p.plan + kPlanHeaderWords + r * kRequestWords;
  const int kv_len = rw[2];
  // Requests without new tokens have no tiles and no V^T units in the plan (build_tile_plan).
  if (rw[1] == 0 || nb * kN >= kv_len) return;
  const int key_end = min(kv_len, (nb + 1) * kN);
  const int32_t* pt = page_table_row(p, r);
  const char* v_base =
      static_cast<const char*>(p.v_pool) + static_cast<int64_t>(kvh) * p.v_stride_head;
  constexpr int C = Tr::kChunksPerRow;  // 16-byte chunks per 128-byte row
  constexpr int kPasses = kVtBlockKeys * C / 128;
#pragma unroll 1
  for (int h = 0; h < Tr::kVtHalves; ++h) {
    const int key0 = nb * kN + h * kVtBlockKeys;
    uint4 w[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int idx = i * 128 + tid, row = idx / C, chunk = idx % C;
      const int key = key0 + row;
      w[i] = make_uint4(0u, 0u, 0u, 0u);
      if (key < key_end) {
        const int in_page = key % p.page_size;
        const int64_t slot = pt[key - in_page] + in_page;
        w[i] = *reinterpret_cast<const uint4*>(v_base + slot * p.v_stride_row + chunk * 16);
      }
    }
    if (h > 0) __syncthreads();  // the previous half's svt is written out
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int idx = i * 128 + tid, row = idx / C, chunk = idx % C;
      *reinterpret_cast<uint4*>(sv + row * 128 + ((chunk ^ (row & 7)) << 4)) = w[i];
    }
    __syncthreads();
    fp8_transpose_v(sv, svt, tid);
    __syncthreads();
    uint8_t* dst = p.vt_ws + kvh * p.vt_head_stride +
                   static_cast<int64_t>(rw[3] + nb * Tr::kVtHalves + h) * Tr::kVtUnitBytes;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int idx = i * 128 + tid;
      reinterpret_cast<uint4*>(dst)[idx] = reinterpret_cast<const uint4*>(svt)[idx];
    }
  }
#endif
}

}  // namespace attnkit::fa3
