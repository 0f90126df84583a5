#include "core/device_scope.h"

#include <string>

#include "core/str_cat.h"

#ifdef ATTNKIT_WITH_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "cuda/common/driver_entry.h"
#endif

namespace attnkit {

#ifdef ATTNKIT_WITH_CUDA
bool cuda_has_primary_context(int ordinal) {
  static const auto device_get = cuda::driver_entry<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000);
  static const auto get_state =
      cuda::driver_entry<PFN_cuDevicePrimaryCtxGetState_v7000>("cuDevicePrimaryCtxGetState", 7000);
  if (device_get == nullptr || get_state == nullptr) return true;
  CUdevice dev = 0;
  unsigned flags = 0;
  int active = 0;
  if (device_get(&dev, ordinal) != CUDA_SUCCESS ||
      get_state(dev, &flags, &active) != CUDA_SUCCESS) {
    return true;
  }
  return active != 0;
}

DeviceScope::DeviceScope(const Device& device) {
  if (device.is_cpu()) return;
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current == device.ordinal) return;
  if (err == cudaSuccess) err = cudaSetDevice(device.ordinal);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the non-sticky error so later calls do not report it again
    status_ = Status::cuda_error(cat("making ", device.to_string(), " current failed: ",
                                     cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
    return;
  }
  previous_ = current;
}

DeviceScope::~DeviceScope() {
  // cudaSetDevice creates the device's primary context (hundreds of MB). A device the caller never
  // used (current only by default) gets none: the scope's device stays current instead.
  if (previous_ >= 0 && cuda_has_primary_context(previous_)) cudaSetDevice(previous_);
}

Status check_stream_device(StreamHandle stream, const Device& device, std::string_view what,
                           std::string_view where) {
  if (stream == nullptr || device.is_cpu()) return Status::ok();
#if CUDART_VERSION >= 12080
  // A stream being captured is not asked (cudaStreamGetDevice there invalidates the capture: H200
  // 2026-11-27, set_kv inside a captured graph); cudaStreamIsCapturing is the capture-safe query.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) {
    cudaGetLastError();  // the device query below names the bad handle
  } else if (capture != cudaStreamCaptureStatusNone) {
    return Status::ok();
  }
  int owner = -1;
  const cudaError_t err = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &owner);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::invalid_argument(cat(
        what, " ", stream, " is not a CUDA stream of this process (", cudaGetErrorName(err), ")"));
  }
  if (owner != device.ordinal) {
    return Status::invalid_argument(cat(
        what, " ", stream, " belongs to cuda:", owner, ", but ", where, " ", device.to_string(),
        ": pass a stream created on ", device.to_string(), " (or nullptr for its default stream)"));
  }
#else
  (void)what;  // cudaStreamGetDevice needs CUDA 12.8: not checked
  (void)where;
#endif
  return Status::ok();
}

Status check_memory_on_device(const void* ptr, const Device& device, std::string_view what) {
  if (ptr == nullptr || device.is_cpu()) return Status::ok();
  const DeviceScope scope(device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::cuda_error(cat(what, ": asking CUDA where address ", ptr, " lies failed: ",
                                  cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
  if (attr.type == cudaMemoryTypeManaged) return Status::ok();
  if (attr.type != cudaMemoryTypeDevice) {
    return Status::invalid_argument(
        cat(what, ": address ", ptr, " is ",
            attr.type == cudaMemoryTypeHost
                ? "pinned host memory"
                : "memory CUDA neither allocated nor registered (pageable host memory, say)",
            ", not device memory of ", device.to_string(), " (where the pool is): allocate it on ",
            device.to_string()));
  }
  if (attr.device != device.ordinal) {
    return Status::invalid_argument(cat(
        what, ": address ", ptr, " is memory of cuda:", attr.device, ", but the pool is on ",
        device.to_string(), ": allocate it on ", device.to_string(), " (or make the pool there)"));
  }
  return Status::ok();
}
#else
bool cuda_has_primary_context(int /*ordinal*/) { return false; }
Status check_memory_on_device(const void* /*ptr*/, const Device& /*device*/,
                              std::string_view /*what*/) {
  return Status::ok();
}
DeviceScope::DeviceScope(const Device& /*device*/) {}
DeviceScope::~DeviceScope() = default;
Status check_stream_device(StreamHandle /*stream*/, const Device& /*device*/,
                           std::string_view /*what*/, std::string_view /*where*/) {
  return Status::ok();
}
#endif

Status check_pools_on_device(std::string_view owner, const KVPool* kv_pool,
                             const ReqToTokenPool* req_to_token_pool, const Device& device) {
  if (kv_pool != nullptr && kv_pool->device() != device) {
    return Status::invalid_argument(
        cat(owner, ": the KV pool is on ", kv_pool->device().to_string(), ", the backend on ",
            device.to_string(), ": make the pools on the backend's device"));
  }
  if (req_to_token_pool != nullptr && req_to_token_pool->device() != device) {
    return Status::invalid_argument(
        cat(owner, ": the req_to_token pool is on ", req_to_token_pool->device().to_string(),
            ", the backend on ", device.to_string(), ": make the pools on the backend's device"));
  }
  return Status::ok();
}

Status check_batch_devices(const ForwardBatch& batch, StreamHandle stream, const Device& device) {
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(
      stream, device, "ForwardBatch.stream (or the context's stream when it is null)"));
  return check_pools_on_device("ForwardBatch", batch.kv_pool, batch.req_to_token_pool, device);
}

}  // namespace attnkit
