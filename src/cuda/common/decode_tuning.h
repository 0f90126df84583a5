// Experiment knob of the paged decode split planners (triton and flashinfer): the grid's target
// blocks per SM. Default: the ring decode's residency (2 blocks of 110 KB shared memory per SM90
// multiprocessor), i.e. one wave. ATTNKIT_DECODE_BLOCKS_PER_SM=N (1..8) overrides it when the
// backend is created, so a device run can compare waves without a rebuild
// (docs/perf/decode_notes.md). Not part of the API; the default is the documented heuristic.
// Also the host-side pieces both backends (triton and flashinfer) need around the ring decode: its
// row-stride limit and its zeroed split counters.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backend/device_array.h"
#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::cuda {

// ATTNKIT_DECODE_BLOCKS_PER_SM: 1..8 (a bad value is reported once and ignored, env_knob.h).
inline int decode_blocks_per_sm(int default_value) {
  return env_int_range("ATTNKIT_DECODE_BLOCKS_PER_SM", default_value, 1, 8);
}

// The ring decode (ring_decode.cuh) addresses pool rows with 32-bit byte strides: pools whose K
// or V rows are 4 GiB or more apart are refused by name instead of wrapping around.
inline Status check_ring_decode_row_stride(const char* backend, DType kv_dtype, const TensorView& k,
                                           const TensorView& v) {
  const int64_t row_bytes = std::max(dtype_storage_bytes(kv_dtype, k.stride(0)),
                                     dtype_storage_bytes(kv_dtype, v.stride(0)));
  if (row_bytes >= (int64_t{1} << 32)) {
    return Status::unsupported(std::string(backend) + ": KV pool rows of " +
                               std::to_string(row_bytes) +
                               " bytes; the tensor-core decode takes row strides below 4 GiB");
  }
  return Status::ok();
}

// Grows `a` to n split counters; a new allocation is zeroed on `stream` (the decode kernels leave
// the counters zero after every launch, so only fresh memory needs it).
inline Status reserve_zeroed_counters(DeviceArray<int32_t>& a, Device device, int64_t n,
                                      StreamHandle stream) {
  const int64_t before = a.capacity;
  ATTNKIT_RETURN_IF_ERROR(a.reserve(device, n));
  if (a.capacity != before) {
    ATTNKIT_CUDA_TRY(cudaMemsetAsync(a.data(), 0, static_cast<size_t>(a.capacity) * sizeof(int32_t),
                                     to_stream(stream)));
  }
  return Status::ok();
}

}  // namespace attnkit::cuda
