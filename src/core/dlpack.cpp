// DLPack interop: borrow a DLManagedTensor as a TensorView, or export a view as one.
//
// The installed dlpack header (0.6) predates the narrow float type codes. DLPack 1.1 assigned them
// fixed wire values (kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12, kDLFloat4_e2m1fn = 17), which
// PyTorch emits; they are accepted and produced here by value so fp8/fp4 tensors cross without a
// uint8 reinterpretation whatever header version attnkit is built against.
#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

#include "attnkit/tensor.h"

namespace attnkit {
namespace {

constexpr uint8_t kDLFloat8E4M3FnCode = 10;
constexpr uint8_t kDLFloat8E5M2Code = 12;
constexpr uint8_t kDLFloat4E2M1FnCode = 17;

constexpr int kBits4 = 4;
constexpr int kBits8 = 8;
constexpr int kBits16 = 16;
constexpr int kBits32 = 32;
constexpr int kBits64 = 64;

std::string describe_dl_dtype(DLDataType t) {
  return "{code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ", lanes " +
         std::to_string(t.lanes) + "}";
}

Result<DType> dtype_from_dl(DLDataType t) {
  if (t.lanes != 1) {
    return Status::unsupported("from_dlpack: dtype " + describe_dl_dtype(t) +
                               " has lanes != 1 (vector types are not accepted)");
  }
  const int bits = t.bits;
  switch (t.code) {
    case kDLFloat:
      if (bits == kBits32) return DType::kF32;
      if (bits == kBits16) return DType::kF16;
      break;
    case kDLBfloat:
      if (bits == kBits16) return DType::kBF16;
      break;
    case kDLInt:
      if (bits == kBits32) return DType::kI32;
      if (bits == kBits64) return DType::kI64;
      break;
    case kDLUInt:
      if (bits == kBits8) return DType::kU8;
      break;
    case kDLFloat8E4M3FnCode:
      if (bits == kBits8) return DType::kFP8E4M3;
      break;
    case kDLFloat8E5M2Code:
      if (bits == kBits8) return DType::kFP8E5M2;
      break;
    case kDLFloat4E2M1FnCode:
      if (bits == kBits4) return DType::kFP4E2M1;
      break;
    default:
      break;
  }
  return Status::unsupported(
      "from_dlpack: dtype " + describe_dl_dtype(t) +
      " is not supported (accepted: float32/16 {code 2}, bfloat16 {code 4}, int32/64 {code 0}, "
      "uint8 {code 1}, float8_e4m3fn {code 10}, float8_e5m2 {code 12}, float4_e2m1fn {code 17, "
      "bits 4})");
}

DLDataType dl_from_dtype(DType dtype) {
  DLDataType t{};
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(dtype_bits(dtype));
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
      t.code = kDLFloat;
      break;
    case DType::kBF16:
      t.code = kDLBfloat;
      break;
    case DType::kFP8E4M3:
      t.code = kDLFloat8E4M3FnCode;
      break;
    case DType::kFP8E5M2:
      t.code = kDLFloat8E5M2Code;
      break;
    case DType::kFP4E2M1:
      t.code = kDLFloat4E2M1FnCode;
      break;
    case DType::kI32:
    case DType::kI64:
      t.code = kDLInt;
      break;
    case DType::kU8:
      t.code = kDLUInt;
      break;
  }
  return t;
}

// The exported tensor and the shape/stride arrays it points into, freed together.
struct ExportedTensor {
  DLManagedTensor managed{};
  int64_t shape[kMaxDims]{};
  int64_t strides[kMaxDims]{};
};

void delete_exported(DLManagedTensor* self) {
  delete static_cast<ExportedTensor*>(self->manager_ctx);
}

}  // namespace

Result<TensorView> from_dlpack(const DLManagedTensor* tensor) {
  if (tensor == nullptr) {
    return Status::invalid_argument("from_dlpack: tensor is null");
  }
  const DLTensor& dl = tensor->dl_tensor;
  if (dl.ndim < 0 || dl.ndim > kMaxDims) {
    return Status::unsupported("from_dlpack: ndim " + std::to_string(dl.ndim) +
                               " is not supported (accepted: 0.." + std::to_string(kMaxDims) + ")");
  }
  if (dl.ndim > 0 && dl.shape == nullptr) {
    return Status::invalid_argument("from_dlpack: shape is null for ndim " +
                                    std::to_string(dl.ndim));
  }
  ATTNKIT_ASSIGN_OR_RETURN(DType dtype, dtype_from_dl(dl.dtype));

  TensorView view;
  view.dtype = dtype;
  switch (dl.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory is ordinary host memory to the CPU
      view.device = Device::cpu();
      break;
    case kDLCUDA:
      view.device = Device::cuda(dl.device.device_id);
      break;
    default:
      return Status::unsupported("from_dlpack: device_type " +
                                 std::to_string(static_cast<int>(dl.device.device_type)) +
                                 " is not supported (accepted: kDLCPU 1, kDLCUDA 2, "
                                 "kDLCUDAHost 3)");
  }

  view.ndim = dl.ndim;
  int64_t contiguous_stride = 1;
  for (int d = dl.ndim - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    if (dl.shape[d] < 0) {
      return Status::invalid_argument("from_dlpack: shape[" + std::to_string(d) +
                                      "] = " + std::to_string(dl.shape[d]) + " is negative");
    }
    view.shape[i] = dl.shape[d];
    view.strides[i] = dl.strides != nullptr ? dl.strides[d] : contiguous_stride;
    contiguous_stride *= dl.shape[d];
  }
  if (dtype == DType::kFP4E2M1 && view.ndim > 0 &&
      view.shape[static_cast<size_t>(view.ndim - 1)] > 1 &&
      view.strides[static_cast<size_t>(view.ndim - 1)] != 1) {
    return Status::unsupported("from_dlpack: fp4_e2m1 tensor has innermost stride " +
                               std::to_string(view.strides[static_cast<size_t>(view.ndim - 1)]) +
                               " (packed fp4 needs 1)");
  }
  view.data = dl.data == nullptr ? nullptr : static_cast<char*>(dl.data) + dl.byte_offset;
  return view;
}

Result<DLManagedTensor*> to_dlpack(const TensorView& view) {
  if (view.ndim < 0 || view.ndim > kMaxDims) {
    return Status::invalid_argument("to_dlpack: ndim " + std::to_string(view.ndim) +
                                    " is out of range (accepted: 0.." + std::to_string(kMaxDims) +
                                    ")");
  }
  auto* exported = new ExportedTensor();
  DLTensor& dl = exported->managed.dl_tensor;
  dl.data = view.data;
  dl.device.device_type = view.device.is_cuda() ? kDLCUDA : kDLCPU;
  dl.device.device_id = view.device.ordinal;
  dl.ndim = view.ndim;
  dl.dtype = dl_from_dtype(view.dtype);
  for (int d = 0; d < view.ndim; ++d) {
    exported->shape[d] = view.shape[static_cast<size_t>(d)];
    exported->strides[d] = view.strides[static_cast<size_t>(d)];
  }
  dl.shape = exported->shape;
  dl.strides = exported->strides;
  dl.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = delete_exported;
  return &exported->managed;
}

}  // namespace attnkit
