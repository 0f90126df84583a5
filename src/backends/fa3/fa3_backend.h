// Factory for the `fa3` backend (CUDA builds only); its descriptor lives in
// src/registry/builtin.cpp.
//
// On SM90 (sm_90a code in the binary), extend / mixed / draft-extend forwards of MHA layers with
// bf16 / f16 q and KV of the same dtype, head dim 64 / 128 / 256 (sliding window, soft-cap and
// sinks included, in the kernel's variant instantiations) and no encoder (cross-attention) tokens
// run the warp-specialised wgmma kernel
// (kernels/prefill_sm90.cuh through the engine of prefill_sm90_engine.h, which the flashinfer
// backend's SM90 prefill shares): TMA page boxes or a cp.async page-table gather into a swizzled
// shared-memory ring, mbarrier pipeline, two consumer warpgroups (three at d 64, 192-row tiles)
// with wgmma QK^T and register-A P.V, causal block skipping, persistent zigzag grid over
// longest-first tiles, key blocks of 128 (d 64 / 128) or 80 (d 256). With an fp8_e4m3 pool, bf16 q
// and d 128 the same forwards run the FP8 kernel (kernels/prefill_sm90_fp8.cuh: Q quantised to e4m3
// per row, P e4m3, both GEMMs on e4m3 wgmma, V^T pre-transposed per layer by a small kernel through
// the page table (any page size) or, for forwards with few queries per key, in shared memory by the
// producer; speculative softmax and row sums through the P.V GEMM only while the longest request
// has <= 2048 keys, fp32 row sums beyond (kernels/tile_plan.h choose_fp8_variant);
// ATTNKIT_FA3_FP8=0: off; a window / sinks / soft-cap on the three-warpgroup plan and the
// two-warpgroup one with V^T in the kernel). Everything else -- decode, target verify, a window /
// sinks / soft-cap over an fp8_e4m3 pool on other (knob-forced) plans, fp8_e5m2 KV (and e4m3 KV at
// other head dims / f16 q), head dims 80 / 96, encoder batches, MLA other than the non-absorbed
// 192 / 128 prefill layers (their own SM90 kernel: PrefillSm90Engine::create_mla_prefill, which
// also runs the attention passes of their chunked prefix cache), SM80,
// CUDA graphs -- runs on
// an owned `flashinfer` backend (mma.sync tensor-core kernels, which themselves hand MLA, f32 and
// encoder batches to the portable triton kernels). fa3_stats() says which path ran.
#pragma once

#include <cstdint>
#include <memory>

#include "attnkit/backend.h"

namespace attnkit {

Result<std::unique_ptr<AttentionBackend>> create_fa3_backend(const BackendContext& ctx);

// Per-layer call counters of an fa3 backend.
struct Fa3Stats {
  int64_t wgmma_calls = 0;      // the SM90 wgmma prefill kernels (bf16 / f16 and FP8)
  int64_t wgmma_fp8_calls = 0;  // of which the FP8 kernel (fp8_e4m3 pool, bf16 q, d 128)
  int64_t wgmma_mla_calls = 0;  // of which the MLA prefill kernel (non-absorbed 192 / 128 layers)
  // Passes of the MLA chunked prefix cache (layers with AttentionLayer::mla_prefix, counted in
  // flashinfer_calls) that ran on the MLA prefill kernel: per such layer 1 + its prefix chunks.
  int64_t wgmma_mla_prefix_passes = 0;
  int64_t flashinfer_calls = 0;  // delegated to the owned flashinfer backend
  // Layers of partitioned mixed forwards (backend/small_extend.h extend_partition): the wgmma
  // kernel ran the longer requests, then the owned flashinfer backend's decode tiles the
  // few-token ones (counted in wgmma_calls and flashinfer_calls as well).
  int64_t partition_calls = 0;
  // Of those, the layers whose wgmma kernel left PrefillSm90Engine::planned_overlap_reserve SMs to
  // the decode tiles and released them at its start (backend/small_extend.h: the two overlap).
  int64_t partition_overlap_calls = 0;
  // Layers with an e4m3 q whose rows for flashinfer's tiles were widened to bf16
  // (kernels/q_widen.h): the few-token requests of a partitioned forward over an fp8_e4m3 pool,
  // or every token of a forward with few new tokens per request (counted in flashinfer_calls).
  int64_t q_widened_calls = 0;
  int last_block_n = 0;  // key block of the last wgmma call (fa3::default_block_n)
  int last_block_m = 0;  // query rows per tile of the last wgmma call (128; 192: three
                         // consumer warpgroups)
  // FP8 variant of the last wgmma call (fa3::choose_fp8_variant; false for bf16 / f16 calls):
  // V^T pre-transposed (else transposed in the kernel), speculative softmax, row sums through the
  // P V GEMM (else fp32 FADDs), per-block promotion of P V to f32 (Fa3Params::fp8_promote: 0 off,
  // 1 / 2 the two chunk orders; ATTNKIT_FA3_FP8_PROMOTE).
  bool last_fp8_vt_pre = false;
  bool last_fp8_spec = false;
  bool last_fp8_gemm_sum = false;
  int last_fp8_promote = 0;
  // Tail split of the last wgmma call (fa3::choose_tail_split; ATTNKIT_FA3_SPLIT): units of the
  // schedule's last round run as last_num_splits pieces each (0 / 1: no split).
  int last_split_units = 0;
  int last_num_splits = 1;
  // q heads per L2 section of the last wgmma call (fa3::choose_section_heads).
  int last_section_heads = 0;
};
// The counters of a backend made by create_fa3_backend; nullptr for any other backend.
const Fa3Stats* fa3_stats(const AttentionBackend& backend);

}  // namespace attnkit
