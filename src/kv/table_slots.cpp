// check_table_slots (table_slots.h).
#include "kv/table_slots.h"

#include <algorithm>

#include "core/str_cat.h"

namespace attnkit::detail {

Status check_table_slots(std::string_view who, const ReqToTokenPool& table, int64_t pool_rows,
                         std::span<const int32_t> rows, std::span<const int64_t> lens) {
  if (static_cast<int64_t>(table.max_slot()) < pool_rows) return Status::ok();
  for (size_t r = 0; r < rows.size(); ++r) {
    const int32_t row = rows[r];
    const int32_t* entries = table.host_row(row);
    if (entries == nullptr) {
      return Status::invalid_argument(cat(who, ": req_pool_indices[", r, "] = ", row,
                                          " is outside the request table rows [0, ",
                                          table.max_reqs(), "]"));
    }
    const int64_t n = std::min<int64_t>(r < lens.size() ? lens[r] : 0, table.max_context_len());
    for (int64_t i = 0; i < n; ++i) {
      if (entries[i] < 0 || entries[i] >= pool_rows) {
        return Status::invalid_argument(
            cat(who, ": req_to_token[", row, ", ", i, "] = ", entries[i], " (request ", r,
                ") is outside the KV pool slots [0, ", pool_rows,
                "): the attention kernels would read it as a pool row"));
      }
    }
  }
  return Status::ok();
}

}  // namespace attnkit::detail
