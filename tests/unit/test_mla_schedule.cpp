// The MLA decode tile scheduler (src/backends/mla/kernels/mla_tile_scheduler.h) on the host: the
// same function the schedule kernel runs. Every tile of every request is covered exactly once,
// segment partial indices are unique and inside split_indptr, the load is balanced, and the
// header's worked examples hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/mla/kernels/mla_decode.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"

namespace attnkit::mla {
namespace {

struct Schedule {
  std::vector<int32_t> sched, indptr;
};

// min_parts < 0: parts (every part used as before session 21).
Schedule build(const std::vector<int>& lens, int parts, int min_parts = -1) {
  Schedule s;
  s.sched.assign(static_cast<size_t>(parts) * kSchedWords, -1);
  s.indptr.assign(lens.size() + 1, -1);
  build_schedule(
      static_cast<int>(lens.size()), parts, min_parts < 0 ? parts : min_parts,
      [&](int b) { return lens[static_cast<size_t>(b)]; }, s.sched.data(), s.indptr.data());
  return s;
}

// Walks the schedule as the kernel does; checks coverage and partial indices; returns the
// per-part cost (tiles + overhead per segment).
std::vector<int64_t> check(const std::vector<int>& lens, int parts, int min_parts = -1) {
  const Schedule s = build(lens, parts, min_parts);
  const int bs = static_cast<int>(lens.size());
  std::vector<std::vector<int>> covered(static_cast<size_t>(bs));
  std::vector<int> partials;
  std::vector<int64_t> cost(static_cast<size_t>(parts), 0);
  for (int part = 0; part < parts; ++part) {
    const int32_t* w = s.sched.data() + part * kSchedWords;
    const int last = std::min(w[2], bs - 1);
    for (int b = w[0]; b <= last; ++b) {
      int t0 = 0, t1 = 0, partial = 0;
      if (!segment_of(w, s.indptr.data(), b, lens[static_cast<size_t>(b)], &t0, &t1, &partial)) {
        continue;
      }
      for (int t = t0; t < t1; ++t) covered[static_cast<size_t>(b)].push_back(t);
      EXPECT_GE(partial, s.indptr[static_cast<size_t>(b)]);
      EXPECT_LT(partial, s.indptr[static_cast<size_t>(b) + 1]);
      partials.push_back(partial);
      cost[static_cast<size_t>(part)] += (t1 - t0) + kFixedOverheadTiles;
    }
  }
  for (int b = 0; b < bs; ++b) {
    std::vector<int>& c = covered[static_cast<size_t>(b)];
    std::sort(c.begin(), c.end());
    const int n = num_tiles(lens[static_cast<size_t>(b)]);
    EXPECT_EQ(static_cast<int>(c.size()), n) << "request " << b;
    if (static_cast<int>(c.size()) != n) continue;
    for (int t = 0; t < n; ++t) EXPECT_EQ(c[static_cast<size_t>(t)], t);
  }
  std::sort(partials.begin(), partials.end());
  EXPECT_TRUE(std::adjacent_find(partials.begin(), partials.end()) == partials.end());
  EXPECT_EQ(static_cast<int>(partials.size()), s.indptr[static_cast<size_t>(bs)]);
  EXPECT_LE(s.indptr[static_cast<size_t>(bs)], bs + parts) << "partial buffer bound";
  return cost;
}

TEST(MlaSchedule, WorkedExamples) {
  Schedule a = build({640, 64}, 2);
  EXPECT_EQ(a.indptr, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.sched[2], 1);  // part 0 ends at (1, 0)
  EXPECT_EQ(a.sched[3], 0);
  Schedule b = build({2048, 64}, 2);
  EXPECT_EQ(b.indptr, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(b.sched[3], 22);               // part 0 takes tiles [0, 22) of request 0
  EXPECT_EQ(b.sched[kSchedWords + 4], 1);  // part 1 starts with segment 1
}

TEST(MlaSchedule, CoversEveryTileOnceAndBalances) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int bs = 1 + static_cast<int>(rng() % 140);
    const int parts = 1 + static_cast<int>(rng() % 140);
    std::vector<int> lens(static_cast<size_t>(bs));
    for (int& n : lens) n = static_cast<int>(rng() % (trial % 3 == 0 ? 20000 : 3000));
    const std::vector<int64_t> cost = check(lens, parts);
    int64_t total = 0;
    for (int n : lens) total += num_tiles(n) + kFixedOverheadTiles;
    const int64_t payload = (total + parts - 1) / parts + kFixedOverheadTiles;
    // Every part but the last stays within its budget (the last takes the rounding remainder).
    for (int p = 0; p + 1 < parts; ++p) EXPECT_LE(cost[static_cast<size_t>(p)], payload);
  }
}

TEST(MlaSchedule, UniformBatchKeepsRequestsWhole) {
  // batch 128, kv 4096 (64 tiles each), 66 parts (128 heads on 132 SMs): payload =
  // ceil(128 * 69 / 66) + 5 = 139, so every part takes two whole requests (138) and nothing is
  // split; 64 of the 66 parts work (the model charges a split 5 tiles of overhead).
  const std::vector<int64_t> cost = check(std::vector<int>(128, 4096), 66);
  const Schedule s = build(std::vector<int>(128, 4096), 66);
  EXPECT_EQ(s.indptr.back(), 128) << "no request is split";
  EXPECT_EQ(std::count(cost.begin(), cost.end(), 138), 64);
  // batch 4 of 16384 keys (256 tiles) over 132 parts: payload ceil(4 * 261 / 132) + 5 = 13, so
  // every request is cut into 32 segments of 8 tiles: 128 parts at cost 13, 4 idle.
  const std::vector<int64_t> few = check(std::vector<int>(4, 16384), 132);
  EXPECT_EQ(std::count(few.begin(), few.end(), 13), 128);
  EXPECT_EQ(build(std::vector<int>(4, 16384), 132).indptr.back(), 128);
}

// Fewer parts where that keeps every request whole (build_schedule's min_parts; the 64-row tiles
// may leave kScheduleIdleSms SMs idle): batch 128 x kv 8192 (128 tiles each) over 66 parts splits
// (payload ceil(128 * 133 / 66) + 5 = 263: the second request of a part gets 125 of its 128
// tiles); 65 parts (payload 267) hold two whole requests each in 64 of them, so that is the
// schedule, and parts 64 and 65 get nothing. A batch that no part count in range keeps whole keeps
// all 66 parts (and its splits); every tile is still covered once either way (check).
TEST(MlaSchedule, FewerPartsWhenThatKeepsRequestsWhole) {
  EXPECT_EQ(schedule_min_parts(66, 128), 64);  // 64-row tiles x 2
  EXPECT_EQ(schedule_min_parts(33, 256), 32);  // x 4
  EXPECT_EQ(schedule_min_parts(16, 512), 16);  // x 8: 4 idle SMs are not a whole part
  EXPECT_EQ(schedule_min_parts(132, 16), 132) << "16-row tiles keep one part per SM";
  EXPECT_EQ(schedule_min_parts(132, 32), 132) << "32-row tiles keep one part per SM";
  EXPECT_EQ(schedule_min_parts(2, 128), 1);
  const std::vector<int> kv8k(128, 8192);
  EXPECT_GT(build(kv8k, 66).indptr.back(), 128) << "66 parts split requests";
  const Schedule s = build(kv8k, 66, 64);
  EXPECT_EQ(s.indptr.back(), 128) << "no request is split";
  const std::vector<int64_t> cost = check(kv8k, 66, 64);
  EXPECT_EQ(std::count(cost.begin(), cost.end(), 2 * 133), 64);
  EXPECT_EQ(cost[64], 0);
  EXPECT_EQ(cost[65], 0);
  for (int part = 64; part < 66; ++part) {
    EXPECT_EQ(s.sched[static_cast<size_t>(part) * kSchedWords], 128);
    EXPECT_EQ(s.sched[static_cast<size_t>(part) * kSchedWords + 2], 128);
  }
  // s_q 2 x 128 heads (four 64-row tiles): 33 parts split b128 x kv 4k, 32 keep quads whole.
  EXPECT_EQ(build(std::vector<int>(128, 4097), 33, 32).indptr.back(), 128);
  EXPECT_GT(build(std::vector<int>(128, 4097), 33).indptr.back(), 128);
  // Uneven lengths: no part count in [64, 66] keeps them whole, so all 66 are used as before.
  std::vector<int> uneven;
  for (int b = 0; b < 97; ++b) uneven.push_back(1000 + 611 * b % 9000);
  const Schedule u = build(uneven, 66, 64);
  const Schedule u66 = build(uneven, 66);
  EXPECT_EQ(u.sched, u66.sched);
  EXPECT_EQ(u.indptr, u66.indptr);
  check(uneven, 66, 64);
  // Random batches with the slack: coverage and partial indices hold.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int bs = 1 + static_cast<int>(rng() % 200);
    const int parts = 2 + static_cast<int>(rng() % 70);
    std::vector<int> lens(static_cast<size_t>(bs));
    const int base = static_cast<int>(rng() % 9000);
    for (int& n : lens) n = trial % 2 == 0 ? base : static_cast<int>(rng() % 9000);
    check(lens, parts, std::max(1, parts - 2));
  }
}

TEST(MlaSchedule, RowTilesAndParts) {
  EXPECT_EQ(rows_per_cta(16), 16);
  EXPECT_EQ(rows_per_cta(32), 32);
  EXPECT_EQ(rows_per_cta(128), 64);
  EXPECT_EQ(row_tiles(128), 2);
  EXPECT_EQ(row_tiles(256), 4);
  EXPECT_EQ(num_parts(132, 16), 132);
  EXPECT_EQ(num_parts(132, 128), 66);
  EXPECT_EQ(num_parts(132, 256), 33);
}

TEST(MlaSchedule, EmptyRequestsGetOneMaskedTile) {
  check({0, 0, 5000, 0}, 8);
  EXPECT_EQ(num_tiles(0), 1);
}

}  // namespace
}  // namespace attnkit::mla
