// What the GPU backends check at CUDA-graph capture and replay (init_forward_metadata_capture /
// _replay_cuda_graph). A captured graph fixes its kernels' grids, q / out pointers and token
// counts, so a replay must be of a batch that was captured: the same mode and batch size, and the
// same queries per request (1 for decode, the N drafts of target verify). A larger batch or N would
// index past the captured q / out; a smaller N would leave rows unwritten. The capture / replay
// inputs are checked as ForwardBatch::validate checks an eager batch's.
#pragma once

#include <cstdint>
#include <map>
#include <string_view>
#include <utility>

#include "attnkit/device.h"
#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

// The (mode, batch size) -> queries per request of a backend's captured graphs, and a grid the
// backend keeps with each (flashinfer: the CTAs per kv head the graph launches); cleared by
// init_cuda_graph_state (its workspaces are reallocated: earlier graphs are invalid).
class GraphCaptures {
 public:
  void clear() { captured_.clear(); }
  void record(ForwardMode mode, int bs, int queries, int grid = 0) {
    captured_[{static_cast<int>(mode), bs}] = Capture{queries, grid};
  }
  // The grid recorded with the graph of (mode, bs); kInvalidArgument naming `backend` when none
  // was captured (since the last init_cuda_graph_state) or it was captured with other queries per
  // request.
  Result<int> check_replay(std::string_view backend, ForwardMode mode, int bs, int queries) const;

 private:
  struct Capture {
    int queries = 0;
    int grid = 0;
  };
  std::map<std::pair<int, int>, Capture> captured_;
};

// req_pool_indices and seq_lens of a capture / replay: defined 1-D int32 views of >= bs elements
// on `device`; encoder_lens, when defined, the same.
Status check_graph_inputs(std::string_view backend, int bs, const TensorView& req_pool_indices,
                          const TensorView& seq_lens, const TensorView& encoder_lens,
                          Device device);

// A replay's keys in all (the sum of seq_lens, plus the drafts of a verify batch) within the int32
// total of the kernels' kv_indptr, as ForwardBatch::validate bounds an eager batch (a larger sum
// wrapped the triton graph's token-index offsets: writes out of bounds).
Status check_graph_key_total(std::string_view backend, int64_t total_keys);

// seq_lens_host[0, bs) of a replay: 0 <= len and len + extra <= max_context_len (extra: the N
// drafts that follow a verify request's committed prefix, else 0), as ForwardBatch::validate
// bounds an eager batch (the kernels walk a request's req_to_token row up to its length: past the
// row they read the next request's slots), and their total (check_graph_key_total).
// max_context_len < 1: not known, only len >= 0.
Status check_graph_lengths(std::string_view backend, int bs, const int32_t* seq_lens_host,
                           int extra, int max_context_len);

// The req_to_token entries a replay's kernels read (kv/table_slots.h): ok at one compare while
// `table` holds only rows of `pool`; otherwise the replayed requests' rows are fetched
// (req_pool_indices copied to the host on `stream`, a synchronous copy on this path only) and
// their entries [0, seq_lens_host[r] + extra) scanned (the whole row without seq_lens_host), and
// the first one outside the pool is named. A null table or pool: nothing to check.
Status check_graph_table_slots(std::string_view backend, const ReqToTokenPool* table,
                               const KVPool* pool, int bs, const TensorView& req_pool_indices,
                               const int32_t* seq_lens_host, int extra, StreamHandle stream);

}  // namespace attnkit
