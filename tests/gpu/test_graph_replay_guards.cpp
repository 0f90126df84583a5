// CUDA-graph capture / replay inputs that do not match what was captured are refused by name on
// every GPU backend with graphs (triton, flashinfer, fa3, flashmla), before anything is planned or
// launched: a replay of a batch size that was not captured, a verify replay with another draft
// count (the captured kernels index q / out by the capture's), replay lengths past the req_to_token
// rows (the kernels would walk into the next request's slots), an int64 seq_lens, and a forward
// captured with fewer tokens than the capture's. The captured replay itself still plans.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/on_backend.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

struct GuardCase {
  std::string name;
  bool verify;
  bool mla;
};

CaseSpec guard_spec(const GuardCase& gc) {
  return test_support::plan_check_case(
      "graph_guard_" + gc.name, gc.verify ? ForwardMode::kTargetVerify : ForwardMode::kDecode,
      {300, 41, 77}, gc.verify ? std::vector<int>{} : std::vector<int>{1, 1, 1}, gc.mla, 9);
}

void expect_refused(const Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

// The (backend, case) parameter prepared on the GPU in SetUp (support/on_backend.h).
class GraphReplayGuards : public test_support::OnBackend<GuardCase, guard_spec> {};

TEST_P(GraphReplayGuards, MismatchedReplaysAreRefused) {
  const GuardCase& gc = std::get<1>(GetParam());
  harness::PreparedCase& pc = made_->pc;
  AttentionBackend& backend = *made_->backend;
  const ForwardBatch& b = pc.batch;
  const ForwardMode mode = b.mode;
  const SpecInfo* sp = gc.verify ? &b.spec : nullptr;
  const int bs = b.batch_size;
  ASSERT_TRUE(backend.init_cuda_graph_state(bs, b.num_tokens).is_ok());
  ASSERT_TRUE(backend
                  .init_forward_metadata_capture_cuda_graph(bs, b.num_tokens, b.req_pool_indices,
                                                            b.seq_lens, TensorView(), mode, sp)
                  .is_ok());
  // A forward with fewer tokens than the capture's (q / out of bs - 1 rows' worth).
  {
    ForwardBatch fewer = b;
    const int64_t tokens = b.num_tokens - (gc.verify ? 4 : 1);
    // One request fewer drafts is not a batch: drop the lengths that name them.
    if (gc.verify) test_support::drop_verify_lengths(&fewer);
    const harness::LayerData& ld = pc.layers[0];
    const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
    const Status st = test_support::forward_first_tokens(backend, ld, fewer, tokens);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument)
        << "a forward of " << tokens << " tokens ran on a capture of " << b.num_tokens << ": "
        << st.to_string();
    // Refused for its token count, not for something else about the cut batch.
    EXPECT_NE(st.message().find("num_tokens " + std::to_string(tokens)), std::string::npos)
        << st.to_string();
    EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
  }
  const auto replay = [&](int rbs, const TensorView& seq_lens, const SpecInfo* rspec,
                          const std::vector<int32_t>& lens) {
    return backend.init_forward_metadata_replay_cuda_graph(
        rbs, b.req_pool_indices, seq_lens, b.seq_lens_sum, TensorView(), mode, rspec, lens.data());
  };
  const Status ok = replay(bs, b.seq_lens, sp, b.seq_lens_host);
  ASSERT_TRUE(ok.is_ok()) << ok.to_string();
  // No forward runs on a replay plan: its buffers hold the replayed batch's indices for the
  // captured kernels (an eager forward of another batch of this size ran on them with status ok).
  {
    const harness::LayerData& ld = pc.layers[0];
    const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
    expect_refused(
        backend.forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, b, false, TensorView()),
        "forward called on a CUDA-graph replay plan");
    EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
  }
  expect_refused(replay(bs - 1, b.seq_lens, sp, b.seq_lens_host), "was captured");
  if (gc.verify) {
    SpecInfo two = b.spec;
    two.draft_token_num = 2;
    expect_refused(replay(bs, b.seq_lens, &two, b.seq_lens_host), "captured with 4");
  }
  std::vector<int32_t> past = b.seq_lens_host;
  past[1] = pc.req_to_token->max_context_len() + (gc.verify ? -1 : 1);
  expect_refused(replay(bs, b.seq_lens, sp, past), "seq_lens_host[1]");
  TensorView wide = b.seq_lens;
  wide.dtype = DType::kI64;
  expect_refused(replay(bs, wide, sp, b.seq_lens_host), "graph seq_lens");
  // init_cuda_graph_state again: the earlier captures are gone with its workspaces.
  ASSERT_TRUE(backend.init_cuda_graph_state(bs, b.num_tokens).is_ok());
  expect_refused(replay(bs, b.seq_lens, sp, b.seq_lens_host), "was captured");
}

INSTANTIATE_TEST_SUITE_P(Backends, GraphReplayGuards,
                         ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3",
                                                              "flashmla"),
                                            ::testing::Values(GuardCase{"decode", false, false},
                                                              GuardCase{"verify", true, false},
                                                              GuardCase{"mla_decode", false, true},
                                                              GuardCase{"mla_verify", true, true})),
                         test_support::backend_case_name<GuardCase>);

}  // namespace
}  // namespace attnkit
