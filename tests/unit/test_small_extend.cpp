// backend/small_extend.h: which extend forwards the flashinfer / fa3 backends run on the decode
// tiles (every request 1 .. max_rows / group new tokens) or leave off the wgmma kernel (the longest
// request at most min_q_len new tokens), and the knobs that bound them (cpu label: host logic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>
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

// Either rule makes a forward one of few new tokens per request: the decode tiles' packed rows
// (9 x 4 = 36 > 32, but 9 <= 16 new tokens: the prefill tiles') or the wgmma minimum alone (one
// request without new tokens keeps it off the decode tiles); neither past both bounds, nor with
// both knobs off.
TEST(SmallExtend, FewNewTokensPerRequestIsEitherRule) {
  using detail::few_new_tokens_per_request;
  EXPECT_TRUE(few_new_tokens_per_request(extend_batch(ForwardMode::kExtend, {1, 8}), 4, 32, 16));
  EXPECT_TRUE(few_new_tokens_per_request(extend_batch(ForwardMode::kExtend, {1, 8}), 4, 32, 0));
  EXPECT_TRUE(few_new_tokens_per_request(extend_batch(ForwardMode::kExtend, {9, 2}), 4, 32, 16));
  EXPECT_FALSE(few_new_tokens_per_request(extend_batch(ForwardMode::kExtend, {9, 2}), 4, 32, 8));
  EXPECT_TRUE(few_new_tokens_per_request(extend_batch(ForwardMode::kMixed, {0, 4}), 4, 32, 16));
  EXPECT_FALSE(few_new_tokens_per_request(extend_batch(ForwardMode::kMixed, {0, 4}), 4, 32, 0));
  EXPECT_FALSE(few_new_tokens_per_request(extend_batch(ForwardMode::kExtend, {17, 1}), 4, 32, 16));
  EXPECT_FALSE(few_new_tokens_per_request(extend_batch(ForwardMode::kExtend, {1}), 4, 0, 0));
  EXPECT_FALSE(few_new_tokens_per_request(extend_batch(ForwardMode::kDecode, {1}), 4, 32, 16));
  // The span form, as the case runner and the GPU tests call it, says the same.
  const std::vector<int32_t> lens = {1, 8};
  EXPECT_TRUE(few_new_tokens_per_request(ForwardMode::kExtend, lens, false, 4, 32, 0));
  EXPECT_FALSE(few_new_tokens_per_request(ForwardMode::kExtend, lens, true, 4, 32, 0));
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

// The overlap model's inputs: K / V bytes of the flagged requests (once per kv head), the QK^T +
// PV FLOPs of the others over their causal keys.
TEST(SmallExtend, PartitionWorkCountsBytesAndFlops) {
  const std::vector<uint8_t> flags = {0, 1, 1, 0};
  const std::vector<int32_t> q_lens = {100, 1, 3, 0};
  const std::vector<int32_t> kv_lens = {150, 4096, 10, 7};
  // GQA 32 / 8, d 128 / 128, bf16 KV.
  const detail::PartitionWork w =
      detail::partition_work(flags, q_lens, kv_lens, 32, 8, 128, 128, 2);
  EXPECT_DOUBLE_EQ(w.decode_bytes, (4096.0 + 10.0) * 8 * 256 * 2);
  // Request 0: 100 new tokens over a 50-token prefix: 100 x 50 + 100 x 101 / 2 pairs; request 3
  // has no new tokens.
  EXPECT_DOUBLE_EQ(w.wgmma_flops, 2.0 * 32 * 256 * (100.0 * 50 + 100.0 * 101 / 2));
  // Shorter flag / length lists: only the common prefix counts.
  const detail::PartitionWork head = detail::partition_work(
      std::span<const uint8_t>(flags).first(2), q_lens, kv_lens, 32, 8, 128, 128, 2);
  EXPECT_DOUBLE_EQ(head.decode_bytes, 4096.0 * 8 * 256 * 2);
}

// The reserve: the SMs the decode tiles get beside the wgmma kernel, from the modelled time.
TEST(SmallExtend, OverlapReserveFollowsTheModel) {
  using detail::partition_overlap_reserve;
  const auto modelled = [](double bytes, double flops, int sms, int r) {
    const double t_dec = bytes;
    const double t_wg = flops / detail::kOverlapFlopPerByte;
    if (r == 0) return t_dec + t_wg;
    const double tw = t_wg * sms / (sms - r);
    const double f = std::min(1.0, r / static_cast<double>(std::max(1, sms / 3)));
    return f * tw >= t_dec ? tw : t_dec + (1.0 - f) * tw;
  };
  // Session 72's first mixed forward on an H200 (132 SMs): a 2048-token chunk (no prefix) beside
  // 63 decode rows over 4k. The decode dominates: it gets the SMs that reach the copy rate (a
  // third), the chunk runs beside it on the rest, and the modelled time is the decode's alone
  // (19% under the serial sum). Of equal times the smallest reserve is taken (the sweep below).
  const double bytes = 63.0 * 4096 * 8 * 256 * 2;
  const double flops = 2.0 * 32 * 256 * (2048.0 * 2049 / 2);
  const int r = partition_overlap_reserve(bytes, flops, 132);
  EXPECT_EQ(r, 132 / 3);
  EXPECT_DOUBLE_EQ(modelled(bytes, flops, 132, r), bytes);
  EXPECT_LT(modelled(bytes, flops, 132, r), 0.85 * modelled(bytes, flops, 132, 0));
  // No reserve is better by the model than the chosen one.
  for (int other = 0; other <= 132 - 132 / 8; ++other) {
    EXPECT_GE(modelled(bytes, flops, 132, other), modelled(bytes, flops, 132, r)) << other;
  }
  // A compute-heavy chunk (2048 over an 8k prefix) beside 31 rows: a few SMs.
  const double bytes2 = 31.0 * 4096 * 8 * 256 * 2;
  const double flops2 = 2.0 * 32 * 256 * (2048.0 * 8192 + 2048.0 * 2049 / 2);
  const int r2 = partition_overlap_reserve(bytes2, flops2, 132);
  EXPECT_GT(r2, 0);
  EXPECT_LT(r2, r);
  // Whatever the balance, the reserve is the smallest of the least modelled time (no larger one
  // taken on rounding noise: the decode-bound ratios all tie at the decode's time from S / 3 on).
  for (double ratio = 0.05; ratio < 40; ratio *= 1.07) {
    const double b = 1e9;
    const double f = b / ratio * detail::kOverlapFlopPerByte;
    for (int sms : {8, 9, 66, 78, 114, 132, 144}) {
      const int got = partition_overlap_reserve(b, f, sms);
      double least = modelled(b, f, sms, 0);
      for (int other = 1; other <= sms - std::max(1, sms / 8); ++other) {
        least = std::min(least, modelled(b, f, sms, other));
      }
      if (got == 0) {
        EXPECT_GT(least, 0.97 * modelled(b, f, sms, 0) * (1 - 1e-9)) << ratio << " " << sms;
        continue;
      }
      EXPECT_NEAR(modelled(b, f, sms, got), least, least * 1e-12) << ratio << " " << sms;
      for (int other = 1; other < got; ++other) {
        EXPECT_GT(modelled(b, f, sms, other), least * (1 + 1e-12)) << ratio << " " << sms;
      }
    }
  }
  // Nothing to overlap, a tiny GPU, or a gain under 3%: none.
  EXPECT_EQ(partition_overlap_reserve(0, flops, 132), 0);
  EXPECT_EQ(partition_overlap_reserve(bytes, 0, 132), 0);
  EXPECT_EQ(partition_overlap_reserve(bytes, flops, 4), 0);
  EXPECT_EQ(partition_overlap_reserve(bytes * 1e-4, flops, 132), 0);
}

// Over an fp8_e4m3 pool: the model's reserve (FP8 FLOPs at 1 / kOverlapFp8Speedup), capped at
// sm_count / 16 (H200: a few SMs beat the model's third, docs/PERF.md "Session 78").
TEST(SmallExtend, Fp8OverlapReserveIsCapped) {
  using detail::partition_overlap_reserve;
  using detail::partition_overlap_reserve_fp8;
  // The three fp8 forwards of bench/cases/mixed_extend_fp8.json (1-byte K / V): the model gives
  // 44 / 7 / 44 SMs of 132; capped, 8 / 7 / 8.
  const double bytes1 = 63.0 * 4096 * 8 * 256;
  const double flops1 = 2.0 * 32 * 256 * (2048.0 * 2049 / 2);
  const double bytes2 = 31.0 * 4096 * 8 * 256;
  const double flops2 = 2.0 * 32 * 256 * (2048.0 * 8192 + 2048.0 * 2049 / 2);
  const double bytes3 = 56.0 * 4096 * 8 * 256;
  const double flops3 = 8 * 2.0 * 32 * 256 * (64.0 * 4096 + 64.0 * 65 / 2);
  const double s = detail::kOverlapFp8Speedup;
  EXPECT_EQ(partition_overlap_reserve(bytes1, flops1 / s, 132), 44);
  EXPECT_EQ(partition_overlap_reserve(bytes2, flops2 / s, 132), 7);
  EXPECT_EQ(partition_overlap_reserve(bytes3, flops3 / s, 132), 44);
  EXPECT_EQ(partition_overlap_reserve_fp8(bytes1, flops1, 132), 8);
  EXPECT_EQ(partition_overlap_reserve_fp8(bytes2, flops2, 132), 7);
  EXPECT_EQ(partition_overlap_reserve_fp8(bytes3, flops3, 132), 8);
  // Never more than the model's, never past 1 / 16 of the SMs (at least 1), none exactly where
  // the model gives none, and the model's own where it is under the cap.
  int capped = 0;
  int uncapped = 0;
  for (double ratio = 0.05; ratio < 40; ratio *= 1.07) {
    const double b = 1e9;
    const double f = b / ratio * detail::kOverlapFlopPerByte;
    for (int sms : {8, 9, 15, 16, 66, 78, 114, 132, 144}) {
      const int model = partition_overlap_reserve(b, f / s, sms);
      const int got = partition_overlap_reserve_fp8(b, f, sms);
      const int cap = std::max(1, sms / 16);
      EXPECT_LE(got, model) << ratio << " " << sms;
      EXPECT_LE(got, cap) << ratio << " " << sms;
      EXPECT_EQ(got == 0, model == 0) << ratio << " " << sms;
      if (model > 0 && model <= cap) EXPECT_EQ(got, model) << ratio << " " << sms;
      capped += model > cap ? 1 : 0;
      uncapped += model > 0 && model <= cap ? 1 : 0;
    }
  }
  EXPECT_GT(capped, 0);  // the sweep reaches both sides of the cap
  EXPECT_GT(uncapped, 0);
  EXPECT_EQ(partition_overlap_reserve_fp8(0, flops1, 132), 0);
  EXPECT_EQ(partition_overlap_reserve_fp8(bytes1, 0, 132), 0);
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
  // ATTNKIT_PARTITION_OVERLAP: on unless 0; ATTNKIT_PARTITION_RESERVE: -1 (the model) unless set.
  if (std::getenv("ATTNKIT_PARTITION_OVERLAP") == nullptr) {
    EXPECT_TRUE(detail::partition_overlap_from_env());
  }
  if (std::getenv("ATTNKIT_PARTITION_RESERVE") == nullptr) {
    EXPECT_EQ(detail::partition_reserve_from_env(), -1);
  }
  test_support::ScopedEnv overlap_off("ATTNKIT_PARTITION_OVERLAP", "0");
  EXPECT_FALSE(detail::partition_overlap_from_env());
  test_support::ScopedEnv reserve("ATTNKIT_PARTITION_RESERVE", "40");
  EXPECT_EQ(detail::partition_reserve_from_env(), 40);
}

}  // namespace
}  // namespace attnkit
