#include "core/device_scope.h"

#include <string>

#include "core/str_cat.h"

#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit {

#ifdef ATTNKIT_WITH_CUDA
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
  if (previous_ >= 0) cudaSetDevice(previous_);
}

Status check_stream_device(StreamHandle stream, const Device& device, std::string_view what) {
  if (stream == nullptr || device.is_cpu()) return Status::ok();
  int owner = -1;
  const cudaError_t err = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &owner);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::invalid_argument(cat(
        what, " ", stream, " is not a CUDA stream of this process (", cudaGetErrorName(err), ")"));
  }
  if (owner != device.ordinal) {
    return Status::invalid_argument(cat(what, " ", stream, " belongs to cuda:", owner,
                                        ", but the backend runs on ", device.to_string(),
                                        ": pass a stream created on ", device.to_string(),
                                        " (or nullptr for its default stream)"));
  }
  return Status::ok();
}
#else
DeviceScope::DeviceScope(const Device& /*device*/) {}
DeviceScope::~DeviceScope() = default;
Status check_stream_device(StreamHandle /*stream*/, const Device& /*device*/,
                           std::string_view /*what*/) {
  return Status::ok();
}
#endif

}  // namespace attnkit
