// The triton backend's split-KV heuristic (src/backends/triton/kernels/split_plan.h): the worked
// examples of its header, padding neutrality (CUDA-graph padded rows of length 1 leave the chunk
// unchanged) and the one-wave bound.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backends/triton/kernels/split_plan.h"

namespace attnkit::triton {
namespace {

constexpr int kH200Sms = 132;
constexpr int kHeadBlocks = 8;  // 8 kv heads, group 4 in one 16-head tile
const int kMaxSplits = plan_max_splits(kH200Sms, kHeadBlocks);
const int kTarget = kTargetBlocksPerSm * kH200Sms;

int chunk_of(const std::vector<int32_t>& lens) {
  return plan_forward_chunk(lens, kHeadBlocks, kTarget, kMaxSplits);
}
int blocks(const std::vector<int32_t>& lens) {
  const int c = chunk_of(lens);
  int n = 0;
  for (int32_t l : lens) n += kHeadBlocks * split_count(l, kMaxSplits, c);
  return n;
}

TEST(TritonSplitPlan, WorkedExamplesOfTheHeader) {
  EXPECT_EQ(kMaxSplits, 33);
  EXPECT_EQ(chunk_of({16384}), 512);
  EXPECT_EQ(split_count(16384, kMaxSplits, 512), 32);
  const std::vector<int32_t> b16(16, 4096);
  EXPECT_EQ(chunk_of(b16), 2048);
  EXPECT_EQ(split_count(4096, kMaxSplits, 2048), 2);
  EXPECT_EQ(blocks(b16), 256);
  const std::vector<int32_t> b64(64, 4096);
  EXPECT_EQ(split_count(4096, kMaxSplits, chunk_of(b64)), 1);
  const std::vector<int32_t> mixed = {16384, 1000, 300, 20};
  const int c = chunk_of(mixed);
  EXPECT_EQ(c, 576);
  EXPECT_EQ(split_count(16384, kMaxSplits, c), 29);
  EXPECT_EQ(split_count(1000, kMaxSplits, c), 2);
  EXPECT_EQ(split_count(300, kMaxSplits, c), 1);
}

TEST(TritonSplitPlan, PaddedRowsLeaveTheChunkUnchanged) {
  for (const std::vector<int32_t>& lens :
       {std::vector<int32_t>{4999, 100, 2047}, std::vector<int32_t>(7, 3000),
        std::vector<int32_t>{40000}, std::vector<int32_t>{600, 513, 9000, 1}}) {
    std::vector<int32_t> padded = lens;
    padded.resize(lens.size() + 5, 1);
    EXPECT_EQ(chunk_of(lens), chunk_of(padded));
  }
}

// The one-CTA shape of the tensor-core decode plans with 1 block per SM (split_plan.h).
TEST(TritonSplitPlan, OneCtaShapeExamplesOfTheHeader) {
  const int max_splits = plan_max_splits(kH200Sms, kHeadBlocks, 1);
  EXPECT_EQ(max_splits, 17);
  const auto chunk1 = [&](const std::vector<int32_t>& lens) {
    return plan_forward_chunk(lens, kHeadBlocks, kH200Sms, max_splits);
  };
  EXPECT_EQ(chunk1({16384}), 1024);
  EXPECT_EQ(split_count(16384, max_splits, 1024), 16);  // 128 blocks <= 132
  const std::vector<int32_t> b16(16, 4096), b64(64, 4096);
  EXPECT_EQ(split_count(4096, max_splits, chunk1(b16)), 1);
  EXPECT_EQ(split_count(4096, max_splits, chunk1(b64)), 1);
  for (int bs : {1, 2, 3, 5, 8, 16}) {
    for (int len : {513, 4096, 16384, 65536}) {
      const std::vector<int32_t> lens(static_cast<size_t>(bs), len);
      const int c = chunk1(lens);
      const int n = bs * kHeadBlocks * split_count(len, max_splits, c);
      EXPECT_TRUE(n <= kH200Sms || n == bs * kHeadBlocks) << bs << " x " << len << ": " << n;
    }
  }
}

TEST(TritonSplitPlan, LongRequestsStayWithinOneWave) {
  for (int bs : {1, 2, 3, 5, 8, 12, 16, 20, 33}) {
    for (int len : {513, 1024, 4096, 10000, 65536}) {
      const std::vector<int32_t> lens(static_cast<size_t>(bs), len);
      const int n = blocks(lens);
      // Within the wave, or unsplit when the requests alone exceed it.
      EXPECT_TRUE(n <= kTarget || n == bs * kHeadBlocks) << bs << " x " << len << ": " << n;
      // The chunk never drops below the 512-key floor, and a short request riding in the same
      // batch is never split (the chunk of a batch with the short one equals the chunk without).
      EXPECT_GE(chunk_of(lens), 512);
      std::vector<int32_t> with_short = lens;
      with_short.push_back(500);
      const int c = chunk_of(with_short);
      EXPECT_EQ(c, chunk_of(lens));
      EXPECT_EQ(split_count(500, kMaxSplits, c), 1);
    }
  }
}

}  // namespace
}  // namespace attnkit::triton
