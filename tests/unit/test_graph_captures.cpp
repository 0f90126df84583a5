// The CUDA-graph capture / replay checks shared by the GPU backends (backend/graph_captures.h):
// a replay of an uncaptured (mode, batch size) or with other queries per request, replay lengths
// past the req_to_token rows, and capture / replay index tensors of the wrong dtype, shape or
// device are refused by name.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/graph_captures.h"

namespace attnkit {
namespace {

void expect_refused(const Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

TEST(GraphCaptures, ReplayMustMatchACapture) {
  GraphCaptures g;
  expect_refused(g.check_replay("triton", ForwardMode::kDecode, 8, 1).status(),
                 "triton: no decode graph of batch size 8 was captured");
  g.record(ForwardMode::kDecode, 8, 1);
  g.record(ForwardMode::kTargetVerify, 8, 4, /*grid=*/24);
  EXPECT_TRUE(g.check_replay("triton", ForwardMode::kDecode, 8, 1).is_ok());
  const Result<int> grid = g.check_replay("flashinfer", ForwardMode::kTargetVerify, 8, 4);
  ASSERT_TRUE(grid.is_ok()) << grid.status().to_string();
  EXPECT_EQ(*grid, 24);
  expect_refused(g.check_replay("triton", ForwardMode::kDecode, 16, 1).status(), "batch size 16");
  expect_refused(g.check_replay("flashinfer", ForwardMode::kTargetVerify, 8, 2).status(),
                 "with 2 queries per request (spec.draft_token_num), its graph was captured "
                 "with 4");
  g.clear();
  expect_refused(g.check_replay("triton", ForwardMode::kDecode, 8, 1).status(), "was captured");
}

TEST(GraphCaptures, ReplayLengthsFitTheRows) {
  const std::vector<int32_t> lens = {5, 100, 97};
  EXPECT_TRUE(check_graph_lengths("x", 3, lens.data(), 0, 100).is_ok());
  EXPECT_TRUE(check_graph_lengths("x", 3, lens.data(), 0, 0).is_ok());  // rows unknown
  EXPECT_TRUE(check_graph_lengths("x", 3, nullptr, 0, 100).is_ok());
  expect_refused(check_graph_lengths("x", 3, lens.data(), 4, 100),
                 "seq_lens_host[1] = 100 (+ 4 drafts) must be >= 0 and fit the req_to_token rows "
                 "of max_context_len 100");
  const std::vector<int32_t> negative = {3, -1};
  expect_refused(check_graph_lengths("x", 2, negative.data(), 0, 0), "seq_lens_host[1] = -1");
  // The total within int32 (the kernels' kv_indptr): two 1.5e9-key requests (prefix sharing) are
  // refused by name, one is not; the drafts count.
  const std::vector<int32_t> huge = {1500000000, 1500000000};
  expect_refused(check_graph_lengths("x", 2, huge.data(), 0, 0),
                 "x: replay batch reads 3000000000 keys in all");
  EXPECT_TRUE(check_graph_lengths("x", 1, huge.data(), 0, 0).is_ok());
  const std::vector<int32_t> edge = {2147483640, 4};
  EXPECT_TRUE(check_graph_lengths("x", 2, edge.data(), 0, 0).is_ok());
  expect_refused(check_graph_lengths("x", 2, edge.data(), 2, 0), "2147483648 keys in all");
  expect_refused(check_graph_key_total("triton", int64_t{1} << 31), "triton: replay batch reads");
  EXPECT_TRUE(check_graph_key_total("triton", (int64_t{1} << 31) - 1).is_ok());
}

// A replay's req_to_token entries are checked against the KV pool: one compare while the table
// holds only pool rows, the replayed rows scanned (and the first bad entry named) otherwise. A
// large slot in a row the replay does not read, or past a request's length, is not its error.
TEST(GraphCaptures, ReplayTableSlotsAreRowsOfThePool) {
  KVPoolConfig cfg;
  cfg.num_layers = 1;
  cfg.size = 64;  // rows [0, 72) with page 8
  cfg.page_size = 8;
  cfg.dtype = DType::kF32;
  cfg.device = Device::cpu();
  cfg.num_kv_heads = 1;
  cfg.head_dim = 4;
  cfg.v_head_dim = 4;
  auto pool = MHAKVPool::create(cfg).value();
  auto table = ReqToTokenPool::create(4, 16, Device::cpu()).value();
  const int a = table->alloc().value();
  const int b = table->alloc().value();
  const int c = table->alloc().value();
  ASSERT_TRUE(table->write(a, 0, std::vector<int64_t>{8, 9, 10, 71}).is_ok());
  ASSERT_TRUE(table->write(b, 0, std::vector<int64_t>{16, 17}).is_ok());
  std::vector<int32_t> rows = {a, b};
  const TensorView indices(rows.data(), DType::kI32, Device::cpu(), {2});
  const std::vector<int32_t> lens = {4, 2};
  EXPECT_TRUE(
      check_graph_table_slots("x", table.get(), pool.get(), 2, indices, lens.data(), 0, nullptr)
          .is_ok());
  // Slot 72 (one past the pool) in a row this replay does not read, and past b's length.
  ASSERT_TRUE(table->write(c, 5, std::vector<int64_t>{72}).is_ok());
  ASSERT_TRUE(table->write(b, 3, std::vector<int64_t>{1000}).is_ok());
  EXPECT_GE(table->max_slot(), pool->rows());
  EXPECT_TRUE(
      check_graph_table_slots("x", table.get(), pool.get(), 2, indices, lens.data(), 0, nullptr)
          .is_ok());
  // b's entry 3 is read once the replay counts a draft past b's committed tokens (verify).
  const std::vector<int32_t> short_lens = {3, 2};
  expect_refused(check_graph_table_slots("flashinfer", table.get(), pool.get(), 2, indices,
                                         short_lens.data(), 2, nullptr),
                 "flashinfer: replay: req_to_token[" + std::to_string(b) +
                     ", 3] = 1000 (request 1) is outside the KV pool slots [0, 72)");
  // Without seq_lens_host the whole row is read.
  expect_refused(
      check_graph_table_slots("x", table.get(), pool.get(), 2, indices, nullptr, 0, nullptr),
      "req_to_token[" + std::to_string(b) + ", 3] = 1000 (request 1)");
  // A replayed row outside the request table is named (it is only looked at on this path).
  rows[1] = 9;
  expect_refused(
      check_graph_table_slots("x", table.get(), pool.get(), 2, indices, lens.data(), 0, nullptr),
      "req_pool_indices[1] = 9 is outside the request table rows [0, 4]");
  // No pools known: nothing to check.
  EXPECT_TRUE(check_graph_table_slots("x", nullptr, pool.get(), 2, indices, lens.data(), 0, nullptr)
                  .is_ok());
  EXPECT_TRUE(
      check_graph_table_slots("x", table.get(), nullptr, 2, indices, lens.data(), 0, nullptr)
          .is_ok());
}

TEST(GraphCaptures, IndexTensorsAreChecked) {
  std::vector<int32_t> rows = {1, 2, 3};
  std::vector<int64_t> wide = {1, 2, 3};
  const Device cpu = Device::cpu();
  const TensorView good(rows.data(), DType::kI32, cpu, {3});
  EXPECT_TRUE(check_graph_inputs("x", 3, good, good, TensorView(), cpu).is_ok());
  EXPECT_TRUE(check_graph_inputs("x", 2, good, good, TensorView(), cpu).is_ok());  // >= bs
  expect_refused(check_graph_inputs("x", 4, good, good, TensorView(), cpu),
                 "graph req_pool_indices: expected a contiguous int32[>= 4]");
  const TensorView int64(wide.data(), DType::kI64, cpu, {3});
  expect_refused(check_graph_inputs("x", 3, good, int64, TensorView(), cpu),
                 "graph seq_lens: expected a contiguous int32[>= 3]");
  expect_refused(check_graph_inputs("x", 3, TensorView(), good, TensorView(), cpu),
                 "graph req_pool_indices is missing");
  expect_refused(check_graph_inputs("x", 3, good, good, int64, cpu), "graph encoder_lens");
  expect_refused(check_graph_inputs("x", 3, good, good, TensorView(), Device::cuda(0)),
                 "graph req_pool_indices is on cpu, the backend on cuda:0");
}

}  // namespace
}  // namespace attnkit
