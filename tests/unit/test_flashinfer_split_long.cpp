// The flashinfer decode planner's split-long rule (work_plan.h, PlanConfig::split_long, knob
// ATTNKIT_FLASHINFER_SPLIT_LONG=1), CPU only: requests much longer than the per-slot share are cut
// into chunks of about the share even where today's rule does not split (bs >= 16 with 8 kv
// heads); the others stay whole. Checked: every (request, q tile, key) in exactly one item (each
// item runs on every kv head: grid y), the split bookkeeping the split kernel and its fused merge
// read (num_splits, partial_base, split index, contiguous partial rows), chunk sizes against the
// share, uniform batches and today's balanced splits unchanged, the graph bound
// (max_decode_items), determinism (eager and replay plan the same requests with the same config),
// edge cases, and a random sweep.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/flashinfer/kernels/work_plan.h"
#include "support/flashinfer_plan_requests.h"

namespace attnkit::flashinfer {
namespace {

using test_support::decode_requests;
using test_support::kH200Sms;
using test_support::q_tiles;

PlanConfig h200(bool split_long = true) {
  PlanConfig c;
  c.shape = TileShape::kDecode;
  c.num_kv_heads = 8;
  c.group = 4;
  c.target_ctas = kTargetCtasPerSm * kH200Sms;
  c.split_long = split_long;
  return c;
}

// Exact per-slot share (keys per CTA slot) as a double, for size checks.
double share_of(const std::vector<PlanRequest>& reqs, const PlanConfig& cfg) {
  double work = 0;
  for (const PlanRequest& r : reqs) work += static_cast<double>(q_tiles(r, cfg.group)) * r.kv_len;
  return work * cfg.num_kv_heads / cfg.target_ctas;
}

// Every invariant the split kernel and its merge rely on.
void check_plan(const WorkPlan& plan, const std::vector<PlanRequest>& reqs, const PlanConfig& cfg) {
  ASSERT_EQ(plan.requests.size(), reqs.size());
  // (request, q row begin) -> key coverage and the split indices seen.
  std::vector<std::vector<std::vector<int>>> hits(reqs.size());
  std::vector<std::vector<std::set<int>>> splits_seen(reqs.size());
  for (size_t r = 0; r < reqs.size(); ++r) {
    const int64_t t = q_tiles(reqs[r], cfg.group);
    hits[r].assign(static_cast<size_t>(t), std::vector<int>(static_cast<size_t>(reqs[r].kv_len)));
    splits_seen[r].resize(static_cast<size_t>(t));
    const RequestPlan& rp = plan.requests[r];
    EXPECT_EQ(rp.q_start, reqs[r].q_start);
    EXPECT_EQ(rp.q_len, reqs[r].q_len);
    EXPECT_EQ(rp.kv_len, reqs[r].kv_len);
    EXPECT_GE(rp.num_splits, 1);
  }
  for (const WorkItem& w : plan.items) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, static_cast<int32_t>(reqs.size()));
    const size_t r = static_cast<size_t>(w.request);
    const RequestPlan& rp = plan.requests[r];
    ASSERT_EQ(w.q_row_begin % kDecodeTileRows, 0);
    const size_t t = static_cast<size_t>(w.q_row_begin / kDecodeTileRows);
    ASSERT_LT(t, hits[r].size());
    EXPECT_GE(w.kv_begin, 0);
    EXPECT_LE(w.kv_end, rp.kv_len);
    if (rp.num_splits == 1) {
      EXPECT_EQ(w.split, 0);
      EXPECT_EQ(w.kv_begin, 0);
      EXPECT_EQ(w.kv_end, rp.kv_len);
    } else {
      EXPECT_LT(w.kv_begin, w.kv_end) << "an empty split";
      EXPECT_GE(w.split, 0);
      EXPECT_LT(w.split, rp.num_splits);
      EXPECT_TRUE(splits_seen[r][t].insert(w.split).second) << "split index reused";
      EXPECT_LT(rp.partial_base + w.split, plan.num_partials);
    }
    for (int32_t k = w.kv_begin; k < w.kv_end; ++k) ++hits[r][t][static_cast<size_t>(k)];
  }
  // Partial rows: each split request owns [partial_base, partial_base + num_splits), disjoint.
  std::vector<int> row_owner(static_cast<size_t>(plan.num_partials), -1);
  int64_t partials = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const RequestPlan& rp = plan.requests[r];
    for (size_t t = 0; t < hits[r].size(); ++t) {
      for (size_t k = 0; k < hits[r][t].size(); ++k) {
        ASSERT_EQ(hits[r][t][k], 1) << "request " << r << " q tile " << t << " key " << k;
      }
      if (rp.num_splits > 1) {
        EXPECT_EQ(static_cast<int>(splits_seen[r][t].size()), rp.num_splits)
            << "request " << r << ": the merge waits for num_splits CTAs";
      }
    }
    if (rp.num_splits > 1 && !hits[r].empty()) {
      EXPECT_TRUE(plan.any_split);
      partials += rp.num_splits;
      for (int s = 0; s < rp.num_splits; ++s) {
        const size_t row = static_cast<size_t>(rp.partial_base + s);
        ASSERT_LT(row, row_owner.size());
        EXPECT_EQ(row_owner[row], -1) << "partial row " << row << " shared";
        row_owner[row] = static_cast<int>(r);
      }
    }
  }
  EXPECT_EQ(partials, plan.num_partials);
  EXPECT_LE(static_cast<int64_t>(plan.items.size()),
            max_decode_items(static_cast<int>(reqs.size()), cfg))
      << "the graph workspace would be too small";
}

// Keys of the longest CTA.
int64_t longest_cta(const WorkPlan& plan) {
  int64_t m = 0;
  for (const WorkItem& w : plan.items) m = std::max<int64_t>(m, w.kv_end - w.kv_begin);
  return m;
}

bool same_plan(const WorkPlan& a, const WorkPlan& b) {
  std::vector<int32_t> wa, wb;
  a.serialize(&wa);
  b.serialize(&wb);
  return wa == wb && a.num_partials == b.num_partials;
}

TEST(FlashInferSplitLong, WorkedExampleOfTheHeader) {
  // bs 16: one 32768-key request among fifteen of 1024. Today: no split (16 items per kv head
  // fill 132 / 8 = 16 slots), so the 8 CTAs of the long request stream 32768 keys each.
  const std::vector<PlanRequest> reqs = decode_requests([] {
    std::vector<int> l(16, 1024);
    l[0] = 32768;
    return l;
  }());
  auto today = build_work_plan(reqs, h200(false));
  ASSERT_TRUE(today.is_ok());
  EXPECT_FALSE(today->any_split);
  EXPECT_EQ(longest_cta(*today), 32768);

  auto plan = build_work_plan(reqs, h200());
  ASSERT_TRUE(plan.is_ok());
  check_plan(*plan, reqs, h200());
  EXPECT_TRUE(plan->split_long);
  // share = 8 * 48128 / 132 = 2916.8 keys; 12 chunks of round_up(2731, 64) = 2752 (last 2496).
  EXPECT_EQ(plan->requests[0].num_splits, 12);
  EXPECT_EQ(plan->chunk, 2752);
  EXPECT_EQ(plan->num_partials, 12);
  for (size_t r = 1; r < reqs.size(); ++r) EXPECT_EQ(plan->requests[r].num_splits, 1);
  EXPECT_EQ(plan->items.size(), 27u);
  EXPECT_EQ(plan->items[11].kv_end - plan->items[11].kv_begin, 2496);
  EXPECT_EQ(longest_cta(*plan), 2752);
}

TEST(FlashInferSplitLong, SplitPlansFarAboveTheShareAreRecut) {
  // bs 15: today splits 32768 in 2 x 16384 (15 + 1 = 16 items per head); the share is 2855 keys.
  std::vector<int> lens(15, 1024);
  lens[0] = 32768;
  const auto reqs = decode_requests(lens);
  auto today = build_work_plan(reqs, h200(false));
  ASSERT_TRUE(today.is_ok());
  EXPECT_EQ(today->requests[0].num_splits, 2);
  auto plan = build_work_plan(reqs, h200());
  ASSERT_TRUE(plan.is_ok());
  check_plan(*plan, reqs, h200());
  EXPECT_TRUE(plan->split_long);
  EXPECT_EQ(plan->requests[0].num_splits, 12);
  EXPECT_LE(longest_cta(*plan), share_of(reqs, h200()) + kDecodeTileKeys);
}

TEST(FlashInferSplitLong, LongChunksAreNearTheShare) {
  // A few long requests among short ones: every cut request's chunk within
  // [0.6 share, share + one tile); whole requests at most 1.5 x share; the longest CTA
  // therefore <= 1.5 x share.
  const std::vector<std::vector<int>> batches = {
      {65536, 40000, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300},
      {16384, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048,
       2048,  2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048,
       2048,  2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048},
      {9000, 9000, 9000, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100},
  };
  for (const auto& lens : batches) {
    const auto reqs = decode_requests(lens);
    auto plan = build_work_plan(reqs, h200());
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, h200());
    ASSERT_TRUE(plan->split_long);
    const double share = share_of(reqs, h200());
    int cut = 0;
    for (size_t r = 0; r < reqs.size(); ++r) {
      const RequestPlan& rp = plan->requests[r];
      if (rp.num_splits > 1) {
        ++cut;
        EXPECT_GT(rp.kv_len, 1.5 * share) << "request " << r << " cut below the threshold";
        for (const WorkItem& w : plan->items) {
          if (w.request != static_cast<int32_t>(r) || w.split == rp.num_splits - 1) continue;
          const int len = w.kv_end - w.kv_begin;
          EXPECT_GE(len, 0.6 * share) << "request " << r;
          EXPECT_LT(len, share + kDecodeTileKeys) << "request " << r;
          EXPECT_EQ(len % kDecodeTileKeys, 0);
        }
      } else {
        EXPECT_LE(rp.kv_len, 1.5 * share) << "request " << r << " left whole above the threshold";
      }
    }
    EXPECT_GT(cut, 0);
    EXPECT_LE(longest_cta(*plan), 1.5 * share);
  }
}

TEST(FlashInferSplitLong, UniformAndBalancedBatchesKeepTodaysPlan) {
  for (int bs : {1, 2, 4, 8, 12, 15, 16, 17, 32, 64, 160}) {
    for (int len : {1, 100, 256, 300, 1024, 4096, 32768, 131072}) {
      const auto reqs = decode_requests(std::vector<int>(static_cast<size_t>(bs), len));
      auto today = build_work_plan(reqs, h200(false));
      auto plan = build_work_plan(reqs, h200());
      ASSERT_TRUE(today.is_ok());
      ASSERT_TRUE(plan.is_ok());
      EXPECT_TRUE(same_plan(*today, *plan)) << "bs " << bs << " kv " << len;
      EXPECT_FALSE(plan->split_long) << "bs " << bs << " kv " << len;
    }
  }
  // The header's worked examples (today's chunk is within 1.5 x the share).
  for (const std::vector<int>& lens :
       std::vector<std::vector<int>>{{16384, 1000, 300, 20}, {32768}, {40000, 7, 300}}) {
    const auto reqs = decode_requests(lens);
    auto today = build_work_plan(reqs, h200(false));
    auto plan = build_work_plan(reqs, h200());
    ASSERT_TRUE(today.is_ok());
    ASSERT_TRUE(plan.is_ok());
    EXPECT_TRUE(same_plan(*today, *plan)) << "bs " << lens.size() << " first " << lens[0];
  }
  // Mildly uneven batches (longest <= 1.5 x share) keep today's plan too.
  std::vector<int> lens(16, 4096);
  lens[3] = 5500;  // share 4019: 5500 < 1.5 x 4019
  const auto reqs = decode_requests(lens);
  auto plan = build_work_plan(reqs, h200());
  ASSERT_TRUE(plan.is_ok());
  EXPECT_FALSE(plan->any_split);
}

TEST(FlashInferSplitLong, OffByDefaultAndOnlyForDecode) {
  std::vector<int> lens(16, 1024);
  lens[0] = 32768;
  const auto reqs = decode_requests(lens);
  EXPECT_FALSE(PlanConfig{}.split_long);
  auto off = build_work_plan(reqs, h200(false));
  ASSERT_TRUE(off.is_ok());
  EXPECT_FALSE(off->any_split);
  EXPECT_FALSE(off->split_long);
  PlanConfig no_split = h200();
  no_split.allow_split = false;
  auto p = build_work_plan(reqs, no_split);
  ASSERT_TRUE(p.is_ok());
  EXPECT_FALSE(p->any_split);
  // Prefill tiles: split-long never applies; without allow_split (extend plans) nothing splits,
  // with it (verify plans) only the uniform chunk rule does (FlashInferVerifySplit below): 15
  // requests are below the per-head target of 16, so the 32k one is cut, but not by split-long.
  PlanConfig prefill = h200();
  prefill.shape = TileShape::kPrefill;
  prefill.allow_split = false;
  auto q = build_work_plan(reqs, prefill);
  ASSERT_TRUE(q.is_ok());
  EXPECT_FALSE(q->any_split);
  EXPECT_FALSE(q->split_long);
  prefill.allow_split = true;
  const std::vector<PlanRequest> fifteen(reqs.begin(), reqs.begin() + 15);  // the 32k one first
  q = build_work_plan(fifteen, prefill);
  ASSERT_TRUE(q.is_ok());
  EXPECT_TRUE(q->any_split);
  EXPECT_FALSE(q->split_long);
}

TEST(FlashInferSplitLong, EdgeCases) {
  const PlanConfig cfg = h200();
  {  // no request
    const std::vector<PlanRequest> reqs;
    auto plan = build_work_plan(reqs, cfg);
    ASSERT_TRUE(plan.is_ok());
    EXPECT_TRUE(plan->items.empty());
    EXPECT_EQ(plan->num_partials, 0);
  }
  {  // all lengths 0 (q_len 0: nothing to attend) / 1
    for (int len : {0, 1}) {
      std::vector<PlanRequest> reqs = decode_requests(std::vector<int>(20, len));
      for (PlanRequest& r : reqs) r.q_len = len;
      auto plan = build_work_plan(reqs, cfg);
      ASSERT_TRUE(plan.is_ok());
      check_plan(*plan, reqs, cfg);
      EXPECT_FALSE(plan->any_split);
    }
  }
  {  // a long request with q_len 0 (no items) is not split; its neighbours' share ignores it
    std::vector<PlanRequest> reqs = decode_requests(std::vector<int>(20, 512));
    reqs[5].q_len = 0;
    reqs[5].kv_len = 100000;
    auto plan = build_work_plan(reqs, cfg);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, cfg);
    EXPECT_EQ(plan->requests[5].num_splits, 1);
    EXPECT_FALSE(plan->any_split);
    reqs[0].kv_len = 20000;  // now the rule runs: request 0 is cut, request 5 still not
    auto cut = build_work_plan(reqs, cfg);
    ASSERT_TRUE(cut.is_ok());
    check_plan(*cut, reqs, cfg);
    EXPECT_TRUE(cut->split_long);
    EXPECT_GT(cut->requests[0].num_splits, 1);
    EXPECT_EQ(cut->requests[5].num_splits, 1);
    EXPECT_EQ(cut->num_partials, cut->requests[0].num_splits);
  }
  {  // long requests of 257..300 keys cannot be cut below kMinSplitChunk into more than 2
    std::vector<int> lens(40, 1);
    lens[0] = 300;
    const auto reqs = decode_requests(lens);
    auto plan = build_work_plan(reqs, cfg);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, cfg);
    EXPECT_EQ(plan->requests[0].num_splits, 2);
    EXPECT_EQ(plan->items[0].kv_end, kMinSplitChunk);
  }
  {  // a longest request <= kMinSplitChunk: nothing to cut
    std::vector<int> lens(40, 1);
    lens[0] = kMinSplitChunk;
    const auto reqs = decode_requests(lens);
    auto plan = build_work_plan(reqs, cfg);
    ASSERT_TRUE(plan.is_ok());
    EXPECT_FALSE(plan->any_split);
    EXPECT_FALSE(plan->split_long);
  }
  {  // group 20: two q tiles per request, each cut the same way
    PlanConfig g = cfg;
    g.group = 20;
    std::vector<int> lens(16, 1024);
    lens[7] = 50000;
    const auto reqs = decode_requests(lens);
    auto plan = build_work_plan(reqs, g);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, g);
    EXPECT_GT(plan->requests[7].num_splits, 1);
    EXPECT_LE(longest_cta(*plan), 1.5 * share_of(reqs, g));
  }
  {  // one kv head, few slots, verify-style q_len > 1 (decode shape)
    PlanConfig one = cfg;
    one.num_kv_heads = 1;
    one.target_ctas = 3;
    std::vector<PlanRequest> reqs = decode_requests({5000, 100, 100, 9000});
    reqs[1].q_len = 3;
    auto plan = build_work_plan(reqs, one);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, one);
  }
  {  // split_long_pct below 100 is rejected, naming the field
    PlanConfig bad = cfg;
    bad.split_long_pct = 99;
    auto plan = build_work_plan(decode_requests({10}), bad);
    ASSERT_FALSE(plan.is_ok());
    EXPECT_NE(plan.status().message().find("split_long_pct 99"), std::string::npos);
  }
  {  // pct 100: cut anything above the share
    PlanConfig eager = cfg;
    eager.split_long_pct = 100;
    std::vector<int> lens(16, 4096);
    lens[0] = 5000;  // share 4035
    const auto reqs = decode_requests(lens);
    auto plan = build_work_plan(reqs, eager);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, eager);
    EXPECT_EQ(plan->requests[0].num_splits, 2);
  }
}

TEST(FlashInferSplitLong, GraphBound) {
  // Knob off: the bound is today's; knob on: + ceil(target / kv heads) items.
  const PlanConfig on = h200();
  const PlanConfig off = h200(false);
  EXPECT_EQ(max_decode_items(16, off), 16);
  EXPECT_EQ(max_decode_items(160, off), 160);
  EXPECT_EQ(max_decode_items(1, off), 16);
  EXPECT_EQ(max_decode_items(16, on), 16 + 17);
  EXPECT_EQ(max_decode_items(160, on), 160 + 17);
  // The worst case for the bound: many long requests just above the threshold plus short ones.
  for (int n_long = 1; n_long <= 16; ++n_long) {
    std::vector<int> lens(64, 1);
    for (int i = 0; i < n_long; ++i) lens[static_cast<size_t>(i)] = 100000 + 997 * i;
    const auto reqs = decode_requests(lens);
    auto plan = build_work_plan(reqs, on);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, on);
  }
}

TEST(FlashInferSplitLong, EagerAndReplayPlansAreIdentical) {
  // The backend plans eager forwards and graph replays with the same requests (decode: q_start r,
  // q_len 1) and the same PlanConfig; the plan is a pure function of them.
  std::mt19937 rng(5);
  for (int it = 0; it < 50; ++it) {
    std::vector<int> lens(static_cast<size_t>(1 + rng() % 64));
    for (int& l : lens) l = 1 + static_cast<int>(rng() % 40000);
    const auto reqs = decode_requests(lens);
    auto a = build_work_plan(reqs, h200());
    auto b = build_work_plan(reqs, h200());
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(b.is_ok());
    EXPECT_TRUE(same_plan(*a, *b));
  }
}

TEST(FlashInferSplitLong, RandomBatches) {
  std::mt19937 rng(10);
  int applied = 0;
  for (int it = 0; it < 400; ++it) {
    PlanConfig cfg = h200();
    cfg.num_kv_heads = std::vector<int>{1, 2, 8, 16}[rng() % 4];
    cfg.group = std::vector<int>{1, 4, 8, 20}[rng() % 4];
    cfg.target_ctas = std::vector<int>{1, 7, 132, 264, 1000}[rng() % 5];
    cfg.split_long_pct = std::vector<int>{100, 150, 200}[rng() % 3];
    if (rng() % 5 == 0) cfg.split_ctas = 1 + static_cast<int>(rng() % 300);
    const int bs = static_cast<int>(rng() % 70);
    const int max_len = std::vector<int>{300, 5000, 70000}[rng() % 3];
    std::vector<PlanRequest> reqs = decode_requests(std::vector<int>(static_cast<size_t>(bs), 0));
    for (PlanRequest& r : reqs) {
      r.kv_len = static_cast<int32_t>(1 + rng() % max_len);
      if (rng() % 10 == 0) r.kv_len = static_cast<int32_t>(max_len * 4);
    }
    SCOPED_TRACE("iteration " + std::to_string(it));
    auto plan = build_work_plan(reqs, cfg);
    ASSERT_TRUE(plan.is_ok());
    check_plan(*plan, reqs, cfg);
    if (plan->split_long) {
      ++applied;
      // The longest CTA: a whole request <= pct % of the share, or a chunk < share + one tile, or
      // kMinSplitChunk.
      const double share = share_of(reqs, cfg);
      EXPECT_LE(static_cast<double>(longest_cta(*plan)),
                std::max({cfg.split_long_pct / 100.0 * share, share + kDecodeTileKeys,
                          static_cast<double>(kMinSplitChunk)}));
    } else {
      auto today = build_work_plan(reqs, [&] {
        PlanConfig c = cfg;
        c.split_long = false;
        return c;
      }());
      ASSERT_TRUE(today.is_ok());
      EXPECT_TRUE(same_plan(*today, *plan));
    }
  }
  EXPECT_GT(applied, 50);
}

}  // namespace
}  // namespace attnkit::flashinfer

namespace attnkit::flashinfer {
namespace {

// Target-verify plans on prefill tiles with allow_split (the backend's verify_plan_config): the
// decode chunk rule cuts the long cached prefixes, every (request, key) in exactly one item, and
// the partial rows are per (split, draft token) with the merge's split count in reserved[0];
// requests left whole keep reserved[0] 0 (the merge leaves their tokens, written by the kernel).
TEST(FlashInferVerifySplit, PrefillTilesSplitPerDraftToken) {
  PlanConfig cfg = h200(false);
  cfg.shape = TileShape::kPrefill;
  cfg.target_ctas = 2 * kH200Sms;  // verify_plan_config: two prefill CTAs per SM
  constexpr int kDrafts = 8;
  // bs 1 at kv 32k + 8 drafts: 33 chunks of 1024 keys (<= 264 / 8 = 33 items per kv head).
  std::vector<PlanRequest> one = {PlanRequest{0, kDrafts, 32768 + kDrafts}};
  Result<WorkPlan> plan = build_work_plan(one, cfg);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->any_split);
  EXPECT_EQ(plan->chunk, 1024);
  const RequestPlan& r0 = plan->requests[0];
  EXPECT_EQ(r0.num_splits, 33);
  EXPECT_EQ(r0.reserved[0], 33);
  EXPECT_EQ(r0.partial_base, 0);
  EXPECT_EQ(plan->num_partials, 33 * kDrafts);
  ASSERT_EQ(plan->items.size(), 33u);
  std::vector<int> hits(32768 + kDrafts, 0);
  for (size_t i = 0; i < plan->items.size(); ++i) {
    const WorkItem& w = plan->items[i];
    EXPECT_EQ(w.q_row_begin, 0);
    EXPECT_EQ(w.split, static_cast<int>(i));
    for (int k = w.kv_begin; k < w.kv_end; ++k) ++hits[static_cast<size_t>(k)];
  }
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  // An uneven batch: the long requests split, the short one stays whole; partial rows are
  // disjoint runs of splits x drafts.
  std::vector<PlanRequest> mixed = {PlanRequest{0, kDrafts, 6000 + kDrafts},
                                    PlanRequest{kDrafts, kDrafts, 100 + kDrafts},
                                    PlanRequest{2 * kDrafts, kDrafts, 9000 + kDrafts}};
  plan = build_work_plan(mixed, cfg);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  const RequestPlan& a = plan->requests[0];
  const RequestPlan& b = plan->requests[1];
  const RequestPlan& c = plan->requests[2];
  EXPECT_GT(a.num_splits, 1);
  EXPECT_EQ(b.num_splits, 1);
  EXPECT_EQ(b.reserved[0], 0);
  EXPECT_GT(c.num_splits, a.num_splits);
  EXPECT_EQ(a.reserved[0], a.num_splits);
  EXPECT_EQ(c.partial_base, a.partial_base + a.num_splits * kDrafts);
  EXPECT_EQ(plan->num_partials, (a.num_splits + c.num_splits) * kDrafts);
  // Without allow_split (extend plans) nothing changes: one item per request.
  cfg.allow_split = false;
  plan = build_work_plan(one, cfg);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_FALSE(plan->any_split);
  EXPECT_EQ(plan->requests[0].reserved[0], 0);
  EXPECT_EQ(plan->items.size(), 1u);
}

// Target-verify plans on decode tiles (the backend's verify_plan_config with verify_decode_tiles):
// the decode's config with q_len N, q tiles of tile_rows (16 or 32) packed (draft, q head) rows,
// partial rows per (split, draft token) as on prefill tiles (the kernel's fused merge reads split
// s of token t at partial_base + s N + t), every (q tile, key) in exactly one item.
TEST(FlashInferVerifySplit, DecodeTilesSplitPerDraftToken) {
  PlanConfig cfg = h200(false);  // decode shape, group 4, 8 kv heads, 132 CTAs
  constexpr int kDrafts = 8;     // 32 rows per request
  for (const int rows : {16, 32}) {
    SCOPED_TRACE("tile rows " + std::to_string(rows));
    cfg.tile_rows = rows;
    const int q_tiles = kDrafts * cfg.group / rows;
    // bs 1 at kv 32k: q_tiles x chunks <= 132 / 8 = 16 items per kv head.
    std::vector<PlanRequest> one = {PlanRequest{0, kDrafts, 32768 + kDrafts}};
    Result<WorkPlan> plan = build_work_plan(one, cfg);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    ASSERT_TRUE(plan->any_split);
    const RequestPlan& r0 = plan->requests[0];
    EXPECT_EQ(r0.num_splits * q_tiles, static_cast<int>(plan->items.size()));
    EXPECT_LE(static_cast<int>(plan->items.size()), 16);
    EXPECT_EQ(plan->num_partials, r0.num_splits * kDrafts);
    std::vector<int> hits(static_cast<size_t>(q_tiles) * (32768 + kDrafts), 0);
    for (const WorkItem& w : plan->items) {
      EXPECT_EQ(w.q_row_begin % rows, 0);
      const int t = w.q_row_begin / rows;
      ASSERT_LT(t, q_tiles);
      for (int k = w.kv_begin; k < w.kv_end; ++k) {
        ++hits[static_cast<size_t>(t) * (32768 + kDrafts) + static_cast<size_t>(k)];
      }
    }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    // b16 kv 4k: one item per (request, q tile), unsplit (16 x q_tiles >= 16 per kv head).
    std::vector<PlanRequest> b16;
    for (int r = 0; r < 16; ++r) b16.push_back(PlanRequest{r * kDrafts, kDrafts, 4096 + kDrafts});
    plan = build_work_plan(b16, cfg);
    ASSERT_TRUE(plan.is_ok());
    EXPECT_FALSE(plan->any_split);
    EXPECT_EQ(static_cast<int>(plan->items.size()), 16 * q_tiles);
  }
  // 32-row tiles at two CTAs per SM (the backend's rule on SM90, session 61): b16 kv 4k x 8 drafts
  // (128 unsplit CTAs against a target of 264) splits each request in two, 32 items per kv head
  // within the graph bound verify_items (264 / 8 = 33), partial rows per (split, draft token),
  // every key of every request in exactly one item.
  cfg.tile_rows = 32;
  cfg.target_ctas = 2 * kH200Sms;
  std::vector<PlanRequest> b16;
  for (int r = 0; r < 16; ++r) b16.push_back(PlanRequest{r * kDrafts, kDrafts, 4096 + kDrafts});
  Result<WorkPlan> two = build_work_plan(b16, cfg);
  ASSERT_TRUE(two.is_ok()) << two.status().to_string();
  EXPECT_TRUE(two->any_split);
  EXPECT_EQ(static_cast<int>(two->items.size()), 32);
  EXPECT_LE(static_cast<int>(two->items.size()), 2 * kH200Sms / cfg.num_kv_heads);
  EXPECT_EQ(two->num_partials, 16 * 2 * kDrafts);
  std::vector<int> hits(16 * (4096 + kDrafts), 0);
  for (const WorkItem& w : two->items) {
    const int r = w.request;
    ASSERT_TRUE(r >= 0 && r < 16);
    EXPECT_EQ(two->requests[static_cast<size_t>(r)].num_splits, 2);
    EXPECT_EQ(w.q_row_begin, 0);  // the request's one 32-row q tile
    for (int k = w.kv_begin; k < w.kv_end; ++k) {
      ++hits[static_cast<size_t>(r) * (4096 + kDrafts) + static_cast<size_t>(k)];
    }
  }
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  cfg.tile_rows = -1;
  const std::vector<PlanRequest> small = {PlanRequest{0, 1, 5}};
  EXPECT_FALSE(build_work_plan(small, cfg).is_ok());
}

}  // namespace
}  // namespace attnkit::flashinfer
