// Backends on a second GPU (review_s40 "Multi-GPU"). A serving process that drives several GPUs
// from one thread leaves whichever device it used last current. A backend made for cuda:1 (its
// context, pools and tensors there) must still launch on cuda:1, where its pointers live, and
// give the caller its device back (core/device_scope.h). A stream of another device is refused by
// name. Skipped on machines with fewer than two CUDA devices.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "core/device_scope.h"
#include "cuda/common/per_device_once.h"
#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/on_backend.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

struct DeviceCase {
  std::string name;
  ForwardMode mode;
  bool mla;
};

CaseSpec device_spec(const DeviceCase& dc) {
  // New tokens: 9 and 3 (extend), one each (decode); verify takes a chain of 4 drafts.
  std::vector<int> fresh;
  if (dc.mode == ForwardMode::kExtend) fresh = {9, 3};
  if (dc.mode == ForwardMode::kDecode) fresh = {1, 1};
  return test_support::plan_check_case("cuda1_" + dc.name, dc.mode, {300, 41}, fresh, dc.mla, 11);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

class OtherDevice : public ::testing::TestWithParam<std::tuple<std::string, DeviceCase>> {
 protected:
  void SetUp() override {
    const int n = device_count();
    if (n < 2) GTEST_SKIP() << "needs two CUDA devices; this machine has " << n;
    const auto& [backend_name, dc] = GetParam();
    // The case is prepared with cuda:1 current (its set-up copies and fills run there); the
    // tests then make cuda:0 current, as a caller that last served another rank would.
    CUDA_OK(cudaSetDevice(1));
    std::string skip;
    Result<test_support::CaseOnBackend> made =
        test_support::case_on_backend(backend_name, device_spec(dc), Device::cuda(1), &skip);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    made_ = std::move(made).value();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaSetDevice(0));
  }
  void TearDown() override { cudaSetDevice(0); }

  std::optional<test_support::CaseOnBackend> made_;
};

// Every layer of the case on `backend` (save_kv on: the backend writes the new keys into the pool
// too), compared with the fp64 reference; `current` must stay the current device throughout.
void expect_runs_and_matches(AttentionBackend& backend, harness::PreparedCase& pc, int current) {
  STATUS_OK(harness::run_backend(backend, pc, /*save_kv=*/true));
  int now = -1;
  CUDA_OK(cudaGetDevice(&now));
  EXPECT_EQ(now, current) << "the backend did not give the caller's device back";
  Result<harness::Comparison> cmp = harness::compare_with_reference(pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_TRUE(cmp.value().passed()) << cmp.value().summary();
  CUDA_OK(cudaGetDevice(&now));
  EXPECT_EQ(now, current);
}

TEST_P(OtherDevice, RunsOnItsDeviceWhateverIsCurrent) {
  ASSERT_EQ(made_->pc.device.ordinal, 1);
  expect_runs_and_matches(*made_->backend, made_->pc, 0);
  // Nothing was launched on cuda:0 with cuda:1's pointers: its context is clean.
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
}

// The same kernels on both devices in one process: each device needs its own kernel attributes
// (the shared-memory opt-in, cuda/common/per_device_once.h), so a backend that ran on cuda:0 first
// must still launch on cuda:1.
TEST_P(OtherDevice, RunsOnBothDevicesInOneProcess) {
  const auto& [backend_name, dc] = GetParam();
  std::string skip;
  Result<test_support::CaseOnBackend> on0 =
      test_support::case_on_backend(backend_name, device_spec(dc), Device::cuda(0), &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_TRUE(on0.is_ok()) << on0.status().to_string();
  expect_runs_and_matches(*on0.value().backend, on0.value().pc, 0);
  expect_runs_and_matches(*made_->backend, made_->pc, 0);
  CUDA_OK(cudaSetDevice(1));
  expect_runs_and_matches(*on0.value().backend, on0.value().pc, 1);
}

// cudaStreamPerThread is a handle of whichever device is current: inside the backend's scope it is
// cuda:1's, so it is not refused and the forward runs there.
TEST_P(OtherDevice, PerThreadStreamHandleRunsOnTheBackendsDevice) {
  made_->pc.batch.stream = cudaStreamPerThread;
  expect_runs_and_matches(*made_->backend, made_->pc, 0);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
}

// A batch over pools of another device than the backend's is refused by name before any launch.
TEST_P(OtherDevice, PoolsOfAnotherDeviceAreRefused) {
  const KVPool& own = *made_->pc.kv_pool;
  KVPoolConfig config = own.config();
  config.device = Device::cuda(0);
  std::unique_ptr<KVPool> on0;
  if (made_->pc.spec.mla) {
    Result<std::unique_ptr<MLAKVPool>> made = MLAKVPool::create(config);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    on0 = std::move(made).value();
  } else {
    Result<std::unique_ptr<MHAKVPool>> made = MHAKVPool::create(config);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    on0 = std::move(made).value();
  }
  ForwardBatch batch = made_->pc.batch;
  batch.kv_pool = on0.get();
  const Status st = made_->backend->init_forward_metadata(batch);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("the KV pool is on cuda:0, the backend on cuda:1"), std::string::npos)
      << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  expect_runs_and_matches(*made_->backend, made_->pc, 0);
}

TEST_P(OtherDevice, StreamOfAnotherDeviceIsRefused) {
#if CUDART_VERSION < 12080
  GTEST_SKIP() << "the stream's device is checked from CUDA 12.8 (cudaStreamGetDevice)";
#endif
  harness::PreparedCase& pc = made_->pc;
  cudaStream_t on0 = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&on0, cudaStreamNonBlocking));  // cuda:0 is current
  ForwardBatch batch = pc.batch;
  batch.stream = on0;
  const Status st = made_->backend->init_forward_metadata(batch);
  CUDA_OK(cudaStreamDestroy(on0));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("ForwardBatch.stream"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("belongs to cuda:0, but the backend runs on cuda:1"),
            std::string::npos)
      << st.to_string();
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
  // The refused plan leaves the backend usable: the batch on the context's stream runs.
  expect_runs_and_matches(*made_->backend, pc, 0);
}

// CUDA graphs on cuda:1 with cuda:0 current: the caller's stream is cuda:1's, the backend is made
// through the registry (its create runs in the context's device scope) and every call to it is
// made with cuda:0 current; the capture is in global mode. Capture, replays and eager must agree
// bit for bit (and eager with the fp64 reference).
TEST_P(OtherDevice, GraphReplayMatchesEager) {
  const auto& [backend_name, dc] = GetParam();
  if (dc.mode == ForwardMode::kExtend) GTEST_SKIP() << "graphs capture decode and verify only";
  const BackendDescriptor* descriptor = builtin_registry().find(backend_name);
  ASSERT_NE(descriptor, nullptr) << backend_name;
  if (!descriptor->cuda_graph) GTEST_SKIP() << backend_name << " has no CUDA-graph support";
  cudaStream_t on1 = nullptr;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaStreamCreateWithFlags(&on1, cudaStreamNonBlocking));
  const std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> owned(on1, cudaStreamDestroy);
  CUDA_OK(cudaSetDevice(0));
  const test_support::BackendFactory make = [&](const BackendContext& ctx) {
    return builtin_registry().create(backend_name, ctx);
  };
  // Captured in global mode, as PyTorch captures: the device scope's calls inside the capture
  // (cudaGetDevice / cudaSetDevice, the stream's device) must be allowed there.
  test_support::expect_graph_replay_matches_eager_on(made_->pc, make, dc.mode, on1,
                                                     /*global_capture=*/true);
  int now = -1;
  CUDA_OK(cudaGetDevice(&now));
  EXPECT_EQ(now, 0) << "the backend did not give the caller's device back";
  CUDA_OK(cudaStreamSynchronize(on1));
  CUDA_OK(cudaDeviceSynchronize());  // cuda:0's context: nothing was launched there
  CUDA_OK(cudaGetLastError());
}

// set_kv and check_device_errors on a pool of cuda:1 refuse a stream of cuda:0 by name, before
// anything is written: the layer's keys stay as they were.
TEST_P(OtherDevice, PoolCallsRefuseAStreamOfAnotherDevice) {
#if CUDART_VERSION < 12080
  GTEST_SKIP() << "the stream's device is checked from CUDA 12.8 (cudaStreamGetDevice)";
#endif
  harness::PreparedCase& pc = made_->pc;
  const harness::LayerData& ld = pc.layers.front();
  KVPool& pool = *pc.kv_pool;
  const TensorView keys = pc.spec.mla ? static_cast<MLAKVPool&>(pool).kv_buffer(ld.layer.layer_id)
                                      : static_cast<MHAKVPool&>(pool).k_buffer(ld.layer.layer_id);
  const std::vector<uint8_t> before = test_support::to_host_bytes(keys);
  cudaStream_t on0 = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&on0, cudaStreamNonBlocking));  // cuda:0 is current
  // New keys that differ from the stored ones, so a write would show.
  Result<Buffer> other = Buffer::allocate(ld.k.device, ld.k.storage_bytes());
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  TensorView k = ld.k;
  k.data = other->data();
  STATUS_OK(fill_float(k, 3.0f));
  const Status st = pool.set_kv(ld.layer.layer_id, pc.batch.out_cache_loc, k, ld.v,
                                ld.layer.k_scale, ld.layer.v_scale, on0);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("set_kv stream"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("belongs to cuda:0, but the pool is on cuda:1"), std::string::npos)
      << st.to_string();
  const Status errors = pool.check_device_errors(on0);
  EXPECT_EQ(errors.code(), StatusCode::kInvalidArgument) << errors.to_string();
  EXPECT_NE(errors.message().find("check_device_errors stream"), std::string::npos)
      << errors.to_string();
  CUDA_OK(cudaStreamDestroy(on0));
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaSetDevice(0));
  EXPECT_TRUE(test_support::to_host_bytes(keys) == before) << "the refused set_kv wrote keys";
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
}

// A pool wrapped over caller memory whose views say cuda:0 while the memory is cuda:1's is refused
// by name (MHAKVPool::wrap asks CUDA where each view lies); the same views as cuda:1 are taken.
TEST(WrapOnTwoDevices, MemoryOfAnotherDeviceIsRefused) {
  const int n = device_count();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices; this machine has " << n;
  KVPoolConfig c = test_support::small_bf16_mha_pool_config(64, Device::cuda(0));
  const int64_t rows = c.size + c.page_size;
  const int64_t bytes = rows * c.num_kv_heads * c.head_dim * 2;
  Result<Buffer> k1 = Buffer::allocate(Device::cuda(1), bytes);
  Result<Buffer> v1 = Buffer::allocate(Device::cuda(1), bytes);
  ASSERT_TRUE(k1.is_ok() && v1.is_ok());
  std::vector<TensorView> k = {
      TensorView(k1->data(), DType::kBF16, Device::cuda(0), {rows, c.num_kv_heads, c.head_dim})};
  std::vector<TensorView> v = {
      TensorView(v1->data(), DType::kBF16, Device::cuda(0), {rows, c.num_kv_heads, c.head_dim})};
  const Status st = MHAKVPool::wrap(c, k, v).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("k[0]: address"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("is memory of cuda:1, but the pool is on cuda:0"), std::string::npos)
      << st.to_string();
  c.device = Device::cuda(1);
  k[0].device = v[0].device = Device::cuda(1);
  Result<std::unique_ptr<MHAKVPool>> ok = MHAKVPool::wrap(c, k, v);
  EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();
}

// cuda::PerDeviceValue runs its probe once on each device and keeps each device's own answer; a
// negative answer ("could not tell") is not kept.
TEST(PerDeviceValueOnTwoDevices, ProbesEachDeviceOnce) {
  const int n = device_count();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices; this machine has " << n;
  cuda::PerDeviceValue value;
  int calls = 0;
  const auto probe = [&] {
    ++calls;
    int device = -1;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    return 10 + device;
  };
  for (int round = 0; round < 3; ++round) {
    for (int device : {0, 1}) {
      CUDA_OK(cudaSetDevice(device));
      EXPECT_EQ(value.get(probe), 10 + device);
    }
  }
  EXPECT_EQ(calls, 2);
  cuda::PerDeviceValue unsure;
  int tries = 0;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(unsure.get([&] { return ++tries, -1; }), -1);
  EXPECT_EQ(tries, 3);
  EXPECT_EQ(unsure.get([] { return 2; }), 2);
  EXPECT_EQ(unsure.get([] { return 5; }), 2);
  CUDA_OK(cudaSetDevice(0));
}

// A scope's end gives the caller its device back only when that device has a context: restoring
// a device that was current by default alone would create one (hundreds of MB on a GPU this
// process does not use). Meaningful in a fresh process (ctest runs each test in its own).
TEST(DeviceScopeRestore, CreatesNoContextOnAnUntouchedDevice) {
  const int n = device_count();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices; this machine has " << n;
  if (cuda_has_primary_context(0)) GTEST_SKIP() << "cuda:0 already has a context in this process";
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  ASSERT_EQ(current, 0);
  Result<Buffer> buf = Buffer::allocate(Device::cuda(1), 4096);
  ASSERT_TRUE(buf.is_ok()) << buf.status().to_string();
  EXPECT_FALSE(cuda_has_primary_context(0)) << "the scope's end created a context on cuda:0";
  EXPECT_TRUE(cuda_has_primary_context(1));
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_EQ(current, 1) << "cuda:1 stays current when cuda:0 has no context";
}

const std::vector<DeviceCase> kMhaCases = {{"decode", ForwardMode::kDecode, false},
                                           {"extend", ForwardMode::kExtend, false},
                                           {"verify", ForwardMode::kTargetVerify, false}};
const std::vector<DeviceCase> kMlaCases = {{"mla_decode", ForwardMode::kDecode, true},
                                           {"mla_verify", ForwardMode::kTargetVerify, true}};

INSTANTIATE_TEST_SUITE_P(Mha, OtherDevice,
                         ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3",
                                                              "torch_native"),
                                            ::testing::ValuesIn(kMhaCases)),
                         test_support::backend_case_name<DeviceCase>);
INSTANTIATE_TEST_SUITE_P(Mla, OtherDevice,
                         ::testing::Combine(::testing::Values("triton", "flashinfer", "flashmla"),
                                            ::testing::ValuesIn(kMlaCases)),
                         test_support::backend_case_name<DeviceCase>);

}  // namespace
}  // namespace attnkit
