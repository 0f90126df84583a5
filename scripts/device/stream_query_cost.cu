// Host cost of the runtime queries on attnkit's per-call paths (docs/review_s40.md: set_kv's
// stream check, `check_stream_device`, asks cudaStreamIsCapturing and cudaStreamGetDevice once per
// layer), beside the calls set_kv makes anyway (cudaGetDevice in its DeviceScope, a kernel launch
// per scatter), so the check's share of a layer's host time is a measured number.
//   nvcc -O2 -std=c++20 -arch=sm_90a -o /tmp/sqc scripts/device/stream_query_cost.cu && /tmp/sqc
// Prints ns per call: the median of 9 rounds of 100000 calls each (launches: 20000 per round, the
// stream synchronised between rounds, outside the timing).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

__global__ void empty_kernel(int* p) {
  if (p != nullptr && threadIdx.x == 1024) *p = 0;  // never true: the launch is the cost
}

template <typename F>
double median_ns(int calls, cudaStream_t stream, F&& call) {
  std::vector<double> rounds;
  for (int r = 0; r < 9; ++r) {
    check(cudaStreamSynchronize(stream), "sync");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    rounds.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  check(cudaStreamSynchronize(stream), "sync");
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace

int main() {
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaFree(nullptr), "context");
  volatile int sink = 0;
  const double capturing = median_ns(100000, stream, [&] {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &s) != cudaSuccess) std::abort();
    sink = sink + static_cast<int>(s);
  });
  const double get_device = median_ns(100000, stream, [&] {
    int d = -1;
    if (cudaStreamGetDevice(stream, &d) != cudaSuccess) std::abort();
    sink = sink + d;
  });
  const double current = median_ns(100000, stream, [&] {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) std::abort();
    sink = sink + d;
  });
  const double launch = median_ns(20000, stream, [&] {
    empty_kernel<<<1, 32, 0, stream>>>(nullptr);
    if (cudaGetLastError() != cudaSuccess) std::abort();
  });
  std::printf("cudaStreamIsCapturing %.1f ns\n", capturing);
  std::printf("cudaStreamGetDevice   %.1f ns\n", get_device);
  std::printf("cudaGetDevice         %.1f ns\n", current);
  std::printf("kernel launch         %.1f ns\n", launch);
  std::printf("stream check (the first two) = %.1f ns = %.1f%% of one launch\n",
              capturing + get_device, 100.0 * (capturing + get_device) / launch);
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return sink == 12345 ? 1 : 0;
}
