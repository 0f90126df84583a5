// DeviceInfo detection (cpuid + the Linux AMX tile permission; the CUDA runtime when built with
// CUDA) and the named virtual devices used for planning.
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "attnkit/device.h"
#include "core/emulated_cc.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ATTNKIT_X86 1
#endif
#if defined(__linux__) && defined(ATTNKIT_X86)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/common/kernel_image.h"
#endif

namespace attnkit {
namespace {

#ifdef ATTNKIT_X86
// CPUID.(EAX=1):ECX and CPUID.(EAX=7,ECX=0/1) bits (Intel SDM vol. 2A, table 3-8 / 3-11).
constexpr uint32_t kLeaf1EcxOsxsave = 1u << 27;
// The avx2 path is compiled with avx2, fma and f16c (kernels_avx2.cpp): a VM exposing AVX2 with
// FMA or F16C masked would SIGILL there.
constexpr uint32_t kLeaf1EcxFma = 1u << 12;
constexpr uint32_t kLeaf1EcxF16c = 1u << 29;
constexpr uint32_t kLeaf7EbxAvx2 = 1u << 5;
constexpr uint32_t kLeaf7EbxAvx512F = 1u << 16;
constexpr uint32_t kLeaf7EbxAvx512Bw = 1u << 30;
constexpr uint32_t kLeaf7EbxAvx512Vl = 1u << 31;
constexpr uint32_t kLeaf7EcxAvx512Vbmi = 1u << 1;
constexpr uint32_t kLeaf7EdxAmxBf16 = 1u << 22;
constexpr uint32_t kLeaf7EdxAmxTile = 1u << 24;
constexpr uint32_t kLeaf7Sub1EaxAvx512Bf16 = 1u << 5;
// XCR0 state components: SSE|AVX (bits 1-2), opmask|ZMM_Hi256|Hi16_ZMM (bits 5-7).
constexpr uint64_t kXcr0Ymm = (1u << 1) | (1u << 2);
constexpr uint64_t kXcr0Zmm = kXcr0Ymm | (1u << 5) | (1u << 6) | (1u << 7);
constexpr uint32_t kBrandLeafFirst = 0x80000002u;
constexpr uint32_t kBrandLeafLast = 0x80000004u;

uint64_t read_xcr0() {
  uint32_t lo = 0;
  uint32_t hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string cpu_brand() {
  uint32_t max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext < kBrandLeafLast) return "x86-64 CPU";
  std::array<char, 49> brand{};
  for (uint32_t leaf = kBrandLeafFirst; leaf <= kBrandLeafLast; ++leaf) {
    uint32_t regs[4] = {0, 0, 0, 0};
    __get_cpuid(leaf, &regs[0], &regs[1], &regs[2], &regs[3]);
    std::memcpy(brand.data() + (leaf - kBrandLeafFirst) * sizeof(regs), regs, sizeof(regs));
  }
  std::string s(brand.data());
  const size_t first = s.find_first_not_of(' ');
  return first == std::string::npos ? "x86-64 CPU" : s.substr(first);
}

// Linux keeps AMX tile data disabled per process until it is requested (kernel >= 5.16).
bool request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif  // ATTNKIT_X86

int host_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

DeviceInfo virtual_cpu(bool amx) {
  DeviceInfo d;
  d.name = amx ? "virtual cpu (Xeon with AMX-BF16)" : "virtual cpu-noamx (AVX-512, no AMX)";
  d.platform = Platform::kCPU;
  d.has_avx2 = true;
  d.has_avx512 = true;
  d.has_avx512_bf16 = amx;
  d.has_avx512_vbmi = amx;
  d.has_amx_bf16 = amx;
  d.cpu_threads = host_threads();
  d.is_virtual = true;
  return d;
}

struct VirtualGpu {
  const char* name;
  const char* label;
  int compute_capability;
  int sm_count;
  int max_shared_memory_per_block;  // opt-in bytes per block
};

// Representative parts: T4, A100, L40S, H100 SXM, B200, RTX PRO 6000 Blackwell.
constexpr VirtualGpu kVirtualGpus[] = {
    {"sm75", "virtual sm75 (T4-class)", 75, 40, 65536},
    {"sm80", "virtual sm80 (A100-class)", 80, 108, 166912},
    {"sm89", "virtual sm89 (L40S-class)", 89, 142, 101376},
    {"sm90", "virtual sm90 (H100-class)", 90, 132, 232448},
    {"sm100", "virtual sm100 (B200-class)", 100, 148, 232448},
    {"sm120", "virtual sm120 (RTX PRO 6000-class)", 120, 188, 101376},
};
constexpr int kVirtualCudaRuntime = 13000;

DeviceInfo virtual_other(Platform platform, const char* label) {
  DeviceInfo d;
  d.name = label;
  d.platform = platform;
  d.cpu_threads = host_threads();
  d.is_virtual = true;
  return d;
}

}  // namespace

const char* platform_name(Platform platform) {
  switch (platform) {
    case Platform::kCPU:
      return "cpu";
    case Platform::kCUDA:
      return "cuda";
    case Platform::kROCm:
      return "rocm";
    case Platform::kNPU:
      return "npu";
    case Platform::kXPU:
      return "xpu";
  }
  return "unknown";
}

DeviceInfo detect_cpu() {
  DeviceInfo d;
  d.platform = Platform::kCPU;
  d.cpu_threads = host_threads();
#ifdef ATTNKIT_X86
  d.name = cpu_brand();
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
  const uint32_t max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 1 && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & kLeaf1EcxOsxsave)) {
    const bool fma_f16c = (ecx & kLeaf1EcxFma) && (ecx & kLeaf1EcxF16c);
    const uint64_t xcr0 = read_xcr0();
    const bool os_ymm = (xcr0 & kXcr0Ymm) == kXcr0Ymm;
    const bool os_zmm = (xcr0 & kXcr0Zmm) == kXcr0Zmm;
    if (max_leaf >= 7 && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
      const uint32_t ebx7 = ebx;
      const uint32_t ecx7 = ecx;
      const uint32_t edx7 = edx;
      const uint32_t max_sub = eax;
      d.has_avx2 = os_ymm && fma_f16c && (ebx7 & kLeaf7EbxAvx2);
      d.has_avx512 = os_zmm && (ebx7 & kLeaf7EbxAvx512F) && (ebx7 & kLeaf7EbxAvx512Bw) &&
                     (ebx7 & kLeaf7EbxAvx512Vl);
      d.has_avx512_vbmi = d.has_avx512 && (ecx7 & kLeaf7EcxAvx512Vbmi);
      if (max_sub >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
        d.has_avx512_bf16 = d.has_avx512 && (eax & kLeaf7Sub1EaxAvx512Bf16);
      }
      const bool cpu_amx = (edx7 & kLeaf7EdxAmxBf16) && (edx7 & kLeaf7EdxAmxTile);
      d.has_amx_bf16 = cpu_amx && request_amx_permission();
#ifdef ATTNKIT_AMX_EMULATE
      // Test-only build: the AMX kernel runs on a software model of the tiles (amx_tiles.h).
      d.has_amx_bf16 = d.has_amx_bf16 || (d.has_avx512_bf16 && d.has_avx512_vbmi);
#endif
    }
  }
#else
  d.name = "CPU";
#endif
  return d;
}

Result<DeviceInfo> detect_cuda(int ordinal) {
#ifdef ATTNKIT_WITH_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return Status::not_found(std::string("detect_cuda: no CUDA device available (") +
                             cudaGetErrorString(err) + ")");
  }
  if (ordinal < 0 || ordinal >= count) {
    return Status::not_found("detect_cuda: ordinal " + std::to_string(ordinal) +
                             " is out of range; this machine has " + std::to_string(count) +
                             " CUDA device(s)");
  }
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, ordinal);
  if (err != cudaSuccess) {
    return Status::cuda_error(std::string("detect_cuda: cudaGetDeviceProperties failed: ") +
                              cudaGetErrorString(err));
  }
  int runtime = 0;
  err = cudaRuntimeGetVersion(&runtime);
  if (err != cudaSuccess) {
    return Status::cuda_error(std::string("detect_cuda: cudaRuntimeGetVersion failed: ") +
                              cudaGetErrorString(err));
  }
  constexpr int kCcMajorScale = 10;
  if (!cuda::binary_has_kernel_image(ordinal)) {
    return Status::unsupported(
        std::string("detect_cuda: this binary has no CUDA code for ") + prop.name + " (sm_" +
        std::to_string(prop.major * kCcMajorScale + prop.minor) +
        "): it was built for CMAKE_CUDA_ARCHITECTURES " ATTNKIT_CUDA_ARCHITECTURES
        "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" +
        std::to_string(prop.major * kCcMajorScale + prop.minor) + " added");
  }
  DeviceInfo d = detect_cpu();
  d.name = prop.name;
  d.platform = Platform::kCUDA;
  d.compute_capability = prop.major * kCcMajorScale + prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.max_shared_memory_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
  d.cuda_runtime_version = runtime;
  ATTNKIT_RETURN_IF_ERROR(detail::apply_emulated_compute_capability(
      &d.compute_capability, &d.max_shared_memory_per_block));
  return d;
#else
  (void)ordinal;
  return Status::not_built("detect_cuda: this binary was built without CUDA (ATTNKIT_CUDA=OFF)");
#endif
}

DeviceInfo detect_default_device() {
  Result<DeviceInfo> cuda = detect_cuda(0);
  if (cuda.is_ok()) return std::move(cuda).value();
  return detect_cpu();
}

std::vector<std::string> virtual_device_names() {
  std::vector<std::string> names = {"cpu", "cpu-noamx"};
  for (const VirtualGpu& g : kVirtualGpus) names.emplace_back(g.name);
  names.insert(names.end(), {"rocm", "npu", "xpu"});
  return names;
}

Result<DeviceInfo> device_by_name(std::string_view name) {
  if (name == "auto") return detect_default_device();
  if (name == "cpu") return virtual_cpu(true);
  if (name == "cpu-noamx") return virtual_cpu(false);
  for (const VirtualGpu& g : kVirtualGpus) {
    if (name == g.name) {
      DeviceInfo d;
      d.name = g.label;
      d.platform = Platform::kCUDA;
      d.compute_capability = g.compute_capability;
      d.sm_count = g.sm_count;
      d.max_shared_memory_per_block = g.max_shared_memory_per_block;
      d.cuda_runtime_version = kVirtualCudaRuntime;
      d.cpu_threads = host_threads();
      d.is_virtual = true;
      return d;
    }
  }
  if (name == "rocm") return virtual_other(Platform::kROCm, "virtual rocm (MI300-class)");
  if (name == "npu") return virtual_other(Platform::kNPU, "virtual npu (Ascend)");
  if (name == "xpu") return virtual_other(Platform::kXPU, "virtual xpu (Intel Data Center GPU)");
  std::string valid = "auto";
  for (const std::string& n : virtual_device_names()) valid += ", " + n;
  return Status::invalid_argument("--device \"" + std::string(name) +
                                  "\" is not a known device; valid devices: " + valid);
}

}  // namespace attnkit
