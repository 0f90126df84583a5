// The SM90 (sm_90a) wgmma MLA decode kernel for 64-query-row tiles with a bf16 or (converted by
// the consumers, kFp8 below) fp8_e4m3 latent cache (128 heads, or 33-64 heads x s_q): same plan
// (mla_tile_scheduler.h), same partial layout and combine kernel, same paged-loader addressing as
// the mma.sync kernel (mla_decode_mma.cuh), which keeps the 16/32-row tiles.
//
// CTA = 384 threads, one per SM (~226 KiB of shared memory):
//   warpgroup 0 (producer, setmaxnreg 40): loads Q [64 x 576] once per request segment (by TMA
//     where q is dense and a request's rows are whole 64-row tiles, p.q_tma_ok; else cp.async)
//     and the K tiles [64 keys x 576] into a 2-stage ring by 16-byte cp.async through the page
//     table (slot = req_to_token[j - j % P] + j % P), in the 128-byte swizzle the wgmma descriptors
//     read; completion on mbarriers (full: cp.async.mbarrier.arrive.noinc), a stage is refilled
//     after both consumer warpgroups released it (empty). kVariant (below): 1 and up have one
//     full barrier per 64-column block, 2 and up release the two V halves separately.
//   warpgroups 1, 2 (consumers g = 0, 1, setmaxnreg 232): consumer g owns output
//     columns [256 g, 256 g + 256) of all 64 rows (O: 128 f32 registers per thread) and the S = Q
//     K^T of the segment's tiles i with i % 2 == g (wgmma m64n64k16, A = Q and B = K from shared
//     memory, 36 k-steps). For its tile it runs the online softmax (running max from the tile
//     before, through shared memory), writes P (bf16) and the rescale factor to shared memory,
//     signals the other consumer (named barrier 1 + g), and accumulates O += P V with P from
//     registers and V = the first 512 columns of the same K tile read MN-major (transposing
//     descriptor, wgmma m64n256k16, 4 k-steps). For the other consumer's tile it waits for that P,
//     rescales O and issues O += P V for its columns (A = P from shared memory), then its own next
//     S; once that P V is done (wait_group 1) the stage is released, so the producer refills it
//     while S and the softmax run. One warpgroup's softmax overlaps the other's GEMMs. (That is
//     kVariant 0-2; the default, kVariant 3, is the seesaw described below: both S of a tile pair
//     at once, only the row max handed between the softmaxes.)
//   Epilogue: the row sums of both consumers are added through shared memory (named barrier 3);
//     whole requests write bf16 out (+ natural-log LSE), split segments the normalised f32
//     partial + log2 LSE for mla_combine_kernel.
//
// Shared memory: Q 72 KiB | K 2 x 72 KiB | P 8 KiB | l [2][64] | m, f [64] + 512 B (kVariant 8:
// the exchange arrays m0, scale0, m1, scale1 [64] there) | 45 mbarriers (18 of them raw_full, used
// with an fp8 cache only); 232296 of 232448 bytes, aligned to 1024 bytes in the kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backends/mla/kernels/mla_decode_common.cuh"
#include "backends/mla/kernels/mla_decode_params.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/sm90/sm90_primitives.cuh"
#include "cuda/sm90/wgmma_sm90.cuh"

namespace attnkit::mla {

template <int kPage_>
struct MlaWgmmaTraits {
  static constexpr int kPage = kPage_;
  static constexpr int kRows = 64;
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  // The CTA starts with kEntryRegs per thread (65536 / 384 rounded down to a multiple of 8) and
  // setmaxnreg only moves registers between warpgroups: a consumer's setmaxnreg.inc waits until
  // the producer's dec has freed enough (with a producer of 48 it waits forever).
  static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;  // 168
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kEntryRegs,
                "setmaxnreg budget of one CTA per SM");
  static constexpr int kChunks = kRowDim / 8;               // 16-byte chunks of a bf16 row (72)
  static constexpr int kKSteps = kRowDim / 16;              // 36
  static constexpr int kTileBytes = kBlockN * kRowDim * 2;  // 73728
  static constexpr int kQBytes = kRows * kRowDim * 2;       // 73728
  static constexpr int kPBytes = kRows * kBlockN * 2;       // 8192
  static constexpr int kAlign = 1024;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kPOffset = kKOffset + 2 * kTileBytes;
  // Seesaw (kVariant 3, 6, 7): P lives in the rope block of its stage; the P buffer holds the
  // exchange arrays m0, scale0, m1, scale1 [64] instead.
  static constexpr int kXOffset = kPOffset;
  static constexpr int kLOffset = kPOffset + kPBytes;        // [2][kRows] row sums per consumer
  static constexpr int kMOffset = kLOffset + 2 * kRows * 4;  // running max per row (log2 domain)
  static constexpr int kFOffset = kMOffset + kRows * 4;      // rescale factor of the latest tile
  // kVariant 8: the P buffer holds P1, the exchange arrays take m, f (variants 0-2 only) and
  // 512 bytes more.
  static constexpr int kX2Offset = kMOffset;
  static constexpr int kBarOffset = kX2Offset + 4 * kRows * 4;
  static constexpr int kColBlocks = kRowDim / 64;  // 64-column (128-byte swizzle) blocks: 9
  // q_full, q_empty, full[2], empty[2], block_full[2][kColBlocks] (block-barrier variants),
  // empty_hi[2] (split release), empty_rope (stage 1's rope block, kVariant 8), raw_full[2][9]
  // (kFp8: the raw e4m3 bytes of a block have landed)
  static constexpr int kBarriers = 6 + 2 * kColBlocks + 2 + 1 + 2 * kColBlocks;  // + raw_full
  static constexpr int kSmemBytes = kBarOffset + kBarriers * 8 + kAlign;
  static_assert(kSmemBytes <= 227 * 1024, "227 KiB opt-in of SM90");
  static_assert(kQBytes % kAlign == 0 && kTileBytes % kAlign == 0 && kPOffset % kAlign == 0,
                "1024-byte swizzle atoms");
  // Layout after the P buffer (review, session 10): row sums, then m / f (variants 0-2) inside
  // the exchange arrays of kVariant 8, then the mbarriers (8-byte aligned).
  static_assert(kLOffset == kPOffset + kPBytes && kMOffset >= kLOffset + 2 * kRows * 4 &&
                    kFOffset + kRows * 4 <= kBarOffset && kX2Offset >= kLOffset + 2 * kRows * 4 &&
                    kX2Offset + 4 * kRows * 4 <= kBarOffset && kBarOffset % 8 == 0,
                "shared-memory regions overlap");
  static_assert(kPage == 1 || kPage % kBlockN == 0, "a tile never straddles a page boundary");
};

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier in its non-aligned form (barrier.sync without .aligned). bar.sync is
// barrier.sync.aligned: every thread that blocks on one generation of the barrier must execute the
// same instruction, else the behaviour is undefined (PTX ISA, barrier). A barrier that both
// consumers block on from their own code (consumer<g>() / consumer_seesaw<g>() are two template
// instances, so two instructions) must use this form. compute-sanitizer's synccheck reported the
// aligned form there as "Divergent thread(s) in block" (H200, 2026-11-29, kBarEpilogue in
// publish_row_sums) and passes with this one. racecheck reports the l_sh exchange this barrier
// orders with either form: a false positive, reproduced by a probe (the tool drops this barrier's
// order once a bar.arrive / bar.sync pair on another barrier runs between its generations,
// docs/perf/mla_notes.md "Session 64"). A sync paired with bar.arrive on
// the other side (kBarM0, kBarSc1, kBarP0, kBarP1, kBarPReady) has one blocking instruction per
// generation and keeps the aligned form.
__device__ __forceinline__ void named_bar_sync_any(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// This thread's accumulator rows r_lo / r_lo + 8 (o[4j + 0..1] / o[4j + 2..3]) times f[0] / f[1].
__device__ __forceinline__ void scale_o_rows(float (&o)[128], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= f[0];
    o[4 * j + 1] *= f[0];
    o[4 * j + 2] *= f[1];
    o[4 * j + 3] *= f[1];
  }
}
// o and its row sums l rescaled by f (a new running max); with sum: l plus this tile's row sums.
__device__ __forceinline__ void rescale_o_l(float (&o)[128], float (&l)[2], const float (&f)[2]) {
  scale_o_rows(o, f);
  l[0] *= f[0];
  l[1] *= f[1];
}
__device__ __forceinline__ void rescale_o_l(float (&o)[128], float (&l)[2], const float (&f)[2],
                                            const float (&sum)[2]) {
  scale_o_rows(o, f);
  l[0] = l[0] * f[0] + sum[0];
  l[1] = l[1] * f[1] + sum[1];
}

// Named barrier ids (bar.sync / bar.arrive over the two consumer warpgroups; 0 is __syncthreads).
// The variants' ids may coincide: one kernel runs one variant.
// Variants 0-2:
inline constexpr int kBarPReady = 1;  // + g (1, 2): consumer g published P / f / m of its tile
// Variant 3 (the seesaw):
inline constexpr int kBarM0 = 1;   // consumer 0 published m and the scale after tile a
inline constexpr int kBarP1 = 2;   // consumer 1 published P1 (frame m1) for consumer 0
inline constexpr int kBarP0 = 4;   // consumer 0 published P0 scale1 (frame m1) for consumer 1
inline constexpr int kBarSc1 = 9;  // consumer 1 published m1 and scale1 (before P1)
// Variant 6, a phantom pair: consumer 0's 128 threads are done with S0 (stage 0's rope block).
inline constexpr int kBarC0 = 5;
// kFp8: consumer g's warpgroup has converted a block of its stage (6 + g).
inline constexpr int kBarCvt = 6;
// kFp8 (f16 inputs): both consumers have converted their share of the segment's Q tile.
inline constexpr int kBarQCvt = 8;
// Every variant:
inline constexpr int kBarEpilogue = 3;  // epilogue exchange

// Diagnostic timeline (compile-time ATTNKIT_MLA_TIMELINE, CMake option of the same name; never in
// a timed or shipped build): thread 0 of each seesaw consumer of the first kTlCtas CTAs (linear id
// blockIdx.y * gridDim.x + blockIdx.x) records (clock64, event | pair tile << 8) pairs at the phase
// points named by MlaTlEvent (and so does the producer's thread 0, record 2); word 0 of a (CTA,
// record) holds the number of words written.
// The engine copies the buffer to $ATTNKIT_MLA_TIMELINE_OUT after each launch
// (mla_timeline_dump); scripts/device/mla_timeline.py reads it.
enum MlaTlEvent : int {
  kTlSegment = 1,         // segment start (Q waited for, rope block in registers)
  kTlPair = 2,            // pair body entered
  kTlSIssued = 3,         // this consumer's S issued (every block waited for)
  kTlSDone = 4,           // S retired (wait_group 0)
  kTlMaxOut = 5,          // consumer 0: m0 / scale0 published; 1: m1 / scale1 published
  kTlMaxIn = 6,           // consumer 1: kBarM0 synced; 0: kBarSc1 synced
  kTlOwnPvIssued = 7,     // P0 V0L (0) / P1 V1R (1) issued
  kTlOwnPvDone = 8,       // consumer 0: P0 V0L retired, stage 0 blocks 0-3 released
  kTlPStored = 9,         // P0 scale1 (0) / P1 (1) stored and announced
  kTlPIn = 10,            // kBarP1 (0) / kBarP0 (1) synced
  kTlOtherPvIssued = 11,  // P1 V1L (0) / P0 V0R (1) issued (its V blocks waited for)
  kTlRetired = 12,        // consumer 1: every P V retired; consumer 0 (kEarlyS): P1 V1L retired
  kTlEarlyLo = 13,        // kEarlyS: next S0 blocks 0-3 issued
  kTlEarlyHi = 14,        // kEarlyS: next S0 blocks 4-8 issued
  kTlSegmentEnd = 15,     // output written
  kTlGlobalStart = 16,    // %globaltimer (ns) at the segment start, for the order across CTAs
  kTlGlobalEnd = 17,      // %globaltimer at the segment end
  kTlRowSums = 18,        // epilogue: both consumers' row sums exchanged
  kTlQFree = 19,          // the segment's last S retired: Q released to the producer (q_empty)
  kTlSegHead = 20,        // the segment's request, bounds and page-table row read
  kTlQIn = 21,            // q_full waited for
  kTlQIssued = 23,        // producer: q_empty waited for, Q's copies issued
  kTlFirstIssued = 24,    // producer: the segment's first pair's loads issued
};
#if defined(ATTNKIT_MLA_TIMELINE)
inline constexpr int kTlCtas = 32;
inline constexpr int kTlWords = 8192;  // per CTA and record
inline constexpr int kTlRecords = 3;   // consumer 0, consumer 1, the producer (g = 2)
__device__ unsigned long long g_mla_timeline[kTlCtas * kTlRecords * kTlWords];
struct MlaTimeline {
  unsigned long long* buf = nullptr;  // null: this thread does not record
  int n = 2;  // words 0 (count) and 1 (unused): the pairs stay 16-byte aligned
  __device__ MlaTimeline(int g, int tid) {
    const int cta = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
    if (tid == 0 && cta < kTlCtas) buf = g_mla_timeline + (kTlRecords * cta + g) * kTlWords;
  }
  // Branch-free (a predicated store), so no divergent branch sits between wgmmas in flight.
  __device__ __forceinline__ void stamp(int ev, int tile) {
    unsigned long long t;
    if (ev == kTlGlobalStart || ev == kTlGlobalEnd) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } else {
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    }
    const unsigned long long meta =
        static_cast<unsigned long long>(ev) | static_cast<unsigned long long>(tile) << 8;
    unsigned long long* at = buf != nullptr && n + 2 <= kTlWords ? buf + n : nullptr;
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.u64 p, %0, 0;\n @p st.global.v2.u64 [%0], {%1, %2};\n}" ::"l"(
            at),
        "l"(t), "l"(meta));
    n += 2;
  }
  __device__ void finish() const {
    if (buf != nullptr) buf[0] = static_cast<unsigned long long>(n);
  }
};
#define ATTNKIT_MLA_TL(ev, tile) tl.stamp(ev, tile)
#else
#define ATTNKIT_MLA_TL(ev, tile) ((void)0)
#endif

// kVariant 0 (ATTNKIT_MLA_WGMMA_BLOCKS=0): one full barrier per K tile.
// kVariant 1 (ATTNKIT_MLA_WGMMA_BLOCKS=1; H200 session 7: 128 heads +5-10% over 0): the producer
// arrives on one full barrier per 64-column block of a K tile (9 per stage), and S = Q K^T waits
// block by block, so the S of a freshly refilled stage starts when its first 8 KiB have landed
// instead of all 72 KiB (the load of the tile overlaps its own S).
// kVariant 2 (ATTNKIT_MLA_WGMMA_BLOCKS=2; H200 session 7: +2-3% over 1): 1 + split release:
// consumer 0 releases blocks 0-3 and the rope block 8 (empty), consumer 1 blocks 4-7 (empty_hi);
// the producer refills 0-3, 8 first and S runs the blocks in that order (0, 1, 2, 3, 8, 4-7).
//
// kVariant 3 (the default of session 9; H200 session 9: +4-6% over 2): the tiles of a segment go in
// pairs (a, a + 1) on stages (0, 1); consumer g computes S of tile a + g (both S GEMMs back to
// back), the online softmax of the pair is split in the FlashMLA "seesaw" way: consumer 0 takes the
// max of tile a first (m0 = max(m, max S0), scale0) and hands m0 / scale0 to consumer 1, which
// takes m1 = max(m0, max S1), scale1, publishes m1 / scale1 (kBarSc1, before its exponentials;
// session 24) and then P1 (in frame m1) in stage 1's rope block (kBarP1); consumer 0 runs O_L =
// O_L scale0 + P0 V0L from registers meanwhile, then publishes P0 scale1 (frame m1) in stage 0's
// rope block (kBarP0) while P1 is being computed, and runs O_L = O_L scale1 + P1 V1L; consumer 1
// runs O_R = O_R scale0 scale1 + P1 V1R + (P0 scale1) V0R without waiting in between. Only the
// max (not P) is on the chain between the two softmaxes. P is stored by stmatrix (store_p), and a
// tile that came by TMA alone is read without a proxy fence (tma_only). Release: stage 0 blocks 0-3
// after P0 V0L (empty), blocks 4-8 after (P0 scale1) V0R (empty_hi); stage 1 blocks 4-7 after P1
// V1R (empty), blocks 0-3, 8 after P1 V1L (empty_hi); the producer loads in that order and S0 / S1
// read their blocks in the order loaded. An odd segment's last pair has a phantom tile a + 1
// (zero-filled, masked).
//
// kVariant 6 (the default for fewer than two full 64-row tiles per request, and for the fp8
// cache;
// ATTNKIT_MLA_WGMMA_BLOCKS=6): the seesaw without the phantom tile. An odd segment's last pair runs
// a second copy of the pair body (compile-time kPhantom, so every branch around a wgmma stays
// uniform): the producer loads nothing into stage 1, consumer 1 skips S1, its softmax and P1 V1R
// (it only rescales O_R by scale0 and runs (P0) V0R), consumer 0 skips the wait for P1 and P1 V1L.
// Stage 1 then has no barrier phase in that pair: its full / empty parities count the pairs that
// use it (pc1), stage 0's all pairs (pc). In that pair consumer 0 overwrites stage 0's rope block
// with P0 after its own 128-thread barrier (kBarC0: every warp's S0 is done; in a full pair the
// kBarSc1 sync orders it). The protocol was checked by docs/perf/mla_s10/seesaw_model.py (random
// interleavings; sessions 10 and 23). That model predates session 24's kBarSc1 hand-over, in which
// P0 is stored before the P1 sync, variant 8's consumer-issued refills and session 27's kEarlyP0;
// read-only reviews re-derived their ordering by hand and have not extended the model.
//
// kVariant 7 (the default for 128 heads x s_q >= 2 in sessions 23-25; session 10, H200 session
// 11: no faster with the producer's loads): 6 + consumer 0
// issues the next pair's S0 early, FlashMLA's order (its public "new kernel deep dive"; no code
// taken): right behind P1 V1L (no wait in between) the k-steps of stage 0's blocks 0-3 (released
// after P0 V0L, refilled while P1 V1L runs), then wait_group<1> (P1 V1L done), the release of stage
// 1's blocks 0-3, 8, then blocks 4-8 (released by consumer 1's P0 V0R). The next pair starts with
// S0 done or nearly done, so the softmax of tile a overlaps consumer 1's S1 instead of both S
// finishing together and the tensor pipe idling through softmax 0. The first pair's S0 of a
// segment is issued before the loop; the segment's last pair issues none. With the consumers'
// TMA (session 23) the release of stage 1's blocks 0-3, 8 issues their refill; the compute chain
// alone (ATTNKIT_MLA_WGMMA_DIAG=noload) is 4-6% faster than 6, with the loads +2-5% at s_q 2 and
// 1-2% slower at s_q 1 on an H100 (the next S0's blocks 0-3, refilled half a pair earlier, are
// waited for before stage 1's release when their loads come from DRAM).
//
// kVariant 8 (the default since session 26 where a request's rows fill two or more 64-row tiles
// and the consumers refill by TMA, default_wgmma_variant: +4% at 128 heads x s_q 1 on an H200,
// level to +1% on an H100; with the producer's loads, sessions 10-11, slower): 7 + P1 in the P
// buffer (its own 8 KiB; the exchange arrays move to kX2Offset), so stage 1's rope block is read
// by S1 only: consumer 1 releases it right after S1 (empty_rope; with the consumers' TMA its
// refill is issued there), the producer refills it first in the next pair, and S1 reads stage 1
// in the order 8, 4-7, 0-3 (5 early blocks instead of 4; 9 in the pair, as FlashMLA's).
// Variants 7 and 8 since session 27 (kEarlyP0): consumer 0 takes scale1 and publishes P0 scale1
// while its P0 V0L runs, and waits for P0 V0L (then releases stage 0's blocks 0-3) only after that.
// kFp8 (an fp8_e4m3 cache; seesaw variant 6): the producer walks the release groups as for
// bf16 but copies the raw e4m3 bytes by cp.async into the stage, each 16-byte fp8 chunk into the
// first of the two 16-bit chunks it becomes, arriving on raw_full(stage, kb). Consumer g converts
// stage g's blocks in place, each right before its S reads it (acquire_s_block: wait raw_full,
// two 16-byte units per thread, fence for the async proxy, a 128-thread named barrier, then
// block_full for the other consumer's P V), so the conversion of block n + 1 overlaps the wgmma
// of block n. Since session 16 the tiles are f16 (kF16: one cvt per pair of values instead of
// four instructions for bf16; exact either way), Q is converted to f16 x 2^-8 once per segment
// and P is f16, so every wgmma of the fp8 kernel is an f16 one; k_scale is folded into
// scale_log2 / v_scale. Figures before the f16 change (bf16 tiles): H200 2026-11-24 00:24Z
// (b128, 128 heads, page 64, two alternated rounds): kv 4k / 8k / s_q 2 0.439-0.441 / 0.840-0.854
// / 0.868-0.875 ms (331-348 TFLOP/s), 0.83x the bf16 cache; 1.17-1.20x the earlier design in the
// same command (producer warps 0-1 loading, warps 2-3 converting: 0.525-0.529 / 0.995-0.998 /
// 1.027-1.030 ms), which was 1.39x the mma.sync kernel's fp8 after its spills were removed
// (session 15) and 1.15x before (session 14; docs/perf/mla_notes.md has every variant measured).
// With the conversion skipped (ATTNKIT_MLA_WGMMA_DIAG=noconvert, wrong results) fp8 runs at the
// bf16 kernel's speed (0.362-0.363 ms), so what is left is the conversion on the S path.
template <typename Tr, int kVariant, bool kFp8_ = false>
struct MlaWgmmaCta {
  static constexpr bool kFp8 = kFp8_;
  static_assert(!kFp8 || kVariant == 6, "the fp8 cache: the default seesaw (variant 6) only");
  // The tensor-core input type: f16 with an fp8 cache (e4m3 -> f16 is one cvt per pair, -> bf16
  // four; both exact), bf16 otherwise. With f16, Q is converted in place to f16 x 2^-kQShiftF16
  // once per segment (convert_q_f16; the softmax scale takes the 2^kQShiftF16 back) and P is f16.
  static constexpr bool kF16 = kFp8;
  static constexpr bool kBf16Mma = !kF16;
  __device__ static uint32_t pack_p(float a, float b) {
    if constexpr (kF16) {
      return cuda::pack2<__half>(a, b);
    } else {
      return cuda::pack2<__nv_bfloat16>(a, b);
    }
  }
  static constexpr bool kBlockFull = kVariant >= 1;
  static constexpr bool kSplitRelease = kVariant >= 2;
  static constexpr bool kSeesaw = mla_seesaw_variant(kVariant);
  static constexpr bool kSkipPhantom = kVariant >= 6;
  static constexpr bool kEarlyS = kVariant >= 7;
  static constexpr bool kP1Buf = kVariant == 8;
  // Consumer 0 hands P0 scale1 to consumer 1 before waiting for its own P0 V0L (session 27,
  // H200: +1.5% / +1% / +4.5% / +3% at 128 heads kv 4k / 8k x s_q 1 / 2 with variant 8; the fp8
  // cache's variant 6 lost 1-6%, so 6 keeps the old order). Orders tried in the same session and
  // not kept (docs/perf/mla_notes.md session 27): consumer 1's P1 V1R before its P1 store (mixed),
  // consumer 0 in frame m1 from the start with both P V back to back (-9%), skipping rescales by
  // exactly 1, with or without a lazy running max (-2 to -6% / level).
  static constexpr bool kEarlyP0 = kEarlyS;
  // Whole tiles may come by TMA (MlaDecodeParams::kv_tma_ok): a bf16 cache whose pages hold a
  // tile's 64 keys as consecutive pool rows.
  static constexpr bool kTmaTiles = mla_tma_tiles(Tr::kPage, kFp8);
  // p.kv_tma_ok == 3 (ATTNKIT_MLA_K_TMA=consumer): the whole bf16 tiles of a segment's later pairs
  // are refilled by TMA from the consumer thread that releases each group (as FlashMLA does), not
  // by the producer; seesaw variants 3, 6, 7 and 8 (whose release points are the four groups below,
  // plus variant 8's stage-1 rope block right after S1; variant 7's consumer 0 releases stage 1
  // blocks 0-3, 8 between its early S0's blocks 0-3 and 4-8). Thread 0 issues a group's boxes
  // after its own wgmma_wait and arrives for the other 127 threads, as FlashMLA does: this relies
  // on a warpgroup's wgmma completing for all four warps at once.
  static constexpr bool kConsumerTma = kSeesaw && kTmaTiles;
  // Blocks of stage 1's last release group (consumer 0, after P1 V1L): 0-3 and the rope block,
  // which holds P1; kP1Buf: 0-3 (its rope block went right after S1).
  static constexpr int kNb1Lo = kP1Buf ? 4 : 5;
  // Seesaw: the column block consumer (= stage) s multiplies n-th in S (the order its blocks are
  // released and refilled): stage 0 0..8, stage 1 4..7, 0..3, 8 (kP1Buf: 8, 4..7, 0..3).
  __device__ static constexpr int seesaw_block(int s, int n) {
    if (s == 0) return n;
    if (kP1Buf) return n == 0 ? 8 : n < 5 ? n + 3 : n - 5;
    return n == 8 ? n : (n < 4 ? n + 4 : n - 4);
  }
  // P of stage s (64 x 64 keys, one 128-byte swizzle block) in that stage's rope block.
  __device__ uint32_t sP(int s) const { return sK(s) + 8 * kBlockN * 128; }
  // Column block loaded / multiplied n-th.
  __device__ static constexpr int block_at(int n) {
    return !kSplitRelease || n < 4 ? n : (n == 4 ? 8 : n - 1);
  }

  const MlaDecodeParams& p;
  uint8_t* smem;
  uint32_t base;

  __device__ uint32_t sQ() const { return base + Tr::kQOffset; }
  __device__ uint32_t sK(int stage) const { return base + Tr::kKOffset + stage * Tr::kTileBytes; }
  __device__ uint32_t bar(int i) const { return base + Tr::kBarOffset + 8 * i; }
  __device__ uint32_t q_full() const { return bar(0); }
  __device__ uint32_t q_empty() const { return bar(1); }
  __device__ uint32_t full(int s) const { return bar(2 + s); }
  __device__ uint32_t empty(int s) const { return bar(4 + s); }
  __device__ uint32_t block_full(int s, int kb) const { return bar(6 + s * Tr::kColBlocks + kb); }
  __device__ uint32_t empty_hi(int s) const { return bar(6 + 2 * Tr::kColBlocks + s); }
  __device__ uint32_t empty_rope() const { return bar(6 + 2 * Tr::kColBlocks + 2); }
  // kFp8: the raw bytes of block kb of stage s have landed (the producer's cp.async arrivals).
  __device__ uint32_t raw_full(int s, int kb) const {
    return bar(6 + 2 * Tr::kColBlocks + 3 + s * Tr::kColBlocks + kb);
  }
  // Consumer g's release of a stage (its last read of it was a P V).
  __device__ void release(int s, int g) const {
    sm90::mbar_arrive(kSplitRelease && g == 1 ? empty_hi(s) : empty(s));
  }

  // Q rows [row0, row0 + 64) of request b (padding rows zero-filled), after the previous
  // segment's consumers are done with Q (q_empty; segment number tcount). The seesaw consumers
  // release Q after their last S of a segment; the exchange arrays and the row sums are ordered
  // between segments by the epilogue's kBarEpilogue syncs, not by q_empty. p.q_tma_ok: nine
  // 64 x 64 boxes from thread 0 (the tile's 64 rows are rows b x rows_per_req + row0 .. of q as
  // [tokens x heads, 576]; no padding rows), the other 127 threads arrive on q_full at once, so
  // q_full sees the same 128 arrivals as from the cp.async path.
  __device__ void load_q(int b, int tcount) const {
    using namespace sm90;
    const int tid = threadIdx.x;
    const auto* qg = static_cast<const uint8_t*>(p.q);
    const int row0 = mla_row_tile(p) * Tr::kRows;
    mbar_wait(q_empty(), (tcount & 1) ^ 1);
    if (p.q_tma_ok != 0) {
      static_assert(Tr::kRows == kBlockN, "a Q tile is one 64-row box per 64-column block");
      if (tid == 0) {
        const int first = b * p.rows_per_req + row0;
        mbar_arrive_expect_tx(q_full(), Tr::kRows * Tr::kChunks * 16);
#pragma unroll 1
        for (int kb = 0; kb < Tr::kChunks / 8; ++kb) {
          tma_load_2d(sQ() + kb * Tr::kRows * 128, &p.q_tma, 64 * kb, first, q_full());
        }
      } else {
        mbar_arrive(q_full());
      }
      return;
    }
    // Warp w copies rows w, w + 4, ...: the row's source (one division by the head count) once per
    // row, lane l its chunks l, l + 32, l + 64 (< 72): each instruction reads 512 contiguous bytes.
    const int warp = tid >> 5, lane = tid & 31;
#pragma unroll 1
    for (int r = warp; r < Tr::kRows; r += 4) {
      const uint8_t* row = q_chunk_src(p, b, row0 + r, 0);
#pragma unroll
      for (int c = lane; c < Tr::kChunks; c += 32) {
        cp_async_16(sQ() + swizzle_offset(Tr::kRows, r, c), row ? row + c * 16 : qg, row ? 16 : 0);
      }
    }
    cp_async_arrive_noinc(q_full());
  }

  // ---- producer (warpgroup 0) ----

  // The page-table row (req_to_token) of request b.
  __device__ __forceinline__ const int32_t* page_table_row(int b) const {
    return p.req_to_token + static_cast<int64_t>(p.req_pool_indices[b]) * p.req_to_token_stride;
  }

  // Thread tid's chunks 8 kb + 2 i + tid % 2, i in [0, 4), of block kb of K row `key` (global row
  // `row`; !valid: zero-filled from kvg) into the tile at shared address dst. The two threads of a
  // key copy the two halves of one 32-byte sector in the same instruction, so every sector crosses
  // from L2 once (cp.async.cg does not merge across instructions).
  __device__ __forceinline__ static void copy_block_chunks(uint32_t dst, int key, int kb, int tid,
                                                           const uint8_t* row, const uint8_t* kvg,
                                                           bool valid) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = 8 * kb + 2 * i + (tid & 1);
      sm90::cp_async_16(dst + sm90::swizzle_offset(kBlockN, key, c), valid ? row + c * 16 : kvg,
                        valid ? 16 : 0);
    }
  }

  __device__ void producer() const {
    using namespace sm90;
    const int tid = threadIdx.x;  // 0..127
    const auto* kvg = static_cast<const uint8_t*>(p.kv);
    int it = 0, tcount = 0;
    for_each_segment(p, [&](int b, int kv_len, int t0, int t1, bool, int) {
      const int32_t* tok = page_table_row(b);
      load_q(b, tcount++);
      // K tiles: thread t copies key t / 2 (its chunks: copy_block_chunks).
      const int key = tid >> 1;
      for (int tile = t0; tile < t1; ++tile, ++it) {
        const int j = tile * kBlockN + key;
        const bool valid = j < kv_len;
        const int64_t slot = valid ? kv_slot<Tr::kPage>(tok, j) : 0;
        const uint8_t* row = kvg + slot * p.kv_stride_row * 2;
        const int stage = it & 1;
        mbar_wait(empty(stage), ((it >> 1) & 1) ^ 1);
        const uint32_t dst = sK(stage);
        // Diagnostic (ATTNKIT_MLA_WGMMA_DIAG=noload; wrong results, timing only): after the
        // first fill of both stages no global loads, the consumers recompute stale tiles.
        const bool load = !(p.wgmma_diag == 1 && it >= 2);
        if constexpr (kBlockFull) {
          // Block kb = chunks [8 kb, 8 kb + 8): thread t copies chunks 8 kb + 2 i + t % 2.
#pragma unroll 1
          for (int n = 0; n < Tr::kColBlocks; ++n) {
            const int kb = block_at(n);
            if (kSplitRelease && n == 5) mbar_wait(empty_hi(stage), ((it >> 1) & 1) ^ 1);
            if (load) copy_block_chunks(dst, key, kb, tid, row, kvg, valid);
            cp_async_arrive_noinc(block_full(stage, kb));
          }
        } else {
          if (load) {
#pragma unroll
            for (int i = 0; i < Tr::kChunks / 2; ++i) {
              const int c = (tid & 1) + 2 * i;
              cp_async_16(dst + swizzle_offset(kBlockN, key, c), valid ? row + c * 16 : kvg,
                          valid ? 16 : 0);
            }
          }
          cp_async_arrive_noinc(full(stage));
        }
      }
    });
    cp_async_wait<0>();
  }

  // ---- consumers (warpgroups 1, 2 -> g = 0, 1) ----
  // kBlockFull: block 0 was waited for by the caller; blocks 1.. are waited for here, between
  // the wgmmas (nothing touches sacc meanwhile).
  __device__ void issue_s(float (&sacc)[32], int stage, uint32_t parity) const {
    const uint64_t q_desc = sm90::make_desc(sQ(), 16, 1024);
    const uint64_t k_desc = sm90::make_desc(sK(stage), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) {
      if constexpr (kBlockFull) {
        if (kk % 4 == 0 && kk > 0) {
          sm90::mbar_wait(block_full(stage, block_at(kk / 4)), parity);
          sm90::fence_proxy_async();
          sm90::wgmma_fence();  // ptxas would inject it (C7519) after the wait loop
        }
      }
      const int kb = block_at(kk / 4);
      sm90::wgmma_ss<64, kBf16Mma, 0>(
          sacc, sm90::desc_advance(q_desc, kb * Tr::kRows * 128 + (kk % 4) * 32),
          sm90::desc_advance(k_desc, kb * kBlockN * 128 + (kk % 4) * 32), kk > 0 ? 1 : 0);
    }
  }
  // The whole tile has landed (tile barrier, or the blocks [kb0, kb1) this consumer reads).
  __device__ void wait_tile(int stage, uint32_t parity, int kb0, int kb1) const {
    if constexpr (kBlockFull) {
      for (int kb = kb0; kb < kb1; ++kb) sm90::mbar_wait(block_full(stage, kb), parity);
    } else {
      sm90::mbar_wait(full(stage), parity);
    }
  }
  // O[:, 256 g .. +256) += P V: V = columns [256 g, +256) of the tile, MN-major (4 blocks of 64
  // columns, LBO = one block), k-step kk = keys 16 kk .. +16.
  __device__ void issue_pv(float (&o)[128], const uint32_t (&pa)[4][4], int stage, int g) const {
    const uint64_t v_desc = sm90::make_desc(sK(stage) + g * 4 * kBlockN * 128, kBlockN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      sm90::wgmma_rs<256, kBf16Mma, 1>(o, pa[kk], sm90::desc_advance(v_desc, kk * 16 * 128), 1);
    }
  }

  // g: a template parameter so that every branch around a wgmma is uniform for ptxas (a branch
  // it cannot prove warp-uniform makes it serialise every wgmma of the kernel, C7518 / C7520).
  // The same with P [64 x 64 keys] from shared memory (K-major, one 128-byte swizzle block).
  __device__ void issue_pv_smem_p(float (&o)[128], int stage, int g) const {
    issue_pv_smem_p_at(o, base + Tr::kPOffset, stage, g);
  }
  __device__ void issue_pv_smem_p_at(float (&o)[128], uint32_t p_addr, int stage, int g) const {
    const uint64_t p_desc = sm90::make_desc(p_addr, 16, 1024);
    const uint64_t v_desc = sm90::make_desc(sK(stage) + g * 4 * kBlockN * 128, kBlockN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      sm90::wgmma_ss<256, kBf16Mma, 1>(o, sm90::desc_advance(p_desc, kk * 32),
                                       sm90::desc_advance(v_desc, kk * 16 * 128), 1);
    }
  }

  // Epilogue: consumer g's row sums l (reduced over the quad) published in l_sh, then both
  // consumers' sums visible (kBarEpilogue). The first sync is what keeps this segment's writes
  // behind the other consumer's reads of the previous segment's sums in the seesaw: it hands Q
  // back before the epilogue, so q_empty no longer orders them, and in a bf16 segment of one
  // (phantom) pair consumer 0 never waits for consumer 1. (In consumer(), variants 0-2, q_empty
  // still follows the reads; the sync is redundant there.)
  template <int g>
  __device__ __forceinline__ void publish_row_sums(float (&l)[2], float* l_sh, int r_lo,
                                                   int lane) const {
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
      l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    }
    named_bar_sync_any(kBarEpilogue, 256);
    if ((lane & 3) == 0) {
      l_sh[g * Tr::kRows + r_lo] = l[0];
      l_sh[g * Tr::kRows + r_lo + 8] = l[1];
    }
    named_bar_sync_any(kBarEpilogue, 256);
  }

  template <int g>
  __device__ void consumer() const {
    using namespace sm90;
    const int tid = threadIdx.x - 128 * (g + 1);
    const int warp = tid >> 5, lane = tid & 31;
    const int r_lo = 16 * warp + (lane >> 2);  // this thread's rows r_lo, r_lo + 8
    const float kNegInf = -__int_as_float(0x7f800000);
    auto* m_sh = reinterpret_cast<float*>(smem + Tr::kMOffset);
    auto* f_sh = reinterpret_cast<float*>(smem + Tr::kFOffset);
    auto* l_sh = reinterpret_cast<float*>(smem + Tr::kLOffset);
    uint8_t* p_sh = smem + Tr::kPOffset;
    const int row0 = mla_row_tile(p) * Tr::kRows;
    int it = 0, tcount = 0;
    for_each_segment(p, [&](int b, int kv_len, int t0, int t1, bool whole, int partial) {
      const int n = t1 - t0;
      int limit[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int m = row0 + r_lo + 8 * x;
        const int i = m < p.rows_per_req ? m / p.num_heads : p.s_q - 1;
        limit[x] = kv_len - (p.s_q - 1 - i);
      }
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.f;
      float l[2] = {0.f, 0.f};  // this thread's share of the row sums (rescaled by every tile)
      float m_prev[2] = {kNegInf, kNegInf};
      float sacc[32];
      uint32_t pa_own[4][4];

      mbar_wait(q_full(), tcount & 1);
      fence_proxy_async();  // Q may have arrived by cp.async

      // i: this consumer's tile (i % 2 == g, if i < n); i - 1: the other consumer's tile.
      for (int i = g; i < n + 1; i += 2) {
        const bool own = i < n;
        const bool other = i >= 1;
        const int it_own = it + i, it_oth = it + i - 1;
        // The other consumer's tile first: its P V is issued (and its stage released) before
        // this consumer's S, so the producer refills that stage while S runs. ptxas serialises
        // every wgmma of the kernel (C7514 / C7515) when a non-wgmma instruction touches an
        // accumulator while any wgmma may be in flight on some path: O is only rescaled with
        // nothing in flight, and every path retires its wgmmas explicitly (no correlated
        // branches).
        auto other_pv = [&]() {
          named_bar_sync(kBarPReady + (1 - g), 256);
          float f[2];
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            f[x] = f_sh[r_lo + 8 * x];
            m_prev[x] = m_sh[r_lo + 8 * x];
          }
          rescale_o_l(o, l, f);
          wait_tile(it_oth & 1, (it_oth >> 1) & 1, 4 * g, 4 * g + 4);  // V columns of g
          fence_proxy_async();
          wgmma_fence();
          issue_pv_smem_p(o, it_oth & 1, g);
          wgmma_commit();
        };
        auto own_s = [&]() {
          wait_tile(it_own & 1, (it_own >> 1) & 1, 0, kBlockFull ? 1 : 0);
          fence_proxy_async();
          wgmma_fence();
          issue_s(sacc, it_own & 1, (it_own >> 1) & 1);
          wgmma_commit();
        };
        if (!own) {  // the segment's last tile is the other consumer's
          other_pv();
          wgmma_wait<0>();
          fence_regs(o);
          release(it_oth & 1, g);
          continue;
        }
        if (other) {
          other_pv();
          own_s();
          wgmma_wait<1>();  // the P V (committed first) is done; S may still run
          release(it_oth & 1, g);
        } else {
          own_s();
        }
        {
          wgmma_wait<0>();  // S
          fence_regs(sacc);
          fence_regs(o);
          // The softmax reads S and packs P straight into the A fragment (pa_own).
          const int tile = t0 + i;
          const float scale = qk_scale_log2(p, kF16);
          auto masked = [&](int j, int e) {
            const int key = tile * kBlockN + 8 * j + 2 * (lane & 3) + (e & 1);
            return key < limit[e >> 1] ? sacc[4 * j + e] * scale : kNegInf;
          };
          float mx[2] = {kNegInf, kNegInf};
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], masked(j, e));
          }
          float f[2], m_use[2], sum[2] = {0.f, 0.f};
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
            const float m_new = fmaxf(m_prev[x], mx[x]);
            m_use[x] = m_new == kNegInf ? 0.f : m_new;
            f[x] = exp2_approx(m_prev[x] - m_use[x]);  // m_prev = -inf -> 0
            m_prev[x] = m_new;
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              v[e] = exp2_approx(masked(j, e) - m_use[e >> 1]);
              sum[e >> 1] += v[e];
            }
            // j = 2 kk + h: words 2 h (row r_lo) and 2 h + 1 (row r_lo + 8) of k-step kk.
            pa_own[j >> 1][2 * (j & 1) + 0] = pack_p(v[0], v[1]);
            pa_own[j >> 1][2 * (j & 1) + 1] = pack_p(v[2], v[3]);
          }
          __syncwarp();  // this warp's reads of f / m (the other consumer's tile) are done
          // P (bf16) for the other consumer, read by its wgmma (async proxy): fence, then signal.
          // The buffer's previous P (the other's) was read by this consumer's P V, done above.
          // Rows are per warp; word (kk, q): row r_lo + 8 (q & 1), keys 16 kk + 8 (q >> 1) + ...
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              *reinterpret_cast<uint32_t*>(
                  p_sh + sm90::swizzle_offset(64, r_lo + 8 * (q & 1), 2 * kk + (q >> 1)) +
                  4 * (lane & 3)) = pa_own[kk][q];
            }
          }
          if ((lane & 3) == 0) {
#pragma unroll
            for (int x = 0; x < 2; ++x) {
              f_sh[r_lo + 8 * x] = f[x];
              m_sh[r_lo + 8 * x] = m_prev[x];
            }
          }
          fence_proxy_async();
          named_bar_arrive(kBarPReady + g, 256);
          rescale_o_l(o, l, f, sum);
          wgmma_fence();
          issue_pv(o, pa_own, it_own & 1, g);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(o);
          release(it_own & 1, g);
        }
      }
      it += n;

      // ---- epilogue: total row sums, final max ----
      publish_row_sums<g>(l, l_sh, r_lo, lane);
      float denom[2], m_fin[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        denom[x] = l_sh[r_lo + 8 * x] + l_sh[Tr::kRows + r_lo + 8 * x];
        m_fin[x] = m_sh[r_lo + 8 * x];
      }
      mbar_arrive(q_empty());  // Q, P, m, f, l free for the next segment
      ++tcount;

      write_out<g>(o, denom, m_fin, b, whole, partial, r_lo, lane);
    });
  }

  // The four words a[0..3] of each lane of a quad (lane q = lane % 4 holds a[s] = M[q][s]) become
  // M[0..3][q]: two exchange rounds (lanes q ^ 1, then q ^ 2), each swapping the two words whose
  // slot bit differs from the lane bit. Every lane of the warp takes part.
  __device__ __forceinline__ static void quad_transpose(uint32_t (&a)[4], int lane) {
    const bool q0 = (lane & 1) != 0, q1 = (lane & 2) != 0;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint32_t r = __shfl_xor_sync(0xffffffffu, q0 ? a[2 * t] : a[2 * t + 1], 1);
      a[2 * t] = q0 ? r : a[2 * t];
      a[2 * t + 1] = q0 ? a[2 * t + 1] : r;
    }
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint32_t r = __shfl_xor_sync(0xffffffffu, q1 ? a[t] : a[2 + t], 2);
      a[t] = q1 ? r : a[t];
      a[2 + t] = q1 ? a[2 + t] : r;
    }
  }

  // Epilogue store of consumer g's 256 output columns of rows r_lo, r_lo + 8: whole requests bf16
  // out (+ natural-log LSE), split segments the normalised f32 partial + log2 LSE. The bf16 rows go
  // out as 16-byte stores (the engine admits only 16-byte aligned output rows: MlaDecodeEngine::
  // run): per 4 column groups j = 4 k + jj the quad transposes its words (quad_transpose), so
  // lane q writes columns 8 (4 k + q) .. + 8 and the quad 64 contiguous bytes of the row (session
  // 25: 4-byte stores, 8 half-used sectors per instruction, kept each consumer ~7000-8700 cycles
  // in the epilogue at 128 heads).
  template <int g>
  __device__ void write_out(const float (&o)[128], const float (&denom)[2], const float (&m_fin)[2],
                            int b, bool whole, int partial, int r_lo, int lane) const {
    const float kNegInf = -__int_as_float(0x7f800000);
    const int row0 = mla_row_tile(p) * Tr::kRows;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int m = row0 + r_lo + 8 * x;
      const bool valid = m < p.rows_per_req;  // the same for the 4 lanes of a quad
      const bool any = cuda::row_has_keys(denom[x]);
      const float inv = any ? 1.f / denom[x] : 0.f;
      const float lse2 = any ? m_fin[x] + log2f(denom[x]) : kNegInf;
      const int token = b * p.s_q + m / p.num_heads;
      const int h = m % p.num_heads;
      if (whole) {
        auto* dst = static_cast<__nv_bfloat16*>(p.out) + token * p.o_stride_token +
                    h * p.o_stride_head + 256 * g;
        const float scale = inv * p.v_scale;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          uint32_t a[4];  // columns 8 (4 k + jj) + 2 (lane & 3), + 1
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const int j = 4 * k + jj;
            a[jj] =
                cuda::pack2<__nv_bfloat16>(o[4 * j + 2 * x] * scale, o[4 * j + 2 * x + 1] * scale);
          }
          quad_transpose(a, lane);  // on every lane (whole is uniform); the stores on valid rows
          if (valid)
            *reinterpret_cast<uint4*>(dst + 8 * (4 * k + (lane & 3))) =
                make_uint4(a[0], a[1], a[2], a[3]);
        }
        if (valid && p.lse != nullptr && g == 0 && (lane & 3) == 0) {
          p.lse[token * p.lse_stride_token + h] = any ? lse2 * cuda::kLn2 : kNegInf;
        }
      } else if (valid) {
        const int64_t prow = static_cast<int64_t>(partial) * p.rows_per_req + m;
        float* dst = p.partial_out + prow * kLatentDim + 256 * g + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(o[4 * j + 2 * x] * inv, o[4 * j + 2 * x + 1] * inv);
        }
        if (g == 0 && (lane & 3) == 0) p.partial_lse[prow] = lse2;
      }
    }
  }

  // Block n of a release group: blocks kb0 .. kb0 + 3, then (n == 4) the rope block 8.
  __device__ static constexpr int group_block(int kb0, int n) { return n == 4 ? 8 : kb0 + n; }
  // kConsumerTma with p.kv_tma_ok == 3: whether stage s's tile of the pair starting at tile a
  // (a + s) is loaded by TMA from the consumers at the previous pair's releases: the pair is not
  // the segment's first and the tile is a whole tile of the segment. The producer and both
  // consumers evaluate the same predicate.
  __device__ __forceinline__ bool consumer_refills(int a, int s, int t0, int t1, int kv_len) const {
    const int t = a + s;
    return p.kv_tma_ok == 3 && p.wgmma_diag == 0 && a != t0 && t < t1 &&
           (t + 1) * kBlockN <= kv_len;
  }
  // Whether tile t of the segment [.., t1) of a request of kv_len keys reaches shared memory by TMA
  // only (the producer's or the consumers' boxes: a whole tile, kTmaTiles with p.kv_tma_ok, no
  // diagnostic), so a wgmma may read it right after its block barrier: the async proxy wrote it.
  // Otherwise (cp.async, zero fill: generic-proxy writes) the reader fences first.
  __device__ __forceinline__ bool tma_only(int t, int t1, int kv_len) const {
    return kTmaTiles && p.kv_tma_ok != 0 && p.wgmma_diag == 0 && t < t1 &&
           (t + 1) * kBlockN <= kv_len;
  }
  // A consumer's release of the blocks group_block(kb0, n), n < nb, of stage s (kb0 0 / 4 with nb 4
  // or 5: blocks kb0 .. kb0 + 3 (+ the rope block 8); kb0 8 with nb 1: the rope block): with
  // first >= 0 (the next pair's tile of that stage is refilled by the consumers, its first pool
  // row) thread 0 issues the TMA boxes, each block's barrier receiving its 128 arrivals and the
  // box's bytes; else the 128 threads arrive on `empty_bar` for the producer. Called after the
  // consumer's last wgmma reading those blocks has completed (wait_group).
  __device__ __forceinline__ void release_group(uint32_t empty_bar, int s, int kb0, int nb,
                                                int first, int tid) const {
    using namespace sm90;
    if (!kConsumerTma || first < 0) {
      mbar_arrive(empty_bar);
      return;
    }
    if (tid == 0) {
      const uint32_t dst = sK(s);
#pragma unroll
      for (int n = 0; n < nb; ++n) {
        const int kb = group_block(kb0, n);
        mbar_arrive_expect_tx(block_full(s, kb), kBlockN * 128);
        tma_load_2d(dst + kb * kBlockN * 128, &p.kv_tma, 64 * kb, first, block_full(s, kb));
        mbar_arrive_cnt(block_full(s, kb), 127);
      }
    }
  }

  // ---- seesaw (kVariant 3; 6 without the phantom tile) ----
  // Producer: per pair of tiles (a, a + 1) the four release groups in the order they free up
  // (variant 8: first stage 1's rope block alone, empty_rope, then the groups with 4 blocks each
  // for stage 1):
  // stage 0 blocks 0-3 (empty(0)), stage 1 blocks 4-7 (empty(1)), stage 0 blocks 4-8
  // (empty_hi(0)), stage 1 blocks 0-3, 8 (empty_hi(1)).
  __device__ void producer_seesaw() const {
    using namespace sm90;
    const int tid = threadIdx.x;  // 0..127
    const auto* kvg = static_cast<const uint8_t*>(p.kv);
    int pc = 0, pc1 = 0, tcount = 0;  // pc1: pairs that use stage 1 (kSkipPhantom)
    int n_fill[2] = {0, 0};           // kConsumerTma: pairs whose stage s the producer filled
#if defined(ATTNKIT_MLA_TIMELINE)
    MlaTimeline tl(2, tid);
#endif
    for_each_segment(p, [&](int b, int kv_len, int t0, int t1, bool, int) {
      const int32_t* tok = page_table_row(b);
      ATTNKIT_MLA_TL(kTlSegHead, t0);
      load_q(b, tcount++);
      ATTNKIT_MLA_TL(kTlQIssued, t0);
      // K tiles: thread t copies key t / 2: of 64-column block kb the bf16 chunks 8 kb + 2 i + t %
      // 2, i in [0, 4) (copy_block_chunks), fp8 the raw chunks 4 kb + 2 i + t % 2, i in [0, 2)
      // (copy_fp8_raw).
      const int key = tid >> 1;
      // p.kv_tma_ok (bf16, pages of >= 64 tokens): whole tiles by TMA, one 64 x 64 box per block
      // issued by thread 0 (arrive.expect_tx), the other 127 threads arrive at once, so a block's
      // barrier sees the same 128 arrivals as from the cp.async path, which partial tiles keep.
      const bool tma = kTmaTiles && p.kv_tma_ok != 0;
      for (int a = t0; a < t1; a += 2, ++pc) {
        // kConsumerTma: stage s's tile of this pair is loaded by the consumers (consumer_refills)
        // when it is whole and the pair is not the segment's first; the producer then skips its
        // groups and the empty barriers of that stage see no phase for it, so each stage's
        // parity counts the pairs whose stage the producer fills (n_fill).
        const bool by_cons0 = kConsumerTma && consumer_refills(a, 0, t0, t1, kv_len);
        const bool by_cons1 = kConsumerTma && consumer_refills(a, 1, t0, t1, kv_len);
        // kSkipPhantom: an odd segment's last pair leaves stage 1 alone (no loads, no phase).
        const bool skip1 = kSkipPhantom && a + 1 >= t1;
        const uint32_t ph0 = ((kConsumerTma ? n_fill[0] : pc) & 1) ^ 1;
        const uint32_t ph1 = ((kConsumerTma ? n_fill[1] : kSkipPhantom ? pc1 : pc) & 1) ^ 1;
        if (!skip1) ++pc1;
        if (!by_cons0) ++n_fill[0];
        if (!skip1 && !by_cons1) ++n_fill[1];
        // A pair whose tiles the consumers refill (or skip): nothing to do here, not even the
        // page-table reads below (session 25).
        if (by_cons0 && (by_cons1 || skip1)) continue;
        // Tile a + 1 == t1 (odd segment): the phantom tile, zero-filled (and masked).
        const int j0 = a * kBlockN + key, j1 = j0 + kBlockN;
        const bool valid0 = j0 < kv_len, valid1 = a + 1 < t1 && j1 < kv_len;
        constexpr int kElemBytes = kFp8 ? 1 : 2;
        const uint8_t* row0 =
            kvg + (valid0 ? kv_slot<Tr::kPage>(tok, j0) : 0) * p.kv_stride_row * kElemBytes;
        const uint8_t* row1 =
            kvg + (valid1 ? kv_slot<Tr::kPage>(tok, j1) : 0) * p.kv_stride_row * kElemBytes;
        const bool load = !(p.wgmma_diag == 1 && pc >= 1);
        // kP1Buf: group -1 = stage 1's rope block (released right after S1), group 3 without it.
#pragma unroll 1
        for (int grp = kP1Buf ? -1 : 0; grp < 4; ++grp) {
          const int s = grp < 0 ? 1 : grp & 1;
          if (s == 1 && skip1) continue;
          if (s == 0 ? by_cons0 : by_cons1) continue;
          mbar_wait(grp < 0 ? empty_rope() : grp < 2 ? empty(s) : empty_hi(s), s ? ph1 : ph0);
          const int nb = grp < 0 ? 1 : grp < 2 || (kP1Buf && grp == 3) ? 4 : 5;
          const int kb0 = grp < 0 ? 8 : grp == 0 || grp == 3 ? 0 : 4;
          const uint32_t dst = sK(s);
          const bool valid = s ? valid1 : valid0;
          const uint8_t* row = s ? row1 : row0;
          if (kTmaTiles && tma && load && (s == 0 || a + 1 < t1) &&
              (a + s + 1) * kBlockN <= kv_len) {
            if (tid == 0) {
              const int first = static_cast<int>(kv_slot<Tr::kPage>(tok, (a + s) * kBlockN));
#pragma unroll 1
              for (int n = 0; n < nb; ++n) {
                const int kb = group_block(kb0, n);
                mbar_arrive_expect_tx(block_full(s, kb), kBlockN * 128);
                if (p.kv_tma_ok == 2)
                  tma_load_2d_hint(dst + kb * kBlockN * 128, &p.kv_tma, 64 * kb, first,
                                   block_full(s, kb), l2_evict_first_policy());
                else
                  tma_load_2d(dst + kb * kBlockN * 128, &p.kv_tma, 64 * kb, first,
                              block_full(s, kb));
              }
            } else {
#pragma unroll 1
              for (int n = 0; n < nb; ++n) mbar_arrive(block_full(s, group_block(kb0, n)));
            }
            continue;
          }
#pragma unroll 1
          for (int n = 0; n < nb; ++n) {
            const int kb = group_block(kb0, n);
            if constexpr (kFp8) {
              if (load) copy_fp8_raw(dst, key, kb, tid, row, kvg, valid);
              cp_async_arrive_noinc(raw_full(s, kb));
            } else {
              if (load) copy_block_chunks(dst, key, kb, tid, row, kvg, valid);
              cp_async_arrive_noinc(block_full(s, kb));
            }
          }
        }
        if (a == t0) ATTNKIT_MLA_TL(kTlFirstIssued, a);
      }
    });
#if defined(ATTNKIT_MLA_TIMELINE)
    tl.finish();
#endif
    cp_async_wait<0>();
  }

  // ---- fp8 cache (kFp8): raw loads, conversion by the consumers ----
  // Producer thread t copies the raw e4m3 bytes of key t / 2 of a block (fp8 chunks 4 kb + f, f =
  // 2 i + t % 2, i in [0, 2), 16 values each: the two threads of a key read one 32-byte sector per
  // instruction) by cp.async into the first of the two f16 chunks each becomes (chunk 8 kb + 2 f of
  // the stage; !valid: zero-filled), arriving on raw_full.
  __device__ __forceinline__ static void copy_fp8_raw(uint32_t dst, int key, int kb, int tid,
                                                      const uint8_t* row, const uint8_t* kvg,
                                                      bool valid) {
#pragma unroll
    for (int f = tid & 1; f < 4; f += 2) {
      sm90::cp_async_16(dst + sm90::swizzle_offset(kBlockN, key, 8 * kb + 2 * f),
                        valid ? row + (4 * kb + f) * 16 : kvg, valid ? 16 : 0);
    }
  }
  // Consumer thread c (0..127) of the warpgroup whose S reads block kb of the stage at dst: units
  // u = c and c + 128 (key u / 4, raw chunk f = u % 4) are read from chunk 8 kb + 2 f and written
  // as the f16 chunks 8 kb + 2 f and + 1 of the same key (no other thread touches them, so no
  // barrier before; both loads are issued first).
  __device__ __forceinline__ static void convert_fp8_block(uint32_t dst, int kb, int c) {
    uint4 r[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int u = c + 128 * i;
      const uint32_t a0 = dst + sm90::swizzle_offset(kBlockN, u >> 2, 8 * kb + 2 * (u & 3));
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[i].x), "=r"(r[i].y), "=r"(r[i].z), "=r"(r[i].w)
                   : "r"(a0)
                   : "memory");
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int u = c + 128 * i;
      const int key = u >> 2, ch = 8 * kb + 2 * (u & 3);
      uint32_t w[8];
      fp8x4_to_f16x4(r[i].x, w[0], w[1]);
      fp8x4_to_f16x4(r[i].y, w[2], w[3]);
      fp8x4_to_f16x4(r[i].z, w[4], w[5]);
      fp8x4_to_f16x4(r[i].w, w[6], w[7]);
      const uint32_t a0 = dst + sm90::swizzle_offset(kBlockN, key, ch);
      const uint32_t a1 = dst + sm90::swizzle_offset(kBlockN, key, ch + 1);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a0), "r"(w[0]), "r"(w[1]),
                   "r"(w[2]), "r"(w[3])
                   : "memory");
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a1), "r"(w[4]), "r"(w[5]),
                   "r"(w[6]), "r"(w[7])
                   : "memory");
    }
  }

  // kF16: Q [64 x 576] bf16 -> f16 x 2^-kQShiftF16 in place (elementwise, so the swizzle does not
  // matter; exact for |q| in [2^-6, 2^24)), consumer thread c (0..255 over both consumers) takes
  // 16-byte units c, c + 256, ...; then the generic -> async proxy fence and a named barrier over
  // both consumers (each S reads all of Q). After q_full; the producer writes Q again only after
  // both consumers' q_empty, which they arrive on once their last S of the segment has retired.
  __device__ __forceinline__ void convert_q_f16(int c) const {
    constexpr int kUnits = Tr::kQBytes / 16;
    static_assert(kUnits % 256 == 0, "Q units per consumer thread");
    auto* q = reinterpret_cast<uint4*>(smem + Tr::kQOffset);
#pragma unroll 6
    for (int u = c; u < kUnits; u += 256) {
      uint4 v = q[u];
      v.x = bf16x2_to_scaled_f16x2(v.x);
      v.y = bf16x2_to_scaled_f16x2(v.y);
      v.z = bf16x2_to_scaled_f16x2(v.z);
      v.w = bf16x2_to_scaled_f16x2(v.w);
      q[u] = v;
    }
    sm90::fence_proxy_async();
    named_bar_sync_any(kBarQCvt, 256);
  }

  // Consumer kS (the seesaw's consumer g multiplies stage g in S) before its S reads block kb of
  // stage kS: bf16: wait for block_full; kFp8: wait for the raw bytes, convert units c and c + 128
  // of the block (c = the consumer thread), fence, sync the warpgroup and announce the block on
  // block_full where the other consumer's P V reads it (stage 0 blocks 4-7: V0R of consumer 1;
  // stage 1 blocks 0-3: V1L of consumer 0; nobody waits for the others).
  template <int kS>
  __device__ __forceinline__ void acquire_s_block(int kb, uint32_t parity, bool tma) const {
    if constexpr (kFp8) {
      static_assert(kSeesaw && !kEarlyS, "consumer kS converts stage kS (variant 6)");
      sm90::mbar_wait(raw_full(kS, kb), parity);
      // Both timing diagnostics (noload, noconvert) skip the conversion.
      if (p.wgmma_diag == 0) convert_fp8_block(sK(kS), kb, threadIdx.x - 128 * (kS + 1));
      sm90::fence_proxy_async();
      named_bar_sync(kBarCvt + kS, 128);
      if (kS == 0 ? kb >= 4 && kb < 8 : kb < 4) sm90::mbar_arrive(block_full(kS, kb));
    } else {
      sm90::mbar_wait(block_full(kS, kb), parity);
      if (!tma) sm90::fence_proxy_async();  // cp.async (generic proxy) writes
    }
  }

  // The seesaw's Q rope block (columns 512-575) as this thread's wgmma A fragments, one [4] per
  // k-step (word q: rows r_lo + 8 (q & 1), columns 16 kk + 8 (q >> 1) + 2 (lane & 3) + [0, 2)),
  // loaded once per segment by ldmatrix (lane t addresses row t % 8 of matrix t / 8), so the
  // rope k-steps of S read A from registers (FlashMLA's rQ8): 8 KiB less shared-memory traffic
  // per S.
  // Called after the q_full wait, convert_q_f16's named barrier (f16) and the proxy fence: those
  // asm statements clobber memory, so the ldmatrix asm (volatile, no clobber) stays behind them.
  __device__ void load_q_rope(uint32_t (&rq)[4][4], int warp, int lane) const {
    const int row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      cuda::ldmatrix_x4(
          rq[kk], sQ() + 8 * Tr::kRows * 128 + sm90::swizzle_offset(64, row, 2 * kk + (lane >> 4)));
    }
  }
  // k-step kk of S (column block kb, compile-time after unrolling): the rope block's A from rq.
  __device__ __forceinline__ void s_kstep(float (&sacc)[32], const uint32_t (&rq)[4][4],
                                          uint64_t q_desc, uint64_t k_desc, int kb, int kk) const {
    const uint64_t kd = sm90::desc_advance(k_desc, kb * kBlockN * 128 + (kk % 4) * 32);
    if (kb == Tr::kColBlocks - 1) {
      sm90::wgmma_rs<64, kBf16Mma, 0>(sacc, rq[kk % 4], kd, kk > 0 ? 1 : 0);
    } else {
      sm90::wgmma_ss<64, kBf16Mma, 0>(
          sacc, sm90::desc_advance(q_desc, kb * Tr::kRows * 128 + (kk % 4) * 32), kd,
          kk > 0 ? 1 : 0);
    }
  }

  // S = Q K^T of stage kS in seesaw_block order; the first block was waited for by the caller.
  template <int kS>
  __device__ void issue_s_seesaw(float (&sacc)[32], const uint32_t (&rq)[4][4], uint32_t parity,
                                 bool tma) const {
    const uint64_t q_desc = sm90::make_desc(sQ(), 16, 1024);
    const uint64_t k_desc = sm90::make_desc(sK(kS), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) {
      const int kb = seesaw_block(kS, kk / 4);
      if (kk % 4 == 0 && kk > 0) {
        acquire_s_block<kS>(kb, parity, tma);
        sm90::wgmma_fence();
      }
      s_kstep(sacc, rq, q_desc, k_desc, kb, kk);
    }
  }

  // kEarlyS: the k-steps of stage kS's blocks at seesaw positions [kN0, kN1), each block waited
  // for here (the first k-step overwrites sacc when kN0 == 0).
  // The base addresses pass through an empty asm so that ptxas does not share (and keep live
  // across the loop: 144 B of spills) the descriptors of the three call sites.
  template <int kS, int kN0, int kN1>
  __device__ void issue_s_blocks(float (&sacc)[32], const uint32_t (&rq)[4][4], uint32_t parity,
                                 bool tma) const {
    uint32_t q_base = sQ(), k_base = sK(kS);
    asm volatile("" : "+r"(q_base), "+r"(k_base));
    const uint64_t q_desc = sm90::make_desc(q_base, 16, 1024);
    const uint64_t k_desc = sm90::make_desc(k_base, 16, 1024);
#pragma unroll
    for (int kk = 4 * kN0; kk < 4 * kN1; ++kk) {
      const int kb = seesaw_block(kS, kk / 4);
      if (kk % 4 == 0) {
        acquire_s_block<kS>(kb, parity, tma);
        sm90::wgmma_fence();
      }
      s_kstep(sacc, rq, q_desc, k_desc, kb, kk);
    }
  }

  // Writes this thread's share of P (sacc scaled by f[row], bf16; f16 with an fp8 cache) into the P
  // block at shared address p_addr (one 128-byte swizzle block, K-major) by stmatrix: per k-step kk
  // the four 8 x 8 matrices of the A-fragment words (kk, q) = rows r_lo + 8 (q & 1), keys 16 kk +
  // 8 (q >> 1) + 2 (lane & 3) + [0, 2); lane t addresses row t % 8 of matrix q = t / 8.
  __device__ void store_p(uint32_t p_addr, const float (&sacc)[32], const float (&f)[2], int warp,
                          int lane) const {
    const int row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = 2 * kk + (q >> 1);
        const int x = q & 1;
        w[q] = pack_p(sacc[4 * j + 2 * x] * f[x], sacc[4 * j + 2 * x + 1] * f[x]);
      }
      sm90::stmatrix_x4(p_addr + sm90::swizzle_offset(64, row, 2 * kk + (lane >> 4)), w);
    }
  }

  // The seesaw's hand-over of a running max: rows r_lo, r_lo + 8's max m and rescale factor sc
  // into m_sh / sc_sh (one thread of each row's quad), then an arrive on named barrier `bar` for
  // the other consumer's sync.
  __device__ __forceinline__ static void publish_max(float* m_sh, float* sc_sh, const float (&m)[2],
                                                     const float (&sc)[2], int r_lo, int lane,
                                                     int bar) {
    if ((lane & 3) == 0) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        m_sh[r_lo + 8 * x] = m[x];
        sc_sh[r_lo + 8 * x] = sc[x];
      }
    }
    named_bar_arrive(bar, 256);
  }

  template <int g>
  __device__ void consumer_seesaw() const {
    using namespace sm90;
    const int tid = threadIdx.x - 128 * (g + 1);
    const int warp = tid >> 5, lane = tid & 31;
    const int r_lo = 16 * warp + (lane >> 2);
    const float kNegInf = -__int_as_float(0x7f800000);
    auto* x_sh = reinterpret_cast<float*>(smem + (kP1Buf ? Tr::kX2Offset : Tr::kXOffset));
    float* m0_sh = x_sh;  // m after tile a (consumer 0)
    float* sc0_sh = x_sh + Tr::kRows;
    float* m1_sh = x_sh + 2 * Tr::kRows;  // m after tile a + 1 (consumer 1)
    float* sc1_sh = x_sh + 3 * Tr::kRows;
    auto* l_sh = reinterpret_cast<float*>(smem + Tr::kLOffset);
    const int row0 = mla_row_tile(p) * Tr::kRows;
#if defined(ATTNKIT_MLA_TIMELINE)
    MlaTimeline tl(g, tid);
#endif
    int pc = 0, pc1 = 0, tcount = 0;  // pc1: pairs that use stage 1 (kSkipPhantom)
    for_each_segment(p, [&](int b, int kv_len, int t0, int t1, bool whole, int partial) {
      [[maybe_unused]] const int32_t* tok = page_table_row(b);
      ATTNKIT_MLA_TL(kTlSegHead, t0);
      int limit[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int m = row0 + r_lo + 8 * x;
        const int i = m < p.rows_per_req ? m / p.num_heads : p.s_q - 1;
        const int lim = kv_len - (p.s_q - 1 - i);
        limit[x] = lim < t1 * kBlockN ? lim : t1 * kBlockN;  // masks the phantom tile
      }
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.f;
      float l[2] = {0.f, 0.f};
      float m_prev[2] = {kNegInf, kNegInf};  // the running max before the pair (after: m1)
      float sacc[32];
      uint32_t pa[4][4];

      mbar_wait(q_full(), tcount & 1);
      ATTNKIT_MLA_TL(kTlQIn, t0);
      if constexpr (kF16) convert_q_f16(tid + 128 * g);
      fence_proxy_async();
      uint32_t rq[4][4];
      load_q_rope(rq, warp, lane);
      ATTNKIT_MLA_TL(kTlGlobalStart, t0);
      ATTNKIT_MLA_TL(kTlSegment, t0);

      // kConsumerTma: the first pool rows of pair (a + 2, a + 3)'s tiles that the releases of
      // pair a refill by TMA (read at the start of pair a, used at the releases; -1: the
      // producer refills; only thread 0 issues, the others keep 0).
      auto next_firsts = [&](int a, int(&nfirst)[2]) {
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          nfirst[st] = -1;
          if (kConsumerTma && consumer_refills(a + 2, st, t0, t1, kv_len))
            nfirst[st] =
                tid == 0 ? static_cast<int>(kv_slot<Tr::kPage>(tok, (a + 2 + st) * kBlockN)) : 0;
        }
      };
      // One pair (a, a + 1). kPh (kSkipPhantom only): tile a + 1 is the phantom of an odd segment
      // and stage 1 is not used; a compile-time copy of the body, so no run-time branch sits
      // around a wgmma. par0 / par1: the barrier parities of stages 0 / 1 in this pair.
      // kEarlyS: consumer 0's S0 of the pair is in flight at entry, its P1 V1L at exit (the
      // caller issues the next S0, then retires it and releases stage 1 blocks 0-3, 8 with the
      // returned first pool row of the next pair's stage-1 tile, as release_group takes it).
      auto pair = [&](int a, uint32_t par0, uint32_t par1, auto phantom) {
        constexpr bool kPh = decltype(phantom)::value;
        [[maybe_unused]] const uint32_t par = g == 0 ? par0 : par1;
        const int tile = a + g;
        [[maybe_unused]] const bool tma_own = tma_only(tile, t1, kv_len);
        ATTNKIT_MLA_TL(kTlPair, a);
        int nfirst[2];
        next_firsts(a, nfirst);
        float mx[2] = {kNegInf, kNegInf};
        const float scale = qk_scale_log2(p, kF16);
        if constexpr (!(kPh && g == 1)) {
          if constexpr (!(kEarlyS && g == 0)) {  // kEarlyS: consumer 0's S0 is in flight
            acquire_s_block<g>(seesaw_block(g, 0), par, tma_own);
            wgmma_fence();
            issue_s_seesaw<g>(sacc, rq, par, tma_own);
            wgmma_commit();
            ATTNKIT_MLA_TL(kTlSIssued, a);
          }
          wgmma_wait<0>();
          fence_regs(sacc);
          fence_regs(o);
          ATTNKIT_MLA_TL(kTlSDone, a);
          if constexpr (kP1Buf && g == 1) {
            // Stage 1's rope block: read by S1 only (P1 lives in the P buffer).
            release_group(empty_rope(), 1, 8, 1, nfirst[1], tid);
          }
          // Raw scores; the scale (> 0: scaling and k_scale are checked positive) multiplies
          // the row max once and folds into the exp2's FMA. Only a tile that reaches one of this
          // thread's row limits (the last tiles of a request, s_q > 1 rows, the phantom) sets its
          // keys past the limit to -inf; the other tiles skip the compare and select.
          if ((tile + 1) * kBlockN > (limit[0] < limit[1] ? limit[0] : limit[1])) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int key = tile * kBlockN + 8 * j + 2 * (lane & 3) + (e & 1);
                if (key >= limit[e >> 1]) sacc[4 * j + e] = kNegInf;
              }
            }
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sacc[4 * j + e]);
          }
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
            mx[x] *= scale;  // -inf stays -inf
          }
        }
        // The segment's last pair: this consumer's last read of Q (its S; none in a phantom pair
        // for consumer 1) has retired, so the producer may load the next segment's Q while this
        // pair's softmax and P V and the epilogue run (session 25: before, Q was released after
        // the epilogue's row-sum exchange and the next segment's first S waited ~10 us for it).
        if (a + 2 >= t1) {
          mbar_arrive(q_empty());
          ATTNKIT_MLA_TL(kTlQFree, a);
        }
        float m_ref[2], sc[2], m_use[2], sum[2] = {0.f, 0.f};
        [[maybe_unused]] float sc_other[2];  // consumer 1: scale0
        if constexpr (g == 0) {
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const float m_new = fmaxf(m_prev[x], mx[x]);
            m_use[x] = m_new == kNegInf ? 0.f : m_new;
            sc[x] = exp2_approx(m_prev[x] - m_use[x]);  // scale0
            m_ref[x] = m_new;
          }
          publish_max(m0_sh, sc0_sh, m_ref, sc, r_lo, lane, kBarM0);
          ATTNKIT_MLA_TL(kTlMaxOut, a);
        } else {
          named_bar_sync(kBarM0, 256);
          ATTNKIT_MLA_TL(kTlMaxIn, a);
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const float m0 = m0_sh[r_lo + 8 * x];
            sc_other[x] = sc0_sh[r_lo + 8 * x];
            const float m_new = fmaxf(m0, mx[x]);  // kPh: mx = -inf, m1 = m0
            m_use[x] = m_new == kNegInf ? 0.f : m_new;
            sc[x] = kPh ? 1.f : exp2_approx(m0 - m_use[x]);  // scale1
            m_ref[x] = m_new;
          }
          if constexpr (!kPh) {
            // m1 / scale1 for consumer 0 before the exponentials: its P0 (frame m1) is stored
            // while this consumer computes and stores P1.
            publish_max(m1_sh, sc1_sh, m_ref, sc, r_lo, lane, kBarSc1);
            ATTNKIT_MLA_TL(kTlMaxOut, a);
          }
        }
        if constexpr (!(kPh && g == 1)) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              sacc[4 * j + e] = exp2_approx(fmaf(sacc[4 * j + e], scale, -m_use[e >> 1]));
              sum[e >> 1] += sacc[4 * j + e];
            }
            pa[j >> 1][2 * (j & 1) + 0] = pack_p(sacc[4 * j], sacc[4 * j + 1]);
            pa[j >> 1][2 * (j & 1) + 1] = pack_p(sacc[4 * j + 2], sacc[4 * j + 3]);
          }
        }
        if constexpr (g == 0) {
          // O_L = O_L scale0 + P0 V0L
          rescale_o_l(o, l, sc, sum);
          wgmma_fence();
          issue_pv(o, pa, 0, 0);
          wgmma_commit();
          ATTNKIT_MLA_TL(kTlOwnPvIssued, a);
          // P0 V0L retired: stage 0 blocks 0-3 go back.
          auto retire_own_pv = [&] {
            wgmma_wait<0>();
            fence_regs(o);
            release_group(empty(0), 0, 0, 4, nfirst[0], tid);
            ATTNKIT_MLA_TL(kTlOwnPvDone, a);
          };
          // kEarlyP0: the hand-over below runs while P0 V0L does (it reads pa and V0L and
          // accumulates into o; nothing before its wait touches them), so consumer 1's (P0
          // scale1) V0R no longer waits for P0 V0L to retire.
          if constexpr (!kEarlyP0) retire_own_pv();
          float sc1[2];
          if constexpr (kPh) {
            // No P1: scale1 = 1, m1 = m0. Every warp of this consumer is done with S0 before
            // P0 overwrites stage 0's rope block (in a full pair the kBarSc1 sync orders it).
            named_bar_sync(kBarC0, 128);
#pragma unroll
            for (int x = 0; x < 2; ++x) {
              sc1[x] = 1.f;
              m_prev[x] = m_ref[x];
            }
          } else {
            // Every warp of this consumer is past S0 here too (the barrier's 128 threads of
            // this consumer), so P0 may overwrite stage 0's rope block.
            named_bar_sync(kBarSc1, 256);
            ATTNKIT_MLA_TL(kTlMaxIn, a);
#pragma unroll
            for (int x = 0; x < 2; ++x) {
              sc1[x] = sc1_sh[r_lo + 8 * x];
              m_prev[x] = m1_sh[r_lo + 8 * x];
            }
          }
          // P0 scale1 (frame m1) for consumer 1, in stage 0's rope block (S0 read it, done; P0
          // V0L reads stage 0's blocks 0-3 only).
          store_p(sP(0), sacc, sc1, warp, lane);
          fence_proxy_async();
          named_bar_arrive(kBarP0, 256);
          ATTNKIT_MLA_TL(kTlPStored, a);
          if constexpr (kEarlyP0) retire_own_pv();
          if constexpr (!kPh) {
            rescale_o_l(o, l, sc1);
            named_bar_sync(kBarP1, 256);  // P1 stored
            ATTNKIT_MLA_TL(kTlPIn, a);
            wait_tile(1, par1, 0, 4);  // V1L
            if (!tma_only(a + 1, t1, kv_len)) fence_proxy_async();
            wgmma_fence();
            issue_pv_smem_p_at(o, kP1Buf ? base + Tr::kPOffset : sP(1), 1, 0);
            wgmma_commit();
            ATTNKIT_MLA_TL(kTlOtherPvIssued, a);
            if constexpr (!kEarlyS) {
              wgmma_wait<0>();
              fence_regs(o);
              release_group(empty_hi(1), 1, 0, kNb1Lo, nfirst[1], tid);  // stage 1 0-3, 8 (P1)
              ATTNKIT_MLA_TL(kTlRetired, a);
            }
          }
        } else {
          if constexpr (!kPh) {
            // P1 (frame m1) for consumer 0, in stage 1's rope block (kP1Buf: the P buffer).
            const float one[2] = {1.f, 1.f};
            store_p(kP1Buf ? base + Tr::kPOffset : sP(1), sacc, one, warp, lane);
            fence_proxy_async();
            named_bar_arrive(kBarP1, 256);
            ATTNKIT_MLA_TL(kTlPStored, a);
          }
          float f[2];
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            f[x] = sc_other[x] * sc[x];
            m_prev[x] = m_ref[x];
          }
          rescale_o_l(o, l, f, sum);
          // O_R += P1 V1R, then += (P0 scale1) V0R: both in frame m1, no wait in between.
          if constexpr (!kPh) {
            wgmma_fence();
            issue_pv(o, pa, 1, 1);
            wgmma_commit();
            ATTNKIT_MLA_TL(kTlOwnPvIssued, a);
          }
          named_bar_sync(kBarP0, 256);
          ATTNKIT_MLA_TL(kTlPIn, a);
          wait_tile(0, par0, 4, 8);
          if (!tma_only(a, t1, kv_len)) fence_proxy_async();
          wgmma_fence();
          issue_pv_smem_p_at(o, sP(0), 0, 1);
          wgmma_commit();
          ATTNKIT_MLA_TL(kTlOtherPvIssued, a);
          if constexpr (!kPh) {
            wgmma_wait<1>();
            release_group(empty(1), 1, 4, 4, nfirst[1], tid);  // stage 1 blocks 4-7
          }
          wgmma_wait<0>();
          fence_regs(o);
          release_group(empty_hi(0), 0, 4, 5, nfirst[0], tid);  // stage 0 blocks 4-8 (P0)
          ATTNKIT_MLA_TL(kTlRetired, a);
        }
        return nfirst[1];  // kEarlyS: consumer 0 releases stage 1 blocks 0-3, 8 after the pair
      };
      if constexpr (kEarlyS) {
        // Every path that leaves the next S0 in flight goes straight (continue) to a pair body,
        // which starts with wait_group<0>: no correlated branches for ptxas (C7515).
        if constexpr (g == 0) {  // the segment's first S0
          issue_s_blocks<0, 0, 9>(sacc, rq, pc & 1, tma_only(t0, t1, kv_len));
          wgmma_commit();
          ATTNKIT_MLA_TL(kTlSIssued, t0);
        }
        int a = t0;
        for (;;) {
          if (a + 1 >= t1) {  // odd segment: the last tile alone
            pair(a, pc & 1, pc1 & 1, std::true_type{});
            ++pc;
            break;
          }
          const int nf1 = pair(a, pc & 1, pc1 & 1, std::false_type{});
          if (a + 2 < t1) {
            if constexpr (g == 0) {
              // The next pair's S0 behind P1 V1L: stage 0 blocks 0-3 (released after P0 V0L),
              // then P1 V1L retired and released, then blocks 4-8.
              const bool tma_next = tma_only(a + 2, t1, kv_len);
              issue_s_blocks<0, 0, 4>(sacc, rq, (pc & 1) ^ 1, tma_next);
              wgmma_commit();
              ATTNKIT_MLA_TL(kTlEarlyLo, a + 2);
              wgmma_wait<1>();  // P1 V1L (o is next touched after the next pair's wait<0>)
              release_group(empty_hi(1), 1, 0, kNb1Lo, nf1, tid);  // stage 1 0-3, 8 (P1)
              ATTNKIT_MLA_TL(kTlRetired, a);
              issue_s_blocks<0, 4, 9>(sacc, rq, (pc & 1) ^ 1, tma_next);
              wgmma_commit();
              ATTNKIT_MLA_TL(kTlEarlyHi, a + 2);
            }
            a += 2, ++pc, ++pc1;
            continue;
          }
          if constexpr (g == 0) {
            wgmma_wait<0>();
            fence_regs(o);
            release_group(empty_hi(1), 1, 0, kNb1Lo, nf1, tid);  // stage 1 0-3, 8 (P1)
          }
          ++pc, ++pc1;
          break;
        }
      } else if constexpr (kSkipPhantom) {
        int a = t0;
        for (; a + 1 < t1; a += 2, ++pc, ++pc1) pair(a, pc & 1, pc1 & 1, std::false_type{});
        if (a < t1) {  // odd segment: the last tile alone
          pair(a, pc & 1, pc1 & 1, std::true_type{});
          ++pc;
        }
      } else {
        for (int a = t0; a < t1; a += 2, ++pc) pair(a, pc & 1, pc & 1, std::false_type{});
      }

      // ---- epilogue (as consumer()): total row sums; the final max is m_prev ----
      // (Q went back to the producer in the segment's last pair.)
      publish_row_sums<g>(l, l_sh, r_lo, lane);
      ATTNKIT_MLA_TL(kTlRowSums, t1);
      float denom[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) denom[x] = l_sh[r_lo + 8 * x] + l_sh[Tr::kRows + r_lo + 8 * x];
      ++tcount;
      write_out<g>(o, denom, m_prev, b, whole, partial, r_lo, lane);
      ATTNKIT_MLA_TL(kTlSegmentEnd, t1);
      ATTNKIT_MLA_TL(kTlGlobalEnd, t1);
    });
#if defined(ATTNKIT_MLA_TIMELINE)
    tl.finish();
#endif
  }
};

// grid: (num_parts, ceil(rows_per_req / 64)), or the two swapped with p.grid_rows_fastest (the
// default for this kernel: decode_grid; mla_part / mla_row_tile read either), block 384, dynamic
// smem Tr::kSmemBytes.
template <int kPage, int kVariant = 3, bool kFp8 = false>
__global__ void __launch_bounds__(384, 1)
    mla_decode_wgmma_kernel(const __grid_constant__ MlaDecodeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = MlaWgmmaTraits<kPage>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = sm90::smem_addr(smem_raw);
  uint8_t* smem = smem_raw + ((Tr::kAlign - raw % Tr::kAlign) % Tr::kAlign);
  using Cta = MlaWgmmaCta<Tr, kVariant, kFp8>;
  Cta cta{p, smem, sm90::smem_addr(smem)};
  if (threadIdx.x == 0) {
    sm90::mbar_init(cta.q_full(), 128);
    sm90::mbar_init(cta.q_empty(), 256);
    for (int s = 0; s < 2; ++s) {
      sm90::mbar_init(cta.full(s), 128);
      sm90::mbar_init(cta.empty(s), Cta::kSplitRelease ? 128 : 256);
      sm90::mbar_init(cta.empty_hi(s), 128);
      if (Cta::kP1Buf && s == 0) sm90::mbar_init(cta.empty_rope(), 128);  // kVariant 8 only
      for (int kb = 0; kb < Tr::kColBlocks; ++kb) {
        // bf16: the 128 producer threads' cp.async arrivals (fp8: raw_full); fp8 block_full:
        // the 128 threads of the consumer that converted the block.
        sm90::mbar_init(cta.block_full(s, kb), 128);
        if constexpr (Cta::kFp8) sm90::mbar_init(cta.raw_full(s, kb), 128);
      }
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    if constexpr (Cta::kSeesaw) {
      cta.producer_seesaw();
    } else {
      cta.producer();
    }
  } else if (wg == 1) {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    if constexpr (Cta::kSeesaw) {
      cta.template consumer_seesaw<0>();
    } else {
      cta.template consumer<0>();
    }
  } else {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    if constexpr (Cta::kSeesaw) {
      cta.template consumer_seesaw<1>();
    } else {
      cta.template consumer<1>();
    }
  }
#endif
}

}  // namespace attnkit::mla
