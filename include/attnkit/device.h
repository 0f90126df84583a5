// What the code runs on: CPU features and CUDA devices, or a named virtual device for planning.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "attnkit/status.h"

namespace attnkit {

enum class Platform { kCPU, kCUDA, kROCm, kNPU, kXPU };
const char* platform_name(Platform platform);

struct DeviceInfo {
  std::string name;  // "NVIDIA H200", "virtual sm90", "Intel Xeon ..."
  Platform platform = Platform::kCPU;
  int compute_capability = 0;           // CUDA only: major * 10 + minor (90 for Hopper)
  int sm_count = 0;                     // CUDA only
  int max_shared_memory_per_block = 0;  // bytes, opt-in limit (CUDA only)
  int cuda_runtime_version = 0;         // e.g. 13000 (CUDA only)
  // CPU features (of the host, also reported for CUDA devices).
  bool has_avx2 = false;
  bool has_avx512 = false;  // AVX-512 F + BW + VL
  bool has_avx512_bf16 = false;
  bool has_avx512_vbmi = false;  // byte permutes (vpermi2b): the fp8 KV table lookups
  bool has_amx_bf16 = false;     // CPU supports it AND the OS granted the tile permission
  int cpu_threads = 1;
  bool is_virtual = false;

  bool is_hopper() const { return platform == Platform::kCUDA && compute_capability == 90; }
  bool is_sm100() const {
    return platform == Platform::kCUDA && compute_capability >= 100 && compute_capability < 110;
  }
};

// Host CPU features (cpuid + arch_prctl(ARCH_REQ_XCOMP_PERM) for AMX tiles).
DeviceInfo detect_cpu();
// CUDA device `ordinal`, or an error when the build or the machine has no CUDA device.
Result<DeviceInfo> detect_cuda(int ordinal = 0);
// A CUDA device if one is present, else the CPU.
DeviceInfo detect_default_device();
// Virtual devices for planning: cpu, cpu-noamx, sm75, sm80, sm89, sm90, sm100, sm120, rocm, npu,
// xpu; "auto" detects.
Result<DeviceInfo> device_by_name(std::string_view name);
std::vector<std::string> virtual_device_names();

}  // namespace attnkit
