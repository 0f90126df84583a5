// Factory for the `flashinfer` backend (CUDA builds only); its descriptor lives in
// src/registry/builtin.cpp.
//
// Tensor-core (mma.sync m16n8k16, SM80+) paged attention with a plan/run split: the plan (work
// items, load-balanced split-KV for decode) is computed once per forward from the host lengths and
// uploaded into a preallocated workspace; every layer only launches. Decode packs the GQA head
// group into the MMA M dimension and reads pages in place through req_to_token[r, ::page_size].
//
// Which kernel runs a prefill / extend layer:
//  * SM90 (sm_90a code in the binary): extend / mixed / draft-extend forwards of bf16/f16 MHA with
//    KV of the q dtype, head dim 64 / 128 / 256, causal (or bidirectional encoder-only layers),
//    any page size, with or without a sliding window / soft-cap / sinks -> the SM90 wgmma kernel
//    of the fa3 backend through the shared engine (backends/fa3/prefill_sm90_engine.h), as upstream
//    FlashInfer runs its FA3-based templates on SM90. ATTNKIT_FLASHINFER_SM90_PREFILL=0 turns this
//    off (A/B).
//    Extends whose requests have few new tokens each run on the decode tiles instead, and a
//    mixed forward of such requests beside longer ones is split: the longer ones on the wgmma
//    kernel, the others on the decode tiles (backend/small_extend.h).
//  * everything else (SM80/SM89, fp8 KV, target verify tree masks,
//    head dims 80 / 96, layers of a shape other than the context's): the mma.sync prefill kernel
//    (kernels/paged_prefill_sm80.cuh). A shared-prefix cascade, when active, serves the layers
//    the wgmma kernel does not take. Decode always runs the mma.sync decode kernel.
//  * MLA on SM90: non-absorbed 192 / 128 prefill layers (causal, bf16 / f16, no window / soft-cap
//    / sinks) -> the fa3 backend's wgmma MLA prefill kernel
//    (PrefillSm90Engine::create_mla_prefill), and so do the attention passes of the chunked prefix
//    cache (encoder-only layers too); the same switches (sm90_prefill,
//    ATTNKIT_FLASHINFER_SM90_PREFILL=0).
// Combinations outside the tensor-core kernels (other MLA prefill layers, f32 activations,
// encoder / cross-attention batches, head dims not compiled in, SM < 80) run on the portable SIMT
// kernels of the triton backend; flashinfer_stats() says which path ran.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attnkit/backend.h"

namespace attnkit::mla {
class MlaPrefixPassKernel;
}  // namespace attnkit::mla
namespace attnkit::fa3 {
class PrefillSm90Engine;
}  // namespace attnkit::fa3

namespace attnkit {

Result<std::unique_ptr<AttentionBackend>> create_flashinfer_backend(const BackendContext& ctx);

// Construction options (create_flashinfer_backend uses the defaults).
struct FlashInferOptions {
  // SM90: route eligible prefill / extend layers to the wgmma kernel (see above). The fa3 backend,
  // which owns a flashinfer backend and routes to the same kernel itself, turns it off.
  bool sm90_prefill = true;
  // The backend name its errors start with: the owning backend's (fa3, flashmla, cutlass_mla run
  // some paths on a flashinfer backend they hold), so that a user of those sees their own name.
  std::string name = "flashinfer";
  // The MLA chunked prefix cache's attention passes on another kernel where it takes the layer
  // (mla_prefix_cache.h: the fa3 backend hands its SM90 wgmma MLA prefill engine); not owned, it
  // must outlive the backend. nullptr: the portable triton kernel runs them.
  mla::MlaPrefixPassKernel* mla_prefix_passes = nullptr;
  // The SM90 wgmma engine of an owning backend (fa3) that runs the other requests of a
  // partitioned mixed forward (backend/small_extend.h extend_partition): the owner plans it before
  // this backend and reads it to plan the flagged requests only, which the owner then runs here
  // after the engine's layer. Not owned. With sm90_prefill the backend's own engine plays this
  // part.
  const fa3::PrefillSm90Engine* wgmma_partner = nullptr;
};
Result<std::unique_ptr<AttentionBackend>> create_flashinfer_backend_with(
    const BackendContext& ctx, const FlashInferOptions& options);

// Engine-facing policy of the shared-prefix cascade (backends/flashinfer/cascade.h says how the
// shared prefix is found and what runs).
//
// Off by default: CUDA-graph decode never cascades (a graph replays the plain plan), and a
// cascaded forward sums in another order, so with it on an eager decode of a shared-prefix batch
// differs in rounding from the replay of the same batch, which DESIGN.md section 3 forbids by
// default. An engine that accepts that (or runs such batches eagerly only) switches it on with
// set_flashinfer_cascade (or ATTNKIT_FLASHINFER_CASCADE=1); the thresholds below are then where it
// was measured faster (H200, docs/perf/extend_notes.md, 2026-11-22, bench/cases/cascade.json, time
// without / with the cascade): decode batches of >= 16 requests sharing >= 4096 cached keys with
// bf16/f16 KV: 1.13x (b16, 4096 shared + 256 private), 1.48x (b16, 8192 + 512), 2.20x (b64, 4096 +
// 256); batches without a shared prefix 1.00x (the detector finds none and the plain plan runs).
// fp8 KV was slower (0.72x at b16, 4096) and extend / verify forwards (and smaller batches or
// prefixes) were not measured: they cascade only with fp8_kv / all_modes set.
struct FlashInferCascadeOptions {
  bool enabled = false;
  int min_batch = 16;            // requests sharing the prefix
  int min_shared_prefix = 4096;  // keys
  bool fp8_kv = false;           // also cascade fp8 KV pools
  bool all_modes = false;        // also cascade extend / mixed / target-verify forwards
};

// Per-layer call counters of a flashinfer backend.
struct FlashInferStats {
  int64_t native_calls = 0;  // tensor-core kernels (mma.sync, or wgmma on SM90)
  int64_t wgmma_calls = 0;   // native calls that ran the SM90 wgmma prefill kernel (MHA)
  // Native calls of non-absorbed MLA prefill layers on the SM90 wgmma MLA kernel (MLA contexts
  // on SM90 with sm90_prefill; the layers with a chunked prefix cache count as portable_calls,
  // their passes may run on that kernel too).
  int64_t wgmma_mla_calls = 0;
  int64_t portable_calls = 0;  // delegated to the portable SIMT path
  int64_t split_calls = 0;     // native decode calls whose plan split some request (merge ran)
  int64_t cascade_calls = 0;   // native calls that ran the shared-prefix cascade
  int64_t cascade_shared_prefix = 0;  // shared prefix (keys) of the last forward's cascade, or 0
  // Decode kernel calls by the PDL mode the backend allowed (PagedParams::decode_pdl; launch_paged
  // lowers it below SM90 or with ATTNKIT_FLASHINFER_PDL): 1 = wait for the previous kernel first,
  // 2 = plan and first page-table words read before the wait. Launches without PDL (split eager
  // plans, graphs with ATTNKIT_FLASHINFER_PDL_GRAPH=0) count in neither.
  int64_t decode_pdl_wait_first_calls = 0;
  int64_t decode_pdl_early_reads_calls = 0;
  // Decode kernel calls on a cut plan (ATTNKIT_FLASHINFER_DECODE_BALANCE=1, or the default =auto
  // where choose_auto_plan picked it).
  int64_t decode_balanced_calls = 0;
  // =auto (the default): decode kernel calls that ran the default plan on the balanced kernel.
  int64_t decode_encoded_default_calls = 0;
  // Eager decode kernel calls whose plan the split-long rule cut (experiment knob
  // ATTNKIT_FLASHINFER_SPLIT_LONG=1, work_plan.h; graph replays plan on the host at replay and are
  // not counted).
  int64_t decode_split_long_calls = 0;
  // Target-verify calls that ran the cascade merge after the attention kernel: eager ones whose
  // plan split some request (verify_plan_config), and every captured verify layer (a graph
  // launches the merge at every replay; it leaves the requests a replay keeps whole).
  int64_t verify_split_merges = 0;
  // Target-verify calls on decode tiles (paged_decode_ring_kernel's kVerify; its split plans merge
  // in the kernel, counted in split_calls).
  int64_t verify_decode_calls = 0;
  // Extend / mixed / draft-extend calls on decode tiles (the same kernel with the causal mask over
  // the new tokens: every request with few new tokens, backend/small_extend.h); not counted in
  // verify_decode_calls.
  int64_t extend_decode_calls = 0;
  // Of those, the calls that ran the few-token requests of a partitioned mixed forward
  // (backend/small_extend.h extend_partition) while the SM90 wgmma kernel ran its others.
  int64_t extend_partition_calls = 0;
  // Of those, the launches that ran beside the wgmma kernel (backend/small_extend.h: its grid left
  // PrefillSm90Engine::planned_overlap_reserve SMs free; PagedParams::decode_overlap).
  int64_t partition_overlap_calls = 0;
  // Of those, the calls on 32-row tiles (two M tiles per CTA; verify_tile_rows), and the CTAs per
  // SM the last one's plan targeted (verify_ctas_per_sm: 2 on 32-row tiles on SM90, else 1, or
  // ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM), 0 before one.
  int64_t verify_decode_rows32_calls = 0;
  int64_t last_verify_ctas_per_sm = 0;
  // CTAs per kv head (balanced plan: CTAs) of the last native launch, eager or captured.
  int64_t last_grid_items = 0;
  // Bytes of split-KV partials (O and LSE, f32) reserved by the last init_cuda_graph_state
  // (balanced_plan.h balanced_graph_partial_entries), 0 before one.
  int64_t graph_partial_bytes = 0;
  // CUDA-graph replay refreshes whose encoded default plan was expanded on the GPU
  // (kernels/plan_expand.h; ATTNKIT_FLASHINFER_DEVICE_PLAN=0 turns it off): from the uploaded
  // work plan, or from the lengths alone for a batch whose work plan cannot split (counted in
  // both).
  int64_t graph_device_plans = 0;
  int64_t graph_length_plans = 0;
  // CUDA-graph replay refreshes whose cut plan (the auto rule's balanced plan) the GPU wrote from
  // the lengths (kernels/plan_expand.h cut_plan_from_lengths; from 512 slots, or every batch with
  // ATTNKIT_FLASHINFER_DEVICE_PLAN=2).
  int64_t graph_device_cut_plans = 0;
};
// The counters of a backend made by create_flashinfer_backend; nullptr for any other backend.
const FlashInferStats* flashinfer_stats(const AttentionBackend& backend);
// Sets the cascade policy (backends/flashinfer/cascade.h) of a flashinfer backend, from the next
// init_forward_metadata on; kInvalidArgument for any other backend or a negative threshold.
Status set_flashinfer_cascade(AttentionBackend& backend, const FlashInferCascadeOptions& options);

}  // namespace attnkit
