// The eager plan's stamp (backend/plan_stamp.h): a forward is refused when its batch is not the
// planned one (shape, lengths) or when it runs on another stream than the one the plan's uploads
// and index kernels were enqueued on; the same batch on the same stream passes.
#include <gtest/gtest.h>

#include <string>

#include "backend/plan_stamp.h"

namespace attnkit {
namespace {

ForwardBatch decode_batch() {
  ForwardBatch b;
  b.mode = ForwardMode::kDecode;
  b.batch_size = 2;
  b.num_tokens = 2;
  b.req_pool_indices_host = {1, 2};
  b.seq_lens_host = {3, 4};
  b.seq_lens_sum = 7;
  return b;
}

void expect_refused(const Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

TEST(PlanStamp, SameBatchAndStreamPassOthersAreNamed) {
  const ForwardBatch b = decode_batch();
  int a_token = 0, b_token = 0;  // two distinct opaque stream handles
  const StreamHandle s1 = &a_token;
  const StreamHandle s2 = &b_token;
  const PlanStamp stamp{true, b.mode, b.batch_size, b.num_tokens, plan_key(b, s1)};
  EXPECT_TRUE(check_forward_matches_plan("x", stamp, b, s1).is_ok());
  expect_refused(check_forward_matches_plan("triton", stamp, b, s2),
                 "(ForwardBatch.stream, or the context's stream when it is null) but "
                 "init_forward_metadata planned this batch on stream ");
  expect_refused(check_forward_matches_plan("triton", stamp, b, nullptr),
                 "forward on the default stream (nullptr)");
  // Planned on the default stream: the same stream passes, another is refused.
  const PlanStamp on_default{true, b.mode, b.batch_size, b.num_tokens, plan_key(b, nullptr)};
  EXPECT_TRUE(check_forward_matches_plan("x", on_default, b, nullptr).is_ok());
  expect_refused(check_forward_matches_plan("x", on_default, b, s1),
                 "planned this batch on the default stream (nullptr)");
  // Other lengths are named as such (before the stream).
  ForwardBatch moved = b;
  moved.seq_lens_host = {4, 3};
  expect_refused(check_forward_matches_plan("x", stamp, moved, s2),
                 "has other request rows or lengths than the batch init_forward_metadata planned");
  // Graph plans keep no key: any stream (the captured kernels run on the replay's).
  const PlanStamp graph{true, b.mode, b.batch_size, b.num_tokens, std::nullopt};
  EXPECT_TRUE(check_forward_matches_plan("x", graph, b, s2).is_ok());
  // No plan, another shape, a replay plan.
  expect_refused(check_forward_matches_plan("x", PlanStamp{}, b, s1),
                 "forward called without a matching init_forward_metadata");
  PlanStamp replay = graph;
  replay.replay = true;
  expect_refused(check_forward_matches_plan("x", replay, b, s1), "CUDA-graph replay plan");
}

}  // namespace
}  // namespace attnkit
