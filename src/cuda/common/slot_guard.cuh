// Device side of the slot guard (kv/kv_guard_record.h): every attention kernel that turns a
// req_to_token / page-table / kv_indices / out_cache_loc entry into a pool row passes the row
// through guard_row before it forms an address. A row outside [0, rows) (a bad entry: negative,
// past the pool, or a page entry whose row overflowed) is recorded in the pool's error word
// (KVPool::check_device_errors reports it) and replaced by row 0, the dummy page inside the pool:
// the kernel never reads outside the pool's buffers, and the forward's output for that request is
// wrong but the error is named. The check is one unsigned compare per row; the recording is out of
// the cold branch (taken only on a bad row).
#pragma once

#include <cstdint>

#include "kv/kv_guard_record.h"

namespace attnkit::cuda {

// Records (layer, request, key, row) as the first bad read unless something is already recorded.
// Any thread may call it; the first caller since the last check wins. Inlined into the cold branch
// of its callers: as an out-of-line call, ptxas saved the caller's live registers around it (new
// spills in the register-tight decode, prefill and MLA kernels, ptxas -v).
__device__ __forceinline__ void record_bad_read(const detail::SlotGuard& g, int request, int key,
                                                int64_t row) {
  detail::KVGuardRecord* rec = g.record;
  if (rec != nullptr &&
      atomicCAS(&rec->flag, detail::kGuardNone, detail::kGuardBadRead) == detail::kGuardNone) {
    rec->layer = g.layer;
    rec->token = request;
    rec->key = key;
    rec->slot = row;
  }
}

// `row` when it is a row of the pool, else records it and returns 0. 64-bit rows (a page entry
// times the page size may not fit 32 bits).
__device__ __forceinline__ int64_t guard_row(const detail::SlotGuard& g, int64_t row, int request,
                                             int key) {
  if (static_cast<uint64_t>(row) < static_cast<uint64_t>(g.rows)) return row;
  record_bad_read(g, request, key, row);
  return 0;
}

// The same for 32-bit row arithmetic (rows < 2^31: the pools' slots are int32): a negative or
// wrapped row is a huge unsigned value and fails the one compare.
__device__ __forceinline__ uint32_t guard_row32(const detail::SlotGuard& g, uint32_t row,
                                                int request, int key) {
  if (row < static_cast<uint32_t>(g.rows)) return row;
  record_bad_read(g, request, key, static_cast<int64_t>(static_cast<int32_t>(row)));
  return 0u;
}

}  // namespace attnkit::cuda
