// GraphCaptures and the CUDA-graph capture / replay input checks (graph_captures.h).
#include "backend/graph_captures.h"

#include <limits>
#include <string>
#include <vector>

#if defined(ATTNKIT_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include "core/str_cat.h"
#include "kv/table_slots.h"

namespace attnkit {

Result<int> GraphCaptures::check_replay(std::string_view backend, ForwardMode mode, int bs,
                                        int queries) const {
  const auto it = captured_.find({static_cast<int>(mode), bs});
  if (it == captured_.end()) {
    return Status::invalid_argument(cat(backend, ": no ", forward_mode_name(mode),
                                        " graph of batch size ", bs,
                                        " was captured (since the last init_cuda_graph_state)"));
  }
  if (it->second.queries != queries) {
    return Status::invalid_argument(
        cat(backend, ": ", forward_mode_name(mode), " replay of batch size ", bs, " with ", queries,
            " queries per request (spec.draft_token_num), its graph was captured with ",
            it->second.queries));
  }
  return it->second.grid;
}

namespace {

Status check_index_array(std::string_view backend, const char* name, const TensorView& t, int bs,
                         Device device) {
  if (!t.defined()) return Status::invalid_argument(cat(backend, ": graph ", name, " is missing"));
  if (t.dtype != DType::kI32 || t.ndim != 1 || t.shape[0] < bs || !t.is_contiguous()) {
    return Status::invalid_argument(cat(backend, ": graph ", name,
                                        ": expected a contiguous int32[>= ", bs, "], got ",
                                        t.describe()));
  }
  if (t.device != device) {
    return Status::invalid_argument(cat(backend, ": graph ", name, " is on ", t.device.to_string(),
                                        ", the backend on ", device.to_string()));
  }
  return Status::ok();
}

}  // namespace

Status check_graph_inputs(std::string_view backend, int bs, const TensorView& req_pool_indices,
                          const TensorView& seq_lens, const TensorView& encoder_lens,
                          Device device) {
  ATTNKIT_RETURN_IF_ERROR(
      check_index_array(backend, "req_pool_indices", req_pool_indices, bs, device));
  ATTNKIT_RETURN_IF_ERROR(check_index_array(backend, "seq_lens", seq_lens, bs, device));
  if (encoder_lens.defined()) {
    ATTNKIT_RETURN_IF_ERROR(check_index_array(backend, "encoder_lens", encoder_lens, bs, device));
  }
  return Status::ok();
}

Status check_graph_key_total(std::string_view backend, int64_t total_keys) {
  if (total_keys > std::numeric_limits<int32_t>::max()) {
    return Status::invalid_argument(
        cat(backend, ": replay batch reads ", total_keys,
            " keys in all (seq_lens plus drafts), past the int32 total (2147483647) of the "
            "kernels' kv_indptr, as ForwardBatch::validate bounds an eager batch"));
  }
  return Status::ok();
}

Status check_graph_lengths(std::string_view backend, int bs, const int32_t* seq_lens_host,
                           int extra, int max_context_len) {
  if (seq_lens_host == nullptr) return Status::ok();
  int64_t total = 0;
  for (int r = 0; r < bs; ++r) {
    const int64_t len = seq_lens_host[r];
    if (len < 0 || (max_context_len >= 1 && len + extra > max_context_len)) {
      return Status::invalid_argument(
          cat(backend, ": replay seq_lens_host[", r, "] = ", len,
              extra > 0 ? cat(" (+ ", extra, " drafts)") : std::string(),
              " must be >= 0 and fit the req_to_token rows of max_context_len ", max_context_len));
    }
    total += len + extra;
  }
  return check_graph_key_total(backend, total);
}

Status check_graph_table_slots(std::string_view backend, const ReqToTokenPool* table,
                               const KVPool* pool, int bs, const TensorView& req_pool_indices,
                               const int32_t* seq_lens_host, int extra, StreamHandle stream) {
  if (table == nullptr || pool == nullptr || bs <= 0) return Status::ok();
  if (static_cast<int64_t>(table->max_slot()) < pool->rows()) return Status::ok();
  std::vector<int32_t> rows(static_cast<size_t>(bs));
  const int64_t bytes = static_cast<int64_t>(bs) * static_cast<int64_t>(sizeof(int32_t));
  if (req_pool_indices.device.is_cpu()) {
    ATTNKIT_RETURN_IF_ERROR(
        copy_bytes(rows.data(), Device::cpu(), req_pool_indices.data, Device::cpu(), bytes));
  } else {
#if defined(ATTNKIT_WITH_CUDA)
    const auto s = static_cast<cudaStream_t>(stream);
    cudaError_t err = cudaMemcpyAsync(rows.data(), req_pool_indices.data,
                                      static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
      return Status::internal(
          cat(backend, ": replay req_pool_indices copy to the host: ", cudaGetErrorString(err)));
    }
#else
    (void)stream;
    return Status::unsupported(cat(backend, ": a CUDA replay in a build without CUDA"));
#endif
  }
  std::vector<int64_t> lens(static_cast<size_t>(bs));
  for (int r = 0; r < bs; ++r) {
    lens[static_cast<size_t>(r)] = seq_lens_host != nullptr
                                       ? static_cast<int64_t>(seq_lens_host[r]) + extra
                                       : static_cast<int64_t>(table->max_context_len());
  }
  return detail::check_table_slots(cat(backend, ": replay"), *table, pool->rows(), rows, lens);
}

}  // namespace attnkit
