// Paged decode bandwidth of the flashinfer backend against the device's measured copy bandwidth
// (gpu label). Prints one line per shape; the DESIGN.md targets are benchmark goals, so the test
// asserts only that every timed run succeeded, launched the tensor-core decode and produced finite
// numbers.
//
//   bytes(decode) = sum_r kv_len_r * Hkv * (Dk + Dv) * kv_bytes + T * Hq * (Dqk + Dv) * q_bytes
//   copy          = 2 * bytes / time of a device-to-device cudaMemcpyAsync (read + write)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "attnkit/tensor.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "harness/case_runner.h"

namespace attnkit {
namespace {

constexpr int kWarmup = 5;
constexpr int kIters = 30;
constexpr int64_t kCopyBytes = int64_t{1} << 30;

// Every CUDA call is checked: a failure is a test failure (and the median is NaN).
#define PERF_CUDA_OK(call) EXPECT_EQ((call), cudaSuccess) << #call

template <typename F>
double median_ms(F&& f) {
  cudaEvent_t a = nullptr, b = nullptr;
  PERF_CUDA_OK(cudaEventCreate(&a));
  PERF_CUDA_OK(cudaEventCreate(&b));
  for (int i = 0; i < kWarmup; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < kIters; ++i) {
    PERF_CUDA_OK(cudaEventRecord(a));
    f();
    PERF_CUDA_OK(cudaEventRecord(b));
    PERF_CUDA_OK(cudaEventSynchronize(b));
    float t = std::numeric_limits<float>::quiet_NaN();
    PERF_CUDA_OK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  PERF_CUDA_OK(cudaEventDestroy(a));
  PERF_CUDA_OK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double copy_bandwidth_gbs() {
  Result<Buffer> src = Buffer::allocate(Device::cuda(0), kCopyBytes);
  Result<Buffer> dst = Buffer::allocate(Device::cuda(0), kCopyBytes);
  if (!src.is_ok() || !dst.is_ok()) return 0.0;
  PERF_CUDA_OK(cudaMemset(src->data(), 1, kCopyBytes));
  const double ms = median_ms([&] {
    PERF_CUDA_OK(cudaMemcpyAsync(dst->data(), src->data(), kCopyBytes, cudaMemcpyDeviceToDevice));
  });
  return 2.0 * static_cast<double>(kCopyBytes) / (ms * 1e-3) / 1e9;
}

struct Shape {
  int bs, kv_len, page;
  DType kv;
  bool shuffle = true;  // random page order (false: pages in pool order)
};

TEST(FlashInferPerfTest, PagedDecodeBandwidth) {
  const double copy = copy_bandwidth_gbs();
  ASSERT_GT(copy, 0.0);
  std::printf("[perf] device copy bandwidth %.0f GB/s\n", copy);
  constexpr int kHq = 32, kHkv = 8, kD = 128;
  // Host-side preparation draws every KV value: a few shapes keep the run short.
  const Shape shapes[] = {{16, 4096, 16, DType::kBF16},        {32, 4096, 16, DType::kBF16},
                          {16, 4096, 16, DType::kBF16, false}, {16, 4096, 1, DType::kBF16},
                          {16, 4096, 64, DType::kBF16},        {32, 4096, 16, DType::kFP8E4M3},
                          {1, 32768, 16, DType::kBF16}};
  // FLASHINFER_PERF_SHAPES=n times only the first n shapes (profiling runs).
  const char* limit_env = std::getenv("FLASHINFER_PERF_SHAPES");
  const size_t limit = limit_env != nullptr ? std::strtoul(limit_env, nullptr, 10) : 1000;
  size_t done = 0;
  for (const Shape& s : shapes) {
    if (done++ >= limit) break;
    harness::CaseSpec spec =
        harness::make_uniform_case("perf", ForwardMode::kDecode, s.bs, s.kv_len - 1, 1, kHq, kHkv,
                                   kD, s.page, DType::kBF16, s.kv);
    spec.shuffle_pages = s.shuffle;  // the "(in order)" row timed shuffled pages before
    harness::PrepareOptions opt;
    opt.num_layers = 1;
    opt.request_lse = false;
    opt.poison = false;
    opt.snapshot_pool = false;
    Result<harness::PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0), opt);
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    Result<std::unique_ptr<AttentionBackend>> backend = create_flashinfer_backend(pc->context());
    ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
    harness::LayerData& ld = pc->layers[0];
    ASSERT_TRUE((*backend)->init_forward_metadata(pc->batch).is_ok());
    Status status;  // the first failure of any timed call
    int64_t calls = 0;
    const double ms = median_ms([&] {
      const Status st = (*backend)->forward_decode(ld.q, TensorView(), TensorView(), ld.out,
                                                   ld.layer, pc->batch, false);
      if (status.is_ok()) status = st;
      ++calls;
    });
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    // Every timed call launched the tensor-core decode (a call that returned OK without a launch
    // would time nothing).
    EXPECT_EQ(flashinfer_stats(**backend)->native_calls, calls);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int64_t kv_bytes = dtype_storage_bytes(s.kv, 1);
    const double bytes = static_cast<double>(s.bs) * s.kv_len * kHkv * 2 * kD * kv_bytes +
                         static_cast<double>(s.bs) * kHq * 2 * kD * 2;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    const double tokens_per_s = s.bs / (ms * 1e-3);
    ASSERT_TRUE(std::isfinite(gbs));
    const FlashInferStats* st = flashinfer_stats(**backend);
    std::printf(
        "[perf] decode bs %2d kv %5d page %2d%s kv %-8s: %8.1f us  %6.0f GB/s  %5.1f%% of copy  "
        "%.3g tok/s  native %lld split %lld\n",
        s.bs, s.kv_len, s.page, s.shuffle ? "" : " (in order)", dtype_name(s.kv), ms * 1e3, gbs,
        100.0 * gbs / copy, tokens_per_s, static_cast<long long>(st->native_calls),
        static_cast<long long>(st->split_calls));
  }
}

}  // namespace
}  // namespace attnkit
