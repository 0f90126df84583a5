// Error plumbing for CUDA calls and kernel launches: every call and every launch is checked and a
// failure becomes a Status (kCudaError) naming the expression, the CUDA error and the source line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attnkit/status.h"

namespace attnkit::cuda {

inline Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  std::string msg = std::string(expr) + " failed: " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line);
  return Status::cuda_error(std::move(msg));
}

inline cudaStream_t to_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace attnkit::cuda

// Evaluates a CUDA runtime call; returns a kCudaError Status from the enclosing function on
// failure.
#define ATTNKIT_CUDA_TRY(expr)                                                           \
  do {                                                                                   \
    const cudaError_t attnkit_cuda_err_ = (expr);                                        \
    if (attnkit_cuda_err_ != cudaSuccess)                                                \
      return ::attnkit::cuda::cuda_status(attnkit_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Checks the launch that was just issued (configuration errors, e.g. too much shared memory).
#define ATTNKIT_CUDA_TRY_LAUNCH(what) ATTNKIT_CUDA_TRY(((void)(what), cudaGetLastError()))
