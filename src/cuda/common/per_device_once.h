// Once per CUDA device: the setup of a kernel (PerDeviceOnce) and a probe's answer
// (PerDeviceValue). cudaFuncSetAttribute (the dynamic shared-memory
// opt-in, the carveout) applies to the function's instance on the current device, so a process
// that launches the same kernel on two devices must set it on each: a flag kept once per process
// let the second device launch without the opt-in (cudaErrorInvalidValue past 48 KB).
#pragma once

#include <cuda_runtime.h>

#include <array>
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

// A small int computed once per device by a probe of the current device: whether a kernel loads as
// sm_90a code there (cudaFuncGetAttributes' binaryVersion), the launch mode its compute capability
// allows. A process-wide static would keep the first device's answer for every GPU of a process
// that mixes generations. A negative answer means "could not tell" (a failed query): it is
// returned, not kept, and the probe runs again at the next call. Devices past 64 run the probe
// every time; two threads may both run it.
class PerDeviceValue {
 public:
  PerDeviceValue() {
    for (std::atomic<int>& v : values_) v.store(kUnset, std::memory_order_relaxed);
  }

  // `probe` (returning int) runs on the current device unless that device has its answer.
  template <typename F>
  int get(F&& probe) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      return probe();
    }
    if (device < 0 || device >= kDevices) return probe();
    std::atomic<int>& slot = values_[static_cast<size_t>(device)];
    int v = slot.load(std::memory_order_acquire);
    if (v != kUnset) return v;
    v = probe();
    if (v >= 0) slot.store(v, std::memory_order_release);
    return v;
  }

 private:
  static constexpr int kDevices = 64;
  static constexpr int kUnset = -0x7fffffff;
  std::array<std::atomic<int>, kDevices> values_;
};

// 1 when `kernel` loads as sm_90a code on the current device (the wgmma / TMA kernels' probe); 0
// when it does not (another architecture's code, or no image for this device); -1 when the query
// failed otherwise (out of memory while loading the module, say), which PerDeviceValue does not
// keep.
template <typename Kernel>
int loads_as_sm90(Kernel* kernel) {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err == cudaErrorInvalidDeviceFunction || err == cudaErrorNoKernelImageForDevice ? 0 : -1;
  }
  return attr.binaryVersion == 90 ? 1 : 0;
}

}  // namespace attnkit::cuda
