// TensorView (non-owning), Buffer (owning host/device memory) and DLPack interop.
// No CUDA types appear here: device memory is a plain pointer tagged with a Device.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "attnkit/dtype.h"
#include "attnkit/status.h"

struct DLManagedTensor;  // from <dlpack/dlpack.h>

namespace attnkit {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int ordinal = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int ordinal = 0) { return {DeviceType::kCUDA, ordinal}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;  // "cpu", "cuda:0"
  // "cpu", "cuda" (= cuda:0) or "cuda:N" with N a non-negative integer; anything else is an
  // invalid_argument error naming the text and the accepted forms.
  static Result<Device> parse(std::string_view text);
};

// An opaque CUDA stream (cudaStream_t) or nullptr for the default stream / CPU.
using StreamHandle = void*;

inline constexpr int kMaxDims = 6;

// Non-owning strided view. Shape and strides are in elements; for fp4 the shape counts logical
// values (two per byte) and the innermost stride must be 1.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);

  bool empty() const { return data == nullptr || numel() == 0; }
  bool defined() const { return data != nullptr; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape[static_cast<size_t>(dim < 0 ? dim + ndim : dim)]; }
  int64_t stride(int dim) const { return strides[static_cast<size_t>(dim < 0 ? dim + ndim : dim)]; }
  bool is_contiguous() const;
  int64_t storage_bytes() const;  // bytes spanned by a contiguous view
  // The bytes the elements occupy, [data + *first, data + *end) (first <= 0 where a negative
  // stride walks below data; fp4 counts the bytes its nibbles sit in). false, with both 0, for an
  // empty view or one whose span overflows int64 (no memory holds it).
  bool byte_extent(int64_t* first, int64_t* end) const;
  // Whether two elements may share an address (a stride of 0, or strides that interleave): the
  // dims sorted by |stride|, each must step past everything the smaller ones span. Conservative:
  // a layout that only this order cannot prove disjoint counts as overlapping.
  bool may_self_overlap() const;
  // Whether this view's byte range and `other`'s share a byte (undefined or empty views: no).
  bool overlaps(const TensorView& other) const;
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
  // View of rows [begin, end) along dim 0, clamped to [0, size(0)] like Python slicing. Returns an
  // undefined view (data == nullptr) for a 0-d view, or for fp4 when row `begin` starts mid-byte.
  TensorView slice0(int64_t begin, int64_t end) const;
  // Same data, new contiguous shape (requires is_contiguous() and equal numel; one extent may be -1
  // and is inferred).
  Result<TensorView> reshape(std::initializer_list<int64_t> shape) const;
  // "bf16[4, 8, 128] cuda:0"
  std::string describe() const;
};

// Validation helpers that produce messages naming the argument:
// "q: expected 3 dims [tokens, q_heads, head_dim], got bf16[4, 8]".
Status check_ndim(const TensorView& t, const char* name, int ndim, const char* layout);
Status check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
Status check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                   const char* layout);  // -1 in expected = any
Status check_device(const TensorView& t, const char* name, Device device);
Status check_contiguous(const TensorView& t, const char* name);

// Owning memory on the host (64-byte aligned) or on a CUDA device (cudaMalloc). Move-only.
class Buffer {
 public:
  Buffer() = default;
  static Result<Buffer> allocate(Device device, int64_t bytes);
  // A non-owning Buffer over caller memory (bytes at data on device): views work as for an owned
  // buffer, and destruction frees nothing. The caller keeps the memory alive for the Buffer's life.
  static Buffer borrow(void* data, int64_t bytes, Device device);
  bool owns_memory() const { return owned_; }
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // Contiguous view of the buffer; undefined (data == nullptr) when the shape needs more bytes than
  // the buffer holds or has a negative extent.
  TensorView view(DType dtype, std::initializer_list<int64_t> shape) const;

 private:
  void release();
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_;
  bool owned_ = true;
};

// Copies bytes between any two devices (cudaMemcpy when CUDA is involved; synchronous).
Status copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes);
// Copies a contiguous view into another of identical dtype and shape.
Status copy_tensor(const TensorView& dst, const TensorView& src);
// Fills every element of a float view with a float value (NaN poisoning for tests); any device.
// Host views may be strided; device views must be contiguous (filled through a host staging copy).
Status fill_float(const TensorView& t, float value);

// ---- DLPack ----
// Borrow a DLPack tensor (does not take ownership; the DLManagedTensor must outlive the view).
// Narrow floats use the DLPack 1.1 wire codes (float8_e4m3fn 10, float8_e5m2 12, float4_e2m1fn 17
// with bits 4) even though the installed header (0.6) does not name them. Devices: kDLCPU,
// kDLCUDAHost (as cpu), kDLCUDA.
Result<TensorView> from_dlpack(const DLManagedTensor* tensor);
// Export a view; the returned tensor's deleter frees only the DLPack wrapper, not the data.
Result<DLManagedTensor*> to_dlpack(const TensorView& view);

}  // namespace attnkit
