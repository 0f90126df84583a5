// The device slot guard of CUDA KV pools (set_kv_cuda.cu): with ATTNKIT_CHECK_INDICES off, a
// set_kv whose loc holds a slot outside [0, rows) (past the end, or negative) must write nothing
// outside the pool and nothing for that token, write the valid tokens of the same call exactly
// as the CPU pool does, and KVPool::check_device_errors must then report the layer, token, slot and
// the pool's rows once (a second call is ok). The same through a replayed CUDA graph. A valid write
// (page-0 dummy slots included) must never trip the guard. With ATTNKIT_CHECK_INDICES=1 the
// synchronous host check still rejects the call before anything is written.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"
#include "support/gpu_test_helpers.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

constexpr int kLayers = 2;
constexpr int kLayer = 1;  // the layer every test writes (layer 0 must stay untouched)
constexpr int kPage = 16;
constexpr int64_t kSize = 256;
constexpr int64_t kRows = kSize + kPage;  // 272
constexpr uint8_t kPoisonByte = 0xFF;     // bf16 / fp8 NaN; fp4: -6 codes with NaN block scales

using test_support::has_cuda;
using test_support::to_host_bytes;
using test_support::upload_bytes;

struct GuardCase {
  const char* name;
  bool mla;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<GuardCase>& info) { return info.param.name; }

// One pool buffer (k, v, scales or MLA kv) of one layer.
struct PoolBuffer {
  int layer;
  std::string what;
  TensorView view;
};

std::vector<PoolBuffer> buffers_of(const KVPool& pool) {
  std::vector<PoolBuffer> out;
  auto add = [&](int l, const char* what, const TensorView& v) {
    if (v.defined()) out.push_back({l, what, v});
  };
  for (int l = 0; l < kLayers; ++l) {
    if (const auto* mha = dynamic_cast<const MHAKVPool*>(&pool)) {
      add(l, "k", mha->k_buffer(l));
      add(l, "v", mha->v_buffer(l));
      add(l, "k scales", mha->k_scale_buffer(l));
      add(l, "v scales", mha->v_scale_buffer(l));
    } else {
      const auto& mla = dynamic_cast<const MLAKVPool&>(pool);
      add(l, "kv", mla.kv_buffer(l));
      add(l, "kv scales", mla.scale_buffer(l));
    }
  }
  return out;
}

class KVGuardTest : public ::testing::TestWithParam<GuardCase> {
 protected:
  static constexpr int kTokens = 5;

  void SetUp() override {
    if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
    const GuardCase c = GetParam();
    KVPoolConfig cfg;
    cfg.num_layers = kLayers;
    cfg.size = kSize;
    cfg.page_size = kPage;
    cfg.dtype = c.dtype;
    if (c.mla) {
      cfg.kv_lora_rank = 64;
      cfg.qk_rope_head_dim = 32;
      k_heads_ = 1;
      k_dim_ = 96;
      v_dim_ = 0;
    } else {
      cfg.num_kv_heads = 2;
      cfg.head_dim = 64;
      cfg.v_head_dim = 32;
      k_heads_ = 2;
      k_dim_ = 64;
      v_dim_ = 32;
    }
    cfg.device = Device::cpu();
    cpu_ = create(cfg);
    cfg.device = Device::cuda(0);
    gpu_ = create(cfg);
    ASSERT_TRUE(cpu_ && gpu_);
    // NaN-poison the whole GPU pool so that any stray or missing write shows.
    for (const PoolBuffer& b : buffers_of(*gpu_)) {
      CUDA_OK(cudaMemset(b.view.data, kPoisonByte, static_cast<size_t>(b.view.storage_bytes())));
    }
    CUDA_OK(cudaDeviceSynchronize());
    STATUS_OK(gpu_->check_device_errors());  // a fresh pool has nothing recorded
    for (const PoolBuffer& b : buffers_of(*gpu_)) before_.push_back(to_host_bytes(b.view));

    // Random values over a wide range (fp8 / fp4 saturation included).
    std::mt19937 rng(static_cast<uint32_t>(c.dtype) * 7 + (c.mla ? 1 : 0));
    std::uniform_real_distribution<float> dist(-3.f, 3.f);
    k_host_.resize(static_cast<size_t>(kTokens * k_heads_ * k_dim_));
    v_host_.resize(static_cast<size_t>(kTokens * k_heads_ * std::max<int64_t>(v_dim_, 1)));
    for (float& x : k_host_) x = dist(rng) * (rng() % 11 == 0 ? 300.f : 1.f);
    for (float& x : v_host_) x = dist(rng);
    k_dev_ = upload_bytes(k_host_.data(), static_cast<int64_t>(k_host_.size() * sizeof(float)));
    v_dev_ = upload_bytes(v_host_.data(), static_cast<int64_t>(v_host_.size() * sizeof(float)));
  }

  static std::unique_ptr<KVPool> create(const KVPoolConfig& cfg) {
    if (cfg.kv_lora_rank > 0) {
      auto p = MLAKVPool::create(cfg);
      EXPECT_TRUE(p.is_ok()) << p.status().to_string();
      return p.is_ok() ? std::unique_ptr<KVPool>(std::move(p).value()) : nullptr;
    }
    auto p = MHAKVPool::create(cfg);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return p.is_ok() ? std::unique_ptr<KVPool>(std::move(p).value()) : nullptr;
  }

  TensorView k_view(Device d, void* data) const {
    return TensorView(data, DType::kF32, d, {kTokens, k_heads_, k_dim_});
  }
  TensorView v_view(Device d, void* data) const {
    if (v_dim_ == 0) return TensorView();
    return TensorView(data, DType::kF32, d, {kTokens, k_heads_, v_dim_});
  }

  Status gpu_set_kv(const Buffer& loc, StreamHandle stream = nullptr) {
    return gpu_->set_kv(kLayer, loc.view(DType::kI64, {kTokens}),
                        k_view(Device::cuda(0), k_dev_.data()),
                        v_view(Device::cuda(0), v_dev_.data()), 0.5f, 0.25f, stream);
  }

  // The bytes the CPU pool writes for the same call, with the slots it rejects (bad ones and
  // page-0 dummies) replaced by spare rows not in `slots`; returns the CPU slots. Only the rows of
  // valid GPU slots are compared.
  std::vector<int64_t> write_cpu(const std::vector<int64_t>& slots) {
    std::vector<int64_t> cpu_slots = slots;
    int64_t spare = kRows - 1;
    for (int64_t& s : cpu_slots) {
      if (s >= kPage && s < kRows) continue;
      while (std::find(slots.begin(), slots.end(), spare) != slots.end()) --spare;
      s = spare--;
    }
    const TensorView loc(cpu_slots.data(), DType::kI64, Device::cpu(), {kTokens});
    const Status st = cpu_->set_kv(kLayer, loc, k_view(Device::cpu(), k_host_.data()),
                                   v_view(Device::cpu(), v_host_.data()), 0.5f, 0.25f, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return cpu_slots;
  }

  // Every row of every buffer equals `before_` except the rows of `written` in layer kLayer,
  // which equal the CPU pool's bytes.
  void expect_pool(const std::vector<int64_t>& written, const std::string& when) {
    const std::vector<PoolBuffer> gpu_bufs = buffers_of(*gpu_);
    const std::vector<PoolBuffer> cpu_bufs = buffers_of(*cpu_);
    ASSERT_EQ(gpu_bufs.size(), before_.size());
    for (size_t i = 0; i < gpu_bufs.size(); ++i) {
      const PoolBuffer& b = gpu_bufs[i];
      const std::vector<uint8_t> after = to_host_bytes(b.view);
      const auto* cpu_bytes = static_cast<const uint8_t*>(cpu_bufs[i].view.data);
      const int64_t row_bytes = b.view.storage_bytes() / kRows;
      int64_t bad_rows = 0, first_bad = -1;
      for (int64_t r = 0; r < kRows; ++r) {
        const bool is_written =
            b.layer == kLayer && std::find(written.begin(), written.end(), r) != written.end();
        const uint8_t* want =
            is_written ? cpu_bytes + r * row_bytes : before_[i].data() + r * row_bytes;
        if (std::memcmp(after.data() + r * row_bytes, want, static_cast<size_t>(row_bytes)) != 0) {
          if (bad_rows++ == 0) first_bad = r;
        }
      }
      EXPECT_EQ(bad_rows, 0) << when << ": layer " << b.layer << " " << b.what << ": " << bad_rows
                             << " rows differ from the expected bytes, first row " << first_bad;
    }
  }

  void expect_guard_error(const std::vector<std::string>& one_of, const std::string& when) {
    const Status st = gpu_->check_device_errors();
    ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << when << ": " << st.to_string();
    EXPECT_NE(st.message().find("layer " + std::to_string(kLayer)), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("rows [0, " + std::to_string(kRows) + ")"), std::string::npos)
        << st.message();
    bool named = false;
    for (const std::string& needle : one_of)
      named |= st.message().find(needle) != std::string::npos;
    EXPECT_TRUE(named) << when << ": " << st.message();
    const Status again = gpu_->check_device_errors();
    EXPECT_TRUE(again.is_ok()) << when << " (second check): " << again.to_string();
  }

  std::unique_ptr<KVPool> cpu_, gpu_;
  int64_t k_heads_ = 0, k_dim_ = 0, v_dim_ = 0;
  std::vector<std::vector<uint8_t>> before_;
  std::vector<float> k_host_, v_host_;
  Buffer k_dev_, v_dev_;
};

TEST_P(KVGuardTest, OutOfRangeSlotsAreSkippedAndReported) {
  test_support::ScopedEnv knob("ATTNKIT_CHECK_INDICES", "0");
  const std::vector<int64_t> slots{20, kRows, 33, -1, 47};
  Buffer loc = upload_bytes(slots.data(), kTokens * static_cast<int64_t>(sizeof(int64_t)));
  STATUS_OK(gpu_set_kv(loc));  // asynchronous: the bad slots are reported later
  CUDA_OK(cudaDeviceSynchronize());
  write_cpu(slots);
  expect_pool({20, 33, 47}, "past-the-end and negative slots");
  expect_guard_error({"loc[1] = " + std::to_string(kRows), "loc[3] = -1"}, "eager");
}

TEST_P(KVGuardTest, NegativeSlotAloneIsReported) {
  test_support::ScopedEnv knob("ATTNKIT_CHECK_INDICES", "0");
  const std::vector<int64_t> slots{20, 21, 22, 23, -1000000000000LL};
  Buffer loc = upload_bytes(slots.data(), kTokens * static_cast<int64_t>(sizeof(int64_t)));
  STATUS_OK(gpu_set_kv(loc));
  CUDA_OK(cudaDeviceSynchronize());
  write_cpu(slots);
  expect_pool({20, 21, 22, 23}, "negative slot");
  expect_guard_error({"loc[4] = -1000000000000"}, "negative");
}

TEST_P(KVGuardTest, ValidWriteDoesNotTripTheGuard) {
  test_support::ScopedEnv knob("ATTNKIT_CHECK_INDICES", "0");
  // kRows - 1 is the last row; slot 3 is a page-0 dummy slot (legal on CUDA pools).
  const std::vector<int64_t> slots{kRows - 1, 16, 3, 100, 200};
  Buffer loc = upload_bytes(slots.data(), kTokens * static_cast<int64_t>(sizeof(int64_t)));
  STATUS_OK(gpu_set_kv(loc));
  const Status st = gpu_->check_device_errors();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  // The CPU pool rejects page 0, so token 2's bytes come from a spare CPU row: compare the GPU
  // dummy row with that row here, then the rest of the pool.
  const std::vector<int64_t> cpu_slots = write_cpu(slots);
  const std::vector<PoolBuffer> bufs = buffers_of(*gpu_);
  const std::vector<PoolBuffer> cpu_bufs = buffers_of(*cpu_);
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (bufs[i].layer != kLayer) continue;
    const std::vector<uint8_t> after = to_host_bytes(bufs[i].view);
    const int64_t row_bytes = bufs[i].view.storage_bytes() / kRows;
    const auto* cpu_row =
        static_cast<const uint8_t*>(cpu_bufs[i].view.data) + cpu_slots[2] * row_bytes;
    EXPECT_EQ(std::memcmp(after.data() + 3 * row_bytes, cpu_row, static_cast<size_t>(row_bytes)), 0)
        << bufs[i].what << ": the page-0 dummy row does not hold token 2";
    std::memcpy(before_[i].data() + 3 * row_bytes, after.data() + 3 * row_bytes,
                static_cast<size_t>(row_bytes));
  }
  expect_pool({kRows - 1, 16, 100, 200}, "valid write");
}

TEST_P(KVGuardTest, CapturedGraphReplayIsGuarded) {
  test_support::ScopedEnv knob("ATTNKIT_CHECK_INDICES", "0");
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<int64_t> slots{40, 41, 42, 43, 44};
  Buffer loc = upload_bytes(slots.data(), kTokens * static_cast<int64_t>(sizeof(int64_t)));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status captured = gpu_set_kv(loc, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  STATUS_OK(captured);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  // Replay 1: bad slots written into the captured loc buffer.
  slots = {20, kRows + 7, 33, -2, 47};
  CUDA_OK(cudaMemcpyAsync(loc.data(), slots.data(), kTokens * sizeof(int64_t),
                          cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  write_cpu(slots);
  expect_pool({20, 33, 47}, "graph replay with bad slots");
  {
    const Status st = gpu_->check_device_errors(stream);
    ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_TRUE(st.message().find("loc[1] = " + std::to_string(kRows + 7)) != std::string::npos ||
                st.message().find("loc[3] = -2") != std::string::npos)
        << st.message();
    STATUS_OK(gpu_->check_device_errors(stream));
  }

  // Replay 2: valid slots; the guard stays quiet and the rows are written.
  slots = {60, 61, 62, 63, 64};
  CUDA_OK(cudaMemcpyAsync(loc.data(), slots.data(), kTokens * sizeof(int64_t),
                          cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  STATUS_OK(gpu_->check_device_errors(stream));
  write_cpu(slots);
  expect_pool({20, 33, 47, 60, 61, 62, 63, 64}, "graph replay with valid slots");

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_P(KVGuardTest, CheckIndicesKnobStillRejectsSynchronously) {
  test_support::ScopedEnv knob("ATTNKIT_CHECK_INDICES", "1");
  const std::vector<int64_t> slots{20, 21, kRows + 1, 23, 24};
  Buffer loc = upload_bytes(slots.data(), kTokens * static_cast<int64_t>(sizeof(int64_t)));
  const Status st = gpu_set_kv(loc);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("loc[2] = " + std::to_string(kRows + 1)), std::string::npos)
      << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  expect_pool({}, "rejected by ATTNKIT_CHECK_INDICES=1");
  STATUS_OK(gpu_->check_device_errors());  // nothing was launched, nothing recorded
}

INSTANTIATE_TEST_SUITE_P(Pools, KVGuardTest,
                         ::testing::Values(GuardCase{"mha_bf16", false, DType::kBF16},
                                           GuardCase{"mha_fp8_e4m3", false, DType::kFP8E4M3},
                                           GuardCase{"mha_fp4_e2m1", false, DType::kFP4E2M1},
                                           GuardCase{"mla_bf16", true, DType::kBF16},
                                           GuardCase{"mla_fp4_e2m1", true, DType::kFP4E2M1}),
                         case_name);

}  // namespace
}  // namespace attnkit
