// Whether this binary carries device code the current CUDA device can run: a build for
// CMAKE_CUDA_ARCHITECTURES "80-real;90a-real" has none for a Turing (sm_75) or Blackwell GPU, where
// every kernel launch would fail with "no kernel image is available". detect_cuda() asks before a
// backend is chosen for the device.
#include <cuda_runtime_api.h>

#include "cuda/common/kernel_image.h"

namespace attnkit::cuda {
namespace {

__global__ void kernel_image_probe() {}

}  // namespace

bool binary_has_kernel_image(int ordinal) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const bool switch_device = current != ordinal;
  if (switch_device && cudaSetDevice(ordinal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cudaFuncAttributes attributes{};
  const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel_image_probe);
  if (err != cudaSuccess) cudaGetLastError();  // clear the "no kernel image" error
  if (switch_device) cudaSetDevice(current);
  return err == cudaSuccess;
}

}  // namespace attnkit::cuda
