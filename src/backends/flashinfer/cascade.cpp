// Cascade (shared-prefix) attention of the flashinfer backend: detection, the three plans and the
// per-layer launches (see cascade.h).
#include "backends/flashinfer/cascade.h"

#include <algorithm>
#include <limits>
#include <string>

#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "attnkit/kv_cache.h"
#include "backends/flashinfer/kernels/cascade_kernels.h"
#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dispatch.h"
#endif

namespace attnkit::flashinfer {

int64_t shared_prefix_len(std::span<const int32_t* const> rows, int64_t cap, int page_size) {
  if (rows.size() < 2 || cap <= 0 || page_size < 1) return 0;
  for (const int32_t* row : rows) {
    if (row == nullptr) return 0;
  }
  // Kernels read only the page-start entries (slot of key k = row[k - k % page] + k % page), so
  // equal page starts mean equal keys for the whole page. Row by row, the shared run can only
  // shrink: a batch without sharing costs one compare per request, a shared one a linear scan.
  int64_t pages = (cap + page_size - 1) / page_size;
  const int32_t* first = rows[0];
  for (size_t r = 1; r < rows.size() && pages > 0; ++r) {
    const int32_t* row = rows[r];
    if (page_size == 1) {
      pages = std::mismatch(first, first + pages, row).first - first;
    } else {
      int64_t p = 0;
      while (p < pages && row[p * page_size] == first[p * page_size]) ++p;
      pages = p;
    }
  }
  return std::min(pages * page_size, cap);
}

#ifdef ATTNKIT_WITH_CUDA

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status Cascade::plan(const ForwardBatch& batch, std::span<const PlanRequest> reqs, TileShape shape,
                     const PlanConfig& config, int num_q_heads, int head_dim, Device device,
                     const FlashInferCascadeOptions& options, StreamHandle stream) {
  active_ = false;
  shared_ = 0;
  const int bs = static_cast<int>(reqs.size());
  if (!options.enabled || bs < std::max(2, options.min_batch) ||
      (!options.all_modes && batch.mode != ForwardMode::kDecode) ||
      batch.req_to_token_pool == nullptr || batch.kv_pool == nullptr ||
      (!options.fp8_kv && dtype_is_fp8(batch.kv_pool->dtype())) ||
      batch.req_pool_indices_host.size() != reqs.size()) {
    return Status::ok();
  }
  int64_t cap = std::numeric_limits<int64_t>::max();
  int64_t tokens = 0;
  for (const PlanRequest& r : reqs) {
    cap = std::min<int64_t>(cap, r.kv_len - r.q_len);
    tokens = std::max<int64_t>(tokens, static_cast<int64_t>(r.q_start) + r.q_len);
  }
  if (cap < std::max(1, options.min_shared_prefix)) return Status::ok();
  std::vector<const int32_t*> rows(reqs.size());
  for (size_t r = 0; r < reqs.size(); ++r) {
    rows[r] = batch.req_to_token_pool->host_row(batch.req_pool_indices_host[r]);
  }
  const int64_t shared = shared_prefix_len(rows, cap, batch.kv_pool->page_size());
  if (shared < std::max(1, options.min_shared_prefix)) return Status::ok();

  // Pass 1: every token of the batch against keys [0, shared), key-chunked to fill the GPU.
  const int group = config.group;
  const int64_t row_tiles = ceil_div(tokens * group, kPrefillTileRows);
  const int64_t per_head_target = std::max(1, config.target_ctas / config.num_kv_heads);
  const int64_t max_chunks = std::max<int64_t>(1, ceil_div(shared, kMinSplitChunk));
  int64_t chunks = std::clamp<int64_t>(per_head_target / row_tiles, 1, max_chunks);
  const int64_t chunk = ceil_div(ceil_div(shared, chunks), kDecodeTileKeys) * kDecodeTileKeys;
  chunks = ceil_div(shared, chunk);
  WorkPlan prefix;
  RequestPlan all;
  all.q_start = 0;
  all.q_len = static_cast<int32_t>(tokens);
  all.kv_len = static_cast<int32_t>(shared);
  all.num_splits = static_cast<int32_t>(std::max<int64_t>(2, chunks));  // > 1: f32 partials
  all.partial_base = 0;
  prefix.requests.push_back(all);
  for (int64_t t = 0; t < row_tiles; ++t) {
    for (int64_t c = 0; c < chunks; ++c) {
      WorkItem w;
      w.request = 0;
      w.q_row_begin = static_cast<int32_t>(t * kPrefillTileRows);
      w.kv_begin = static_cast<int32_t>(c * chunk);
      w.kv_end = static_cast<int32_t>(std::min(shared, (c + 1) * chunk));
      w.split = static_cast<int32_t>(c);
      prefix.items.push_back(w);
    }
  }

  // Pass 2: each request against its own keys [shared, kv_len), on prefill tiles (their split
  // path writes f32 partials and leaves the merge to us; the decode kernel merges in place).
  // Decode requests are key-chunked like a split plan so that a long private suffix still
  // spreads over the SMs; extend / verify tiles take their whole suffix (causal clip).
  const bool decode = shape == TileShape::kDecode;
  int64_t suffix_keys = 0;
  for (const PlanRequest& r : reqs) suffix_keys += r.kv_len - shared;
  const int64_t suffix_chunk = std::max<int64_t>(
      kMinSplitChunk,
      ceil_div(ceil_div(suffix_keys, per_head_target), kDecodeTileKeys) * kDecodeTileKeys);
  WorkPlan suffix;
  int64_t partial_rows = chunks * tokens;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const PlanRequest& in = reqs[i];
    const int64_t own_keys = in.kv_len - shared;
    const int64_t splits = decode ? std::max<int64_t>(1, ceil_div(own_keys, suffix_chunk)) : 1;
    const int64_t chunk_len = decode ? suffix_chunk : std::max<int64_t>(own_keys, 1);
    RequestPlan r;
    r.q_start = in.q_start;
    r.q_len = in.q_len;
    r.kv_len = in.kv_len;
    r.num_splits = static_cast<int32_t>(std::max<int64_t>(2, splits));  // > 1: f32 partials
    r.partial_base = static_cast<int32_t>(partial_rows);
    r.reserved[0] = static_cast<int32_t>(splits);  // the merge's count of suffix partials
    suffix.requests.push_back(r);
    partial_rows += splits * in.q_len;
    const int64_t q_tiles = ceil_div(static_cast<int64_t>(in.q_len) * group, kPrefillTileRows);
    for (int64_t t = 0; t < q_tiles; ++t) {
      for (int64_t sp = 0; sp < splits; ++sp) {
        WorkItem w;
        w.request = static_cast<int32_t>(i);
        w.q_row_begin = static_cast<int32_t>(t * kPrefillTileRows);
        w.kv_begin = static_cast<int32_t>(shared + sp * chunk_len);
        w.kv_end =
            static_cast<int32_t>(std::min<int64_t>(in.kv_len, shared + (sp + 1) * chunk_len));
        w.split = static_cast<int32_t>(sp);
        suffix.items.push_back(w);
      }
    }
  }
  if (partial_rows * num_q_heads * head_dim > std::numeric_limits<int32_t>::max()) {
    return Status::ok();  // the plain plan serves batches whose partials would not fit int32 rows
  }

  // Words: [pass-1 plan][pass-2 plan][token -> request map].
  std::vector<int32_t> w1, w2;
  prefix.serialize(&w1);
  suffix.serialize(&w2);
  words_.clear();
  words_.insert(words_.end(), w1.begin(), w1.end());
  prefix_offset_ = 0;
  suffix_offset_ = static_cast<int64_t>(words_.size());
  words_.insert(words_.end(), w2.begin(), w2.end());
  merge_offset_ = static_cast<int64_t>(words_.size());
  words_.resize(words_.size() + static_cast<size_t>(tokens), 0);
  for (int r = 0; r < bs; ++r) {
    const PlanRequest& q = reqs[static_cast<size_t>(r)];
    for (int32_t i = 0; i < q.q_len; ++i) {
      words_[static_cast<size_t>(merge_offset_ + q.q_start + i)] = r;
    }
  }
  ATTNKIT_RETURN_IF_ERROR(words_dev_.reserve(device, static_cast<int64_t>(words_.size())));
  ATTNKIT_RETURN_IF_ERROR(partial_out_.reserve(device, partial_rows * num_q_heads * head_dim));
  ATTNKIT_RETURN_IF_ERROR(partial_lse_.reserve(device, partial_rows * num_q_heads));
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so words_ may change next.
  ATTNKIT_CUDA_TRY(cudaMemcpyAsync(words_dev_.data(), words_.data(),
                                   words_.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   cuda::to_stream(stream)));
  shared_ = shared;
  bs_ = bs;
  tokens_ = static_cast<int>(tokens);
  prefix_items_ = static_cast<int>(prefix.items.size());
  suffix_items_ = static_cast<int>(suffix.items.size());
  prefix_chunks_ = static_cast<int>(chunks);
  sum_kv_ = 0;
  for (const PlanRequest& r : reqs) sum_kv_ += r.kv_len;
  active_ = true;
  return Status::ok();
}

Status Cascade::run(const PagedParams& p, DType q_dtype, DType kv_dtype, int head_dim,
                    StreamHandle stream) const {
  if (!active_) return Status::internal("flashinfer cascade: run without an active plan");
  const int32_t* words = words_dev_.data();
  PagedParams shared = p;  // pass 1: the virtual request reads request 0's (shared) pages
  shared.plan = words + prefix_offset_;
  shared.bs = 1;
  shared.causal = 0;  // every query sits after the shared prefix
  shared.sliding_window = -1;
  shared.custom_mask = nullptr;  // the tree mask shows every prefix column
  shared.mask_indptr = nullptr;
  shared.sinks = nullptr;  // joins once, in the merge
  shared.lse = nullptr;
  shared.partial_out = partial_out_.data();
  shared.partial_lse = partial_lse_.data();
  shared.split_counters = nullptr;
  PagedParams own = p;  // pass 2 (prefill tiles: no in-kernel merge, no counters)
  own.split_counters = nullptr;
  own.plan = words + suffix_offset_;
  own.sinks = nullptr;
  own.lse = nullptr;
  own.partial_out = partial_out_.data();
  own.partial_lse = partial_lse_.data();
  const auto passes = [&]<int kD>() -> Status {
    if constexpr (!head_dim_compiled(kD)) {
      return Status::unsupported("flashinfer cascade: head_dim " + std::to_string(kD) +
                                 " is not compiled in");
    } else {
      const Status first =
          run_paged<kD, TileShape::kPrefill>(shared, q_dtype, kv_dtype, prefix_items_, stream);
      if (!first.is_ok()) return first;
      return run_paged<kD, TileShape::kPrefill>(own, q_dtype, kv_dtype, suffix_items_, stream);
    }
  };
  const Status ran =
      dispatch_value<NativeHeadDims>(head_dim, "flashinfer cascade: head_dim", passes);
  if (!ran.is_ok()) return ran;
  CascadeMergeParams m = merge_output_params(p, head_dim);
  m.suffix_plan = words + suffix_offset_;
  m.token_request = words + merge_offset_;
  m.bs = bs_;
  m.tokens = tokens_;
  m.prefix_chunks = prefix_chunks_;
  m.partial_out = partial_out_.data();
  m.partial_lse = partial_lse_.data();
  return cascade_merge(m, q_dtype, stream);
}

int64_t Cascade::plain_kv_bytes(int64_t kv_elem_bytes, int num_kv_heads, int head_dim) const {
  return 2 * sum_kv_ * num_kv_heads * head_dim * kv_elem_bytes;
}

int64_t Cascade::cascade_kv_bytes(int64_t kv_elem_bytes, int num_kv_heads, int head_dim) const {
  return 2 * (sum_kv_ - static_cast<int64_t>(bs_ - 1) * shared_) * num_kv_heads * head_dim *
         kv_elem_bytes;
}

#endif  // ATTNKIT_WITH_CUDA

}  // namespace attnkit::flashinfer
