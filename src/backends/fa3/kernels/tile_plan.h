// The fa3 backend's host planner for the SM90 prefill kernel: turns one forward's host lengths
// into the plan words of fa3_params.h (planned once per forward, shared by every layer). Plain
// C++, unit-tested on the CPU (tests/unit/test_fa3_plan.cpp).
//
// One tile = kBlockM (128) consecutive new tokens of one request; the kernel runs every tile for
// every q head. Tiles are sorted by descending key count under the causal mask (stable, so equal
// tiles keep request order): a persistent CTA strides through the list, so the heavy tiles start
// first and the short ones fill the tail.
//
// Worked example: requests (q_len 300, kv_len 300) and (q_len 1, kv_len 77):
//   request 0 -> tiles m 0, 1, 2 reading 128, 256, 300 keys; request 1 -> tile m 0 reading 77.
//   Order: (0, 2) 300, (0, 1) 256, (0, 0) 128, (1, 0) 77.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/status.h"

namespace attnkit::fa3 {

struct TileRequest {
  int32_t q_start = 0;  // first of its tokens in [0, T)
  int32_t q_len = 0;    // new tokens
  int32_t kv_len = 0;   // keys: cached prefix + new tokens (>= q_len)
};

struct TilePlan {
  std::vector<int32_t> words;  // header + requests + tiles (fa3_params.h layout)
  int num_tiles = 0;
};

// kInvalidArgument names the first request with q_len < 0 or kv_len < q_len. block_m: query rows
// per tile (Fa3Params::block_m; 192 for the three-warpgroup d 64 kernel).
Result<TilePlan> build_tile_plan(std::span<const TileRequest> requests, int block_m = 128);

}  // namespace attnkit::fa3
