// The fa3 host planner (see tile_plan.h).
#include "backends/fa3/kernels/tile_plan.h"

#include <algorithm>
#include <string>

#include "backends/fa3/kernels/fa3_params.h"

namespace attnkit::fa3 {

Result<TilePlan> build_tile_plan(std::span<const TileRequest> requests, int block_m) {
  struct Tile {
    int32_t request, m_block, work;
  };
  std::vector<Tile> tiles;
  TilePlan plan;
  plan.words.assign(kPlanHeaderWords, 0);
  int32_t vt_blocks = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const TileRequest& q = requests[r];
    if (q.q_len < 0 || q.kv_len < q.q_len) {
      return Status::invalid_argument("fa3: request " + std::to_string(r) + " has " +
                                      std::to_string(q.q_len) + " new tokens but kv_len " +
                                      std::to_string(q.kv_len) +
                                      " (needs 0 <= new tokens <= kv_len)");
    }
    plan.words.insert(plan.words.end(), {q.q_start, q.q_len, q.kv_len, vt_blocks});
    vt_blocks += vt_units(q.kv_len);
    const int32_t prefix = q.kv_len - q.q_len;
    for (int32_t m = 0; m * block_m < q.q_len; ++m) {
      // The tile's last row sees prefix + (m + 1) * block_m keys (clipped to kv_len).
      tiles.push_back({static_cast<int32_t>(r), m, std::min(q.kv_len, prefix + (m + 1) * block_m)});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.work > b.work; });
  plan.words[0] = static_cast<int32_t>(tiles.size());
  plan.words[1] = vt_blocks;
  for (const Tile& t : tiles) plan.words.insert(plan.words.end(), {t.request, t.m_block});
  plan.num_tiles = static_cast<int>(tiles.size());
  return plan;
}

}  // namespace attnkit::fa3
