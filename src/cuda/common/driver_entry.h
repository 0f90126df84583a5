// A CUDA driver function through the runtime (cudaGetDriverEntryPointByVersion), so that no
// translation unit links libcuda: the TMA descriptor encoder (tma_map.cpp) and the primary-context
// query of DeviceScope (core/device_scope.cpp).
#pragma once

#include <cuda_runtime.h>

namespace attnkit::cuda {

// The driver's `name` at ABI `version` as a `Fn` (its PFN_ type from cudaTypedefs.h); nullptr if
// the driver lacks it (the runtime's error is cleared).
template <typename Fn>
Fn driver_entry(const char* name, unsigned version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(f);
}

}  // namespace attnkit::cuda
