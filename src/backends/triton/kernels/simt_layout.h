// Thread layout of the SIMT attention kernel as constexpr functions, so the host planner (which
// sizes grids and workspaces) and the kernel traits agree by construction.
#pragma once

namespace attnkit::triton::simt {

inline constexpr int kThreads = 128;
inline constexpr int kWarpSize = 32;
inline constexpr int kVec = 8;  // elements per vector access
// q + accumulator floats per thread for all q heads of a tile.
inline constexpr int kRegisterFloats = 80;
// q heads per block: 4 covers the common group of 4 (32 q / 8 kv heads) exactly; larger groups
// take several tiles (their K/V re-reads mostly hit L2).
inline constexpr int kMaxGqaTile = 4;

constexpr int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}
constexpr int pow2_floor(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
constexpr int imin(int a, int b) { return a < b ? a : b; }
constexpr int imax(int a, int b) { return a > b ? a : b; }

// Lanes sharing one key row: enough 8-element vectors to cover the wider head dim, <= a warp.
constexpr int threads_per_row(int dqk, int dv) {
  return imin(kWarpSize, pow2_ceil((imax(dqk, dv) + kVec - 1) / kVec));
}
constexpr int vecs_per_thread(int d, int tpr) { return (d / kVec + tpr - 1) / tpr; }
// q heads of one kv head handled per block.
constexpr int gqa_tile(int dqk, int dv) {
  const int tpr = threads_per_row(dqk, dv);
  const int per_head = kVec * (vecs_per_thread(dqk, tpr) + vecs_per_thread(dv, tpr));
  return imax(1, imin(kMaxGqaTile, pow2_floor(kRegisterFloats / per_head)));
}

}  // namespace attnkit::triton::simt
