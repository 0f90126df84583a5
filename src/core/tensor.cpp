// TensorView, Buffer, copies and fills. CUDA is used only under ATTNKIT_WITH_CUDA; without it,
// any request that needs device memory returns kNotBuilt.
#include "attnkit/tensor.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/device_scope.h"

#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit {
namespace {

// Host allocations are aligned (and padded) to one cache line, enough for any SIMD load.
constexpr int64_t kHostAlignment = 64;
constexpr int64_t kHostHugePageBytes = int64_t{2} << 20;  // x86-64 / arm64 transparent huge page
constexpr int64_t kBitsPerByte = 8;

// ndim is a public field: a hand-built view may hold any value. Every loop over a view's dims runs
// over [0, valid_ndim(ndim)), so a value past kMaxDims reads no memory beyond shape / strides (the
// checks then refuse the view by its ndim).
int valid_ndim(int ndim) { return std::clamp(ndim, 0, kMaxDims); }

std::string join_dims(const int64_t* dims, int n) {
  std::ostringstream out;
  out << '[';
  for (int d = 0; d < valid_ndim(n); ++d) {
    if (d > 0) out << ", ";
    out << dims[d];
  }
  out << ']';
  if (n != valid_ndim(n)) out << " (ndim " << n << ", outside [0, " << kMaxDims << "])";
  return out.str();
}

// Byte offset of element `element_offset` (fp4: two elements per byte; caller keeps it even).
int64_t element_byte_offset(DType dtype, int64_t element_offset) {
  return element_offset * dtype_bits(dtype) / kBitsPerByte;
}

#ifdef ATTNKIT_WITH_CUDA
Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::ok();
  cudaGetLastError();  // clear the non-sticky error so later calls do not report it again
  return Status::cuda_error(what + " failed: " + cudaGetErrorName(err) + " (" +
                            cudaGetErrorString(err) + ")");
}
#else
Status not_built_without_cuda(const std::string& what) {
  return Status::not_built(what + " needs CUDA, but attnkit was built without CUDA");
}
#endif

}  // namespace

std::string Device::to_string() const {
  if (type == DeviceType::kCPU) return "cpu";
  return "cuda:" + std::to_string(ordinal);
}

Result<Device> Device::parse(std::string_view text) {
  constexpr std::string_view kCuda = "cuda";
  if (text == "cpu") return Device::cpu();
  if (text == kCuda) return Device::cuda(0);
  if (text.size() > kCuda.size() + 1 && text.substr(0, kCuda.size() + 1) == "cuda:") {
    const std::string_view digits = text.substr(kCuda.size() + 1);
    int ordinal = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
    if (ec == std::errc() && end == digits.data() + digits.size() && ordinal >= 0) {
      return Device::cuda(ordinal);
    }
  }
  return Status::invalid_argument("device \"" + std::string(text) +
                                  "\" is not valid (accepted: \"cpu\", \"cuda\", \"cuda:N\")");
}

// ---- TensorView ----

TensorView::TensorView(void* data_in, DType dtype_in, Device device_in,
                       std::initializer_list<int64_t> shape_in)
    : data(data_in), dtype(dtype_in), device(device_in) {
  assert(shape_in.size() <= static_cast<size_t>(kMaxDims) && "TensorView: too many dims");
  ndim = static_cast<int>(std::min(shape_in.size(), static_cast<size_t>(kMaxDims)));
  int d = 0;
  for (int64_t extent : shape_in) {
    if (d == ndim) break;
    shape[static_cast<size_t>(d++)] = extent;
  }
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = stride;
    stride *= shape[static_cast<size_t>(i)];
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < valid_ndim(ndim); ++d) n *= shape[static_cast<size_t>(d)];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = valid_ndim(ndim) - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

int64_t TensorView::storage_bytes() const {
  const int64_t n = numel();
  if (n <= 0) return 0;
  // Elements spanned from the first to the last element (equals numel when contiguous).
  int64_t span = 1;
  for (int d = 0; d < valid_ndim(ndim); ++d) {
    const auto i = static_cast<size_t>(d);
    span += (shape[i] - 1) * (strides[i] < 0 ? -strides[i] : strides[i]);
  }
  return dtype_storage_bytes(dtype, span);
}

bool TensorView::byte_extent(int64_t* first, int64_t* end) const {
  *first = 0;
  *end = 0;
  if (!defined() || numel() <= 0) return false;
  int64_t lo = 0;  // lowest and highest element offsets from data
  int64_t hi = 0;
  for (int d = 0; d < valid_ndim(ndim); ++d) {
    const auto i = static_cast<size_t>(d);
    int64_t step = 0;
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &step)) return false;
    if (step < 0 ? __builtin_add_overflow(lo, step, &lo) : __builtin_add_overflow(hi, step, &hi)) {
      return false;
    }
  }
  if (dtype == DType::kFP4E2M1) {  // two elements per byte: element e lies in byte floor(e / 2)
    *first = lo >= 0 ? lo / 2 : -((-lo + 1) / 2);
    *end = hi / 2 + 1;
    return true;
  }
  const int64_t size = dtype_storage_bytes(dtype, 1);
  int64_t lo_bytes = 0;
  int64_t hi_bytes = 0;
  if (__builtin_mul_overflow(lo, size, &lo_bytes) ||
      __builtin_mul_overflow(hi + 1, size, &hi_bytes)) {
    return false;
  }
  *first = lo_bytes;
  *end = hi_bytes;
  return true;
}

bool TensorView::overlaps(const TensorView& other) const {
  int64_t first = 0, end = 0, other_first = 0, other_end = 0;
  if (!byte_extent(&first, &end) || !other.byte_extent(&other_first, &other_end)) {
    // Empty: nothing to share. A span past int64 is no real view: count it as overlapping.
    return defined() && other.defined() && numel() > 0 && other.numel() > 0;
  }
  const auto lo = reinterpret_cast<intptr_t>(data);
  const auto other_lo = reinterpret_cast<intptr_t>(other.data);
  return lo + first < other_lo + other_end && other_lo + other_first < lo + end;
}

bool TensorView::may_self_overlap() const {
  if (numel() <= 1) return false;
  // (|stride|, size) of the dims with size > 1, sorted by |stride| (no allocation: a check of
  // every forward's out).
  std::array<std::pair<int64_t, int64_t>, kMaxDims> dims{};
  size_t n = 0;
  for (int d = 0; d < valid_ndim(ndim); ++d) {
    const auto i = static_cast<size_t>(d);
    if (shape[i] <= 1) continue;
    if (strides[i] == std::numeric_limits<int64_t>::min()) return true;  // |stride| past int64
    dims[n++] = {strides[i] < 0 ? -strides[i] : strides[i], shape[i]};
  }
  // Insertion sort of at most kMaxDims pairs (std::sort's unguarded insertion step made g++ 12
  // warn -Warray-bounds past the array, which it cannot reach).
  for (size_t i = 1; i < n; ++i) {
    for (size_t j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t reach = 1;  // elements spanned by the smaller dims, plus one
  for (size_t i = 0; i < n; ++i) {
    if (dims[i].first < reach) return true;
    int64_t step = 0;
    if (__builtin_mul_overflow(dims[i].first, dims[i].second - 1, &step) ||
        __builtin_add_overflow(reach, step, &reach)) {
      return true;  // a span past int64: no memory holds it
    }
  }
  return false;
}

TensorView TensorView::slice0(int64_t begin, int64_t end) const {
  if (ndim == 0) return TensorView();
  const int64_t rows = shape[0];
  begin = std::clamp<int64_t>(begin, 0, rows);
  end = std::clamp<int64_t>(end, begin, rows);
  const int64_t element_offset = begin * strides[0];
  if (dtype == DType::kFP4E2M1 && element_offset % 2 != 0) return TensorView();
  TensorView out = *this;
  out.shape[0] = end - begin;
  if (data != nullptr) {
    out.data = static_cast<char*>(data) + element_byte_offset(dtype, element_offset);
  }
  return out;
}

Result<TensorView> TensorView::reshape(std::initializer_list<int64_t> new_shape) const {
  if (!is_contiguous()) {
    return Status::invalid_argument("reshape: tensor " + describe() +
                                    " is not contiguous (strides " +
                                    join_dims(strides.data(), ndim) + ")");
  }
  std::vector<int64_t> dims(new_shape);
  const std::string requested = join_dims(dims.data(), static_cast<int>(dims.size()));
  if (dims.size() > static_cast<size_t>(kMaxDims)) {
    return Status::invalid_argument("reshape: shape " + requested + " has " +
                                    std::to_string(dims.size()) + " dims (at most " +
                                    std::to_string(kMaxDims) + ")");
  }
  int inferred = -1;
  int64_t known = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == -1 && inferred < 0) {
      inferred = static_cast<int>(d);
    } else if (dims[d] < 0) {
      return Status::invalid_argument("reshape: shape " + requested +
                                      " has a negative extent (only one -1 is accepted)");
    } else {
      known *= dims[d];
    }
  }
  const int64_t n = numel();
  if (inferred >= 0) {
    if (known == 0 || n % known != 0) {
      return Status::invalid_argument("reshape: cannot infer -1 in " + requested + " for " +
                                      describe() + " (" + std::to_string(n) + " elements)");
    }
    dims[static_cast<size_t>(inferred)] = n / known;
    known = n;
  }
  if (known != n) {
    return Status::invalid_argument("reshape: shape " + requested + " has " +
                                    std::to_string(known) + " elements but " + describe() +
                                    " has " + std::to_string(n));
  }
  TensorView out;
  out.data = data;
  out.dtype = dtype;
  out.device = device;
  out.ndim = static_cast<int>(dims.size());
  int64_t stride = 1;
  for (int d = out.ndim - 1; d >= 0; --d) {
    out.shape[static_cast<size_t>(d)] = dims[static_cast<size_t>(d)];
    out.strides[static_cast<size_t>(d)] = stride;
    stride *= dims[static_cast<size_t>(d)];
  }
  return out;
}

std::string TensorView::describe() const {
  return std::string(dtype_name(dtype)) + join_dims(shape.data(), ndim) + " " + device.to_string();
}

// ---- checks ----

Status check_ndim(const TensorView& t, const char* name, int ndim, const char* layout) {
  if (t.ndim != ndim) {
    return Status::invalid_argument(std::string(name) + ": expected " + std::to_string(ndim) +
                                    " dims " + layout + ", got " + t.describe());
  }
  // Every validation starts here, so a negative extent (which numel() and the byte spans would
  // turn into nonsense sizes) is refused once for all of them.
  for (int d = 0; d < ndim; ++d) {
    if (t.shape[static_cast<size_t>(d)] < 0) {
      return Status::invalid_argument(std::string(name) + ": extent " +
                                      std::to_string(t.shape[static_cast<size_t>(d)]) + " of dim " +
                                      std::to_string(d) + " is negative (" + t.describe() +
                                      "); extents must be >= 0");
    }
  }
  return Status::ok();
}

Status check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype == d) return Status::ok();
  }
  std::string accepted;
  for (DType d : allowed) {
    if (!accepted.empty()) accepted += ", ";
    accepted += dtype_name(d);
  }
  return Status::invalid_argument(std::string(name) + ": dtype " + dtype_name(t.dtype) +
                                  " is not accepted (accepted: " + accepted + "), got " +
                                  t.describe());
}

Status check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                   const char* layout) {
  bool match = t.ndim == static_cast<int>(expected.size());
  int d = 0;
  for (int64_t extent : expected) {
    if (!match) break;
    if (extent != -1 && t.shape[static_cast<size_t>(d)] != extent) match = false;
    ++d;
  }
  if (match) return Status::ok();
  std::string want = "[";
  d = 0;
  for (int64_t extent : expected) {
    if (d++ > 0) want += ", ";
    want += extent == -1 ? std::string("*") : std::to_string(extent);
  }
  want += "]";
  return Status::invalid_argument(std::string(name) + ": expected shape " + want + " " + layout +
                                  ", got " + t.describe());
}

Status check_device(const TensorView& t, const char* name, Device device) {
  if (t.device == device) return Status::ok();
  return Status::invalid_argument(std::string(name) + ": expected device " + device.to_string() +
                                  ", got " + t.describe());
}

Status check_contiguous(const TensorView& t, const char* name) {
  if (t.is_contiguous()) return Status::ok();
  return Status::invalid_argument(std::string(name) + ": expected a contiguous tensor, got " +
                                  t.describe() + " with strides " +
                                  join_dims(t.strides.data(), t.ndim));
}

// ---- Buffer ----

Result<Buffer> Buffer::allocate(Device device, int64_t bytes) {
  if (bytes < 0) {
    return Status::invalid_argument("Buffer::allocate: bytes " + std::to_string(bytes) +
                                    " is negative (must be >= 0)");
  }
  Buffer buffer;
  buffer.device_ = device;
  buffer.bytes_ = bytes;
  if (bytes == 0) return buffer;
  if (device.is_cpu()) {
    // Big buffers (KV pools, benchmark inputs) start on a 2 MiB boundary and ask for transparent
    // huge pages: the CPU kernels gather 256-byte K/V head rows at a stride of Hkv rows, touching
    // a new 4 KiB page every few keys, and the page walks cost more than the bytes.
    const int64_t align = bytes >= kHostHugePageBytes ? kHostHugePageBytes : kHostAlignment;
    const int64_t padded = (bytes + align - 1) / align * align;
    buffer.data_ = padded < bytes ? nullptr
                                  : std::aligned_alloc(static_cast<size_t>(align),
                                                       static_cast<size_t>(padded));
    if (buffer.data_ == nullptr) {
      buffer.bytes_ = 0;
      return Status::out_of_memory("host allocation of " + std::to_string(bytes) + " bytes failed");
    }
#if defined(__linux__)
    // Advice only: without THP (or with it disabled) the buffer keeps 4 KiB pages.
    if (align == kHostHugePageBytes)
      madvise(buffer.data_, static_cast<size_t>(padded), MADV_HUGEPAGE);
#endif
    return buffer;
  }
#ifdef ATTNKIT_WITH_CUDA
  const DeviceScope guard(device);
  if (!guard.status().is_ok()) {
    buffer.bytes_ = 0;
    return guard.status();
  }
  const cudaError_t err = cudaMalloc(&buffer.data_, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    buffer.data_ = nullptr;
    buffer.bytes_ = 0;
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return Status::out_of_memory("cudaMalloc of " + std::to_string(bytes) + " bytes on " +
                                   device.to_string() + " failed");
    }
    return cuda_status(
        err, "cudaMalloc of " + std::to_string(bytes) + " bytes on " + device.to_string());
  }
  return buffer;
#else
  buffer.bytes_ = 0;
  return not_built_without_cuda("allocating " + std::to_string(bytes) + " bytes on " +
                                device.to_string());
#endif
}

Buffer Buffer::borrow(void* data, int64_t bytes, Device device) {
  Buffer buffer;
  buffer.data_ = data;
  buffer.bytes_ = data == nullptr || bytes < 0 ? 0 : bytes;
  buffer.device_ = device;
  buffer.owned_ = false;
  return buffer;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), device_(other.device_), owned_(other.owned_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.owned_ = true;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    owned_ = other.owned_;
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.owned_ = true;
  }
  return *this;
}

void Buffer::release() {
  if (data_ != nullptr && owned_) {
    if (device_.is_cpu()) {
      std::free(data_);
    } else {
#ifdef ATTNKIT_WITH_CUDA
      const DeviceScope guard(device_);
      cudaFree(data_);
#endif
    }
  }
  data_ = nullptr;
  bytes_ = 0;
  owned_ = true;
}

TensorView Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  TensorView out(data_, dtype, device_, shape);
  const bool negative = std::any_of(shape.begin(), shape.end(), [](int64_t e) { return e < 0; });
  if (negative || out.storage_bytes() > bytes_) out.data = nullptr;
  return out;
}

// ---- copies and fills ----

Status copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) {
  if (bytes < 0) {
    return Status::invalid_argument("copy_bytes: bytes " + std::to_string(bytes) +
                                    " is negative (must be >= 0)");
  }
  if (bytes == 0) return Status::ok();
  if (dst == nullptr || src == nullptr) {
    return Status::invalid_argument(std::string("copy_bytes: ") + (dst == nullptr ? "dst" : "src") +
                                    " is null for a copy of " + std::to_string(bytes) + " bytes");
  }
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return Status::ok();
  }
#ifdef ATTNKIT_WITH_CUDA
  // Unified addressing: the runtime infers the direction from the pointers. The copy is issued
  // with the CUDA side's device current (dst's when both are), so it is ordered after that
  // device's work on its legacy default stream whichever device the caller left current (a copy
  // between two devices is not ordered after the source device's work).
  const DeviceScope scope(dst_device.is_cpu() ? src_device : dst_device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  return cuda_status(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault),
                     "cudaMemcpy of " + std::to_string(bytes) + " bytes from " +
                         src_device.to_string() + " to " + dst_device.to_string());
#else
  return not_built_without_cuda("copying " + std::to_string(bytes) + " bytes from " +
                                src_device.to_string() + " to " + dst_device.to_string());
#endif
}

Status copy_tensor(const TensorView& dst, const TensorView& src) {
  if (dst.dtype != src.dtype || dst.ndim != src.ndim || dst.ndim != valid_ndim(dst.ndim) ||
      !std::equal(dst.shape.begin(), dst.shape.begin() + dst.ndim, src.shape.begin())) {
    return Status::invalid_argument("copy_tensor: dst " + dst.describe() + " and src " +
                                    src.describe() + " must have the same dtype and shape");
  }
  ATTNKIT_RETURN_IF_ERROR(check_contiguous(dst, "copy_tensor dst"));
  ATTNKIT_RETURN_IF_ERROR(check_contiguous(src, "copy_tensor src"));
  return copy_bytes(dst.data, dst.device, src.data, src.device, src.storage_bytes());
}

Status fill_float(const TensorView& t, float value) {
  if (!dtype_is_float(t.dtype)) {
    return Status::invalid_argument("fill_float: " + t.describe() +
                                    " is not a float tensor (accepted: f32, f16, bf16, fp8_e4m3, "
                                    "fp8_e5m2, fp4_e2m1)");
  }
  const int64_t n = t.numel();
  if (n == 0) return Status::ok();
  if (t.data == nullptr) {
    return Status::invalid_argument("fill_float: " + t.describe() + " has no data");
  }
  if (t.device.is_cpu()) {
    // Walk every index of the strided view (odometer over dims).
    std::array<int64_t, kMaxDims> index{};
    for (int64_t k = 0; k < n; ++k) {
      int64_t offset = 0;
      for (int d = 0; d < valid_ndim(t.ndim); ++d)
        offset += index[static_cast<size_t>(d)] * t.strides[static_cast<size_t>(d)];
      store_from_float(t.data, t.dtype, offset, value);
      for (int d = valid_ndim(t.ndim) - 1; d >= 0; --d) {
        const auto i = static_cast<size_t>(d);
        if (++index[i] < t.shape[i]) break;
        index[i] = 0;
      }
    }
    return Status::ok();
  }
  if (!t.is_contiguous()) {
    return Status::unsupported("fill_float: non-contiguous device tensor " + t.describe() +
                               " with strides " + join_dims(t.strides.data(), t.ndim) +
                               " (device fills need a contiguous view)");
  }
  // Device: fill a host staging copy and upload it in one synchronous copy.
  const int64_t bytes = t.storage_bytes();
  ATTNKIT_ASSIGN_OR_RETURN(Buffer staging, Buffer::allocate(Device::cpu(), bytes));
  if (t.dtype == DType::kFP4E2M1 && n % 2 != 0) {
    // Keep the unused high nibble of the last byte as it is on the device.
    ATTNKIT_RETURN_IF_ERROR(copy_bytes(static_cast<char*>(staging.data()) + bytes - 1,
                                       Device::cpu(), static_cast<const char*>(t.data) + bytes - 1,
                                       t.device, 1));
  }
  for (int64_t k = 0; k < n; ++k) store_from_float(staging.data(), t.dtype, k, value);
  return copy_bytes(t.data, t.device, staging.data(), Device::cpu(), bytes);
}

}  // namespace attnkit
