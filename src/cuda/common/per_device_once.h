// One-time setup of a kernel per CUDA device. cudaFuncSetAttribute (the dynamic shared-memory
// opt-in, the carveout) applies to the function's instance on the current device, so a process
// that launches the same kernel on two devices must set it on each: a flag kept once per process
// let the second device launch without the opt-in (cudaErrorInvalidValue past 48 KB).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace attnkit::cuda {

class PerDeviceOnce {
 public:
  // Calls `setup` (returning cudaError_t) on the current device unless it already succeeded there;
  // a failure is returned and retried at the next call. Devices past the record's 64 run `setup`
  // every time. Two threads may both run it for one device (the attributes are idempotent).
  template <typename F>
  cudaError_t run(F&& setup) {
    int device = 0;
    const cudaError_t got = cudaGetDevice(&device);
    if (got != cudaSuccess) return got;
    if (device < 0 || device >= kDevices) return setup();
    const uint64_t bit = uint64_t{1} << device;
    if ((done_.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
    const cudaError_t err = setup();
    if (err == cudaSuccess) done_.fetch_or(bit, std::memory_order_release);
    return err;
  }

 private:
  static constexpr int kDevices = 64;
  std::atomic<uint64_t> done_{0};
};

}  // namespace attnkit::cuda
