// The shared tensor-core MLA decode kernel (mma.sync m16n8k16, bf16 inputs, f32 accumulation):
// query heads packed into the MMA M dimension, the latent K/V tile of kBlockN keys loaded once
// into shared memory with cp.async (double-buffered) through a paged loader whose page size is a
// template parameter, QK^T over the 576-wide row and P.V over its first 512 columns, split-KV over
// the tile schedule (mla_tile_scheduler.h) with partial outputs merged by mla_combine_kernel.
//
// Tile: kRows = 16 * kWarpsM query rows x kBlockN keys, 8 warps as kWarpsM x kWarpsN. Warp
// (wm, wn) computes S for rows [16 wm, 16 wm + 16) x keys [wn * kSKeys, ...), the row maxima are
// exchanged through shared memory, P (bf16) goes to shared memory, and the same warp accumulates
// O for its 16 rows x kOCols output columns [wn * kOCols, ...) over all kBlockN keys.
//   kWarpsM 4: 64 rows (32+ heads x s_q), S 16x32, O 16x256 per warp (128 f32 registers)
//   kWarpsM 2: 32 rows, S 16x16, O 16x128;  kWarpsM 1: 16 rows (<= 16 heads), S 16x8, O 16x64.
// fp8_e4m3 cache: the stage holds the raw bytes; each tile is converted to a bf16 tile in shared
// memory once (exact), k_scale is folded into the softmax scale and v_scale into the output;
// 16-row tiles convert inside S instead, by default to f16 (MlaDecodeTraits::kF16).
//
// Shared memory (kWarpsM 4): Q 72 KiB + 2 stages x 72 KiB (fp8: 2 x 36 KiB + a 72 KiB bf16 tile)
// + P 8 KiB + 0.5 KiB row reductions = 224.5 KiB: needs the 227 KiB opt-in of SM90 (an A100's
// 163 KiB is not enough; the engine checks the device's opt-in limit).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "backends/mla/kernels/mla_decode_common.cuh"
#include "backends/mla/kernels/mla_decode_params.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::mla {

template <int kWarpsM_, int kPage_, bool kFp8_, bool kF16_ = false, bool kPtSmem_ = false>
struct MlaDecodeTraits {
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kPage = kPage_;
  static constexpr bool kFp8 = kFp8_;
  // fp8 with 16-row tiles only: the tensor-core inputs are f16 instead of bf16 (e4m3 -> f16 is one
  // cvt per pair, e4m3 -> bf16 four); Q is scaled by 2^-kQShiftF16 into f16 (range), P and V are
  // f16 (P in [0, 1], V exact).
  static constexpr bool kF16 = kF16_;
  // Page-table entries through shared memory (16-row tiles; the default at page 64, else
  // ATTNKIT_MLA_MMA_PREFETCH=smem): the entry of a tile's key is copied by a 4-byte cp.async 2
  // (kStages - 1) tiles before its K/V refill, in the commit group that the refill's iteration has
  // already waited for, into a ring of kStages x kBlockN entries; the refill reads it from shared
  // memory. No register holds a pending global load (the register prefetch of mma_prefetch 1 is
  // consumed right after the cp.async burst and waits behind it: -13..-17% on 16-row bf16 tiles).
  static constexpr bool kPtSmem = kPtSmem_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kRows = 16 * kWarpsM;
  static constexpr int kSKeys = kBlockN / kWarpsN;  // S columns per warp
  static constexpr int kSTiles = kSKeys / 8;
  static constexpr int kOCols = kLatentDim / kWarpsN;  // output columns per warp
  static constexpr int kOTiles = kOCols / 8;
  static constexpr int kChunks = kRowDim * 2 / 16;   // 16-byte chunks of a bf16 row (72)
  static constexpr int kFp8Chunks = kRowDim / 16;    // of an fp8 row (36)
  static constexpr int kPChunks = kBlockN * 2 / 16;  // of a P row (8)
  static constexpr int kKSteps = kRowDim / 16;       // QK^T k-steps (36)
  static constexpr int kTileBytes = kBlockN * kRowDim * 2;
  static constexpr int kStageBytes = kFp8 ? kBlockN * kRowDim : kTileBytes;
  // 16-row tiles (<= 16 heads, memory-bound) keep Q in registers (36 A fragments, 144 registers
  // per thread): Q is staged through the last pipeline stage once per segment, which frees its
  // 18 KiB for one more stage of KV in flight.
  static constexpr bool kQInRegs = kWarpsM == 1;
  // cp.async stages (tiles in flight + 1): bf16 2 (3 with Q in registers); an fp8 stage is half
  // as big: 4 / 3 / 2 for 16 / 32 / 64 rows.
  static constexpr int kStages =
      kFp8 ? (kQInRegs ? 4 : (kWarpsM == 2 ? 3 : 2)) : (kQInRegs ? 3 : 2);
  static constexpr int kQBytes = kQInRegs ? 0 : kRows * kRowDim * 2;  // dedicated Q tile
  static constexpr int kPBytes = kRows * kBlockN * 2;
  static constexpr int kRedBytes = kWarpsN * kRows * 4;
  static constexpr int kQOffset = 0;
  static constexpr int kStageOffset = kQOffset + kQBytes;
  static constexpr int kConvOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kPOffset = kConvOffset + (kFp8 ? kTileBytes : 0);
  static constexpr int kRedOffset = kPOffset + kPBytes;
  static constexpr int kPtOffset = kRedOffset + kRedBytes;
  static constexpr int kPtBytes = kPtSmem ? kStages * kBlockN * 4 : 0;
  static constexpr int kSmemBytes = kPtOffset + kPtBytes;
  // The loader's thread mapping: thread t loads key t / kThreadsPerKey, chunks t % kThreadsPerKey
  // + kThreadsPerKey * i, so each thread looks its slot up once per tile.
  static constexpr int kThreadsPerKey = kThreads / kBlockN;

  static_assert(kWarpsM == 1 || kWarpsM == 2 || kWarpsM == 4, "8 warps as kWarpsM x kWarpsN");
  static_assert(!kF16 || (kFp8 && kWarpsM == 1), "f16 inputs: the fused fp8 16-row path only");
  static_assert(!kPtSmem || kWarpsM == 1, "page-table ring: 16-row tiles only");
  static_assert(kSmemBytes <= 227 * 1024, "SM90 opt-in shared memory per block");
  static_assert(kSTiles >= 1 && kOTiles % 2 == 0, "S and O tiles are whole mma tiles");
  static_assert(kPage == 1 || kPage % kBlockN == 0, "a tile never straddles a page boundary");
  static_assert(kChunks % 8 == 0 && kPChunks == 8, "the XOR swizzle stays inside a row");
  static_assert(kThreads % kBlockN == 0 && kChunks % kThreadsPerKey == 0 &&
                    kFp8Chunks % kThreadsPerKey == 0,
                "loader mapping");
};

// Byte offset of 16-byte chunk c of row r in a swizzled tile of kRowChunks chunks per row: the
// chunk index is XORed with r % 8 so that ldmatrix's 8 row addresses hit 8 different bank groups.
template <int kRowChunks>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>((r * kRowChunks + (c ^ (r & 7))) * 16);
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
// With a compile-time byte offset folded into the instruction (no address register per offset).
template <int kOffset>
__device__ __forceinline__ void ldmatrix_x2_at(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2+%3];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr), "n"(kOffset));
}
template <int kOffset>
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4+%5];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr), "n"(kOffset));
}

// f.template operator()<i>() for i in [0, kN), unrolled at compile time.
template <int kN, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  [&]<int... kI>(std::integer_sequence<int, kI...>) { (f.template operator()<kI>(), ...); }
  (std::make_integer_sequence<int, kN>{});
}

// Lane addresses of a swizzled [rows][72 chunks] tile for the k-steps of one 64-row-chunk group:
// chunk 2 kk + c of row r sits at r * 1152 + (kk / 4) * 128 + ((2 (kk % 4) + c) ^ (r % 8)) * 16,
// so 4 base registers (kk % 4) plus an immediate (kk / 4) * 128 address every k-step.
__device__ __forceinline__ void kstep_bases(uint32_t (&base)[4], uint32_t tile, int row, int c) {
  constexpr int kRowBytes = kRowDim * 2;
#pragma unroll
  for (int k4 = 0; k4 < 4; ++k4) {
    base[k4] = tile + row * kRowBytes + (((2 * k4 + c) ^ (row & 7)) * 16);
  }
}

template <typename Traits>
struct MlaDecodeCta {
  using T = Traits;
  const MlaDecodeParams& p;
  uint8_t* smem;
  int tid, lane, wm, wn;
  // fp8 with 16-row tiles: S reads the fp8 stage directly (see run_segment).
  static constexpr bool kFusedFp8 = T::kFp8 && T::kWarpsM == 1;
  using MmaT = std::conditional_t<T::kF16, __half, __nv_bfloat16>;  // tensor-core input type

  __device__ uint32_t q_base() const {
    if constexpr (T::kQInRegs) {
      static_assert(T::kStageBytes >= T::kRows * kRowDim * 2, "Q fits a stage");
      return cuda::smem_addr(smem + T::kStageOffset + (T::kStages - 1) * T::kStageBytes);
    }
    return cuda::smem_addr(smem + T::kQOffset);
  }
  __device__ uint32_t stage_base(int s) const {
    return cuda::smem_addr(smem + T::kStageOffset + s * T::kStageBytes);
  }

  // Q rows [row0, row0 + kRows) of request b into shared memory (padding rows zero-filled).
  __device__ void load_q(int b, int row0) const {
    const auto* q = static_cast<const uint8_t*>(p.q);
    for (int idx = tid; idx < T::kRows * T::kChunks; idx += T::kThreads) {
      const int r = idx / T::kChunks, c = idx % T::kChunks;
      const uint8_t* src = q_chunk_src(p, b, row0 + r, c);
      cuda::cp_async_16(q_base() + swz<T::kChunks>(r, c), src ? src : q, src ? 16 : 0);
    }
  }

  // Keys [tile * kBlockN, +kBlockN) of the request whose token row is `tok` into stage s; keys at
  // or past kv_len are zero-filled (never read: the pool's unused slots may hold NaN).
  __device__ void load_tile(const int32_t* tok, int kv_len, int tile, int s) const {
    load_tile_at(tile_slot(tok, kv_len, tile), s);
  }
  // Pool slot of this thread's key of `tile`, or -1 where the key is at or past kv_len. Split
  // from load_tile so that the page-table read of a tile can be issued one iteration before its
  // cp.async (run_segment, MlaDecodeParams::mma_prefetch): otherwise every tile's loads wait for
  // an L2 round trip at the top of the iteration, on all 8 warps' critical path.
  __device__ int64_t tile_slot(const int32_t* tok, int kv_len, int tile) const {
    const int j = tile * kBlockN + tid / T::kThreadsPerKey;
    return j < kv_len ? kv_slot<T::kPage>(tok, j) : int64_t{-1};
  }
  // kPtSmem: copy this thread's key's page-table entry of `tile` into ring slot r (one thread per
  // key; nothing for keys at or past kv_len, which load_tile_pt zero-fills without reading it).
  __device__ void copy_pt(const int32_t* tok, int kv_len, int tile, int r) const {
    if (tid % T::kThreadsPerKey != 0) return;
    const int key = tid / T::kThreadsPerKey;
    const int j = tile * kBlockN + key;
    if (j >= kv_len) return;
    const uint32_t dst = cuda::smem_addr(smem + T::kPtOffset) + (r * kBlockN + key) * 4;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst),
                 "l"(tok + (j - j % T::kPage)));
  }
  // kPtSmem: the K/V refill of `tile` with the entry copied into ring slot r.
  __device__ void load_tile_pt(int kv_len, int tile, int r, int s) const {
    const int key = tid / T::kThreadsPerKey;
    const int j = tile * kBlockN + key;
    int64_t slot = -1;
    if (j < kv_len) {
      const auto* pt = reinterpret_cast<const int32_t*>(smem + T::kPtOffset);
      slot = static_cast<int64_t>(pt[r * kBlockN + key]) + j % T::kPage;
    }
    load_tile_at(slot, s);
  }
  __device__ void load_tile_at(int64_t slot_or_neg, int s) const {
    const int key = tid / T::kThreadsPerKey;
    const bool valid = slot_or_neg >= 0;
    const int64_t slot = valid ? slot_or_neg : 0;
    constexpr int kElemBytes = T::kFp8 ? 1 : 2;
    const auto* row = static_cast<const uint8_t*>(p.kv) + slot * p.kv_stride_row * kElemBytes;
    const int src_bytes = valid ? 16 : 0;
    const uint32_t base = stage_base(s);
    if constexpr (T::kFp8) {
#pragma unroll
      for (int i = 0; i < T::kFp8Chunks / T::kThreadsPerKey; ++i) {
        const int c = tid % T::kThreadsPerKey + T::kThreadsPerKey * i;
        cuda::cp_async_16(base + (key * T::kFp8Chunks + c) * 16, row + c * 16, src_bytes);
      }
    } else {
#pragma unroll
      for (int i = 0; i < T::kChunks / T::kThreadsPerKey; ++i) {
        const int c = tid % T::kThreadsPerKey + T::kThreadsPerKey * i;
        cuda::cp_async_16(base + swz<T::kChunks>(key, c), row + c * 16, src_bytes);
      }
    }
  }

  // fp8 stage s -> the swizzled bf16 tile (exact: every e4m3 value is a bf16 value); 32/64-row
  // tiles (16-row tiles convert inside S, see run_segment).
  __device__ void convert_tile(int s) const {
    const uint8_t* src = smem + T::kStageOffset + s * T::kStageBytes;
    uint8_t* dst = smem + T::kConvOffset;
    // Fixed trip count, in batches of 3 rounds whose shared loads are issued together.
    static_assert(kBlockN * T::kFp8Chunks % (3 * T::kThreads) == 0, "whole conversion batches");
    constexpr int kRounds = kBlockN * T::kFp8Chunks / T::kThreads;  // 9
#pragma unroll 1
    for (int i0 = 0; i0 < kRounds; i0 += 3) {
      uint4 raws[3];
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        raws[i] = *reinterpret_cast<const uint4*>(src + (tid + (i0 + i) * T::kThreads) * 16);
      }
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const int idx = tid + (i0 + i) * T::kThreads;
        const int key = idx / T::kFp8Chunks, c = idx % T::kFp8Chunks;
        const uint4 raw = raws[i];
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t outw[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
          for (int hlf = 0; hlf < 2; ++hlf) {
            const __nv_fp8x2_storage_t pair =
                static_cast<__nv_fp8x2_storage_t>((words[w] >> (16 * hlf)) & 0xffffu);
            const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
            outw[w * 2 + hlf] = cuda::pack2<__nv_bfloat16>(f.x, f.y);
          }
        }
        *reinterpret_cast<uint4*>(dst + swz<T::kChunks>(key, 2 * c)) =
            make_uint4(outw[0], outw[1], outw[2], outw[3]);
        *reinterpret_cast<uint4*>(dst + swz<T::kChunks>(key, 2 * c + 1)) =
            make_uint4(outw[4], outw[5], outw[6], outw[7]);
      }
    }
  }

  // One request segment: tiles [t0, t1) of request b, query rows [row0, row0 + kRows).
  __device__ void run_segment(int b, int kv_len, int row0, int t0, int t1, bool whole,
                              int partial) {
    const int32_t* tok =
        p.req_to_token + static_cast<int64_t>(p.req_pool_indices[b]) * p.req_to_token_stride;
    __syncthreads();  // the previous segment's readers are done with Q, the stages and P
    load_q(b, row0);
    // Prologue: tiles t0 .. t0 + kStages - 2 in flight (one commit group each, Q with the first).
#pragma unroll
    for (int i = 0; i < T::kStages - 1; ++i) {
      if (t0 + i < t1) load_tile(tok, kv_len, t0 + i, i);
      if constexpr (T::kPtSmem) {  // entries of the refills of iterations t0 .. t0 + kStages - 2
        const int x = t0 + i + T::kStages - 1;
        if (x < t1) copy_pt(tok, kv_len, x, (x - t0) % T::kStages);
      }
      cuda::cp_async_commit();
    }
    // Page-table prefetch: the slot of the tile the next refill loads (see tile_slot).
    // (resolved per tile size by launch_rows; kPtSmem has its own path)
    const bool prefetch = !T::kPtSmem && p.mma_prefetch != 0;
    int64_t next_slot = prefetch ? tile_slot(tok, kv_len, t0 + T::kStages - 1) : 0;
    // Timing diagnostic (wrong results): no K loads after the prologue.
    const bool noload = p.wgmma_diag == 1;

    // Rows of this thread: r_lo = 16 wm + lane / 4 and r_lo + 8; their key limits.
    const int r_lo = 16 * wm + lane / 4;
    int limit[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int m = row0 + r_lo + 8 * x;
      const int i = m < p.rows_per_req ? m / p.num_heads : p.s_q - 1;
      limit[x] = kv_len - (p.s_q - 1 - i);
    }

    float o[T::kOTiles][4];
#pragma unroll
    for (int t = 0; t < T::kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
    float row_max[2] = {cuda::kNoKeyMax, cuda::kNoKeyMax};
    float row_sum[2] = {0.f, 0.f};                               // over this warp's S columns only
    auto* red = reinterpret_cast<float*>(smem + T::kRedOffset);  // [kWarpsN][kRows]
    const uint32_t p_base = cuda::smem_addr(smem + T::kPOffset);
    const int a_row = 16 * wm + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int a_chunk = lane >> 4;
    uint32_t qf[T::kQInRegs ? T::kKSteps : 1][4];

    for (int tile = t0; tile < t1; ++tile) {
      const int s = (tile - t0) % T::kStages;
      cuda::cp_async_wait<T::kStages - 2>();
      __syncthreads();  // tile landed for everyone; the stage of tile - 1 is free
      if constexpr (T::kQInRegs) {
        if (tile == t0) {  // Q (staged in the last stage with the first group) -> registers
          if constexpr (kFusedFp8) {
            // Permuted k order (see the fused S below): k-step kK = 4 G + j, lane quad q holds
            // dims 64 G + 16 q + 4 j + {0, 1} (logical k 2q, 2q+1) and + {2, 3} (2q+8, 2q+9).
            const uint8_t* qs = smem + (q_base() - cuda::smem_addr(smem));
            const int g = lane / 4, q4 = lane & 3;
            static_for<T::kKSteps>([&]<int kK>() {
              constexpr int kG = kK / 4, kJ = kK % 4;
              const int chunk = 8 * kG + 2 * q4 + kJ / 2;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const uint2 v = *reinterpret_cast<const uint2*>(
                    qs + swz<T::kChunks>(16 * wm + g + 8 * h, chunk) + (kJ % 2) * 8);
                if constexpr (T::kF16) {
                  qf[kK][h] = bf16x2_to_scaled_f16x2(v.x);
                  qf[kK][2 + h] = bf16x2_to_scaled_f16x2(v.y);
                } else {
                  qf[kK][h] = v.x;
                  qf[kK][2 + h] = v.y;
                }
              }
            });
          } else {
            uint32_t qb[4];
            kstep_bases(qb, q_base(), a_row, a_chunk);
            static_for<T::kKSteps>(
                [&]<int kK>() { ldmatrix_x4_at<(kK / 4) * 128>(qf[kK], qb[kK % 4]); });
          }
          __syncthreads();  // the staging stage is free for tile t0 + kStages - 1
        }
      }
      const int next = tile + T::kStages - 1;
      if (next < t1 && !noload) {
        if constexpr (T::kPtSmem) {
          load_tile_pt(kv_len, next, (next - t0) % T::kStages, (next - t0) % T::kStages);
          const int x = next + T::kStages - 1;  // its slot was read in iteration tile - 1
          if (x < t1) copy_pt(tok, kv_len, x, (x - t0) % T::kStages);
        } else if (prefetch) {
          load_tile_at(next_slot, (next - t0) % T::kStages);
          next_slot = tile_slot(tok, kv_len, next + 1);  // used one iteration later
        } else {
          load_tile(tok, kv_len, next, (next - t0) % T::kStages);
        }
      }
      cuda::cp_async_commit();
      uint32_t kv_base = stage_base(s);
      if constexpr (T::kFp8) {
        if constexpr (!kFusedFp8) {  // (16-row tiles convert inside S)
          convert_tile(s);
          __syncthreads();
        }
        kv_base = cuda::smem_addr(smem + T::kConvOffset);
      }

      // ---- S = Q K^T for rows [16 wm, +16) x keys [wn * kSKeys, +kSKeys) ----
      float acc[T::kSTiles][4];
#pragma unroll
      for (int t = 0; t < T::kSTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
      if constexpr (kFusedFp8) {
        // fp8, 16 rows: lane (g = lane / 4, q = lane % 4) reads 16 e4m3 values of key
        // wn * 8 + g, dims 64 G + 16 q + [0, 16), per 64-dim group G; converted in registers they
        // are the B fragments of k-steps 4 G .. 4 G + 3 in the permuted k order Q was loaded in,
        // and (dims < 512) the bf16 V tile, which P V reads after the "P complete" barrier. No
        // separate conversion pass, no barrier after it, no K ldmatrix.
        const int key = wn * T::kSKeys + lane / 4, q4 = lane & 3;
        const uint32_t ksrc = stage_base(s) + key * T::kFp8Chunks * 16 + 16 * q4;
        uint8_t* v0 = smem + T::kConvOffset + swz<T::kChunks>(key, 2 * q4);
        uint8_t* v1 = smem + T::kConvOffset + swz<T::kChunks>(key, 2 * q4 + 1);
        float part[3][4] = {};
        static_for<kRowDim / 64>([&]<int kG>() {
          // volatile: kept after the previous group's mma (hoisting all 9 loads spills).
          uint32_t words[4];
          asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4+%5];\n"
                       : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                       : "r"(ksrc), "n"(64 * kG));
          uint32_t w[8];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if constexpr (T::kF16) {
              fp8x4_to_f16x4(words[j], w[2 * j], w[2 * j + 1]);
            } else {
              fp8x4_to_bf16x4(words[j], w[2 * j], w[2 * j + 1]);
            }
          }
          if constexpr (kG < kLatentDim / 64) {
            // chunk 8 G + c of a row: (8 G + c) ^ (key % 8) = 8 G + (c ^ (key % 8)) for c < 8
            *reinterpret_cast<uint4*>(v0 + 128 * kG) = make_uint4(w[0], w[1], w[2], w[3]);
            *reinterpret_cast<uint4*>(v1 + 128 * kG) = make_uint4(w[4], w[5], w[6], w[7]);
          }
          static_for<4>([&]<int kJ>() {
            constexpr int kK = 4 * kG + kJ;
            const uint32_t bf[2] = {w[2 * kJ], w[2 * kJ + 1]};
            if constexpr (kJ == 0) {
              cuda::mma_m16n8k16<MmaT>(acc[0], qf[kK], bf);
            } else {
              cuda::mma_m16n8k16<MmaT>(part[kJ - 1], qf[kK], bf);
            }
          });
        });
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][e] += (part[0][e] + part[1][e]) + part[2][e];
      } else if constexpr (T::kQInRegs) {
        static_assert(T::kSTiles == 1, "16-row tiles: 8 keys per warp");
        uint32_t kb[4];
        kstep_bases(kb, kv_base, wn * T::kSKeys + (lane & 7), (lane >> 3) & 1);
        // Four independent accumulator chains (k-step % 4), summed after: one chain of 36
        // dependent mma.sync would put 36 mma latencies on every tile's critical path (8 warps
        // per SM hide little of it).
        float part[3][4] = {};
        static_for<T::kKSteps>([&]<int kK>() {
          uint32_t bf[2];
          ldmatrix_x2_at<(kK / 4) * 128>(bf, kb[kK % 4]);
          if constexpr (kK % 4 == 0) {
            cuda::mma_m16n8k16<__nv_bfloat16>(acc[0], qf[kK], bf);
          } else {
            cuda::mma_m16n8k16<__nv_bfloat16>(part[kK % 4 - 1], qf[kK], bf);
          }
        });
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][e] += (part[0][e] + part[1][e]) + part[2][e];
      }
#pragma unroll 4
      for (int kk = 0; kk < (T::kQInRegs ? 0 : T::kKSteps); ++kk) {
        uint32_t a[4];
        cuda::ldmatrix_x4(a, q_base() + swz<T::kChunks>(a_row, 2 * kk + a_chunk));
        if constexpr (T::kSTiles == 1) {
          uint32_t bf[2];
          const int key = wn * T::kSKeys + (lane & 7);
          ldmatrix_x2(bf, kv_base + swz<T::kChunks>(key, 2 * kk + ((lane >> 3) & 1)));
          cuda::mma_m16n8k16<__nv_bfloat16>(acc[0], a, bf);
        } else {
#pragma unroll
          for (int t = 0; t < T::kSTiles; t += 2) {
            uint32_t bf[4];
            const int key = wn * T::kSKeys + t * 8 + (lane & 7) + 8 * (lane >> 4);
            cuda::ldmatrix_x4(bf, kv_base + swz<T::kChunks>(key, 2 * kk + ((lane >> 3) & 1)));
            const uint32_t b0[2] = {bf[0], bf[1]};
            const uint32_t b1[2] = {bf[2], bf[3]};
            cuda::mma_m16n8k16<__nv_bfloat16>(acc[t], a, b0);
            cuda::mma_m16n8k16<__nv_bfloat16>(acc[t + 1], a, b1);
          }
        }
      }

      // ---- mask, scale, tile row max across the kWarpsN warps sharing these rows ----
      float mx[2] = {-INFINITY, -INFINITY};
      const float scale_log2 = qk_scale_log2(p, T::kF16);
#pragma unroll
      for (int t = 0; t < T::kSTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e >> 1;
          const int j = tile * kBlockN + wn * T::kSKeys + t * 8 + 2 * (lane & 3) + (e & 1);
          acc[t][e] = j < limit[x] ? acc[t][e] * scale_log2 : -INFINITY;
          mx[x] = fmaxf(mx[x], acc[t][e]);
        }
      }
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
      }
      if ((lane & 3) == 0) {
        red[wn * T::kRows + r_lo] = mx[0];
        red[wn * T::kRows + r_lo + 8] = mx[1];
      }
      __syncthreads();
      float factor[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        float m_new = row_max[x];
#pragma unroll
        for (int w = 0; w < T::kWarpsN; ++w) m_new = fmaxf(m_new, red[w * T::kRows + r_lo + 8 * x]);
        factor[x] = exp2f(row_max[x] - m_new);
        row_max[x] = m_new;
        row_sum[x] *= factor[x];
      }

      // ---- P = exp2(S - m) (bf16, to shared memory); rescale O ----
#pragma unroll
      for (int t = 0; t < T::kSTiles; ++t) {
        const float p0 = exp2f(acc[t][0] - row_max[0]), p1 = exp2f(acc[t][1] - row_max[0]);
        const float p2 = exp2f(acc[t][2] - row_max[1]), p3 = exp2f(acc[t][3] - row_max[1]);
        row_sum[0] += p0 + p1;
        row_sum[1] += p2 + p3;
        const int chunk = (wn * T::kSKeys + t * 8) / 8;
        const uint32_t in_chunk = (lane & 3) * 4;
        uint8_t* pb = smem + T::kPOffset;
        *reinterpret_cast<uint32_t*>(pb + swz<T::kPChunks>(r_lo, chunk) + in_chunk) =
            cuda::pack2<MmaT>(p0, p1);
        *reinterpret_cast<uint32_t*>(pb + swz<T::kPChunks>(r_lo + 8, chunk) + in_chunk) =
            cuda::pack2<MmaT>(p2, p3);
      }
#pragma unroll
      for (int t = 0; t < T::kOTiles; ++t) {
        o[t][0] *= factor[0];
        o[t][1] *= factor[0];
        o[t][2] *= factor[1];
        o[t][3] *= factor[1];
      }
      __syncthreads();  // P complete

      // ---- O += P V: rows [16 wm, +16), columns [wn * kOCols, +kOCols), all kBlockN keys ----
      // V rows key = 16 kk + (lane & 7) + 8 ((lane >> 3) & 1) (key % 8 == lane % 8), chunk
      // wn * kOCols / 8 + t + (lane >> 4): 4 base registers (t % 8) plus immediates.
      uint32_t vb[4];
      {
        const int key = (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          vb[j] = kv_base + key * T::kChunks * 16 + wn * T::kOCols * 2 +
                  (((2 * j + (lane >> 4)) ^ (lane & 7)) * 16);
        }
      }
      static_for<kBlockN / 16>([&]<int kK>() {
        uint32_t a[4];
        cuda::ldmatrix_x4(a, p_base + swz<T::kPChunks>(a_row, 2 * kK + a_chunk));
        static_for<T::kOTiles / 2>([&]<int kT2>() {
          constexpr int kT = 2 * kT2;
          constexpr int kImm = kK * 16 * T::kChunks * 16 + (kT / 8) * 128;
          uint32_t bf[4];
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4+%5];\n"
                       : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3])
                       : "r"(vb[(kT % 8) / 2]), "n"(kImm));
          const uint32_t b0[2] = {bf[0], bf[1]};
          const uint32_t b1[2] = {bf[2], bf[3]};
          cuda::mma_m16n8k16<MmaT>(o[kT], a, b0);
          cuda::mma_m16n8k16<MmaT>(o[kT + 1], a, b1);
        });
      });
    }

    // ---- denominators: sum the kWarpsN partial row sums ----
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      row_sum[x] += __shfl_xor_sync(0xffffffffu, row_sum[x], 1);
      row_sum[x] += __shfl_xor_sync(0xffffffffu, row_sum[x], 2);
    }
    __syncthreads();  // everyone is done reading the row maxima
    if ((lane & 3) == 0) {
      red[wn * T::kRows + r_lo] = row_sum[0];
      red[wn * T::kRows + r_lo + 8] = row_sum[1];
    }
    __syncthreads();
    float denom[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      denom[x] = 0.f;
#pragma unroll
      for (int w = 0; w < T::kWarpsN; ++w) denom[x] += red[w * T::kRows + r_lo + 8 * x];
    }

    // ---- epilogue: the final output (whole request) or a normalised partial ----
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int m = row0 + r_lo + 8 * x;
      if (m >= p.rows_per_req) continue;
      const bool any = cuda::row_has_keys(denom[x]);
      const float inv = any ? 1.f / denom[x] : 0.f;
      const float lse2 = any ? row_max[x] + log2f(denom[x]) : -INFINITY;
      const int token = b * p.s_q + m / p.num_heads;
      const int h = m % p.num_heads;
      if (whole) {
        auto* dst = static_cast<__nv_bfloat16*>(p.out) + token * p.o_stride_token +
                    h * p.o_stride_head + wn * T::kOCols + 2 * (lane & 3);
        const float scale = inv * p.v_scale;
#pragma unroll
        for (int t = 0; t < T::kOTiles; ++t) {
          *reinterpret_cast<uint32_t*>(dst + t * 8) =
              cuda::pack2<__nv_bfloat16>(o[t][2 * x] * scale, o[t][2 * x + 1] * scale);
        }
        if (p.lse != nullptr && wn == 0 && (lane & 3) == 0) {
          p.lse[token * p.lse_stride_token + h] = any ? lse2 * cuda::kLn2 : -INFINITY;
        }
      } else {
        const int64_t prow = static_cast<int64_t>(partial) * p.rows_per_req + m;
        float* dst = p.partial_out + prow * kLatentDim + wn * T::kOCols + 2 * (lane & 3);
#pragma unroll
        for (int t = 0; t < T::kOTiles; ++t) {
          *reinterpret_cast<float2*>(dst + t * 8) =
              make_float2(o[t][2 * x] * inv, o[t][2 * x + 1] * inv);
        }
        if (wn == 0 && (lane & 3) == 0) p.partial_lse[prow] = lse2;
      }
    }
  }
};

// grid: (num_parts, ceil(rows_per_req / kRows)), or the two swapped with p.grid_rows_fastest
// (decode_grid; mla_part / mla_row_tile read either) block: (kThreads), dynamic smem kSmemBytes.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mla_decode_kernel(const __grid_constant__ MlaDecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x;
  MlaDecodeCta<Traits> cta{
      p, smem, tid, tid & 31, (tid >> 5) / Traits::kWarpsN, (tid >> 5) % Traits::kWarpsN};
  const int row0 = mla_row_tile(p) * Traits::kRows;
  for_each_segment(p, [&](int b, int kv_len, int t0, int t1, bool whole, int partial) {
    cta.run_segment(b, kv_len, row0, t0, t1, whole, partial);
  });
}

}  // namespace attnkit::mla
