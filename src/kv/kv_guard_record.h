// The KV pool's device error word (one per CUDA pool) and the slot guard the attention kernels
// take. Plain C++ (no CUDA types): shared by host code, the kernels' parameter structs and the
// device code (set_kv_cuda.cu, cuda/common/slot_guard.cuh).
#pragma once

#include <cstdint>

namespace attnkit::detail {

// What a set record holds (KVGuardRecord::flag).
inline constexpr uint32_t kGuardNone = 0;
inline constexpr uint32_t kGuardBadWrite = 1;  // set_kv skipped a write to an out-of-pool slot
inline constexpr uint32_t kGuardBadRead = 2;   // an attention kernel met an out-of-pool row

// The pool's device error word (24 bytes, zeroed at pool creation and by kv_guard_read_and_clear).
// The first bad write or read since the last check wins an atomicCAS on `flag` and fills the rest.
struct KVGuardRecord {
  uint32_t flag = kGuardNone;
  int32_t layer = -1;  // the set_kv layer / the attention layer's pool layer
  int32_t token = -1;  // write: index into loc; read: the request (batch index), -1 unknown
  int32_t key = -1;    // read: the key position in the request's req_to_token row, -1 unknown
  int64_t slot = 0;    // write: loc[token]; read: the pool row the kernel would have read
};
static_assert(sizeof(KVGuardRecord) == 24, "KVGuardRecord is shared with the device");

// What an attention kernel needs to check the pool rows it reads (kernel parameter structs hold
// one; detail::set_slot_guard fills it from the batch's pool): a row r is read only when
// 0 <= r < rows; any other row is recorded in `record` (nullptr: not recorded) and row 0 (page 0,
// the dummy page inside the pool) is read instead, so no kernel reads outside the pool's buffers.
struct SlotGuard {
  KVGuardRecord* record = nullptr;
  // KVPool::rows(): usable slots plus page 0. The default, for a params struct whose caller sets
  // no guard, lets every non-negative int32 row through (negative rows, which the kernels also use
  // as sentinels, still fail the compare): it never turns a good row into row 0.
  int64_t rows = 0x7fffffff;
  int32_t layer = -1;
  int32_t reserved = 0;
};

}  // namespace attnkit::detail
