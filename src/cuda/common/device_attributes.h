// The CUDA device attributes the backends size their kernels and plans by, queried once when a
// backend is created (cudaDeviceGetAttribute: cheap, no context-wide property dump), capped by
// ATTNKIT_EMULATE_CC (core/emulated_cc.h).
#pragma once

#include <cuda_runtime.h>

#include "attnkit/status.h"
#include "core/emulated_cc.h"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::cuda {

struct DeviceAttributes {
  int sm_count = 0;
  int compute_capability = 0;        // major * 10 + minor (90 for Hopper)
  int max_smem_per_block_optin = 0;  // bytes of dynamic shared memory a block may opt in to
};

inline Status query_device_attributes(int ordinal, DeviceAttributes* out) {
  int major = 0, minor = 0;
  ATTNKIT_CUDA_TRY(cudaDeviceGetAttribute(&out->sm_count, cudaDevAttrMultiProcessorCount, ordinal));
  ATTNKIT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal));
  ATTNKIT_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal));
  ATTNKIT_CUDA_TRY(cudaDeviceGetAttribute(&out->max_smem_per_block_optin,
                                          cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal));
  out->compute_capability = major * 10 + minor;
  return detail::apply_emulated_compute_capability(&out->compute_capability,
                                                   &out->max_smem_per_block_optin);
}

}  // namespace attnkit::cuda
