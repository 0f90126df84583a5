// TensorView geometry, check_* messages, Buffer, copies, fills and DLPack interop (host side).
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <bit>
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
constexpr uint32_t kRandomSeed = 7177;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

TEST(DeviceTest, ToString) {
  EXPECT_EQ(Device::cpu().to_string(), "cpu");
  EXPECT_EQ(Device::cuda().to_string(), "cuda:0");
  EXPECT_EQ(Device::cuda(3).to_string(), "cuda:3");
  EXPECT_TRUE(Device::cuda(1) == Device::cuda(1));
  EXPECT_FALSE(Device::cuda(1) == Device::cuda(0));
}

// ---- TensorView ----

TEST(DeviceTest, Parse) {
  EXPECT_EQ(Device::parse("cpu").value(), Device::cpu());
  EXPECT_EQ(Device::parse("cuda").value(), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:0").value(), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3").value(), Device::cuda(3));
  for (const char* bad : {"", "gpu", "CPU", "cuda:", "cuda:x", "cuda1", "cuda:-1", "cuda:1x",
                          "cuda: 1", "cuda:+1", "cuda:99999999999", "cpu:0"}) {
    const Result<Device> d = Device::parse(bad);
    ASSERT_FALSE(d.is_ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find(std::string("device \"") + bad + "\" is not valid"),
              std::string::npos)
        << d.status().message();
    EXPECT_NE(d.status().message().find("\"cuda:N\""), std::string::npos) << d.status().message();
  }
}

TEST(TensorViewTest, ContiguousConstruction) {
  std::vector<float> storage(4 * 8 * 16);
  const TensorView t(storage.data(), DType::kF32, Device::cpu(), {4, 8, 16});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.numel(), 4 * 8 * 16);
  EXPECT_EQ(t.stride(0), 128);
  EXPECT_EQ(t.stride(1), 16);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_EQ(t.size(-1), 16);
  EXPECT_EQ(t.stride(-2), 16);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.storage_bytes(), 4 * 8 * 16 * 4);
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(t.empty());
  EXPECT_EQ(t.describe(), "f32[4, 8, 16] cpu");
}

TEST(TensorViewTest, DescribeAndEmpty) {
  const TensorView t(nullptr, DType::kBF16, Device::cuda(0), {4, 8, 128});
  EXPECT_EQ(t.describe(), "bf16[4, 8, 128] cuda:0");
  EXPECT_TRUE(t.empty());
  EXPECT_FALSE(t.defined());
  int dummy = 0;
  const TensorView zero_rows(&dummy, DType::kI32, Device::cpu(), {0, 5});
  EXPECT_TRUE(zero_rows.empty());
  EXPECT_EQ(zero_rows.storage_bytes(), 0);
  EXPECT_TRUE(zero_rows.is_contiguous());
  EXPECT_EQ(TensorView().describe(), "f32[] cpu");
}

// ndim is a public field: a hand-built view with ndim past kMaxDims (or negative) read the memory
// after shape / strides in describe(), numel() and the checks (a heap over-read, with neighbouring
// pointers printed in the message). The loops stop at kMaxDims and the message names the ndim.
TEST(TensorViewTest, NdimOutsideTheDimsIsDescribedAndRefused) {
  std::vector<float> data(16, 1.f);
  for (const int ndim : {40, -3}) {
    TensorView t(data.data(), DType::kF32, Device::cpu(), {4, 4});
    t.ndim = ndim;
    const std::string d = t.describe();
    EXPECT_NE(d.find("(ndim " + std::to_string(ndim) + ", outside [0, 6])"), std::string::npos)
        << d;
    const Status st = check_ndim(t, "x", 2, "[a, b]");
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("ndim " + std::to_string(ndim)), std::string::npos)
        << st.to_string();
    (void)t.numel();
    (void)t.is_contiguous();
  }
}

// The bytes a view's elements occupy, negative strides and fp4 nibbles included; overlaps() and
// may_self_overlap() on them (the KV-pool / request-table / set_kv checks use these).
TEST(TensorViewTest, ByteExtentOverlapsAndSelfOverlap) {
  std::vector<float> buf(64);
  TensorView fwd(buf.data() + 8, DType::kF32, Device::cpu(), {4, 2});  // floats 8..15
  int64_t first = 0, end = 0;
  ASSERT_TRUE(fwd.byte_extent(&first, &end));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(end, 8 * 4);
  TensorView back = fwd;  // rows 8.., 6.., 4.., 2..: floats 2..9
  back.strides[0] = -2;
  ASSERT_TRUE(back.byte_extent(&first, &end));
  EXPECT_EQ(first, -6 * 4);
  EXPECT_EQ(end, 2 * 4);
  TensorView below(buf.data(), DType::kF32, Device::cpu(), {2});  // floats 0..1
  TensorView at2(buf.data() + 2, DType::kF32, Device::cpu(), {1});
  TensorView at10(buf.data() + 10, DType::kF32, Device::cpu(), {1});
  EXPECT_FALSE(back.overlaps(below));
  EXPECT_TRUE(back.overlaps(at2));
  EXPECT_FALSE(back.overlaps(at10));
  EXPECT_TRUE(fwd.overlaps(at10));
  EXPECT_FALSE(fwd.overlaps(TensorView()));
  // fp4: element e lies in byte floor(e / 2); two elements walking down from byte 4 cover 3..4.
  std::vector<uint8_t> bytes(16);
  TensorView nibbles(bytes.data() + 4, DType::kFP4E2M1, Device::cpu(), {2});
  nibbles.strides[0] = -1;
  ASSERT_TRUE(nibbles.byte_extent(&first, &end));
  EXPECT_EQ(first, -1);
  EXPECT_EQ(end, 1);
  EXPECT_TRUE(nibbles.overlaps(TensorView(bytes.data() + 4, DType::kU8, Device::cpu(), {1})));
  EXPECT_TRUE(nibbles.overlaps(TensorView(bytes.data() + 3, DType::kU8, Device::cpu(), {1})));
  EXPECT_FALSE(nibbles.overlaps(TensorView(bytes.data() + 5, DType::kU8, Device::cpu(), {1})));
  // Self-overlap: stride 0, interleaved strides; disjoint padded / transposed layouts are fine.
  TensorView zero = fwd;
  zero.strides[1] = 0;
  EXPECT_TRUE(zero.may_self_overlap());
  TensorView interleaved(buf.data(), DType::kF32, Device::cpu(), {4, 4});
  interleaved.strides[0] = 2;
  EXPECT_TRUE(interleaved.may_self_overlap());
  TensorView padded = interleaved;
  padded.strides[0] = 5;
  EXPECT_FALSE(padded.may_self_overlap());
  TensorView transposed = interleaved;
  transposed.strides = {1, 4, 0, 0, 0, 0};
  EXPECT_FALSE(transposed.may_self_overlap());
  // A span past int64: no memory holds it.
  TensorView huge(buf.data(), DType::kF32, Device::cpu(), {3});
  huge.strides[0] = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_FALSE(huge.byte_extent(&first, &end));
  EXPECT_TRUE(huge.overlaps(fwd));
}

TEST(TensorViewTest, Fp4StorageAndSlicing) {
  std::vector<uint8_t> storage(8);
  const TensorView t(storage.data(), DType::kFP4E2M1, Device::cpu(), {3, 5});
  EXPECT_EQ(t.storage_bytes(), 8);  // ceil(15 / 2)
  const TensorView even_rows(storage.data(), DType::kFP4E2M1, Device::cpu(), {4, 4});
  const TensorView rows23 = even_rows.slice0(2, 4);
  EXPECT_EQ(rows23.data, storage.data() + 4);  // 8 values = 4 bytes
  EXPECT_EQ(rows23.size(0), 2);
  // Row 1 of a 5-wide fp4 tensor starts mid-byte: not representable.
  EXPECT_FALSE(t.slice0(1, 2).defined());
}

TEST(TensorViewTest, NonContiguousDetection) {
  std::vector<uint16_t> storage(64);
  TensorView t(storage.data(), DType::kF16, Device::cpu(), {4, 8});
  t.strides[0] = 16;  // padded rows
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage_bytes(), (3 * 16 + 8) * 2);
  TensorView transposed(storage.data(), DType::kF16, Device::cpu(), {8, 4});
  transposed.strides = {1, 8};
  EXPECT_FALSE(transposed.is_contiguous());
  // Size-1 dims do not constrain their stride.
  TensorView unit(storage.data(), DType::kF16, Device::cpu(), {1, 8});
  unit.strides[0] = 999;
  EXPECT_TRUE(unit.is_contiguous());
}

TEST(TensorViewTest, Slice0) {
  std::vector<float> storage(6 * 3);
  const TensorView t(storage.data(), DType::kF32, Device::cpu(), {6, 3});
  const TensorView s = t.slice0(2, 5);
  EXPECT_EQ(s.data, storage.data() + 6);
  EXPECT_EQ(s.size(0), 3);
  EXPECT_EQ(s.size(1), 3);
  EXPECT_EQ(s.stride(0), 3);
  EXPECT_TRUE(s.is_contiguous());
  // Clamped like Python slicing.
  EXPECT_EQ(t.slice0(4, 100).size(0), 2);
  EXPECT_EQ(t.slice0(-3, 2).size(0), 2);
  EXPECT_EQ(t.slice0(5, 2).size(0), 0);
  EXPECT_FALSE(TensorView().slice0(0, 1).defined());
  // Slicing a strided view keeps the stride.
  TensorView strided = t;
  strided.shape[0] = 3;
  strided.strides[0] = 6;
  EXPECT_EQ(strided.slice0(1, 3).data, storage.data() + 6);
}

TEST(TensorViewTest, ReshapeOk) {
  std::vector<float> storage(24);
  const TensorView t(storage.data(), DType::kF32, Device::cpu(), {2, 3, 4});
  Result<TensorView> r = t.reshape({6, 4});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->ndim, 2);
  EXPECT_EQ(r->size(0), 6);
  EXPECT_EQ(r->stride(0), 4);
  EXPECT_EQ(r->data, t.data);
  Result<TensorView> inferred = t.reshape({-1, 2});
  ASSERT_TRUE(inferred.is_ok()) << inferred.status().to_string();
  EXPECT_EQ(inferred->size(0), 12);
}

TEST(TensorViewTest, ReshapeErrors) {
  std::vector<float> storage(48);
  const TensorView t(storage.data(), DType::kF32, Device::cpu(), {2, 3, 4});
  Result<TensorView> wrong = t.reshape({5, 5});
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(),
            "reshape: shape [5, 5] has 25 elements but f32[2, 3, 4] cpu has 24");
  EXPECT_FALSE(t.reshape({-1, 5}).is_ok());
  EXPECT_FALSE(t.reshape({-1, -1}).is_ok());
  EXPECT_FALSE(t.reshape({1, 1, 1, 1, 1, 2, 12}).is_ok());
  TensorView padded = t;
  padded.strides[1] = 8;
  padded.strides[0] = 24;
  Result<TensorView> nc = padded.reshape({24});
  ASSERT_FALSE(nc.is_ok());
  EXPECT_NE(nc.status().message().find("not contiguous"), std::string::npos);
}

// ---- checks ----

TEST(ChecksTest, Messages) {
  std::vector<uint16_t> storage(32);
  TensorView q(storage.data(), DType::kBF16, Device::cpu(), {4, 8});
  EXPECT_TRUE(check_ndim(q, "q", 2, "[tokens, hidden]").is_ok());
  Status s = check_ndim(q, "q", 3, "[tokens, q_heads, head_dim]");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "q: expected 3 dims [tokens, q_heads, head_dim], got bf16[4, 8] cpu");
  // Every validation starts with check_ndim, which refuses a negative extent by dim.
  const TensorView negative(storage.data(), DType::kBF16, Device::cpu(), {4, -8});
  s = check_ndim(negative, "q", 2, "[tokens, hidden]");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("q: extent -8 of dim 1 is negative"), std::string::npos)
      << s.message();

  EXPECT_TRUE(check_dtype(q, "q", {DType::kF16, DType::kBF16}).is_ok());
  s = check_dtype(q, "q", {DType::kF16, DType::kF32});
  EXPECT_EQ(s.message(), "q: dtype bf16 is not accepted (accepted: f16, f32), got bf16[4, 8] cpu");

  EXPECT_TRUE(check_shape(q, "q", {-1, 8}, "[tokens, hidden]").is_ok());
  s = check_shape(q, "q", {-1, 16}, "[tokens, hidden]");
  EXPECT_EQ(s.message(), "q: expected shape [*, 16] [tokens, hidden], got bf16[4, 8] cpu");
  EXPECT_FALSE(check_shape(q, "q", {4, 8, 1}, "[a, b, c]").is_ok());

  EXPECT_TRUE(check_device(q, "q", Device::cpu()).is_ok());
  s = check_device(q, "q", Device::cuda(1));
  EXPECT_EQ(s.message(), "q: expected device cuda:1, got bf16[4, 8] cpu");

  EXPECT_TRUE(check_contiguous(q, "q").is_ok());
  q.strides[0] = 16;
  s = check_contiguous(q, "q");
  EXPECT_EQ(s.message(),
            "q: expected a contiguous tensor, got bf16[4, 8] cpu with strides [16, 1]");
}

// ---- Buffer ----

TEST(BufferTest, HostAllocationAlignedAndMovable) {
  for (int64_t bytes : {1, 63, 64, 1000, 4096 + 3}) {
    Result<Buffer> r = Buffer::allocate(Device::cpu(), bytes);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->data()) % 64, 0u);
    EXPECT_TRUE(r->device().is_cpu());
  }
  Result<Buffer> r = Buffer::allocate(Device::cpu(), 256);
  ASSERT_TRUE(r.is_ok());
  Buffer a = std::move(r).value();
  void* p = a.data();
  Buffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.bytes(), 256);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is defined
  EXPECT_EQ(a.bytes(), 0);
  Buffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
}

TEST(BufferTest, ZeroAndInvalidSizes) {
  Result<Buffer> empty = Buffer::allocate(Device::cpu(), 0);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->bytes(), 0);
  Result<Buffer> negative = Buffer::allocate(Device::cpu(), -5);
  ASSERT_FALSE(negative.is_ok());
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("-5"), std::string::npos);
}

TEST(BufferTest, HostOutOfMemoryNamesBytes) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP()
      << "AddressSanitizer aborts on impossible allocation sizes instead of returning null";
#endif
  const int64_t huge = int64_t{1} << 62;
  Result<Buffer> r = Buffer::allocate(Device::cpu(), huge);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(r.status().message().find(std::to_string(huge)), std::string::npos)
      << r.status().message();
}

#ifndef ATTNKIT_WITH_CUDA
TEST(BufferTest, CudaWithoutCudaIsNotBuilt) {
  Result<Buffer> r = Buffer::allocate(Device::cuda(0), 1024);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotBuilt);
  EXPECT_NE(r.status().message().find("built without CUDA"), std::string::npos);
  float x = 1.0f;
  const Status s = copy_bytes(&x, Device::cuda(0), &x, Device::cpu(), sizeof(x));
  EXPECT_EQ(s.code(), StatusCode::kNotBuilt);
  const TensorView dev(&x, DType::kF32, Device::cuda(0), {1});
  EXPECT_EQ(fill_float(dev, 2.0f).code(), StatusCode::kNotBuilt);
}
#endif

TEST(BufferTest, View) {
  Result<Buffer> r = Buffer::allocate(Device::cpu(), 64);
  ASSERT_TRUE(r.is_ok());
  const TensorView v = r->view(DType::kBF16, {4, 8});
  EXPECT_EQ(v.data, r->data());
  EXPECT_EQ(v.describe(), "bf16[4, 8] cpu");
  EXPECT_TRUE(v.is_contiguous());
  // A view larger than the buffer is returned undefined rather than pointing past the end.
  EXPECT_FALSE(r->view(DType::kF32, {4, 8}).defined());
  EXPECT_TRUE(r->view(DType::kFP4E2M1, {128}).defined());
  EXPECT_FALSE(r->view(DType::kFP4E2M1, {129}).defined());
  // A negative extent is no view (its numel of 16 once passed the size check).
  EXPECT_FALSE(r->view(DType::kF32, {-4, -4}).defined());
  EXPECT_FALSE(r->view(DType::kF32, {-1}).defined());
}

// ---- copies and fills ----

TEST(CopyTest, CopyBytesHost) {
  const std::vector<float> src = random_floats(33, kRandomSeed);
  std::vector<float> dst(33, kNaN);
  ASSERT_TRUE(copy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(),
                         static_cast<int64_t>(src.size() * sizeof(float)))
                  .is_ok());
  EXPECT_EQ(dst, src);
  EXPECT_TRUE(copy_bytes(nullptr, Device::cpu(), nullptr, Device::cpu(), 0).is_ok());
  EXPECT_EQ(copy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(), -1).code(),
            StatusCode::kInvalidArgument);
  const Status null_src = copy_bytes(dst.data(), Device::cpu(), nullptr, Device::cpu(), 4);
  EXPECT_EQ(null_src.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_src.message().find("src"), std::string::npos);
}

TEST(CopyTest, CopyTensor) {
  std::vector<float> src = random_floats(12, kRandomSeed + 1);
  std::vector<float> dst(12, kNaN);
  const TensorView s(src.data(), DType::kF32, Device::cpu(), {3, 4});
  const TensorView d(dst.data(), DType::kF32, Device::cpu(), {3, 4});
  ASSERT_TRUE(copy_tensor(d, s).is_ok());
  EXPECT_EQ(dst, src);

  const TensorView wrong_shape(dst.data(), DType::kF32, Device::cpu(), {4, 3});
  const Status shape_err = copy_tensor(wrong_shape, s);
  EXPECT_EQ(shape_err.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape_err.message().find("f32[4, 3] cpu"), std::string::npos) << shape_err.message();
  const TensorView wrong_dtype(dst.data(), DType::kI32, Device::cpu(), {3, 4});
  EXPECT_FALSE(copy_tensor(wrong_dtype, s).is_ok());
  TensorView strided = d;
  strided.shape[0] = 2;
  strided.strides[0] = 6;
  EXPECT_FALSE(copy_tensor(strided, s.slice0(0, 2)).is_ok());
}

TEST(FillTest, ContiguousFloatDTypes) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                      DType::kFP4E2M1}) {
    constexpr int kCount = 11;
    const auto bytes = static_cast<size_t>(dtype_storage_bytes(dtype, kCount));
    std::vector<unsigned char> storage(bytes + 1, 0x5a);
    const TensorView t(storage.data(), dtype, Device::cpu(), {kCount});
    ASSERT_TRUE(fill_float(t, 1.5f).is_ok());
    for (int i = 0; i < kCount; ++i) {
      EXPECT_EQ(load_as_float(storage.data(), dtype, i), 1.5f) << dtype_name(dtype) << " " << i;
    }
    EXPECT_EQ(storage[bytes], 0x5a) << dtype_name(dtype);
  }
}

TEST(FillTest, NaNPoisonAndStridedView) {
  std::vector<float> storage = random_floats(4 * 6, kRandomSeed + 2);
  const std::vector<float> original = storage;
  TensorView t(storage.data(), DType::kF32, Device::cpu(), {4, 3});
  t.strides[0] = 6;  // every row uses 3 of 6 slots
  ASSERT_TRUE(fill_float(t, kNaN).is_ok());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) {
      const float v = storage[static_cast<size_t>(r * 6 + c)];
      if (c < 3) {
        EXPECT_TRUE(std::isnan(v)) << r << "," << c;
      } else {
        EXPECT_EQ(v, original[static_cast<size_t>(r * 6 + c)]) << r << "," << c;
      }
    }
  }
}

TEST(FillTest, RejectsIntegerDType) {
  int32_t x[4] = {1, 2, 3, 4};
  const TensorView t(x, DType::kI32, Device::cpu(), {4});
  const Status s = fill_float(t, 0.0f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int32[4] cpu"), std::string::npos) << s.message();
  EXPECT_EQ(x[0], 1);
}

// ---- DLPack ----

DLManagedTensor make_dl(void* data, DLDataType dtype, int ndim, int64_t* shape, int64_t* strides,
                        DLDeviceType device = kDLCPU, int device_id = 0) {
  DLManagedTensor m{};
  m.dl_tensor.data = data;
  m.dl_tensor.device.device_type = device;
  m.dl_tensor.device.device_id = device_id;
  m.dl_tensor.ndim = ndim;
  m.dl_tensor.dtype = dtype;
  m.dl_tensor.shape = shape;
  m.dl_tensor.strides = strides;
  return m;
}

TEST(DLPackTest, FromContiguousWithByteOffset) {
  std::vector<uint16_t> storage(64);
  int64_t shape[2] = {3, 5};
  DLManagedTensor m = make_dl(storage.data(), DLDataType{kDLBfloat, 16, 1}, 2, shape, nullptr);
  m.dl_tensor.byte_offset = 8;
  Result<TensorView> r = from_dlpack(&m);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->dtype, DType::kBF16);
  EXPECT_EQ(r->data, reinterpret_cast<char*>(storage.data()) + 8);
  EXPECT_EQ(r->describe(), "bf16[3, 5] cpu");
  EXPECT_EQ(r->stride(0), 5);
  EXPECT_EQ(r->stride(1), 1);
  EXPECT_TRUE(r->is_contiguous());
}

TEST(DLPackTest, FromStridedCudaAndFp8) {
  int64_t shape[3] = {2, 4, 8};
  int64_t strides[3] = {64, 16, 1};
  DLManagedTensor m =
      make_dl(reinterpret_cast<void*>(0x1000), DLDataType{10, 8, 1}, 3, shape, strides, kDLCUDA, 2);
  Result<TensorView> r = from_dlpack(&m);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->dtype, DType::kFP8E4M3);
  EXPECT_EQ(r->device, Device::cuda(2));
  EXPECT_EQ(r->stride(0), 64);
  EXPECT_EQ(r->stride(1), 16);
  EXPECT_FALSE(r->is_contiguous());
  m.dl_tensor.dtype = DLDataType{12, 8, 1};
  EXPECT_EQ(from_dlpack(&m)->dtype, DType::kFP8E5M2);
}

TEST(DLPackTest, FromErrors) {
  float x[8] = {};
  int64_t shape[7] = {1, 1, 1, 1, 1, 1, 8};
  EXPECT_EQ(from_dlpack(nullptr).status().code(), StatusCode::kInvalidArgument);

  DLManagedTensor complex = make_dl(x, DLDataType{kDLComplex, 64, 1}, 1, shape + 6, nullptr);
  Result<TensorView> r = from_dlpack(&complex);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("code 5"), std::string::npos) << r.status().message();

  DLManagedTensor unknown_code = make_dl(x, DLDataType{99, 8, 1}, 1, shape + 6, nullptr);
  EXPECT_EQ(from_dlpack(&unknown_code).status().code(), StatusCode::kUnsupported);
  DLManagedTensor f64 = make_dl(x, DLDataType{kDLFloat, 64, 1}, 1, shape + 6, nullptr);
  EXPECT_EQ(from_dlpack(&f64).status().code(), StatusCode::kUnsupported);
  DLManagedTensor vec = make_dl(x, DLDataType{kDLFloat, 32, 4}, 1, shape + 6, nullptr);
  EXPECT_NE(from_dlpack(&vec).status().message().find("lanes"), std::string::npos);

  DLManagedTensor too_many = make_dl(x, DLDataType{kDLFloat, 32, 1}, 7, shape, nullptr);
  r = from_dlpack(&too_many);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("ndim 7"), std::string::npos) << r.status().message();

  DLManagedTensor opencl =
      make_dl(x, DLDataType{kDLFloat, 32, 1}, 1, shape + 6, nullptr, kDLOpenCL);
  r = from_dlpack(&opencl);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("device_type 4"), std::string::npos) << r.status().message();

  int64_t negative[1] = {-3};
  DLManagedTensor neg = make_dl(x, DLDataType{kDLFloat, 32, 1}, 1, negative, nullptr);
  EXPECT_EQ(from_dlpack(&neg).status().code(), StatusCode::kInvalidArgument);
}

TEST(DLPackTest, ToAndBackRoundTrip) {
  std::vector<float> storage = random_floats(2 * 6, kRandomSeed + 3);
  TensorView t(storage.data(), DType::kF32, Device::cpu(), {2, 3});
  t.strides[0] = 6;  // strided rows
  Result<DLManagedTensor*> exported = to_dlpack(t);
  ASSERT_TRUE(exported.is_ok()) << exported.status().to_string();
  DLManagedTensor* m = *exported;
  EXPECT_EQ(m->dl_tensor.data, storage.data());
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 32);
  EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(m->dl_tensor.shape[0], 2);
  EXPECT_EQ(m->dl_tensor.shape[1], 3);
  EXPECT_EQ(m->dl_tensor.strides[0], 6);
  EXPECT_EQ(m->dl_tensor.strides[1], 1);
  EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
  ASSERT_NE(m->deleter, nullptr);

  Result<TensorView> back = from_dlpack(m);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->data, t.data);
  EXPECT_EQ(back->dtype, t.dtype);
  EXPECT_EQ(back->device, t.device);
  EXPECT_EQ(back->ndim, t.ndim);
  EXPECT_EQ(back->shape, t.shape);
  EXPECT_EQ(back->strides, t.strides);
  m->deleter(m);
  // The data is still owned by the caller and intact after the wrapper is freed.
  EXPECT_EQ(storage[7], random_floats(2 * 6, kRandomSeed + 3)[7]);
}

TEST(DLPackTest, ExportedDTypeCodes) {
  uint8_t storage[16] = {};
  const struct {
    DType dtype;
    uint8_t code;
    uint8_t bits;
  } cases[] = {{DType::kF16, kDLFloat, 16}, {DType::kBF16, kDLBfloat, 16},
               {DType::kFP8E4M3, 10, 8},    {DType::kFP8E5M2, 12, 8},
               {DType::kFP4E2M1, 17, 4},    {DType::kI32, kDLInt, 32},
               {DType::kI64, kDLInt, 64},   {DType::kU8, kDLUInt, 8}};
  for (const auto& c : cases) {
    const TensorView t(storage, c.dtype, Device::cuda(1), {2});
    Result<DLManagedTensor*> e = to_dlpack(t);
    ASSERT_TRUE(e.is_ok()) << dtype_name(c.dtype);
    EXPECT_EQ((*e)->dl_tensor.dtype.code, c.code) << dtype_name(c.dtype);
    EXPECT_EQ((*e)->dl_tensor.dtype.bits, c.bits) << dtype_name(c.dtype);
    EXPECT_EQ((*e)->dl_tensor.device.device_type, kDLCUDA);
    EXPECT_EQ((*e)->dl_tensor.device.device_id, 1);
    Result<TensorView> back = from_dlpack(*e);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->dtype, c.dtype);
    (*e)->deleter(*e);
  }
}

}  // namespace
}  // namespace attnkit
