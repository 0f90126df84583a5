// A forward whose batch has the planned mode and batch size but fewer tokens than the batch that
// init_forward_metadata planned (a target_verify batch with fewer drafts per request and no extend
// lengths, an extend batch with a shorter request) is refused by name on every CUDA backend that
// plans (triton, flashinfer, fa3, flashmla), and writes nothing: the stale plan's query offsets
// index bs x N rows, past the smaller q / out. BatchArrays: a batch whose index arrays are on the
// host or strided over a CUDA pool is refused by name as well. A batch of the planned shape with
// other lengths or request rows is refused by the plan's digest of its host arrays.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/on_backend.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

struct StaleCase {
  std::string name;
  bool verify;
  bool mla;
};

CaseSpec stale_spec(const StaleCase& sc) {
  return test_support::plan_check_case(
      "stale_" + sc.name, sc.verify ? ForwardMode::kTargetVerify : ForwardMode::kExtend, {300, 41},
      sc.verify ? std::vector<int>{} : std::vector<int>{9, 3}, sc.mla, 5);
}

// The (backend, case) parameter prepared on the GPU in SetUp (support/on_backend.h).
using OnBackend = test_support::OnBackend<StaleCase, stale_spec>;

class StalePlan : public OnBackend {};

TEST_P(StalePlan, FewerTokensThanPlannedAreRefused) {
  const StaleCase& sc = std::get<1>(GetParam());
  harness::PreparedCase& pc = made_->pc;
  AttentionBackend& backend = *made_->backend;

  ForwardBatch planned = pc.batch;
  ForwardBatch fewer;
  int64_t tokens = 0;
  if (sc.verify) {
    test_support::drop_verify_lengths(&planned);  // rows and seq_lens alone: N = 4 or 2
    fewer = planned;
    fewer.spec.draft_token_num = 2;
    tokens = 2 * planned.batch_size;
  } else {
    // Request 0's 9 new tokens become 6 (same prefixes): 9 tokens where 12 were planned.
    fewer = planned;
    fewer.extend_seq_lens_host[0] -= 3;
    fewer.seq_lens_host[0] -= 3;
    fewer.seq_lens_sum -= 3;
    fewer.extend_start_loc_host[1] -= 3;
    tokens = planned.num_tokens - 3;
  }
  ASSERT_TRUE(backend.init_forward_metadata(planned).is_ok());
  const harness::LayerData& ld = pc.layers[0];
  const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
  const Status st = test_support::forward_first_tokens(backend, ld, fewer, tokens);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("num_tokens " + std::to_string(tokens)), std::string::npos)
      << st.to_string();
  EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
}

INSTANTIATE_TEST_SUITE_P(Backends, StalePlan,
                         ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3",
                                                              "flashmla"),
                                            ::testing::Values(StaleCase{"verify", true, false},
                                                              StaleCase{"extend", false, false},
                                                              StaleCase{"mla_verify", true, true})),
                         test_support::backend_case_name<StaleCase>);

// The same mode, batch size and token count with other lengths or request rows: the plan's query
// offsets, split partitions and token indices are the planned batch's, so the forward ran on them
// and returned ok with wrong rows. Refused by the plan's digest of the host arrays.
// Plans pc.batch, then expects layer 0's forward of `other` refused (kInvalidArgument, `needle` in
// the message) with out untouched, and the planned batch itself still running on the plan.
void expect_refused_after_planning(AttentionBackend& backend, harness::PreparedCase& pc,
                                   const ForwardBatch& other, const std::string& needle) {
  ASSERT_TRUE(backend.init_forward_metadata(pc.batch).is_ok());
  const harness::LayerData& ld = pc.layers[0];
  const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
  const Status st = backend.forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, other,
                                    false, TensorView());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
  EXPECT_TRUE(backend
                  .forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch, false,
                           TensorView())
                  .is_ok());
}

TEST_P(StalePlan, SameShapeOtherLengthsAreRefused) {
  const StaleCase& sc = std::get<1>(GetParam());
  harness::PreparedCase& pc = made_->pc;
  AttentionBackend& backend = *made_->backend;
  ForwardBatch other = pc.batch;
  if (sc.verify) {
    ASSERT_GE(other.req_pool_indices_host.size(), 2u);
    std::swap(other.req_pool_indices_host[0], other.req_pool_indices_host[1]);
  } else {
    // One new token of request 0 moves to request 1 (9 + 3 -> 8 + 4): 12 tokens either way.
    other.extend_seq_lens_host[0] -= 1;
    other.extend_seq_lens_host[1] += 1;
    other.seq_lens_host[0] -= 1;
    other.seq_lens_host[1] += 1;
    other.extend_start_loc_host[1] -= 1;
  }
  ASSERT_EQ(other.num_tokens, pc.batch.num_tokens);
  expect_refused_after_planning(
      backend, pc, other,
      "has other request rows or lengths than the batch init_forward_metadata planned");
}

// The same batch on another stream than the one init_forward_metadata planned on: the plan's
// uploads and index kernels were enqueued on the planning stream, so a layer on another stream
// could read them before they land. Refused by name (both streams), out untouched; the planned
// stream still runs, and planning again on the new stream makes it the forward's.
TEST_P(StalePlan, AnotherStreamThanPlannedIsRefused) {
  harness::PreparedCase& pc = made_->pc;
  AttentionBackend& backend = *made_->backend;
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreate(&side), cudaSuccess);
  ForwardBatch moved = pc.batch;
  moved.stream = side;
  expect_refused_after_planning(backend, pc, moved,
                                "(ForwardBatch.stream, or the context's stream when it is null) "
                                "but init_forward_metadata planned this batch on ");
  const harness::LayerData& ld = pc.layers[0];
  ASSERT_TRUE(backend.init_forward_metadata(moved).is_ok());
  EXPECT_TRUE(
      backend
          .forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, moved, false, TensorView())
          .is_ok());
  EXPECT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

// A batch whose index arrays are host arrays (or a strided view) over a CUDA pool is refused by
// name at init_forward_metadata, before a planner kernel dereferences a host pointer or reads
// every other element: ForwardBatch::validate, which every backend's plan calls first.
class BatchArrays : public OnBackend {};

TEST_P(BatchArrays, HostOrStridedArraysAreRefused) {
  harness::PreparedCase& pc = made_->pc;
  AttentionBackend& backend = *made_->backend;
  ASSERT_TRUE(backend.init_forward_metadata(pc.batch).is_ok());

  const int64_t bs = pc.batch.batch_size;
  std::vector<int32_t> host(pc.batch.seq_lens_host.begin(), pc.batch.seq_lens_host.end());
  ForwardBatch on_host = pc.batch;
  on_host.seq_lens = TensorView(host.data(), DType::kI32, Device::cpu(), {bs});
  Status st = backend.init_forward_metadata(on_host);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("ForwardBatch.seq_lens is on cpu, the KV pool on cuda:0"),
            std::string::npos)
      << st.to_string();

  ForwardBatch strided = pc.batch;
  TensorView rows = pc.batch.req_pool_indices;  // bs elements read with a stride of 2
  rows.strides[0] = 2;
  strided.req_pool_indices = rows;
  st = backend.init_forward_metadata(strided);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("ForwardBatch.req_pool_indices: expected a contiguous array"),
            std::string::npos)
      << st.to_string();
  // The real batch still plans after the refusals.
  ASSERT_TRUE(backend.init_forward_metadata(pc.batch).is_ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchArrays,
                         ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3",
                                                              "flashmla"),
                                            ::testing::Values(StaleCase{"extend", false, false},
                                                              StaleCase{"mla_verify", true, true})),
                         test_support::backend_case_name<StaleCase>);

}  // namespace
}  // namespace attnkit
