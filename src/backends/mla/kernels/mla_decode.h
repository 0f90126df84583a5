// Host-facing entry points of the shared MLA decode kernel family (no CUDA types). The page
// sizes compiled in are kMlaPageSizes; each page size is its own translation unit
// (mla_decode_page<P>.cu) instantiating the row tiles (16/32/64 query rows) x {bf16, fp8_e4m3}.
#pragma once

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/mla/kernels/mla_decode_params.h"
#include "cuda/common/dispatch.h"

namespace attnkit::mla {

using MlaPageSizes = ValueList<1, 64, 128>;

// Query rows per CTA for rows_per_req = s_q * heads rows: 16, 32 or 64.
//   16 heads, s_q 1 -> 16 (one row tile); 16 heads, s_q 2 -> 32; 128 heads -> 64 (2 tiles).
inline int rows_per_cta(int rows_per_req) {
  if (rows_per_req <= 16) return 16;
  if (rows_per_req <= 32) return 32;
  return 64;
}
// Whether run_decode sends an fp8_e4m3 cache to the sm_90a wgmma kernel (mla_decode_wgmma.cuh
// kFp8): 64-row tiles, the wgmma kernel enabled (p.use_wgmma), not
// ATTNKIT_MLA_WGMMA_FP8=0 (p.wgmma_fp8), and not page 1 (flashinfer's MLA has no fp8 cache, so
// that instantiation is not compiled). The launcher and MlaDecodeStats::wgmma_fp8_runs use it.
inline bool fp8_on_wgmma(const MlaDecodeParams& p, int page_size) {
  return page_size != 1 && p.use_wgmma != 0 && p.wgmma_fp8 != 0 &&
         rows_per_cta(p.rows_per_req) == 64;
}
// Whether run_decode launches the sm_90a wgmma kernel: fp8 as fp8_on_wgmma, bf16 where the kernel
// is enabled (p.use_wgmma) and the tiles have 64 rows.
inline bool runs_wgmma(const MlaDecodeParams& p, int page_size, bool fp8) {
  return fp8 ? fp8_on_wgmma(p, page_size) : p.use_wgmma != 0 && rows_per_cta(p.rows_per_req) == 64;
}
// The wgmma kernel's variant (mla_decode_wgmma.cuh kVariant) when ATTNKIT_MLA_WGMMA_BLOCKS is
// unset: 8 (the next pair's S0 issued behind P1 V1L, P1 in its own buffer so that stage 1's rope
// block is refilled right after S1) when a request's rows fill two or more 64-row tiles (128 heads:
// each K tile read by two or more CTAs) and its whole tiles are refilled by the consumers' TMA
// (consumer_tma: MlaDecodeParams::kv_tma_ok 3 applies; with the producer's loads variant 7 was
// no faster, sessions 11 and 22), else 6. Session 26, b128 page 64, 128 heads bf16, three
// alternated rounds, ms: H200 (03:11Z) v8 / auto (then 6 at s_q 1, 7 at s_q 2) / v7: kv 4k s_q 1
// 0.2513-0.2521 / 0.2620-0.2634 / 0.2528-0.2562, kv 8k s_q 1 0.4791-0.4794 / 0.5016-0.5064 /
// 0.4800-0.4822, kv 4k s_q 2 0.4614-0.4684 / 0.4626-0.4682, kv 8k s_q 2 0.8944-0.9037 /
// 0.9162-0.9279; H100 (03:16Z) v8 / auto: 0.2723-0.2740 / 0.2749-0.2755, 0.5128-0.5210 /
// 0.5137-0.5196, 0.4632-0.4675 / 0.4624-0.4660, 0.8958-0.9016 / 0.9036-0.9154 (level to +1%)
// (docs/perf/mla_notes.md session 26). The fp8 cache always runs 6.
inline int default_wgmma_variant(int rows_per_req, bool consumer_tma) {
  return consumer_tma && rows_per_req >= 2 * 64 ? 8 : 6;
}
// Whether a launch with p may load its K tiles by TMA (MlaDecodeParams::kv_tma_ok): the bf16
// cache on the wgmma seesaw with pages of >= 64 tokens.
inline bool k_tma_eligible(const MlaDecodeParams& p, int page_size, bool fp8) {
  return mla_tma_tiles(page_size, fp8) && runs_wgmma(p, page_size, fp8) &&
         mla_seesaw_variant(p.use_wgmma - 1);
}
// MlaDecodeParams::grid_rows_fastest with auto (2) resolved: rows (1) for the wgmma kernel, parts
// (0) for the mma.sync ones. The launcher and MlaDecodeStats::grid_rows_runs use it.
inline int resolved_grid_rows_fastest(const MlaDecodeParams& p, bool wgmma) {
  return p.grid_rows_fastest == 2 ? (wgmma ? 1 : 0) : p.grid_rows_fastest;
}
inline int row_tiles(int rows_per_req) {
  const int r = rows_per_cta(rows_per_req);
  return (rows_per_req + r - 1) / r;
}
// CTA-parts of the schedule: one CTA per SM in total (the kernel needs ~225 KiB of shared memory,
// so one CTA fits an SM). H200, 132 SMs: 128 heads s_q 1 -> 2 row tiles -> 66 parts; 16 heads
// -> 132 parts.
inline int num_parts(int num_sms, int rows_per_req) {
  const int parts = num_sms / row_tiles(rows_per_req);
  return parts > 0 ? parts : 1;
}
// Fewest parts a schedule of num_parts may use (build_schedule's min_parts): the wgmma kernel's
// 64-row tiles (128 heads; 64 x s_q 2) may leave up to kScheduleIdleSms SMs idle when that keeps
// every request whole. H100 2026-11-24 15:06Z (docs/perf/mla_notes.md session 21 item 9): b128,
// 128 heads, 64 parts instead of 66 (no split, no combine) kv 8k -4%, s_q 2 (32 instead of 33)
// -3%, kv 4k (already unsplit) the same. The 16 / 32-row tiles (memory-bound) keep one part per SM.
inline constexpr int kScheduleIdleSms = 4;
inline int schedule_min_parts(int num_parts, int rows_per_req) {
  if (rows_per_cta(rows_per_req) != 64) return num_parts;
  const int p = num_parts - kScheduleIdleSms / row_tiles(rows_per_req);
  return p > 1 ? p : 1;
}

// Largest dynamic shared memory any instantiation needs (bytes): the device's opt-in limit must
// reach it.
int max_smem_bytes();

// The sm_90a wgmma kernel (64-row tiles, bf16 and fp8 cache): whether this build holds its SM90
// code, and its dynamic shared memory (bytes).
bool wgmma_available();
int wgmma_smem_bytes();
#if defined(ATTNKIT_MLA_TIMELINE)
// Diagnostic build (CMake ATTNKIT_MLA_TIMELINE): the page-64 wgmma kernel's timeline to
// $ATTNKIT_MLA_TIMELINE_OUT (mla_decode_wgmma.cuh); the engine calls it after each launch.
void mla_timeline_dump(StreamHandle stream);
#endif

// Writes p.sched / p.split_indptr from p.seq_lens on `stream` (one tiny kernel).
Status launch_schedule(const MlaDecodeParams& p, int32_t* sched, int32_t* split_indptr,
                       StreamHandle stream);

// The attention kernel, then the combine kernel (which only touches split requests). Needs
// p.sched/p.split_indptr from launch_schedule and partial buffers for bs + num_parts segments.
// kv_dtype: bf16 or fp8_e4m3; q/out bf16.
Status run_decode(const MlaDecodeParams& p, int page_size, DType kv_dtype, StreamHandle stream);

template <int kPage>
Status run_decode_page(const MlaDecodeParams& p, DType kv_dtype, StreamHandle stream);

}  // namespace attnkit::mla
