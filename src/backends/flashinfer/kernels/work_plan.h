// The flashinfer backend's host planner: turns one forward's host lengths into the work items of
// the paged attention kernel (plan/run split: planned once per forward, shared by every layer).
//
// Decode (load-balanced split-KV): every request is cut into chunks of `chunk` keys, one CTA per
// (chunk, q tile, kv head). The chunk is the smallest multiple of the tile that keeps the grid
// within one wave of `target_ctas`, so long requests get many chunks and short ones one, and no CTA
// holds much more work than another. Partial results are merged by LSE afterwards.
//
//   ctas(chunk) = num_kv_heads * q_tiles * sum_r ceil(kv_len_r / chunk)
//   chunk       = min { c = k * tile, c >= min_chunk : ctas(c) <= target_ctas }, else no split
//
// Worked example (H100/H200: 132 SMs, target 1 CTA per SM = 132; 32 q / 8 kv heads so q_tiles 1):
//   * bs 16, kv 4096: 16 * 8 = 128 CTAs unsplit fill the target -> no split.
//   * bs 1, kv 32768: chunk 2048 gives 8 * 16 = 128 -> 16 chunks of 2048 keys.
//   * bs 4, kv 16384 / 1000 / 300 / 20: chunk 1280 -> 13 + 1 + 1 + 1 chunks (8 * 16 = 128): the
//     long request no longer decides the step time alone.
//   * bs 64, kv 4096: 512 CTAs unsplit already exceed the target -> no split.
// (ATTNKIT_DECODE_BLOCKS_PER_SM=2, the target before 2026-11-22 session 4: chunk 2048 at bs 16,
// 1024 at bs 1 kv 32768, 576 in the bs 4 example.)
// Prefill: one CTA per (tile of packed rows, kv head), whole key range (the kernel clips it to the
// causal / window bound of the tile).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/status.h"
#include "backends/flashinfer/kernels/paged_params.h"

namespace attnkit::flashinfer {

// Grid target per SM: one decode CTA (4 warps) per SM, although two fit (kDecodeCtasPerSm): with
// the compact streaming loop, 128 CTAs of 2048 keys stream b1 kv 32k 11% faster than 256 of 1024
// (fewer splits to merge, half the per-CTA ramp and tail per byte) and b16 kv 4k as fast as 2 x 128
// split CTAs (docs/perf/fidecode_notes.md). Batches of more CTAs still run two per SM.
inline constexpr int kTargetCtasPerSm = 1;
inline constexpr int kMinSplitChunk = 256;  // keys: the merge's extra traffic stays ~1% of the read

struct PlanConfig {
  TileShape shape = TileShape::kDecode;
  int num_kv_heads = 1;
  int group = 1;        // q heads per kv head
  int target_ctas = 1;  // kTargetCtasPerSm * SM count
  bool allow_split = true;
  // Experiment knob (ATTNKIT_FLASHINFER_SPLIT_CTAS): the grid target of a plan that splits
  // (target_ctas still decides whether it splits). 0: target_ctas.
  int split_ctas = 0;
};

// Per-request inputs (host copies of the batch lengths).
struct PlanRequest {
  int32_t q_start = 0;
  int32_t q_len = 0;
  int32_t kv_len = 0;
};

struct WorkPlan {
  std::vector<RequestPlan> requests;
  std::vector<WorkItem> items;
  int num_partials = 0;  // partial rows (sum of splits of split requests)
  int chunk = 0;         // decode chunk (0 = no split)
  bool any_split = false;
  // Serialises header + requests + items into `words` (resized).
  void serialize(std::vector<int32_t>* words) const;
  static int64_t words_for(int64_t bs, int64_t items) {
    return kPlanHeaderWords + bs * kRequestWords + items * kItemWords;
  }
};

// Builds the plan; kInvalidArgument names a negative length or an empty config.
Result<WorkPlan> build_work_plan(std::span<const PlanRequest> requests, const PlanConfig& config);

// Upper bounds for a CUDA-graph workspace of up to max_bs decode requests.
int64_t max_decode_items(int max_bs, const PlanConfig& config);

}  // namespace attnkit::flashinfer
