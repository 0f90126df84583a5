// CUDA graphs of the triton backend: a multi-layer decode step is captured for several batch
// sizes, replayed with new lengths and page tables (and padded rows: seq_len = the fill value,
// request row 0, the dummy slot 0), and every replay must match an eager run of the same batch
// bit for bit. Target-verify steps are checked the same way.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/registry.h"
#include "backends/triton/triton_backend.h"
#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

constexpr int kNumLayers = 3;
constexpr int kMaxBs = 8;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Device buffer + typed view helpers for the static graph inputs.
struct DeviceTensor {
  Buffer buffer;
  TensorView view;
};

DeviceTensor make_device(DType dtype, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  Result<Buffer> b = Buffer::allocate(Device::cuda(0), dtype_storage_bytes(dtype, n));
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  DeviceTensor t;
  t.buffer = std::move(b).value();
  t.view = t.buffer.view(dtype, shape);
  return t;
}

template <typename T>
void upload(const TensorView& dst, const std::vector<T>& host) {
  ASSERT_EQ(cudaMemcpy(dst.data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
}

std::vector<uint8_t> download_bytes(const TensorView& t, int64_t rows) {
  const int64_t row_bytes = t.storage_bytes() / t.size(0);
  std::vector<uint8_t> host(static_cast<size_t>(rows * row_bytes));
  EXPECT_EQ(cudaMemcpy(host.data(), t.data, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// One decode step's request set: which prepared request each batch row uses and at which length.
struct StepConfig {
  std::vector<int32_t> rows;       // req_to_token rows
  std::vector<int32_t> seq_lens;   // tokens including the new one
  std::vector<int64_t> out_cache;  // slot of the new token
};

class TritonCudaGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    // Long, uneven histories so that split-KV is exercised (several splits per request).
    spec_ = harness::make_uniform_case("graph_decode", ForwardMode::kDecode, kMaxBs, 1, 1, 8, 2,
                                       128, 16, DType::kBF16, DType::kBF16);
    spec_.prefix_lens = {1500, 700, 2100, 33, 1, 900, 1200, 3000};
    spec_.new_lens.assign(kMaxBs, 1);
    spec_.sliding_window = -1;
    spec_.seed = 7;
    harness::PrepareOptions opt;
    opt.num_layers = kNumLayers;
    opt.request_lse = false;
    opt.snapshot_pool = false;
    Result<harness::PreparedCase> pc = harness::prepare_case(spec_, Device::cuda(0), opt);
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    prepared_ = std::make_unique<harness::PreparedCase>(std::move(pc).value());
    const BackendDescriptor* d = builtin_registry().find("triton");
    ASSERT_NE(d, nullptr);
    ASSERT_TRUE(d->cuda_graph);
    BackendContext ctx = prepared_->context();
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ctx.stream = stream_;
    ctx.max_batch_size = kMaxBs;
    Result<std::unique_ptr<AttentionBackend>> b = d->create(ctx);
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    backend_ = std::move(b).value();

    const int hq = spec_.num_q_heads, hkv = spec_.num_kv_heads, dim = spec_.head_dim;
    for (int l = 0; l < kNumLayers; ++l) {
      q_.push_back(make_device(DType::kBF16, {kMaxBs, hq, dim}));
      k_.push_back(make_device(DType::kBF16, {kMaxBs, hkv, dim}));
      v_.push_back(make_device(DType::kBF16, {kMaxBs, hkv, dim}));
      out_graph_.push_back(make_device(DType::kBF16, {kMaxBs, hq, dim}));
      out_eager_.push_back(make_device(DType::kBF16, {kMaxBs, hq, dim}));
      // Random activations (copied from the prepared layer, which holds random bf16 values).
      CUDA_OK(cudaMemcpy(q_[l].view.data, prepared_->layers[l].q.data, q_[l].view.storage_bytes(),
                         cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaMemcpy(k_[l].view.data, prepared_->layers[l].k.data, k_[l].view.storage_bytes(),
                         cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaMemcpy(v_[l].view.data, prepared_->layers[l].v.data, v_[l].view.storage_bytes(),
                         cudaMemcpyDeviceToDevice));
    }
    req_pool_indices_ = make_device(DType::kI32, {kMaxBs});
    seq_lens_ = make_device(DType::kI32, {kMaxBs});
    out_cache_loc_ = make_device(DType::kI64, {kMaxBs});
    positions_ = make_device(DType::kI64, {kMaxBs});
    STATUS_OK(backend_->init_cuda_graph_state(kMaxBs, kMaxBs));
  }

  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A random step over `bs` distinct prepared requests with random lengths <= their history.
  StepConfig random_step(int bs, std::mt19937& rng) {
    std::vector<int> order(kMaxBs);
    for (int i = 0; i < kMaxBs; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    StepConfig c;
    for (int i = 0; i < bs; ++i) {
      const int r = order[i];
      const int full = prepared_->kv_lens[r];
      std::uniform_int_distribution<int> len(1, full);
      const int n = len(rng);
      const int32_t row = prepared_->rows[r];
      c.rows.push_back(row);
      c.seq_lens.push_back(n);
      c.out_cache.push_back(prepared_->req_to_token->host_row(row)[n - 1]);
    }
    return c;
  }

  // The ForwardBatch over the static buffers for `bs` rows (after fill_static).
  ForwardBatch batch_for(const StepConfig& c, int bs) {
    ForwardBatch b;
    b.mode = ForwardMode::kDecode;
    b.batch_size = bs;
    b.num_tokens = bs;
    b.req_pool_indices = req_pool_indices_.view.slice0(0, bs);
    b.seq_lens = seq_lens_.view.slice0(0, bs);
    b.out_cache_loc = out_cache_loc_.view.slice0(0, bs);
    b.positions = positions_.view.slice0(0, bs);
    b.req_pool_indices_host.assign(c.rows.begin(), c.rows.end());
    b.seq_lens_host.assign(c.seq_lens.begin(), c.seq_lens.end());
    b.req_pool_indices_host.resize(bs, 0);
    b.seq_lens_host.resize(bs, backend_->cuda_graph_seq_len_fill_value());
    b.seq_lens_sum = 0;
    for (int32_t n : b.seq_lens_host) b.seq_lens_sum += n;
    b.req_to_token_pool = prepared_->req_to_token.get();
    b.kv_pool = prepared_->kv_pool.get();
    b.stream = stream_;
    return b;
  }

  // Writes the step into the static buffers; rows [real, padded) become padding rows.
  void fill_static(const StepConfig& c, int padded) {
    std::vector<int32_t> rows(c.rows), lens(c.seq_lens);
    std::vector<int64_t> slots(c.out_cache), pos;
    rows.resize(padded, 0);
    lens.resize(padded, backend_->cuda_graph_seq_len_fill_value());
    slots.resize(padded, 0);
    for (int32_t n : lens) pos.push_back(n - 1);
    upload(req_pool_indices_.view, rows);
    upload(seq_lens_.view, lens);
    upload(out_cache_loc_.view, slots);
    upload(positions_.view, pos);
  }

  void poison(std::vector<DeviceTensor>& outs) {
    for (auto& o : outs) STATUS_OK(fill_float(o.view, kNaN));
  }

  void run_layers(const ForwardBatch& b, std::vector<DeviceTensor>& outs, int bs) {
    for (int l = 0; l < kNumLayers; ++l) {
      STATUS_OK(backend_->forward_decode(q_[l].view.slice0(0, bs), k_[l].view.slice0(0, bs),
                                         v_[l].view.slice0(0, bs), outs[l].view.slice0(0, bs),
                                         prepared_->layers[l].layer, b, /*save_kv=*/true));
    }
  }

  harness::CaseSpec spec_;
  std::unique_ptr<harness::PreparedCase> prepared_;
  std::unique_ptr<AttentionBackend> backend_;
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceTensor> q_, k_, v_, out_graph_, out_eager_;
  DeviceTensor req_pool_indices_, seq_lens_, out_cache_loc_, positions_;
};

TEST_F(TritonCudaGraphTest, DecodeReplayIsBitIdenticalToEager) {
  std::mt19937 rng(2024);
  for (int captured_bs : {1, 3, 8}) {
    SCOPED_TRACE("captured batch size " + std::to_string(captured_bs));
    // Capture with one configuration.
    const StepConfig first = random_step(captured_bs, rng);
    fill_static(first, captured_bs);
    const ForwardBatch cap_batch = batch_for(first, captured_bs);
    STATUS_OK(backend_->init_forward_metadata_capture_cuda_graph(
        captured_bs, captured_bs, cap_batch.req_pool_indices, cap_batch.seq_lens, TensorView(),
        ForwardMode::kDecode, nullptr));
    CUDA_OK(cudaStreamSynchronize(stream_));
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    run_layers(cap_batch, out_graph_, captured_bs);
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    // Replays: new lengths and request rows (page tables); a smaller real batch is padded.
    for (int replay = 0; replay < 3; ++replay) {
      const int real_bs = replay == 2 && captured_bs > 1 ? captured_bs - 1 : captured_bs;
      SCOPED_TRACE("replay " + std::to_string(replay) + " real bs " + std::to_string(real_bs));
      const StepConfig step = random_step(real_bs, rng);

      // Eager run of exactly the real batch.
      fill_static(step, real_bs);
      poison(out_eager_);
      const ForwardBatch eager = batch_for(step, real_bs);
      STATUS_OK(backend_->init_forward_metadata(eager));
      run_layers(eager, out_eager_, real_bs);
      CUDA_OK(cudaStreamSynchronize(stream_));

      // Graph replay of the padded batch.
      fill_static(step, captured_bs);
      poison(out_graph_);
      const ForwardBatch padded = batch_for(step, captured_bs);
      std::vector<int32_t> lens_host = padded.seq_lens_host;
      STATUS_OK(backend_->init_forward_metadata_replay_cuda_graph(
          captured_bs, padded.req_pool_indices, padded.seq_lens, padded.seq_lens_sum, TensorView(),
          ForwardMode::kDecode, nullptr, lens_host.data()));
      CUDA_OK(cudaGraphLaunch(exec, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));

      for (int l = 0; l < kNumLayers; ++l) {
        const std::vector<uint8_t> g = download_bytes(out_graph_[l].view, real_bs);
        const std::vector<uint8_t> e = download_bytes(out_eager_[l].view, real_bs);
        ASSERT_EQ(g.size(), e.size());
        EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size()), 0) << "layer " << l;
        // Every real output was written (no NaN left from the poison).
        const auto* bf = reinterpret_cast<const uint16_t*>(e.data());
        for (size_t i = 0; i < e.size() / 2; ++i) {
          ASSERT_FALSE(std::isnan(bf16_bits_to_float(bf[i]))) << "layer " << l << " elem " << i;
        }
      }
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
}

TEST_F(TritonCudaGraphTest, ReplayWithoutStateIsAnError) {
  const BackendDescriptor* d = builtin_registry().find("triton");
  BackendContext ctx = prepared_->context();
  Result<std::unique_ptr<AttentionBackend>> b = d->create(ctx);
  ASSERT_TRUE(b.is_ok());
  const Status s = b.value()->init_forward_metadata_replay_cuda_graph(
      1, req_pool_indices_.view.slice0(0, 1), seq_lens_.view.slice0(0, 1), 1, TensorView(),
      ForwardMode::kDecode, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  const Status big = backend_->init_forward_metadata_capture_cuda_graph(
      kMaxBs + 1, kMaxBs + 1, req_pool_indices_.view, seq_lens_.view, TensorView(),
      ForwardMode::kDecode, nullptr);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument) << big.to_string();
}

// A graph's decode grid holds the split extent that fills the GPU at its batch size (a few splits
// at 8 requests x 8 kv heads), so a long request among short ones has more splits than CTAs per
// (request, head block): those CTAs loop over splits. The replay must still equal the eager run
// (whose grid holds every split) bit for bit, and both the fp64 reference.
TEST(TritonCudaGraphSplits, LongRequestAmongShortLoopsOverSplits) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    harness::CaseSpec spec =
        harness::make_uniform_case(std::string("graph_split_loop_") + dtype_name(kv),
                                   ForwardMode::kDecode, 8, 1, 1, 32, 8, 128, 16, DType::kBF16, kv);
    spec.prefix_lens = {16000, 90, 300, 7, 511, 64, 200, 1};
    SCOPED_TRACE(spec.describe());
    Result<harness::PreparedCase> prepared = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
    test_support::expect_graph_replay_matches_eager(*prepared, create_triton_backend,
                                                    ForwardMode::kDecode, 2);
  }
}

}  // namespace
}  // namespace attnkit
