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
// Split-long (experiment, PlanConfig::split_long, ATTNKIT_FLASHINFER_SPLIT_LONG=1, default off;
// session 10, not yet run on a GPU): the rule above splits only while a forward has fewer items
// than target_ctas / num_kv_heads (16 on the H200 with 8 kv heads), so at bs >= 16 an uneven batch
// (one 32k request among fifteen 1k ones) runs as long as its longest item. With split_long, the
// per-slot share is
//   share = num_kv_heads * sum_r q_tiles_r * kv_len_r / target_ctas   (keys per CTA slot)
// and, when the plan above would leave a CTA with more than split_long_pct % of the share (no
// split at bs >= 16, or a split chunk much above the share), each (request, q tile) whose kv_len
// exceeds split_long_pct % of the share is cut into k = ceil(kv_len / ceil(share)) chunks of
// round_up(ceil(kv_len / k), tile) keys (at least kMinSplitChunk); every other request stays whole.
// The chunk is per request (RequestPlan::num_splits / partial_base, WorkItem::kv_begin / kv_end /
// split already carry it, so the split kernel and its fused merge run it unchanged). Uniform
// batches keep today's plan (their items are <= ~1.03 x share). Items per kv head <=
// sum_r q_tiles_r + ceil(target_ctas / num_kv_heads) (max_decode_items raises the graph bound by
// that when split_long is on).
//   * bs 16, 32768 + 15 x 1024 (H200): share 2917 -> the long request in 12 chunks of 2752 keys
//     (last 2496), the others whole: 27 items per head (216 CTAs, 2 per SM) instead of 16 with
//     one 32768-key CTA per head.
// Prefill: one CTA per (tile of packed rows, kv head), whole key range (the kernel clips it to the
// causal / window bound of the tile). With allow_split (target-verify forwards, eager and graph
// replays: a few drafts per request over a long cached prefix, so one tile per request and kv
// head), the same chunk rule cuts the keys; the partial rows are per (split, token) and the caller
// merges them (cascade_merge with the plan as its suffix plan: RequestPlan::reserved[0] =
// num_splits). Target verify on decode tiles (TileShape::kDecode with q_len = N drafts): q tiles of
// 16 (draft, q head) rows, the decode's chunk rule, partial rows per (split, token) as on prefill
// tiles, merged by the kernel's last split CTA.
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
  // Experiment knob (ATTNKIT_FLASHINFER_SPLIT_LONG=1): cut requests much longer than the per-slot
  // share even where the rule above does not split (see the header). split_long_pct: "much
  // longer" = more than this percentage of the share (>= 100).
  bool split_long = false;
  int split_long_pct = 150;
  // Packed rows of one work item; 0 = the shape's (kDecodeTileRows / kPrefillTileRows). Target
  // verify on decode tiles: 16, or 32 (the two-M-tile CTA, PagedParams::decode_tile_rows).
  int tile_rows = 0;
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
  int chunk = 0;         // decode chunk (0 = no split; split_long: the largest request chunk)
  bool any_split = false;
  bool split_long = false;  // the split-long rule chose the chunks (per request)
  // Serialises header + requests + items into words[0, serialized_words()) (every word written),
  // or into `words` (resized).
  void serialize(int32_t* words) const;
  void serialize(std::vector<int32_t>* words) const;
  int64_t serialized_words() const {
    return words_for(static_cast<int64_t>(requests.size()), static_cast<int64_t>(items.size()));
  }
  static int64_t words_for(int64_t bs, int64_t items) {
    return kPlanHeaderWords + bs * kRequestWords + items * kItemWords;
  }
};

// Builds the plan; kInvalidArgument names a negative length or an empty config.
Result<WorkPlan> build_work_plan(std::span<const PlanRequest> requests, const PlanConfig& config);
// The same into *dst, reusing its vectors' storage (a CUDA-graph replay's refresh then allocates
// nothing once the vectors have grown); *dst is unspecified after an error.
Status build_work_plan(std::span<const PlanRequest> requests, const PlanConfig& config,
                       WorkPlan* dst);

// Upper bounds for a CUDA-graph workspace of up to max_bs decode requests.
int64_t max_decode_items(int max_bs, const PlanConfig& config);

}  // namespace attnkit::flashinfer
