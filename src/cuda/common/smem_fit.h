// Shared memory per block against the device. The tensor-core kernels' default shapes are sized
// for SM90 (227 KB a block) and SM80 (163 KB); sm_86 / sm_89 blocks (A10, A40, L4, L40, L40S,
// RTX 30 / 40) may opt in to 99 KB only. The ring decode, prefill and extend launchers check their
// bytes against the current device here first (the MLA decode engine refuses at creation, fa3's
// kernels run on SM90 only, the cut-plan kernel sizes itself), and the families whose default needs
// more than 99 KB keep a compact shape that fits (ring decode, flashinfer's prefill, triton's
// extend), chosen at launch from the same limit; where no compact shape exists the backend takes
// its portable kernel before it launches (docs/review_s58.md).
//
// The limit is the one the backends read (device_attributes.h), so ATTNKIT_EMULATE_CC=86 caps it
// at 99 KB on an H200 and a launch past it fails there as it would on the real device.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <string>
#include <type_traits>

#include "attnkit/status.h"
#include "core/emulated_cc.h"
#include "cuda/common/per_device_once.h"
#include "cuda/common/smem_limits.h"

namespace attnkit::cuda {

// The current device's opt-in shared memory per block, ATTNKIT_EMULATE_CC applied at every call
// (as device_attributes.h applies it at every backend creation, so a process that changes the
// variable between backends sees the same limit here as there); the device's own attributes are
// queried once per device (per_device_once.h). INT_MAX when the query fails (the launch then
// reports CUDA's own error rather than this check inventing one).
inline int current_device_smem_optin() {
  static PerDeviceValue compute_capability;
  static PerDeviceValue optin_bytes;
  const auto query = [](cudaDeviceAttr attr) {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return value;
  };
  int cc = compute_capability.get([&] {
    const int major = query(cudaDevAttrComputeCapabilityMajor);
    const int minor = query(cudaDevAttrComputeCapabilityMinor);
    return major < 0 || minor < 0 ? -1 : major * 10 + minor;
  });
  int optin = optin_bytes.get([&] { return query(cudaDevAttrMaxSharedMemoryPerBlockOptin); });
  if (cc < 0 || optin < 0) return INT_MAX;
  if (!detail::apply_emulated_compute_capability(&cc, &optin).is_ok()) return INT_MAX;
  return optin;
}

// ok when a block of `bytes` dynamic shared memory fits the current device; else unsupported,
// naming the kernel (`what`), its bytes and the device's limit. Launchers call it before they opt
// in, so a shape the backend should not have chosen is a clear error, never a CUDA launch failure.
inline Status check_smem_fits(int bytes, const char* what) {
  const int optin = current_device_smem_optin();
  if (bytes <= optin) return Status::ok();
  return Status::unsupported(std::string(what) + " needs " + std::to_string(bytes) +
                             " bytes of shared memory per block; this device allows " +
                             std::to_string(optin) + " (cudaDevAttrMaxSharedMemoryPerBlockOptin)");
}

// Runs launch.template operator()<Default>() when Default's `default_bytes` fit the current device,
// else launch.template operator()<Compact>(); one instantiation where the two are the same type
// (a default that fits every tensor-core device names itself as its compact shape).
template <typename Default, typename Compact, typename Launch>
Status launch_fitting(int default_bytes, Launch&& launch) {
  if constexpr (std::is_same_v<Default, Compact>) {
    (void)default_bytes;
    return launch.template operator()<Default>();
  } else {
    if (default_bytes <= current_device_smem_optin()) return launch.template operator()<Default>();
    return launch.template operator()<Compact>();
  }
}

}  // namespace attnkit::cuda
