// Helpers the GPU backend tests share (tests/gpu): which cases the SM90 wgmma prefill kernel must
// take, and the CUDA-graph capture / replay check against an eager run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"
#include "harness/case_runner.h"

// ASSERTs (so: inside a TEST body or a void helper) that a CUDA runtime call returned cudaSuccess
// (the caller includes cuda_runtime.h) / that an attnkit call returned an ok Status.
#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define STATUS_OK(expr)                        \
  do {                                         \
    const Status s_ = (expr);                  \
    ASSERT_TRUE(s_.is_ok()) << s_.to_string(); \
  } while (0)

namespace attnkit::test_support {

// A one-layer bf16 MHA pool config on `device`: `size` slots, page 16, 2 kv heads, d 64 (the wrap
// tests' pools over caller memory).
KVPoolConfig small_bf16_mha_pool_config(int64_t size, Device device);

// Whether this process sees a CUDA device (false in CPU-only builds).
bool has_cuda();
// The bytes of a tensor's storage, copied to the host (EXPECTs the copy succeeded).
std::vector<uint8_t> to_host_bytes(const TensorView& t);
// A CUDA-device buffer holding `bytes` host bytes from `src` (at least 1 byte; EXPECTs success).
Buffer upload_bytes(const void* src, int64_t bytes);

// Whether every layer of the case must run on the SM90 wgmma prefill kernel that the fa3 and
// flashinfer backends share (prefill_sm90_engine.h): a device of compute capability 90; an extend,
// mixed or draft-extend forward; bf16/f16 MHA with KV of the q dtype; d 64/128/256 with
// qk dim = v dim; no cross-attention (a sliding window, soft-cap or sinks run the kernel's variant
// instantiations), unless the forward has few new tokens per request (backend/small_extend.h:
// expects_small_extend; the kernel still takes those of an e4m3 q: s.fp8_q).
bool expects_sm90_wgmma_prefill(const harness::CaseSpec& s, int compute_capability);
// The same for this process's CUDA device 0 (detect_cuda, so ATTNKIT_EMULATE_CC counts, as it
// does for the backends); false without a CUDA device.
bool expects_sm90_wgmma_prefill(const harness::CaseSpec& s);
// backend/small_extend.h's rules for the case's forward, with the bounds this process's
// environment sets (ATTNKIT_EXTEND_DECODE_ROWS, ATTNKIT_FA3_MIN_Q_LEN):
// expects_extend_decode_tiles: an extend / mixed / draft-extend forward of MHA without
// cross-attention whose requests all have >= 1 new token and at most the decode-tile bound of
// packed rows (new tokens x group); expects_small_extend: that, or at most the wgmma kernel's
// minimum of new tokens in the longest request (the SM90 kernel declines both).
bool expects_extend_decode_tiles(const harness::CaseSpec& s);
bool expects_small_extend(const harness::CaseSpec& s);
// The partition of the case's forward between flashinfer's decode tiles and the SM90 wgmma kernel
// (backend/small_extend.h extend_partition, with this environment's bounds and
// ATTNKIT_EXTEND_PARTITION) where that kernel takes the forward (expects_sm90_wgmma_prefill, not
// an e4m3 q): one flag per request, 1 for the decode tiles; empty when the forward runs whole.
std::vector<uint8_t> expected_extend_partition(const harness::CaseSpec& s, int compute_capability);
std::vector<uint8_t> expected_extend_partition(const harness::CaseSpec& s);
// Why a partition test over the mixed forward `base` cannot run here ("" when it can): no SM90
// wgmma kernel on device 0, or this environment's bounds split no forward. Where the bounds are
// the defaults it also expects `base` to split as `want` says (1: decode tiles).
std::string partition_test_skip(const harness::CaseSpec& base, const std::vector<uint8_t>& want);
// The cases both partition tests run beside `base` (a mixed forward that splits), each with the
// save_kv its run uses: base with a window and sinks (the runner writes k / v); with a soft-cap on
// page 1; a bidirectional (encoder-only) extend of 3 / 40 / 1 new tokens; d 64 and d 256 with
// 1 / 90 / 8 new tokens over 1200 / 0 / 77 cached ones. base's heads, page and seed throughout.
struct PartitionVariant {
  harness::CaseSpec spec;
  bool save_kv = true;
};
std::vector<PartitionVariant> partition_variants(const harness::CaseSpec& base);
// Whether the case's layers are non-absorbed MLA prefill layers the SM90 wgmma MLA kernel runs
// (PrefillSm90Engine::create_mla_prefill / why_not_mla_layer: device 0 of compute capability 90,
// extend / draft-extend, bf16 / f16, 192 / 128, decoder (causal) layers, no window / soft-cap /
// sinks, no chunked prefix cache; any pool dtype).
bool expects_sm90_mla_prefill(const harness::CaseSpec& s);

// Expects layer `layer`'s out (after its forward) to be finite everywhere and within
// harness::tolerance_for(q dtype) in relative L2 of the fp64 reference over the pool as it is now
// (the bound compare_with_reference puts on every layer, for a test that ran one layer only).
// Call from a TEST body or a void helper (uses ASSERT).
void expect_layer_matches_reference(const harness::PreparedCase& pc, int layer);

// flashinfer's target-verify decode-tile bound as this process's environment sets it
// (ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS, default 32; ctest's FlashInferVerify* variants set it):
// a verify of N drafts x group packed rows per request runs on decode tiles when that is <= it.
int64_t flashinfer_verify_decode_rows();
// Its verify tile rows on decode tiles as the environment sets them
// (ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS: 16 or 32, else the default 32), read as the backend reads
// it.
int flashinfer_verify_tile_rows();
// The CTAs per SM its decode-tile verify plan targets, as the backend decides it:
// ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM (1 or 2) where set, else 2 on 32-row tiles (rows32) of a
// device of compute capability 9.x (the one detect_cuda reports, emulation included), else 1.
int flashinfer_verify_ctas_per_sm(bool rows32, int compute_capability);

using BackendFactory =
    std::function<Result<std::unique_ptr<AttentionBackend>>(const BackendContext&)>;

// Stream order after an overlapped partitioned forward (backend/small_extend.h): prepares `spec`
// (a mixed forward that splits, with a long chunk), runs it on a backend made by `make` with the
// wgmma kernel on few SMs (ATTNKIT_PARTITION_RESERVE=`reserve`), its out / lse NaN-poisoned
// first, and enqueues a copy of every layer's out and lse on the batch's stream right after the
// layer, before any synchronisation: each copy must equal its tensor once the stream is done (the
// decode grid completed after the wgmma grid). `overlapped` is called on the backend afterwards
// (the caller's stats checks). Call from a TEST body (uses ASSERT).
void expect_partition_stream_order(const harness::CaseSpec& spec, const BackendFactory& make,
                                   const char* reserve,
                                   const std::function<void(AttentionBackend&)>& overlapped);

// CUDA graphs: runs the prepared case eagerly on a backend made by `make` (on a fresh stream) and
// checks it against the fp64 reference; poisons out / lse with NaN; sets up the graph state
// (max_bs = the batch size or `graph_max_bs` if larger, as an engine that captures several batch
// sizes passes; max_num_tokens = the batch's tokens, scaled alike), captures one forward of every
// layer in `mode` (kDecode or kTargetVerify; the batch's SpecInfo for verify), replays it `replays`
// times, each after init_forward_metadata_replay_cuda_graph, and expects out and lse bit-identical
// to the eager run. `after_replay`, when set, runs on the backend before it is destroyed (more
// checks on the captured state). Call from a TEST body (uses ASSERT).
void expect_graph_replay_matches_eager(
    harness::PreparedCase& pc, const BackendFactory& make, ForwardMode mode, int replays = 2,
    const std::function<void(AttentionBackend&)>& after_replay = {}, int graph_max_bs = 0);

// The same on the caller's `stream` (not synchronised or destroyed here): a stream of another
// device than the current one, say. `global_capture`: cudaStreamCaptureModeGlobal (PyTorch's
// default, under which other threads' unsafe calls are refused too) instead of ThreadLocal.
void expect_graph_replay_matches_eager_on(harness::PreparedCase& pc, const BackendFactory& make,
                                          ForwardMode mode, StreamHandle stream,
                                          bool global_capture = false, int replays = 2);

}  // namespace attnkit::test_support
