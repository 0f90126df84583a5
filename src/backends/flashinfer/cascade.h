// Cascade (shared-prefix) attention for the flashinfer backend.
//
// When every request of a forward starts with the same cached tokens (a system prompt, few-shot
// examples, the parallel samples of one prompt: the radix cache hands them the same pages), the
// plain plan reads that prefix once per request. The cascade reads it once per forward:
//
//   pass 1  one virtual request whose queries are ALL the batch's tokens (GQA-packed rows of every
//           request, prefill tiles) attends to keys [0, P) of the shared prefix: no causal mask
//           (every query sits after the prefix), split into key chunks for parallelism. Each
//           (chunk, token, head) writes a normalised f32 partial + log2 LSE.
//   pass 2  every request attends to its own suffix [P, kv_len) on prefill tiles (decode: key
//           chunks for long suffixes; extend / verify: causal or the tree mask), also as f32
//           partials (the prefill kernel leaves split partials to the caller's merge).
//   merge   out = sum_i w_i O_i / sum_i w_i, w_i = 2^(lse_i - max) over the partials of the token,
//           plus the sink in the denominator, times v_scale; lse (natural log) when requested.
//
// Detection (no API change for the engine): the shared prefix is read from the page table itself.
// P = the longest run of leading page-start entries req_to_token[row, k * page_size] that are equal
// in every request's row (host mirror of ReqToTokenPool), capped at the smallest cached prefix
// min_r (kv_len_r - q_len_r) so that no new token lies in it. Requests that share cached pages
// through the radix cache get this for free; an engine that wants another policy sets the options.
// The cascade runs when bs >= min_batch and P >= min_shared_prefix, for native (tensor-core)
// forwards of eager execution (decode only unless options.all_modes, fp8 KV only with
// options.fp8_kv; off unless an engine enables it, FlashInferCascadeOptions has the measured
// thresholds); a layer with a sliding
// window uses the plain plan of the same forward (both are planned). CUDA-graph forwards never
// cascade.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/forward_batch.h"
#include "attnkit/status.h"
#include "backend/device_array.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "backends/flashinfer/kernels/work_plan.h"

namespace attnkit {

namespace flashinfer {

// Longest shared prefix of the batch's page tables (see the header comment); 0 when none.
// rows: the req_to_token host rows of the requests; cap: the largest admissible P.
int64_t shared_prefix_len(std::span<const int32_t* const> rows, int64_t cap, int page_size);

// The host side of one cascade forward: the three plans and the partial workspace.
class Cascade {
 public:
  // Plans the cascade for this forward when the batch qualifies (active() says whether it did).
  // reqs: the forward's requests as the plain plan sees them; shape: the plain plan's tile shape.
  Status plan(const ForwardBatch& batch, std::span<const PlanRequest> reqs, TileShape shape,
              const PlanConfig& config, int num_q_heads, int head_dim, Device device,
              const FlashInferCascadeOptions& options, StreamHandle stream);
  void reset() { active_ = false; }
  bool active() const { return active_; }
  int64_t shared_prefix() const { return shared_; }

  // Runs one layer: pass 1, pass 2 and the merge. p is the plain plan's fully filled PagedParams
  // (q, out, lse, pool, table, mask, sinks, scales).
  Status run(const PagedParams& p, DType q_dtype, DType kv_dtype, int head_dim,
             StreamHandle stream) const;

  // K/V bytes one layer reads from the pool: plain plan vs cascade (bf16 = 2 bytes per element,
  // fp8 = 1), for the bench/stats. Valid when active().
  int64_t plain_kv_bytes(int64_t kv_elem_bytes, int num_kv_heads, int head_dim) const;
  int64_t cascade_kv_bytes(int64_t kv_elem_bytes, int num_kv_heads, int head_dim) const;

 private:
  bool active_ = false;
  int64_t shared_ = 0;
  int bs_ = 0;
  int tokens_ = 0;
  int prefix_items_ = 0;  // pass-1 work items (CTAs per kv head)
  int suffix_items_ = 0;  // pass-2 work items
  int prefix_chunks_ = 0;
  int64_t sum_kv_ = 0;  // sum of kv_len over the requests (plain plan's key reads)
  std::vector<int32_t> words_;
  DeviceArray<int32_t> words_dev_;
  DeviceArray<float> partial_out_, partial_lse_;
  int64_t prefix_offset_ = 0, suffix_offset_ = 0, merge_offset_ = 0;  // into words_dev_
};

}  // namespace flashinfer
}  // namespace attnkit
