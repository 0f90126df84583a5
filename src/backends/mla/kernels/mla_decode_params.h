// Parameters and plan layout of the shared tensor-core MLA decode kernel family (used by the
// `flashmla` (page 64), `cutlass_mla` (page 128) and `flashinfer` (page 1) backends). One POD
// passed as `const __grid_constant__`, shared by the host engine (plain C++) and the kernels.
//
// Absorbed MLA decode is MQA with up to 128 query heads over one latent KV head: every query row
// is [kRowDim] = 512 latent + 64 rope, every pool row the same, V = the first kLatentDim columns.
// A request contributes rows_per_req = s_q * num_heads query rows (row m: token m / num_heads,
// head m % num_heads); query token i of s_q sees the keys [0, kv_len - (s_q - 1 - i)).
#pragma once

#include <cstdint>

#include "cuda/common/tma_map.h"

namespace attnkit::mla {

inline constexpr int kLatentDim = 512;  // kv_lora_rank: V is the first kLatentDim columns
inline constexpr int kRopeDim = 64;     // qk_rope_head_dim
inline constexpr int kRowDim = kLatentDim + kRopeDim;
inline constexpr int kBlockN = 64;  // keys per tile
// Scheduler cost of starting one request segment (Q load, pipeline fill, epilogue), in tiles.
inline constexpr int kFixedOverheadTiles = 5;
// Words per CTA-part in the schedule: begin_req, begin_tile, end_req, end_tile (exclusive),
// split index of the first segment.
inline constexpr int kSchedWords = 5;

// The f16 paths scale Q by 2^-kQShiftF16 (exact) so that |q| up to 2^24 stays finite; the
// softmax scale takes the 2^kQShiftF16 back (qk_scale_log2; the engine checks that it stays
// finite).
inline constexpr int kQShiftF16 = 8;

// Whether wgmma variant v (ATTNKIT_MLA_WGMMA_BLOCKS; MlaDecodeParams::use_wgmma = v + 1) runs the
// seesaw schedule (mla_decode_wgmma.cuh kSeesaw; the host's K-TMA eligibility).
constexpr bool mla_seesaw_variant(int v) { return v == 3 || v >= 6; }
// Whether a tile's 64 keys are 64 consecutive pool rows of a bf16 cache, so that whole tiles may
// come by TMA boxes (the wgmma kernel's kTmaTiles; the host's K-TMA eligibility).
constexpr bool mla_tma_tiles(int page_size, bool fp8) { return !fp8 && page_size % kBlockN == 0; }

struct MlaDecodeParams {
  const void* q = nullptr;  // [T, H, kRowDim] bf16; token of (request b, query i) = b * s_q + i
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;  // [T, H, kLatentDim] bf16
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;  // [T, H] natural log, optional
  int64_t lse_stride_token = 0;

  const void* kv = nullptr;               // [rows, kRowDim] pool layer (bf16 or fp8_e4m3)
  int64_t kv_stride_row = 0;              // elements
  const int32_t* req_to_token = nullptr;  // [max_reqs + 1, max_context_len]
  int64_t req_to_token_stride = 0;
  const int32_t* req_pool_indices = nullptr;  // [bs]
  const int32_t* seq_lens = nullptr;          // [bs]
  int kv_len_extra = 0;  // kv_len(b) = seq_lens[b] + kv_len_extra (verify: the N drafts)

  int bs = 0;
  int s_q = 1;
  int num_heads = 0;
  int rows_per_req = 0;    // s_q * num_heads
  float scale_log2 = 0.f;  // scaling * k_scale * log2(e)
  float v_scale = 1.f;     // applied to the output (fp8: k_scale, V shares the K row)
  // 1: 64-row tiles with a bf16 cache run the sm_90a wgmma kernel (mla_decode_wgmma.cuh) instead
  // of the mma.sync one; set by the engine only where that kernel is compiled and the device is
  // SM90 (ATTNKIT_MLA_WGMMA=0 turns it off) with one full barrier per K tile
  // (ATTNKIT_MLA_WGMMA_BLOCKS=0); 2 (ATTNKIT_MLA_WGMMA_BLOCKS=1): one full barrier per 64-column
  // block of a K tile; 3 (ATTNKIT_MLA_WGMMA_BLOCKS=2): 2 + split release; 4
  // (ATTNKIT_MLA_WGMMA_BLOCKS=3): the seesaw schedule (mla_decode_wgmma.cuh, kVariant); 7
  // (ATTNKIT_MLA_WGMMA_BLOCKS=6, session 10; H200 session 11: +4.5-6% over 4): the seesaw
  // without the phantom tile of odd segments (kVariant 6); 8 (ATTNKIT_MLA_WGMMA_BLOCKS=7): 7 +
  // consumer 0 issues the next pair's S0 behind P1 V1L (kVariant 7); 9 (ATTNKIT_MLA_WGMMA_BLOCKS=8,
  // likewise): 8 + P1 in its own buffer, stage 1's rope block released after S1 (kVariant 8).
  // ATTNKIT_MLA_WGMMA_BLOCKS unset: 1 + default_wgmma_variant (mla_decode.h), i.e. 7 or 9.
  int use_wgmma = 0;
  // Diagnostics, timing only (results are wrong): 1 (ATTNKIT_MLA_WGMMA_DIAG=noload) the wgmma
  // kernel's producer stops loading K tiles after the first two, the mma.sync kernel after its
  // prologue (the fp8 wgmma kernel's consumers also skip the conversion, as the producer's
  // converters did in session 14); 2 (=noconvert) the fp8 wgmma kernel loads the raw tiles but
  // does not convert them (every wait and arrival kept).
  int wgmma_diag = 0;
  // mma.sync kernel: read the page table one tile ahead of the cp.async that needs it. 0 off (the
  // session-7 loader), 1 on for every tile size, 2 (default) per tile size and page (resolved to
  // 0 / 1 / 3 by resolve_prefetch in mla_decode_launch.cuh), 3 16-row tiles read the page table
  // through a shared-memory ring (MlaDecodeTraits::kPtSmem; the default for page 64 since the
  // session-8 A/B). ATTNKIT_MLA_MMA_PREFETCH "0" / "1" / unset / "smem".
  int mma_prefetch = 2;
  // fp8 cache, 64-row tiles on SM90 with use_wgmma: the wgmma kernel, the consumers converting
  // (mla_decode_wgmma.cuh kFp8); 0 (ATTNKIT_MLA_WGMMA_FP8=0): the mma.sync kernel.
  int wgmma_fp8 = 1;
  // fp8 cache, 16-row tiles: f16 tensor-core inputs (MlaDecodeTraits::kF16) instead of bf16.
  // Default 1; ATTNKIT_MLA_FP8_F16=0 keeps bf16.
  int mma_fp8_f16 = 1;

  // 1: run_decode launches no combine kernel: the host schedule splits no request, so the decode
  // kernel has written every output and LSE (eager plans with seq_lens_host; the default since
  // session 9, ATTNKIT_MLA_COMBINE_SKIP=0 launches it always). Graph plans always launch it.
  int skip_combine = 0;

  // Launch order of the decode grid: 0 (ATTNKIT_MLA_GRID_ORDER=parts) grid (num_parts, row
  // tiles), the parts of one row tile adjacent; 1 (=rows) grid (row tiles, num_parts), the row
  // tiles of one part (which stream the same keys) adjacent in launch order; 2 (default, auto)
  // resolved at the launch (decode_grid_order): rows for the wgmma kernel (2026-11-24 session 21,
  // 128 heads bf16: H200 1.5-3% faster, H100 10-15%; fp8 the same), parts for the mma.sync
  // kernels (not measured). mla_part() / mla_row_tile() read the CTA's indices either way.
  int grid_rows_fastest = 2;
  // 1 (ATTNKIT_MLA_K_TMA=1): kv_tma is the bf16 pool as a 2D map {kRowDim, pool rows}, box 64 x
  // 64, 128-byte swizzle, and the wgmma seesaw loads whole K tiles with it (pages of >= 64
  // tokens: one box per 64-column block, issued by one producer thread; partial tiles by cp.async
  // as before); 2 (=evict_first): the boxes with an L2 evict-first policy; 3 (default, unset /
  // =consumer): a segment's later whole tiles issued by the consumer thread that releases each
  // group (seesaw variants 3 / 6 / 7 / 8; kConsumerTma), its first pair's by the
  // producer. Set by the engine; 0 (=0) keeps every tile on cp.async.
  int kv_tma_ok = 0;
  cuda::TmaDesc kv_tma;
  // 1 (default where it applies; ATTNKIT_MLA_Q_TMA=0 keeps cp.async): q_tma is q as a 2D map
  // {kRowDim, tokens x heads} (q dense, rows_per_req a multiple of 64), box 64 x 64, 128-byte
  // swizzle, and the wgmma kernel's producer loads each 64-row Q tile as nine boxes issued by one
  // thread (session 26: the 128 threads' 36 cp.async each took ~9700 cycles to issue at a
  // segment boundary, H200 timeline). Set by the engine; 0: cp.async.
  int q_tma_ok = 0;
  cuda::TmaDesc q_tma;

  // Plan (written on the device by the schedule kernel once per forward).
  const int32_t* sched = nullptr;  // [num_parts, kSchedWords]
  const int32_t* split_indptr =
      nullptr;                   // [bs + 1] segments of request b: [indptr[b], indptr[b+1])
  float* partial_out = nullptr;  // [bs + num_parts, rows_per_req, kLatentDim] normalised
  float* partial_lse = nullptr;  // [bs + num_parts, rows_per_req] log2 domain
  int num_parts = 1;
};

}  // namespace attnkit::mla
