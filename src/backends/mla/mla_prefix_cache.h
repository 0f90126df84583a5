// The MLA chunked prefix cache on CUDA (AttentionLayer::mla_prefix, DESIGN.md section 4): a
// non-absorbed MLA prefill layer (qk 192 / v 128) whose new tokens attend their cached prefix.
// Shared by the backends whose MLA row says "chunked prefix cache" (flashinfer, fa3, flashmla,
// cutlass_mla: the last three reach it through their flashinfer MLA path).
//
// Once per forward (plan, from init_forward_metadata): the chunk layout of the batch's prefixes
// for BackendContext::mla_prefix_chunk_tokens, uploaded with the new tokens' layout, and the
// workspace reserved. Per layer (run; no allocation, no host->device copy, no synchronisation):
//   1. new tokens over new tokens, causal (the triton SIMT 192/128 kernel, or the passes'
//      kernel: MlaPrefixPassKernel) -> f32 partial A
//   2. for each prefix chunk c (PrefixChunkLayout: at most chunk_tokens prefix positions of the
//      batch, each request's next ones): gather the chunk's latent rows (mla_prefix_gather.cu),
//      decompress them with layer.mla_prefix->expand, attend the new tokens to them without a mask
//      (the same SIMT kernel, chunk rows as its key pool) -> f32 partial B; merge A and B by LSE
//      (the flashinfer cascade merge kernel, f32 result) -> A; the last merge writes out / lse.
//      On the pass kernel the chunk pass merges itself into A (its epilogue), and one cascade
//      merge of A alone writes out / lse after the last chunk.
// Workspace: the largest chunk's latent rows and decompressed k/v (at most chunk_tokens rows),
// three f32 partial row sets of the new tokens; nothing grows with the prefix beyond the
// per-chunk offsets.
// The prefix modes (extend, mixed, draft extend) are not CUDA-graph captured; capture and replay
// drop the plan, so a layer with mla_prefix there fails with a clear error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/attention_layer.h"
#include "attnkit/backend.h"
#include "attnkit/forward_batch.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backend/device_array.h"

namespace attnkit::mla {

// Host plan of the prefix chunks. A chunk holds at most capacity = max(1, chunk_tokens) prefix
// tokens of the whole batch, shared by the requests with prefix left, each taking its prefix in
// order: the requests sorted by what they have left, each takes min(its remainder, an equal share
// of what the requests before it left over). So every chunk but the last is full, and chunks =
// ceil(total prefix / capacity). (SGLang's layout gives each request capacity / bs positions per
// chunk, whether or not its prefix has ended: prefixes of 16k + 7 x 1k in chunks of 8k take 16
// chunks there, 3 here.)
struct PrefixChunkLayout {
  int capacity = 1;
  int chunks = 0;
  std::vector<int32_t> indptr;  // [chunks][bs + 1] chunk-local token offsets per request
  std::vector<int32_t> starts;  // [chunks][bs] prefix position of request r's first chunk token
  std::vector<int32_t> tokens;  // [chunks] tokens of each chunk (<= capacity)
};
PrefixChunkLayout plan_prefix_chunks(const std::vector<int32_t>& prefix_lens, int chunk_tokens);

// The three-slot merge ring: the running partial sits in slot `acc` (0 or 2), every chunk lands in
// slot 1; the merge reads the two adjacent slots [first, first + 2) and writes slot `dst` (the one
// not read), or the output when dst == -1 (the last chunk).
struct MergeStep {
  int first = 0;
  int dst = -1;
};
MergeStep merge_step(int acc, bool last);

// The runner's attention passes on another kernel: the fa3 backend's SM90 wgmma MLA prefill
// (fa3::PrefillSm90Engine, create_mla_prefill), handed to the flashinfer backend it owns
// (FlashInferOptions::mla_prefix_passes). Pass 0: the new tokens over their own k / v (causal;
// bidirectional for encoder-only layers); pass c + 1: the new tokens over chunk c's decompressed
// k / v (bidirectional; request r's keys are rows [indptr[c][r], indptr[c][r + 1]) of the chunk's
// tensors, PrefixChunkLayout). Pass 0 writes every new token's row normalised in f32 to part_o
// [T, H, 128] and its log2-domain LSE to part_lse [T, H]; the chunk passes merge into them.
class MlaPrefixPassKernel {
 public:
  virtual ~MlaPrefixPassKernel() = default;
  // Once per forward, after the runner planned `layout` for `batch` (a forward the kernel does not
  // take plans nothing: why_not_prefix_passes then says so).
  virtual Status plan_prefix_passes(const ForwardBatch& batch, const PrefixChunkLayout& layout,
                                    StreamHandle stream) = 0;
  virtual void drop_prefix_passes() = 0;
  // "" when this layer's passes of the planned forward run here (k / v: the new tokens').
  virtual std::string why_not_prefix_passes(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const AttentionLayer& layer,
                                            const ForwardBatch& batch) const = 0;
  // One pass (why_not_prefix_passes was ""): k / v the new tokens' (pass 0) or chunk pass - 1's
  // [chunk tokens, H, 192 / 128]; out: the layer's output (its shape; not written). merge: part_o
  // / part_lse hold the running partial of the earlier passes (every row), into which the pass
  // merges its rows by LSE in place; else (pass 0 only) it overwrites them. A chunk pass needs
  // merge: the rows of a request without keys in its chunk are left as they are.
  virtual Status run_prefix_pass(int pass, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& out,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 float* part_o, float* part_lse, bool merge,
                                 StreamHandle stream) = 0;
};

class MlaPrefixCacheRunner {
 public:
  // passes: runs the attention passes where it takes the layer (not owned; may be null: the
  // triton SIMT kernel runs them).
  explicit MlaPrefixCacheRunner(const BackendContext& ctx, MlaPrefixPassKernel* passes = nullptr)
      : ctx_(ctx), passes_(passes) {}

  // Why this layer call cannot run here ("" = it can): head dims, dtypes, features.
  static std::string why_not(const TensorView& q, const AttentionLayer& layer,
                             const ForwardBatch& batch);
  // Whether a forward of `batch` may carry layers with mla_prefix (an MLA context with
  // mla_prefix_chunk_tokens > 0; an extend, mixed or draft-extend batch with
  // the host extend lengths and no encoder): then plan() prepares it.
  static bool takes(const BackendContext& ctx, const ForwardBatch& batch);

  // Once per forward (init_forward_metadata), for a batch that takes() accepts: the chunk layout,
  // the device metadata and the workspace. The batch was validated by the caller.
  Status plan(const ForwardBatch& batch, StreamHandle stream);
  // Forgets the plan (the next forward did not ask for one, or a CUDA graph is captured).
  void drop_plan() {
    planned_ = false;
    if (passes_ != nullptr) passes_->drop_prefix_passes();
  }

  // Inputs validated by the caller (validate_forward_inputs); layer.mla_prefix != nullptr.
  // Needs the plan of this forward.
  Status run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionLayer& layer, const ForwardBatch& batch, const TensorView& lse,
             StreamHandle stream);

 private:
  BackendContext ctx_;
  MlaPrefixPassKernel* passes_ = nullptr;
  bool planned_ = false;
  int planned_bs_ = 0;
  int64_t planned_tokens_ = 0;
  PrefixChunkLayout layout_;
  size_t chunk_base_ = 0;   // meta_: offset of the chunk offsets
  size_t starts_base_ = 0;  // meta_: offset of the chunks' first prefix positions
  DeviceArray<unsigned char> latent_, kc_, vc_;
  DeviceArray<int32_t> iota_, meta_;
  DeviceArray<float> partial_out_, partial_lse_;
  int64_t iota_filled_ = 0;
  std::vector<int32_t> meta_host_, iota_host_;
};

}  // namespace attnkit::mla
