// Whether the req_to_token entries a forward's kernels read are rows of its KV pool. The CUDA
// kernels turn every entry of a request's row into a pool address unchecked (one compare per key
// in the hot loops cost 1-4% of decode bandwidth, docs/kv_guard.md), so the entries are checked
// on the host, where they are written: ReqToTokenPool::max_slot() bounds the whole table, so a
// table that holds only pool rows passes with one compare, and only a table that holds a larger
// slot somewhere has the forward's own rows scanned.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "attnkit/kv_cache.h"
#include "attnkit/status.h"

namespace attnkit::detail {

// Request r of a batch reads req_to_token[rows[r], 0 : lens[r]) (lens[r] past max_context_len is
// cut to it). ok when every one of those entries is in [0, pool_rows); otherwise
// kInvalidArgument naming `who`, the first entry outside it, its request and the pool's rows. A row
// outside [0, max_reqs] is named too.
Status check_table_slots(std::string_view who, const ReqToTokenPool& table, int64_t pool_rows,
                         std::span<const int32_t> rows, std::span<const int64_t> lens);

}  // namespace attnkit::detail
