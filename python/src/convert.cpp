// DLPack import/export through nanobind's ndarray, argument parsing and host integer arrays.
#include <dlpack/dlpack.h>

#include <cstring>
#include <string>
#include <utility>

#include "common.h"

namespace attnkit::python {
namespace {

using nb::dlpack::dtype_code;

constexpr uint8_t kBits8 = 8;
constexpr uint8_t kBits16 = 16;
constexpr uint8_t kBits32 = 32;
constexpr uint8_t kBits64 = 64;
// Two fp4 values share one byte.
constexpr int64_t kFp4PerByte = 2;

bool is_integer_code(uint8_t code) {
  return code == static_cast<uint8_t>(dtype_code::Int) ||
         code == static_cast<uint8_t>(dtype_code::UInt);
}

std::string with_name(const char* name, const std::string& message) {
  return std::string(name) + ": " + message;
}

template <typename T>
nb::object numpy_array_of(std::vector<T> values) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule deleter(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t shape[1] = {owned->size()};
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), 1, shape, deleter));
}

// One body for read-only and writable arrays (the library's views are mutable either way; a
// read-only one is only ever read).
template <typename A>
TensorView view_of(const A& array, const char* name, std::optional<DType> as) {
  if (!array.is_valid()) raise_invalid(with_name(name, "is missing"));
  DLManagedTensor managed{};
  DLTensor& dl = managed.dl_tensor;
  dl.data = const_cast<void*>(static_cast<const void*>(array.data()));  // byte_offset applied
  dl.device.device_type = static_cast<DLDeviceType>(array.device_type());
  dl.device.device_id = array.device_id();
  dl.ndim = static_cast<int32_t>(array.ndim());
  const nb::dlpack::dtype t = array.dtype();
  dl.dtype.code = t.code;
  dl.dtype.bits = t.bits;
  dl.dtype.lanes = t.lanes;
  // Boolean masks (torch.bool, np.bool_) are bytes.
  if (t.code == static_cast<uint8_t>(dtype_code::Bool) && t.bits == kBits8) {
    dl.dtype.code = kDLUInt;
  }
  // Raw storage reinterpreted as a float dtype the producer cannot name: import it as a type
  // from_dlpack accepts with the same width, then relabel.
  bool fp4_from_bytes = false;
  bool relabel = false;
  if (as.has_value() && is_integer_code(t.code) && t.lanes == 1) {
    if (*as == DType::kFP4E2M1 && t.bits == kBits8) {
      dl.dtype.code = kDLUInt;
      fp4_from_bytes = true;
    } else if (dtype_is_float(*as) && t.bits == dtype_bits(*as)) {
      dl.dtype.code =
          t.bits == kBits8 ? static_cast<uint8_t>(kDLUInt) : static_cast<uint8_t>(kDLFloat);
      relabel = true;
    }
  }
  dl.shape = const_cast<int64_t*>(array.shape_ptr());
  dl.strides = const_cast<int64_t*>(array.stride_ptr());
  Result<TensorView> imported = from_dlpack(&managed);
  if (!imported.is_ok()) {
    check(Status(imported.status().code(), with_name(name, imported.status().message())));
  }
  TensorView view = imported.value();
  if (relabel) view.dtype = *as;
  if (fp4_from_bytes) {
    const int last = view.ndim - 1;
    if (last < 0 || (view.shape[static_cast<size_t>(last)] > 1 &&
                     view.strides[static_cast<size_t>(last)] != 1)) {
      raise_invalid(with_name(name,
                              "packed fp4_e2m1 bytes need at least one dimension with "
                              "innermost stride 1, got " +
                                  view.describe()));
    }
    view.dtype = DType::kFP4E2M1;
    for (int d = 0; d < view.ndim; ++d) {
      const auto i = static_cast<size_t>(d);
      if (d == last) {
        view.shape[i] *= kFp4PerByte;
      } else {
        view.strides[i] *= kFp4PerByte;
      }
    }
  }
  if (as.has_value() && view.dtype != *as) {
    raise_invalid(with_name(name, std::string("dtype ") + dtype_name(view.dtype) +
                                      " does not match the requested " + dtype_name(*as) +
                                      " (pass that dtype, or raw storage: uint8 for fp8 / "
                                      "packed fp4, 16-bit integers for bf16 / f16)"));
  }
  return view;
}

}  // namespace

TensorView to_view(const Array& array, const char* name, std::optional<DType> as) {
  return view_of(array, name, as);
}

TensorView to_view(const OutArray& array, const char* name, std::optional<DType> as) {
  return view_of(array, name, as);
}

OutArray writable_array(nb::handle obj, const char* name, const char* writes) {
  OutArray out;
  if (nb::try_cast<OutArray>(obj, out)) return out;
  Array readable;
  if (nb::try_cast<Array>(obj, readable)) {
    raise_invalid(with_name(name, std::string("the array is read-only; attnkit writes ") + writes +
                                      " into it (pass a writable array)"));
  }
  raise_invalid(with_name(name,
                          "expected a writable DLPack array (a torch tensor or a NumPy "
                          "array), got " +
                              nb::cast<std::string>(nb::str(obj.type()))));
}

ExportArray to_array(const TensorView& view, nb::handle owner) {
  if (!view.defined()) raise_invalid("to_array: the view is undefined (null data)");
  nb::dlpack::dtype t{};
  t.lanes = 1;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  for (int d = 0; d < view.ndim; ++d) {
    shape[d] = view.shape[static_cast<size_t>(d)];
    strides[d] = view.strides[static_cast<size_t>(d)];
  }
  switch (view.dtype) {
    case DType::kF32:
      t = {static_cast<uint8_t>(dtype_code::Float), kBits32, 1};
      break;
    case DType::kF16:
      t = {static_cast<uint8_t>(dtype_code::Float), kBits16, 1};
      break;
    case DType::kBF16:
      t = {static_cast<uint8_t>(dtype_code::Bfloat), kBits16, 1};
      break;
    case DType::kI32:
      t = {static_cast<uint8_t>(dtype_code::Int), kBits32, 1};
      break;
    case DType::kI64:
      t = {static_cast<uint8_t>(dtype_code::Int), kBits64, 1};
      break;
    case DType::kU8:
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
      t = {static_cast<uint8_t>(dtype_code::UInt), kBits8, 1};
      break;
    case DType::kFP4E2M1: {
      t = {static_cast<uint8_t>(dtype_code::UInt), kBits8, 1};
      const int last = view.ndim - 1;
      for (int d = 0; d < view.ndim; ++d) {
        if (d == last) {
          shape[d] /= kFp4PerByte;
        } else {
          strides[d] /= kFp4PerByte;
        }
      }
      break;
    }
  }
  size_t ushape[kMaxDims];
  for (int d = 0; d < view.ndim; ++d) ushape[d] = static_cast<size_t>(shape[d]);
  const int device_type = view.device.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  return ExportArray(view.data, static_cast<size_t>(view.ndim), ushape, owner, strides, t,
                     device_type, view.device.ordinal);
}

DType parse_dtype_arg(nb::handle obj, const char* name) {
  std::string text;
  if (nb::isinstance<nb::str>(obj)) {
    text = nb::cast<std::string>(obj);
  } else if (nb::hasattr(obj, "itemsize") && nb::hasattr(obj, "name")) {
    text = nb::cast<std::string>(obj.attr("name"));  // numpy.dtype
  } else if (nb::hasattr(obj, "__name__")) {
    text = nb::cast<std::string>(obj.attr("__name__"));  // numpy.float32 and friends
  } else {
    text = nb::cast<std::string>(nb::str(obj));  // torch.bfloat16 -> "torch.bfloat16"
  }
  constexpr std::string_view kTorchPrefix = "torch.";
  if (text.rfind(kTorchPrefix, 0) == 0) text = text.substr(kTorchPrefix.size());
  Result<DType> dtype = parse_dtype(text);
  if (!dtype.is_ok()) {
    check(Status(dtype.status().code(), with_name(name, dtype.status().message())));
  }
  return dtype.value();
}

Device parse_device_arg(nb::handle obj) {
  if (obj.is_none()) return Device::cpu();
  Result<Device> device = Device::parse(nb::cast<std::string>(nb::str(obj)));
  if (!device) raise_invalid(device.status().message());
  return *device;
}

StreamHandle parse_stream_arg(nb::handle obj) {
  if (obj.is_none()) return nullptr;
  nb::handle value = obj;
  nb::object attr;
  if (!nb::isinstance<nb::int_>(obj) && nb::hasattr(obj, "cuda_stream")) {
    attr = obj.attr("cuda_stream");
    value = attr;
  }
  if (!nb::isinstance<nb::int_>(value)) {
    raise_invalid(
        "stream must be an int (cudaStream_t, e.g. "
        "torch.cuda.current_stream().cuda_stream), an object with .cuda_stream, or "
        "None; got " +
        nb::cast<std::string>(nb::str(obj.type())));
  }
  uintptr_t handle = 0;
  if (!nb::try_cast(value, handle)) {
    raise_invalid("stream must be a cudaStream_t handle in [0, 2^64), got " +
                  nb::cast<std::string>(nb::repr(value)));
  }
  return reinterpret_cast<StreamHandle>(handle);
}

std::vector<int64_t> view_ints(const TensorView& view, const char* name) {
  if (view.ndim != 1 || (view.dtype != DType::kI32 && view.dtype != DType::kI64)) {
    raise_invalid(with_name(name, "expected a 1-D int32 or int64 array, got " + view.describe()));
  }
  const int64_t n = view.size(0);
  // A broadcast array (stride 0) is tiny whatever its length: copying 2^31 of its elements took
  // 23 GB before validate() refused the stride.
  if (n > 1 && view.stride(0) == 0) {
    raise_invalid(with_name(name, "a broadcast (stride 0) array is not accepted, got " +
                                      view.describe() + ": pass a contiguous one"));
  }
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const int64_t elem = dtype_storage_bytes(view.dtype, 1);
  std::vector<uint8_t> staging;
  const auto* base = static_cast<const uint8_t*>(view.data);
  int64_t stride = view.stride(0);
  if (view.device.is_cuda()) {
    if (stride != 1) {
      raise_invalid(with_name(
          name, "a CUDA array read on the host must be contiguous, got " + view.describe()));
    }
    staging.resize(static_cast<size_t>(n * elem));
    check(copy_bytes(staging.data(), Device::cpu(), view.data, view.device, n * elem));
    base = staging.data();
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = base + i * stride * elem;
    if (view.dtype == DType::kI32) {
      int32_t v;
      std::memcpy(&v, p, sizeof(v));
      out[static_cast<size_t>(i)] = v;
    } else {
      std::memcpy(&out[static_cast<size_t>(i)], p, sizeof(int64_t));
    }
  }
  return out;
}

std::vector<int64_t> host_ints(nb::handle obj, const char* name) {
  std::vector<int64_t> out;
  if (obj.is_none()) return out;
  Array array;
  if (nb::try_cast<Array>(obj, array)) return view_ints(to_view(array, name), name);
  if (!nb::isinstance<nb::sequence>(obj) && !nb::hasattr(obj, "__iter__")) {
    raise_invalid(with_name(name, "expected a sequence of ints or a 1-D integer array, got " +
                                      nb::cast<std::string>(nb::str(obj.type()))));
  }
  for (nb::handle item : obj) {
    int64_t v = 0;
    if (!nb::try_cast<int64_t>(item, v)) {
      raise_invalid(
          with_name(name, "element " + nb::cast<std::string>(nb::repr(item)) + " is not an int"));
    }
    out.push_back(v);
  }
  return out;
}

std::vector<int32_t> host_ints32(nb::handle obj, const char* name) {
  return narrow_ints32(host_ints(obj, name), name);
}

std::vector<int32_t> narrow_ints32(const std::vector<int64_t>& wide, const char* name) {
  std::vector<int32_t> out(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < INT32_MIN || wide[i] > INT32_MAX) {
      raise_invalid(with_name(name, "element " + std::to_string(i) + " = " +
                                        std::to_string(wide[i]) + " does not fit in int32"));
    }
    out[i] = static_cast<int32_t>(wide[i]);
  }
  return out;
}

nb::object numpy_array(std::vector<int64_t> values) { return numpy_array_of(std::move(values)); }
nb::object numpy_array(std::vector<int32_t> values) { return numpy_array_of(std::move(values)); }

}  // namespace attnkit::python
