// backend/small_extend.h: which extend forwards the flashinfer / fa3 backends run on the decode
// tiles (every request 1 .. max_rows / group new tokens) or leave off the wgmma kernel (the longest
// request at most min_q_len new tokens), and the knobs that bound them (cpu label: host logic).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "attnkit/forward_batch.h"
#include "backend/small_extend.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

ForwardBatch extend_batch(ForwardMode mode, std::vector<int32_t> new_tokens) {
  ForwardBatch b;
  b.mode = mode;
  b.batch_size = static_cast<int>(new_tokens.size());
  b.extend_seq_lens_host = std::move(new_tokens);
  return b;
}

TEST(SmallExtend, DecodeTilesTakeEveryRequestWithinTheRowBound) {
  using detail::extend_decode_q_len;
  // Group 4, 32 rows: up to 8 new tokens per request; the longest one is returned.
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1, 3, 8, 2}), 4, 32), 8);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1}), 4, 32), 1);
  // One request past the bound, or one without new tokens: none.
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1, 9}), 4, 32), 0);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1, 0, 2}), 4, 32), 0);
  // Group 1 (MHA) fits 32 new tokens, group 32 (MQA-like) one.
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {32, 5}), 1, 32), 32);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {2}), 32, 32), 0);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1}), 32, 32), 1);
  // Mixed and draft-extend forwards too; decode and target verify have their own rules.
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kMixed, {1, 4}), 4, 32), 4);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kDraftExtend, {3, 3}), 4, 32), 3);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kDecode, {1, 1}), 4, 32), 0);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kTargetVerify, {4}), 4, 32), 0);
  // Bound 0 (the knob's off), no host lengths, an encoder batch: none.
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1}), 4, 0), 0);
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {}), 4, 32), 0);
  ForwardBatch enc = extend_batch(ForwardMode::kExtend, {1, 2});
  enc.encoder_lens_host = {5, 5};
  EXPECT_EQ(extend_decode_q_len(enc, 4, 32), 0);
  // No overflow at large counts: rows are counted in 64 bits.
  EXPECT_EQ(extend_decode_q_len(extend_batch(ForwardMode::kExtend, {1 << 30}), 1 << 20, 1 << 20),
            0);
}

TEST(SmallExtend, WgmmaMinimumLooksAtTheLongestRequest) {
  using detail::below_wgmma_q_len;
  EXPECT_TRUE(below_wgmma_q_len(extend_batch(ForwardMode::kExtend, {16, 9, 1}), 16));
  EXPECT_FALSE(below_wgmma_q_len(extend_batch(ForwardMode::kExtend, {17, 1}), 16));
  EXPECT_TRUE(below_wgmma_q_len(extend_batch(ForwardMode::kMixed, {0, 4}), 16));
  EXPECT_FALSE(below_wgmma_q_len(extend_batch(ForwardMode::kExtend, {4}), 0));  // knob off
  EXPECT_FALSE(below_wgmma_q_len(extend_batch(ForwardMode::kDecode, {1}), 16));
  EXPECT_FALSE(below_wgmma_q_len(extend_batch(ForwardMode::kExtend, {}), 16));
}

// A forward mixing few-token requests (1 .. max_rows / group new tokens) with longer ones splits
// between the decode tiles (flag 1) and the wgmma kernel; a forward small as a whole, or one with
// only one kind, does not.
TEST(SmallExtend, PartitionSplitsMixedForwards) {
  using detail::extend_partition;
  const auto flags = [](ForwardMode mode, std::vector<int32_t> n, int group = 4, int rows = 32,
                        int min_q = 16) {
    return extend_partition(extend_batch(mode, std::move(n)), group, rows, min_q);
  };
  using F = std::vector<uint8_t>;
  // A 2048-token chunk with decode rows (SGLang's mixed chunk); 8 new tokens at group 4 is 32
  // rows, 9 is 36.
  EXPECT_EQ(flags(ForwardMode::kMixed, {2048, 1, 1, 8}), (F{0, 1, 1, 1}));
  EXPECT_EQ(flags(ForwardMode::kMixed, {1, 9, 17, 1}), (F{1, 0, 0, 1}));
  EXPECT_EQ(flags(ForwardMode::kExtend, {300, 2}), (F{0, 1}));
  EXPECT_EQ(flags(ForwardMode::kDraftExtend, {40, 3}), (F{0, 1}));
  // A request without new tokens is in neither set.
  EXPECT_EQ(flags(ForwardMode::kMixed, {0, 100, 1}), (F{0, 0, 1}));
  // Small as a whole (every request on the decode tiles, or the longest <= min_q_len), one kind
  // only, other modes, an encoder batch, the bounds off: none.
  EXPECT_TRUE(flags(ForwardMode::kMixed, {1, 8, 2}).empty());
  EXPECT_TRUE(flags(ForwardMode::kMixed, {16, 1}).empty());
  EXPECT_TRUE(flags(ForwardMode::kMixed, {100, 17}).empty());
  EXPECT_TRUE(flags(ForwardMode::kDecode, {100, 1}).empty());
  EXPECT_TRUE(flags(ForwardMode::kTargetVerify, {100, 1}).empty());
  EXPECT_TRUE(flags(ForwardMode::kMixed, {100, 1}, 4, 0).empty());
  EXPECT_TRUE(flags(ForwardMode::kMixed, {}).empty());
  ForwardBatch enc = extend_batch(ForwardMode::kExtend, {100, 1});
  enc.encoder_lens_host = {5, 5};
  EXPECT_TRUE(extend_partition(enc, 4, 32, 16).empty());
  // min_q_len 0 (the wgmma kernel takes every extend): a mixed forward still splits.
  EXPECT_EQ(flags(ForwardMode::kMixed, {10, 1}, 4, 32, 0), (F{0, 1}));
  // Group 1 (MHA): up to 32 new tokens are small.
  EXPECT_EQ(flags(ForwardMode::kMixed, {32, 33}, 1), (F{1, 0}));
  // Past kPartitionDecodeItemsBound 16-row decode tiles: whole.
  std::vector<int32_t> many(static_cast<size_t>(detail::kPartitionDecodeItemsBound) + 1, 1);
  many.push_back(100);
  EXPECT_TRUE(flags(ForwardMode::kMixed, many).empty());
  many.erase(many.begin());
  EXPECT_EQ(flags(ForwardMode::kMixed, many).size(), many.size());
}

TEST(SmallExtend, KnobsAndTheirDefaults) {
  if (std::getenv("ATTNKIT_EXTEND_DECODE_ROWS") == nullptr &&
      std::getenv("ATTNKIT_FA3_MIN_Q_LEN") == nullptr) {
    EXPECT_EQ(detail::extend_decode_rows_from_env(), detail::kExtendDecodeRows);
    EXPECT_EQ(detail::wgmma_min_q_len_from_env(), detail::kWgmmaMinQLen);
  }
  {
    test_support::ScopedEnv rows("ATTNKIT_EXTEND_DECODE_ROWS", "0");
    test_support::ScopedEnv min("ATTNKIT_FA3_MIN_Q_LEN", "64");
    EXPECT_EQ(detail::extend_decode_rows_from_env(), 0);
    EXPECT_EQ(detail::wgmma_min_q_len_from_env(), 64);
  }
  // Out of range: the default (env_int_range warns and keeps it).
  test_support::ScopedEnv rows("ATTNKIT_EXTEND_DECODE_ROWS", "-3");
  EXPECT_EQ(detail::extend_decode_rows_from_env(), detail::kExtendDecodeRows);
  // ATTNKIT_EXTEND_PARTITION: on unless 0.
  if (std::getenv("ATTNKIT_EXTEND_PARTITION") == nullptr) {
    EXPECT_TRUE(detail::extend_partition_from_env());
  }
  test_support::ScopedEnv off("ATTNKIT_EXTEND_PARTITION", "0");
  EXPECT_FALSE(detail::extend_partition_from_env());
}

}  // namespace
}  // namespace attnkit
