// The fa3 host planner: plan layout, longest-first tile order (the header's worked example), empty
// requests, the error for inconsistent lengths; key blocks, TMA box rows and the persistent
// schedule (fa3_params.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/fa3/kernels/fa3_params.h"
#include "backends/fa3/kernels/tile_plan.h"

namespace attnkit::fa3 {
namespace {

struct TileWords {
  int32_t request, m_block;
  bool operator==(const TileWords&) const = default;
};

std::vector<TileWords> tiles_of(const TilePlan& plan, int bs) {
  std::vector<TileWords> t;
  const size_t first = kPlanHeaderWords + static_cast<size_t>(bs) * kRequestWords;
  for (size_t i = first; i + 1 < plan.words.size(); i += kTileWords) {
    t.push_back({plan.words[i], plan.words[i + 1]});
  }
  return t;
}

TEST(Fa3PlanTest, WorkedExampleOfTheHeader) {
  const std::vector<TileRequest> reqs = {{0, 300, 300}, {300, 1, 77}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->num_tiles, 4);
  EXPECT_EQ(plan->words[0], 4);
  ASSERT_EQ(plan->words.size(),
            static_cast<size_t>(kPlanHeaderWords + 2 * kRequestWords + 4 * kTileWords));
  // V^T units (vt_units: 2 per 192 keys): 2 * 2 + 2 * 1.
  EXPECT_EQ(plan->words[1], 6);
  // Requests: q_start, q_len, kv_len, first V^T block.
  EXPECT_EQ(plan->words[kPlanHeaderWords + 0], 0);
  EXPECT_EQ(plan->words[kPlanHeaderWords + 1], 300);
  EXPECT_EQ(plan->words[kPlanHeaderWords + 2], 300);
  EXPECT_EQ(plan->words[kPlanHeaderWords + 3], 0);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 0], 300);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 2], 77);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 3], 4);
  const std::vector<TileWords> expected = {{0, 2}, {0, 1}, {0, 0}, {1, 0}};
  EXPECT_EQ(tiles_of(*plan, 2), expected);
}

TEST(Fa3PlanTest, PrefixRaisesEveryTileAndEmptyRequestsHaveNone) {
  // A 1000-key prefix: every tile of request 1 reads more keys than request 0's longest tile.
  const std::vector<TileRequest> reqs = {{0, 200, 200}, {200, 0, 5}, {200, 129, 1129}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_TRUE(plan.is_ok());
  const std::vector<TileWords> expected = {{2, 1}, {2, 0}, {0, 1}, {0, 0}};
  EXPECT_EQ(tiles_of(*plan, 3), expected);
}

TEST(Fa3PlanTest, TilesOf192RowsForThreeConsumerWarpgroups) {
  // block_m 192 (d 64, ATTNKIT_FA3_WG3): 300 new tokens -> tiles m 0, 1 (rows 0..191, 192..299),
  // a 1000-key prefix request of 129 tokens -> one tile; longest first.
  const std::vector<TileRequest> reqs = {{0, 300, 300}, {300, 129, 1129}};
  Result<TilePlan> plan = build_tile_plan(reqs, 192);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->num_tiles, 3);
  const std::vector<TileWords> expected = {{1, 0}, {0, 1}, {0, 0}};
  EXPECT_EQ(tiles_of(*plan, 2), expected);
}

TEST(Fa3PlanTest, RejectsInconsistentLengths) {
  const std::vector<TileRequest> reqs = {{0, 4, 4}, {4, 9, 3}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("request 1"), std::string::npos)
      << plan.status().message();
}

TEST(Fa3PlanTest, KeyBlockFollowsTheHeadDim) {
  EXPECT_EQ(default_block_n(64), 192);
  EXPECT_EQ(default_block_n(128), 128);
  EXPECT_EQ(default_block_n(256), 80);
  for (int d : {64, 128, 256}) EXPECT_TRUE(block_n_supported(d, default_block_n(d)));
  EXPECT_TRUE(block_n_supported(256, 64));
  EXPECT_TRUE(block_n_supported(64, 128));
  EXPECT_FALSE(block_n_supported(128, 192));
  EXPECT_FALSE(block_n_supported(128, 176));
  EXPECT_FALSE(block_n_supported(128, 80));
  EXPECT_FALSE(block_n_supported(96, 128));
}

TEST(Fa3PlanTest, TmaBoxesNeverCrossAPage) {
  EXPECT_EQ(tma_rows_for(16, 128), 16);
  EXPECT_EQ(tma_rows_for(64, 128), 64);
  EXPECT_EQ(tma_rows_for(256, 128), 128);  // one key block of a larger page
  EXPECT_EQ(tma_rows_for(64, 80), 16);     // 80 = 5 x 16: 16-row boxes inside 64-row pages
  EXPECT_EQ(tma_rows_for(8, 80), 8);
  EXPECT_EQ(tma_rows_for(16, 192), 16);  // d 64 blocks of 192 = 3 x 64
  EXPECT_EQ(tma_rows_for(256, 192), 64);
  EXPECT_EQ(tma_rows_for(1, 128), 0);  // gathered
  EXPECT_EQ(tma_rows_for(4, 128), 0);
  EXPECT_EQ(tma_rows_for(24, 128), 0);  // not a power of two
  for (int page : {8, 16, 32, 64, 128, 256, 1024}) {
    for (int block : {64, 80, 128}) {
      const int rows = tma_rows_for(page, block);
      ASSERT_GT(rows, 0);
      EXPECT_EQ(block % rows, 0) << page << " " << block;  // boxes tile the key block
      EXPECT_EQ(page % rows, 0) << page << " " << block;   // and stay inside one page
    }
  }
}

TEST(Fa3PlanTest, PersistentScheduleCoversEveryUnitOnce) {
  for (bool zigzag : {false, true}) {
    for (int grid : {1, 2, 7, 132}) {
      for (int units : {0, 1, 5, 131, 132, 133, 263, 264, 1000, 4096}) {
        std::vector<int> seen(static_cast<size_t>(units), 0);
        for (int cta = 0; cta < grid; ++cta) {
          int prev = -1;
          for (int r = 0, u = schedule_unit(0, cta, grid, zigzag); u < units;
               u = schedule_unit(++r, cta, grid, zigzag)) {
            EXPECT_GT(u, prev);
            prev = u;
            ++seen[static_cast<size_t>(u)];
          }
        }
        for (int u = 0; u < units; ++u) {
          EXPECT_EQ(seen[static_cast<size_t>(u)], 1)
              << "unit " << u << " of " << units << " grid " << grid << " zigzag " << zigzag;
        }
      }
    }
  }
  // Zigzag: CTA 0 takes units 0, 2G - 1, 2G, ...
  EXPECT_EQ(schedule_unit(1, 0, 132, true), 263);
  EXPECT_EQ(schedule_unit(2, 0, 132, true), 264);
}

}  // namespace
}  // namespace attnkit::fa3
