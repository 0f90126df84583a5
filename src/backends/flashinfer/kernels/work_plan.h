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
// Worked example (H100/H200: 132 SMs, target 2 CTAs per SM = 264; 32 q / 8 kv heads so q_tiles 1):
//   * bs 16, kv 4096: 16 * 8 = 128 CTAs unsplit; chunk 2048 gives 256 <= 264 -> 2 chunks each.
//   * bs 1, kv 32768: chunk 1024 gives 8 * 32 = 256 -> 32 chunks of 1024 keys.
//   * bs 4, kv 16384 / 1000 / 300 / 20: chunk 576 -> 29 + 2 + 1 + 1 chunks (8 * 33 = 264): the
//     long request no longer decides the step time alone.
//   * bs 64, kv 4096: 512 CTAs unsplit already exceed the target -> no split.
// Prefill: one CTA per (tile of packed rows, kv head), whole key range (the kernel clips it to the
// causal / window bound of the tile).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/status.h"
#include "backends/flashinfer/kernels/paged_params.h"

namespace attnkit::flashinfer {

// Grid target per SM: one wave of the decode CTAs that fit on an SM (see ../PERF_NOTES.md).
inline constexpr int kTargetCtasPerSm = kDecodeCtasPerSm;
inline constexpr int kMinSplitChunk = 256;  // keys: the merge's extra traffic stays ~1% of the read

struct PlanConfig {
  TileShape shape = TileShape::kDecode;
  int num_kv_heads = 1;
  int group = 1;        // q heads per kv head
  int target_ctas = 1;  // kTargetCtasPerSm * SM count
  bool allow_split = true;
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
