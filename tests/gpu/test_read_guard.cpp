// The attention kernels' slot guard (kv/kv_guard_record.h, cuda/common/slot_guard.cuh): a
// req_to_token entry outside the KV pool (past its rows, negative, or a page entry whose row
// overflows 32 bits) must not make a CUDA backend read outside the pool's buffers. The kernel reads
// row 0 (the dummy page) instead and records the first bad row in the pool's device error word, so
// KVPool::check_device_errors names the layer and the request; the other requests' outputs are
// bit-identical to a clean forward's, the CUDA context stays usable, and once the entry is mended
// the same forward is clean again.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attnkit/registry.h"
#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

struct GuardCase {
  std::string name;
  ForwardMode mode;
  int page_size;
  bool mla;
};

// Two requests; request 1's cached prefix holds the bad entry (key kBadKey, a page start for every
// page size used here, so a paged kernel reads it as a page-table entry). The out-of-pool test also
// tries kLateBadKey: the MLA wgmma kernel's consumers refill tiles from the third on by TMA, with
// their own read of the page table.
constexpr int kBadKey = 64;
constexpr int kLateBadKey = 128;

CaseSpec guard_spec(const GuardCase& gc) {
  const bool decode = gc.mode == ForwardMode::kDecode;
  const bool verify = gc.mode == ForwardMode::kTargetVerify;
  CaseSpec c = test_support::plan_check_case("read_guard_" + gc.name, gc.mode, {300, 200},
                                             decode   ? std::vector<int>{1, 1}
                                             : verify ? std::vector<int>{}
                                                      : std::vector<int>{9, 5},
                                             gc.mla, 11);
  c.page_size = gc.page_size;
  return c;
}

// The bytes of the output rows of request 0 (tokens [0, rows0) of out [T, Hq, dv]).
std::vector<uint8_t> request0_rows(const std::vector<uint8_t>& out, int64_t tokens, int64_t rows0) {
  const size_t per_token = out.size() / static_cast<size_t>(tokens);
  return {out.begin(), out.begin() + static_cast<std::ptrdiff_t>(per_token * rows0)};
}

class ReadGuard : public ::testing::TestWithParam<std::tuple<std::string, GuardCase>> {
 protected:
  void SetUp() override {
    if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
    const auto& [backend_name, gc] = GetParam();
    std::string skip;
    Result<test_support::CaseOnBackend> made =
        test_support::case_on_backend(backend_name, guard_spec(gc), Device::cuda(0), &skip);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    made_ = std::move(made).value();
  }

  // One planned forward of layer 0 (the pool already holds every key); returns out's bytes.
  std::vector<uint8_t> forward_layer0(Status* st) {
    harness::PreparedCase& pc = made_->pc;
    const harness::LayerData& ld = pc.layers[0];
    *st = made_->backend->init_forward_metadata(pc.batch);
    if (st->is_ok()) {
      *st = made_->backend->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                                    /*save_kv=*/false, ld.lse);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the CUDA context must stay usable";
    return test_support::to_host_bytes(ld.out);
  }

  // Writes `value` into request r's req_to_token entry at key position `key` (device table).
  void set_entry(int r, int key, int32_t value) {
    harness::PreparedCase& pc = made_->pc;
    const TensorView table = pc.req_to_token->table();
    int32_t* entry =
        table.data_as<int32_t>() + pc.rows[static_cast<size_t>(r)] * table.stride(0) + key;
    ASSERT_EQ(cudaMemcpy(entry, &value, sizeof(value), cudaMemcpyHostToDevice), cudaSuccess);
  }
  int32_t get_entry(int r, int key) {
    harness::PreparedCase& pc = made_->pc;
    const TensorView table = pc.req_to_token->table();
    const int32_t* entry =
        table.data_as<const int32_t>() + pc.rows[static_cast<size_t>(r)] * table.stride(0) + key;
    int32_t value = 0;
    EXPECT_EQ(cudaMemcpy(&value, entry, sizeof(value), cudaMemcpyDeviceToHost), cudaSuccess);
    return value;
  }

  std::optional<test_support::CaseOnBackend> made_;
};

TEST_P(ReadGuard, OutOfPoolEntryIsReadAsRowZeroAndReported) {
  harness::PreparedCase& pc = made_->pc;
  KVPool& pool = *pc.kv_pool;
  const int64_t tokens = pc.num_tokens;
  // Request 0's tokens come first in out.
  const int64_t rows0 = pc.batch.extend_seq_lens_host.empty() ? tokens / pc.batch.batch_size
                                                              : pc.batch.extend_seq_lens_host[0];
  ASSERT_GT(rows0, 0);
  STATUS_OK(pool.check_device_errors());

  Status st;
  const std::vector<uint8_t> clean = forward_layer0(&st);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_TRUE(pool.check_device_errors().is_ok()) << "a clean forward recorded a bad row";
  const std::vector<uint8_t> pool_before =
      test_support::to_host_bytes(pool.is_mla() ? dynamic_cast<MLAKVPool&>(pool).kv_buffer(0)
                                                : dynamic_cast<MHAKVPool&>(pool).k_buffer(0));

  const int64_t rows = pool.rows();
  // Past the pool, negative, a page entry whose row + in-page offset wraps int32, and INT32_MIN.
  for (const int key : {kBadKey, kLateBadKey}) {
    const int32_t good = get_entry(1, key);
    for (const int64_t bad : {rows + 5 * pc.spec.page_size, int64_t{-3} * pc.spec.page_size,
                              int64_t{std::numeric_limits<int32_t>::max()} - 2,
                              int64_t{std::numeric_limits<int32_t>::min()}}) {
      SCOPED_TRACE("bad entry " + std::to_string(bad) + " at key " + std::to_string(key));
      set_entry(1, key, static_cast<int32_t>(bad));
      const std::vector<uint8_t> out = forward_layer0(&st);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      const Status reported = pool.check_device_errors();
      EXPECT_EQ(reported.code(), StatusCode::kInvalidArgument) << reported.to_string();
      EXPECT_NE(reported.message().find("attention kernel (device slot guard): layer " +
                                        std::to_string(pc.layers[0].layer.layer_id) +
                                        ", request 1, key "),
                std::string::npos)
          << reported.to_string();
      EXPECT_TRUE(request0_rows(out, tokens, rows0) == request0_rows(clean, tokens, rows0))
          << "request 0's output changed";
      EXPECT_TRUE(pool.check_device_errors().is_ok()) << "the record was not cleared";
    }
    set_entry(1, key, good);
  }

  const std::vector<uint8_t> again = forward_layer0(&st);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(pool.check_device_errors().is_ok());
  EXPECT_TRUE(again == clean) << "the mended forward differs from the clean one";
  EXPECT_TRUE(test_support::to_host_bytes(
                  pool.is_mla() ? dynamic_cast<MLAKVPool&>(pool).kv_buffer(0)
                                : dynamic_cast<MHAKVPool&>(pool).k_buffer(0)) == pool_before)
      << "the pool was written";
}

// The same inside a captured CUDA graph: the kernels' guard pointer is the pool's fixed error
// word, so a bad entry met by a replay is recorded and reported too.
class ReadGuardGraph : public ReadGuard {};

TEST_P(ReadGuardGraph, ReplayReportsTheBadRow) {
  const auto& [backend_name, gc] = GetParam();
  harness::PreparedCase& pc = made_->pc;
  KVPool& pool = *pc.kv_pool;
  const harness::LayerData& ld = pc.layers[0];
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  BackendContext ctx = pc.context();
  ctx.stream = stream;
  pc.batch.stream = stream;
  const BackendDescriptor* descriptor = builtin_registry().find(backend_name);
  ASSERT_NE(descriptor, nullptr);
  Result<std::unique_ptr<AttentionBackend>> made = descriptor->create(ctx);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  AttentionBackend& backend = **made;

  const ForwardBatch& b = pc.batch;
  const int bs = b.batch_size;
  const SpecInfo* spec = gc.mode == ForwardMode::kTargetVerify ? &b.spec : nullptr;
  STATUS_OK(backend.init_cuda_graph_state(bs, b.num_tokens));
  STATUS_OK(backend.init_forward_metadata_capture_cuda_graph(
      bs, b.num_tokens, b.req_pool_indices, b.seq_lens, TensorView(), gc.mode, spec));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status fwd = backend.forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, b,
                                     /*save_kv=*/false, ld.lse);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(fwd.is_ok()) << fwd.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const auto replay = [&]() {
    EXPECT_TRUE(backend
                    .init_forward_metadata_replay_cuda_graph(bs, b.req_pool_indices, b.seq_lens,
                                                             b.seq_lens_sum, TensorView(), gc.mode,
                                                             spec, b.seq_lens_host.data())
                    .is_ok());
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "the CUDA context must stay usable";
    return test_support::to_host_bytes(ld.out);
  };
  const int64_t rows0 = b.num_tokens / bs;
  const std::vector<uint8_t> clean = replay();
  EXPECT_TRUE(pool.check_device_errors(stream).is_ok());

  const int32_t good = get_entry(1, kBadKey);
  set_entry(1, kBadKey, static_cast<int32_t>(pool.rows() + 3 * pc.spec.page_size));
  const std::vector<uint8_t> bad = replay();
  const Status reported = pool.check_device_errors(stream);
  EXPECT_EQ(reported.code(), StatusCode::kInvalidArgument) << reported.to_string();
  EXPECT_NE(reported.message().find("attention kernel (device slot guard): layer " +
                                    std::to_string(ld.layer.layer_id) + ", request 1, key "),
            std::string::npos)
      << reported.to_string();
  EXPECT_TRUE(request0_rows(bad, b.num_tokens, rows0) == request0_rows(clean, b.num_tokens, rows0))
      << "request 0's output changed";

  set_entry(1, kBadKey, good);
  EXPECT_TRUE(replay() == clean) << "the mended replay differs from the clean one";
  EXPECT_TRUE(pool.check_device_errors(stream).is_ok());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  pc.batch.stream = nullptr;
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Graphs, ReadGuardGraph,
    ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3"),
                       ::testing::Values(GuardCase{"decode_p1", ForwardMode::kDecode, 1, false},
                                         GuardCase{"decode_p16", ForwardMode::kDecode, 16, false},
                                         GuardCase{"verify_p16", ForwardMode::kTargetVerify, 16,
                                                   false})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

INSTANTIATE_TEST_SUITE_P(
    MlaGraphs, ReadGuardGraph,
    ::testing::Combine(::testing::Values("triton", "flashinfer", "flashmla", "cutlass_mla"),
                       ::testing::Values(GuardCase{"mla_decode_p64", ForwardMode::kDecode, 64,
                                                   true})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

INSTANTIATE_TEST_SUITE_P(
    Mha, ReadGuard,
    ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3"),
                       ::testing::Values(GuardCase{"decode_p1", ForwardMode::kDecode, 1, false},
                                         GuardCase{"decode_p16", ForwardMode::kDecode, 16, false},
                                         GuardCase{"extend_p1", ForwardMode::kExtend, 1, false},
                                         GuardCase{"extend_p16", ForwardMode::kExtend, 16, false},
                                         GuardCase{"extend_p64", ForwardMode::kExtend, 64, false},
                                         GuardCase{"verify_p16", ForwardMode::kTargetVerify, 16,
                                                   false})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

INSTANTIATE_TEST_SUITE_P(
    Mla, ReadGuard,
    ::testing::Combine(
        ::testing::Values("triton", "flashinfer", "flashmla", "cutlass_mla"),
        ::testing::Values(GuardCase{"mla_decode_p64", ForwardMode::kDecode, 64, true},
                          GuardCase{"mla_verify_p64", ForwardMode::kTargetVerify, 64, true})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

}  // namespace
}  // namespace attnkit
