// DeviceInfo: host CPU detection, CUDA detection without a GPU / without CUDA, virtual devices.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "attnkit/device.h"
#include "core/emulated_cc.h"

namespace attnkit {
namespace {

TEST(DeviceInfo, DetectCpuIsConsistent) {
  const DeviceInfo d = detect_cpu();
  EXPECT_EQ(d.platform, Platform::kCPU);
  EXPECT_FALSE(d.is_virtual);
  EXPECT_FALSE(d.name.empty());
  EXPECT_GE(d.cpu_threads, 1);
  // Feature implications: AVX-512 BF16 needs AVX-512; AVX-512 (F/BW/VL) implies AVX2 on every
  // shipped CPU; AMX here also needs the OS permission, so it is only ever a subset.
  if (d.has_avx512_bf16) EXPECT_TRUE(d.has_avx512);
  if (d.has_avx512_vbmi) EXPECT_TRUE(d.has_avx512);
  if (d.has_avx512) EXPECT_TRUE(d.has_avx2);
  EXPECT_EQ(d.compute_capability, 0);
  // Detection is deterministic.
  const DeviceInfo again = detect_cpu();
  EXPECT_EQ(again.has_amx_bf16, d.has_amx_bf16);
  EXPECT_EQ(again.has_avx512, d.has_avx512);
}

TEST(DeviceInfo, DetectCudaWithoutDeviceIsAnError) {
  Result<DeviceInfo> cuda = detect_cuda(0);
#ifdef ATTNKIT_WITH_CUDA
  if (cuda.is_ok()) {
    EXPECT_EQ(cuda->platform, Platform::kCUDA);
    EXPECT_GE(cuda->compute_capability, 50);
    EXPECT_GT(cuda->sm_count, 0);
    EXPECT_GT(cuda->cuda_runtime_version, 0);
  } else {
    EXPECT_EQ(cuda.status().code(), StatusCode::kNotFound) << cuda.status().to_string();
  }
  constexpr int kAbsurdOrdinal = 1000;
  EXPECT_FALSE(detect_cuda(kAbsurdOrdinal).is_ok());
#else
  ASSERT_FALSE(cuda.is_ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kNotBuilt);
  EXPECT_NE(cuda.status().message().find("built without CUDA"), std::string::npos);
  EXPECT_EQ(detect_default_device().platform, Platform::kCPU);
#endif
}

TEST(DeviceInfo, VirtualGpus) {
  struct Expected {
    const char* name;
    int cc;
  };
  for (const Expected& e : {Expected{"sm75", 75}, Expected{"sm80", 80}, Expected{"sm89", 89},
                            Expected{"sm90", 90}, Expected{"sm100", 100}, Expected{"sm120", 120}}) {
    Result<DeviceInfo> d = device_by_name(e.name);
    ASSERT_TRUE(d.is_ok()) << e.name;
    EXPECT_EQ(d->platform, Platform::kCUDA);
    EXPECT_EQ(d->compute_capability, e.cc);
    EXPECT_TRUE(d->is_virtual);
    EXPECT_GT(d->sm_count, 0);
    EXPECT_GT(d->max_shared_memory_per_block, 0);
    EXPECT_GE(d->cuda_runtime_version, 12030);
    EXPECT_EQ(d->is_hopper(), e.cc == 90) << e.name;
    EXPECT_EQ(d->is_sm100(), e.cc == 100) << e.name;
  }
}

TEST(DeviceInfo, VirtualCpusAndOtherPlatforms) {
  Result<DeviceInfo> cpu = device_by_name("cpu");
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_TRUE(cpu->has_amx_bf16);
  EXPECT_TRUE(cpu->has_avx512);
  Result<DeviceInfo> noamx = device_by_name("cpu-noamx");
  ASSERT_TRUE(noamx.is_ok());
  EXPECT_FALSE(noamx->has_amx_bf16);
  EXPECT_TRUE(noamx->has_avx512);
  EXPECT_EQ(device_by_name("rocm")->platform, Platform::kROCm);
  EXPECT_EQ(device_by_name("npu")->platform, Platform::kNPU);
  EXPECT_EQ(device_by_name("xpu")->platform, Platform::kXPU);
  Result<DeviceInfo> detected = device_by_name("auto");
  ASSERT_TRUE(detected.is_ok());
  EXPECT_FALSE(detected->is_virtual);
}

TEST(DeviceInfo, UnknownNameListsValidOnes) {
  Result<DeviceInfo> d = device_by_name("h100");
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("--device \"h100\""), std::string::npos);
  EXPECT_NE(d.status().message().find("auto, cpu, cpu-noamx, sm75, sm80, sm89, sm90, sm100, "
                                      "sm120, rocm, npu, xpu"),
            std::string::npos)
      << d.status().message();
  EXPECT_EQ(virtual_device_names().size(), 11u);
}

TEST(DeviceInfo, PlatformNames) {
  EXPECT_STREQ(platform_name(Platform::kCPU), "cpu");
  EXPECT_STREQ(platform_name(Platform::kCUDA), "cuda");
  EXPECT_STREQ(platform_name(Platform::kROCm), "rocm");
  EXPECT_STREQ(platform_name(Platform::kNPU), "npu");
  EXPECT_STREQ(platform_name(Platform::kXPU), "xpu");
}

// ATTNKIT_EMULATE_CC caps the compute capability and the opt-in shared memory by the named
// generation, never raises them, and rejects an unknown value by name.
TEST(DeviceInfo, EmulatedComputeCapability) {
  struct Restore {
    ~Restore() { unsetenv("ATTNKIT_EMULATE_CC"); }
  } restore;
  constexpr int kH200Smem = 227 * 1024;
  int cc = 90, smem = kH200Smem;
  unsetenv("ATTNKIT_EMULATE_CC");
  ASSERT_TRUE(detail::apply_emulated_compute_capability(&cc, &smem).is_ok());
  EXPECT_EQ(cc, 90);
  EXPECT_EQ(smem, kH200Smem);

  setenv("ATTNKIT_EMULATE_CC", "80", 1);
  ASSERT_TRUE(detail::apply_emulated_compute_capability(&cc, &smem).is_ok());
  EXPECT_EQ(cc, 80);
  EXPECT_EQ(smem, 163 * 1024);

  setenv("ATTNKIT_EMULATE_CC", "75", 1);
  ASSERT_TRUE(detail::apply_emulated_compute_capability(&cc, &smem).is_ok());
  EXPECT_EQ(cc, 75);
  EXPECT_EQ(smem, 64 * 1024);

  setenv("ATTNKIT_EMULATE_CC", "90", 1);  // above the (now emulated) 75: unchanged
  ASSERT_TRUE(detail::apply_emulated_compute_capability(&cc, &smem).is_ok());
  EXPECT_EQ(cc, 75);

  setenv("ATTNKIT_EMULATE_CC", "sm_80", 1);
  const Status bad = detail::apply_emulated_compute_capability(&cc, &smem);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("ATTNKIT_EMULATE_CC=sm_80"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("75, 80"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace attnkit
