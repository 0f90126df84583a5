// ReqToTokenPool: the int32 [max_reqs + 1, max_context_len] request -> slot table.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "attnkit/kv_cache.h"

namespace attnkit {

namespace {

constexpr int64_t kMaxSlotInt32 = std::numeric_limits<int32_t>::max();

}  // namespace

Result<std::unique_ptr<ReqToTokenPool>> ReqToTokenPool::create(int max_reqs, int max_context_len,
                                                               Device device) {
  if (max_reqs < 1) {
    return Status::invalid_argument("max_reqs " + std::to_string(max_reqs) +
                                    " must be >= 1 (row 0 is reserved on top of it)");
  }
  if (max_context_len < 1) {
    return Status::invalid_argument("max_context_len " + std::to_string(max_context_len) +
                                    " must be >= 1");
  }
  const int64_t entries = (static_cast<int64_t>(max_reqs) + 1) * max_context_len;
  if (entries > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(int32_t))) {
    return Status::invalid_argument("ReqToTokenPool: (max_reqs " + std::to_string(max_reqs) +
                                    " + 1) x max_context_len " + std::to_string(max_context_len) +
                                    " int32 entries overflow a 64-bit byte count");
  }
  const int64_t bytes = entries * static_cast<int64_t>(sizeof(int32_t));
  ATTNKIT_ASSIGN_OR_RETURN(Buffer buffer, Buffer::allocate(device, bytes));

  auto pool = std::unique_ptr<ReqToTokenPool>(new ReqToTokenPool());
  pool->max_reqs_ = max_reqs;
  pool->max_context_len_ = max_context_len;
  pool->buffer_ = std::move(buffer);
  if (device.is_cpu()) {
    std::memset(pool->buffer_.data(), 0, static_cast<size_t>(bytes));
  } else {
    // The host mirror starts zeroed; push it so the device table matches (row 0 -> slot 0).
    pool->host_.assign(static_cast<size_t>(entries), 0);
    ATTNKIT_RETURN_IF_ERROR(
        copy_bytes(pool->buffer_.data(), device, pool->host_.data(), Device::cpu(), bytes));
  }
  pool->in_use_.assign(static_cast<size_t>(max_reqs) + 1, 0);
  pool->written_end_.assign(static_cast<size_t>(max_reqs) + 1, 0);
  pool->row_max_.assign(static_cast<size_t>(max_reqs) + 1, 0);
  pool->free_rows_.reserve(static_cast<size_t>(max_reqs));
  for (int row = max_reqs; row >= 1; --row) pool->free_rows_.push_back(row);  // lowest at back
  return pool;
}

Result<int> ReqToTokenPool::alloc() {
  if (free_rows_.empty()) {
    return Status::out_of_memory("ReqToTokenPool: all " + std::to_string(max_reqs_) +
                                 " request rows are in use");
  }
  const int row = free_rows_.back();
  free_rows_.pop_back();
  in_use_[static_cast<size_t>(row)] = 1;
  return row;
}

Status ReqToTokenPool::free(int row) {
  if (row < 1 || row > max_reqs_) {
    return Status::invalid_argument("ReqToTokenPool::free: row " + std::to_string(row) +
                                    " is outside [1, " + std::to_string(max_reqs_) +
                                    "] (row 0 is reserved)");
  }
  if (!in_use_[static_cast<size_t>(row)]) {
    return Status::invalid_argument("ReqToTokenPool::free: row " + std::to_string(row) +
                                    " is not allocated (double free?)");
  }
  // Back to all zeros (page 0, the dummy page) before the row can be handed out again: a reader
  // of a stale req_pool_index or the next request on this row never sees this request's slots.
  // Only the columns ever written can be non-zero, so only those are copied (a request of 2k
  // tokens in a 128k table moves 8 KB, not 512 KB).
  const auto r = static_cast<size_t>(row);
  const std::vector<int32_t> zeros(static_cast<size_t>(written_end_[r]), 0);
  ATTNKIT_RETURN_IF_ERROR(store(row_offset(row), zeros));
  written_end_[r] = 0;
  const bool held_the_max = row_max_[r] == max_slot_ && max_slot_ != 0;
  row_max_[r] = 0;
  if (held_the_max) recompute_max_slot();  // O(max_reqs), beside the row's copy above
  in_use_[r] = 0;
  free_rows_.push_back(row);
  return Status::ok();
}

bool ReqToTokenPool::is_allocated(int row) const {
  return row >= 1 && row <= max_reqs_ && in_use_[static_cast<size_t>(row)] != 0;
}

int ReqToTokenPool::available() const { return static_cast<int>(free_rows_.size()); }

TensorView ReqToTokenPool::table() const {
  return buffer_.view(DType::kI32, {static_cast<int64_t>(max_reqs_) + 1, max_context_len_});
}

const int32_t* ReqToTokenPool::host_row(int row) const {
  if (row < 0 || row > max_reqs_) return nullptr;
  const size_t offset = row_offset(row);
  if (buffer_.device().is_cpu()) return static_cast<const int32_t*>(buffer_.data()) + offset;
  return host_.data() + offset;
}

void ReqToTokenPool::recompute_max_slot() {
  max_slot_ = *std::max_element(row_max_.begin(), row_max_.end());
}

void ReqToTokenPool::note_row_max(int row, int32_t largest) {
  int32_t& m = row_max_[static_cast<size_t>(row)];
  m = std::max(m, largest);
  max_slot_ = std::max(max_slot_, m);
}

size_t ReqToTokenPool::row_offset(int row) const {
  return static_cast<size_t>(row) * static_cast<size_t>(max_context_len_);
}

Status ReqToTokenPool::store(size_t offset, std::span<const int32_t> values) {
  if (values.empty()) return Status::ok();
  if (buffer_.device().is_cpu()) {
    std::copy(values.begin(), values.end(), static_cast<int32_t*>(buffer_.data()) + offset);
    return Status::ok();
  }
  // The device table first, the host mirror only after the copy succeeded: a failed copy leaves
  // both as they were (the mirror had been updated first and then disagreed with the device).
  ATTNKIT_RETURN_IF_ERROR(copy_bytes(static_cast<int32_t*>(buffer_.data()) + offset,
                                     buffer_.device(), values.data(), Device::cpu(),
                                     static_cast<int64_t>(values.size_bytes())));
  std::copy(values.begin(), values.end(), host_.begin() + static_cast<std::ptrdiff_t>(offset));
  return Status::ok();
}

Status ReqToTokenPool::write(int row, int start, std::span<const int64_t> slots) {
  if (row < 1 || row > max_reqs_) {
    return Status::invalid_argument("ReqToTokenPool::write: row " + std::to_string(row) +
                                    " is outside [1, " + std::to_string(max_reqs_) +
                                    "] (row 0 is reserved)");
  }
  if (!in_use_[static_cast<size_t>(row)]) {
    return Status::invalid_argument("ReqToTokenPool::write: row " + std::to_string(row) +
                                    " is not allocated (take rows from alloc(); a freed row "
                                    "belongs to no request)");
  }
  const int64_t n = static_cast<int64_t>(slots.size());
  if (start < 0 || static_cast<int64_t>(start) + n > max_context_len_) {
    return Status::invalid_argument("ReqToTokenPool::write: columns [" + std::to_string(start) +
                                    ", " + std::to_string(static_cast<int64_t>(start) + n) +
                                    ") do not fit in [0, max_context_len " +
                                    std::to_string(max_context_len_) + ")");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = slots[static_cast<size_t>(i)];
    if (slot < 0 || slot > kMaxSlotInt32) {
      return Status::invalid_argument("ReqToTokenPool::write: slots[" + std::to_string(i) +
                                      "] = " + std::to_string(slot) + " is outside [0, INT32_MAX]");
    }
  }
  std::vector<int32_t> values(static_cast<size_t>(n));
  int32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    values[static_cast<size_t>(i)] = static_cast<int32_t>(slots[static_cast<size_t>(i)]);
    largest = std::max(largest, values[static_cast<size_t>(i)]);
  }
  ATTNKIT_RETURN_IF_ERROR(store(row_offset(row) + static_cast<size_t>(start), values));
  int32_t& end = written_end_[static_cast<size_t>(row)];
  end = std::max(end, static_cast<int32_t>(start + n));
  note_row_max(row, largest);
  return Status::ok();
}

Status ReqToTokenPool::copy_rows_from(const ReqToTokenPool& src, std::span<const int32_t> rows) {
  if (src.max_reqs_ != max_reqs_ || src.max_context_len_ != max_context_len_) {
    return Status::invalid_argument(
        "ReqToTokenPool::copy_rows_from: src is [" + std::to_string(src.max_reqs_) + " + 1, " +
        std::to_string(src.max_context_len_) + "] but this pool is [" + std::to_string(max_reqs_) +
        " + 1, " + std::to_string(max_context_len_) + "]");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] > max_reqs_) {
      return Status::invalid_argument("ReqToTokenPool::copy_rows_from: rows[" + std::to_string(i) +
                                      "] = " + std::to_string(rows[i]) + " is outside [0, " +
                                      std::to_string(max_reqs_) + "]");
    }
  }
  if (&src == this) return Status::ok();
  for (const int32_t row : rows) {
    if (row == 0) continue;  // all zeros in both, never allocated
    const int32_t* entries = src.host_row(row);
    ATTNKIT_RETURN_IF_ERROR(store(
        row_offset(row), std::span<const int32_t>(entries, static_cast<size_t>(max_context_len_))));
    written_end_[static_cast<size_t>(row)] = max_context_len_;  // the whole row was copied
    // Overwritten whole: the row's bound is src's, which may be lower than this row's was.
    const bool lowered =
        row_max_[static_cast<size_t>(row)] > src.row_max_[static_cast<size_t>(row)];
    row_max_[static_cast<size_t>(row)] = 0;
    note_row_max(row, src.row_max_[static_cast<size_t>(row)]);
    if (lowered) recompute_max_slot();
    const bool allocated = src.is_allocated(row);
    if (allocated == is_allocated(row)) continue;
    in_use_[static_cast<size_t>(row)] = allocated ? 1 : 0;
    if (allocated) {
      free_rows_.erase(std::find(free_rows_.begin(), free_rows_.end(), row));
    } else {
      free_rows_.push_back(row);
    }
  }
  return Status::ok();
}

}  // namespace attnkit
