// The KV pool's device error word (one per CUDA pool). Plain C++ (no CUDA types): shared by host
// code and set_kv_cuda.cu's scatter kernels.
#pragma once

#include <cstdint>

namespace attnkit::detail {

// What a set record holds (KVGuardRecord::flag).
inline constexpr uint32_t kGuardNone = 0;
inline constexpr uint32_t kGuardBadWrite = 1;  // set_kv skipped a write to an out-of-pool slot

// The pool's device error word (24 bytes, zeroed at pool creation and by kv_guard_read_and_clear).
// The first bad write since the last check wins an atomicCAS on `flag` and fills the rest.
struct KVGuardRecord {
  uint32_t flag = kGuardNone;
  int32_t layer = -1;  // the set_kv layer
  int32_t token = -1;  // index into loc
  int32_t pad = 0;
  int64_t slot = 0;  // loc[token]
};
static_assert(sizeof(KVGuardRecord) == 24, "KVGuardRecord is shared with the device");

}  // namespace attnkit::detail
