// ATTNKIT_HOST_DEVICE: marks a function that host code and CUDA kernels share (a plan formula
// that the host planner and a GPU planner must compute alike); empty outside nvcc.
#pragma once

#if defined(__CUDACC__)
#define ATTNKIT_HOST_DEVICE __host__ __device__
#else
#define ATTNKIT_HOST_DEVICE
#endif
