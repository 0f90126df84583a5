// Buffer, copies and fills on a CUDA device (gpu label; CUDA builds only).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/tensor.h"

namespace attnkit {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(CudaBufferTest, AllocateCopyRoundTrip) {
  constexpr int kCount = 1000;
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> host(kCount);
  for (float& v : host) v = dist(rng);
  Result<Buffer> dev = Buffer::allocate(Device::cuda(0), kCount * sizeof(float));
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  EXPECT_TRUE(dev->device().is_cuda());
  const TensorView d = dev->view(DType::kF32, {10, 100});
  ASSERT_TRUE(d.defined());
  const TensorView h(host.data(), DType::kF32, Device::cpu(), {10, 100});
  ASSERT_TRUE(copy_tensor(d, h).is_ok());
  std::vector<float> back(kCount, kNaN);
  const TensorView b(back.data(), DType::kF32, Device::cpu(), {10, 100});
  ASSERT_TRUE(copy_tensor(b, d).is_ok());
  EXPECT_EQ(back, host);
}

TEST(CudaBufferTest, OutOfMemoryNamesBytes) {
  const int64_t huge = int64_t{1} << 50;  // 1 PiB
  Result<Buffer> r = Buffer::allocate(Device::cuda(0), huge);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory) << r.status().to_string();
  EXPECT_NE(r.status().message().find(std::to_string(huge)), std::string::npos);
  // The failure must not poison later calls.
  EXPECT_TRUE(Buffer::allocate(Device::cuda(0), 256).is_ok());
}

TEST(CudaBufferTest, InvalidOrdinal) {
  Result<Buffer> r = Buffer::allocate(Device::cuda(1000), 256);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCudaError) << r.status().to_string();
}

TEST(CudaFillTest, FillsEveryFloatDType) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                      DType::kFP4E2M1}) {
    constexpr int kCount = 13;  // odd: the fp4 tail nibble must survive
    const int64_t bytes = dtype_storage_bytes(dtype, kCount);
    Result<Buffer> dev = Buffer::allocate(Device::cuda(0), bytes);
    ASSERT_TRUE(dev.is_ok());
    std::vector<uint8_t> canary(static_cast<size_t>(bytes), 0xa0);
    ASSERT_TRUE(
        copy_bytes(dev->data(), dev->device(), canary.data(), Device::cpu(), bytes).is_ok());
    ASSERT_TRUE(fill_float(dev->view(dtype, {kCount}), -1.5f).is_ok());
    std::vector<uint8_t> back(static_cast<size_t>(bytes));
    ASSERT_TRUE(copy_bytes(back.data(), Device::cpu(), dev->data(), dev->device(), bytes).is_ok());
    for (int i = 0; i < kCount; ++i) {
      EXPECT_EQ(load_as_float(back.data(), dtype, i), -1.5f) << dtype_name(dtype) << " " << i;
    }
    if (dtype == DType::kFP4E2M1) EXPECT_EQ(back.back() >> 4, 0xa);
  }
}

TEST(CudaFillTest, NonContiguousDeviceFillIsUnsupported) {
  Result<Buffer> dev = Buffer::allocate(Device::cuda(0), 64 * sizeof(float));
  ASSERT_TRUE(dev.is_ok());
  TensorView v = dev->view(DType::kF32, {4, 8});
  v.strides[0] = 16;
  EXPECT_EQ(fill_float(v, 0.0f).code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace attnkit
