// The encoded default decode plan built on the GPU from the compact work plan, for CUDA-graph
// replay refreshes (flashinfer backend): the host uploads WorkPlan::serialize's words (header,
// bs RequestPlan, items WorkItem: 16 KB at bs 256) and this kernel writes the balanced kernel's
// plan (balanced_plan.h: header, requests, cta_begin, one segment per (item, kv head): 80 KB at
// bs 256), word for word what BalancedPlan::serialize writes for balanced_from_work_plan's plan.
// Plans without padding items (build_work_plan's plans have none): CTA k = (item k / heads, kv
// head k % heads), slot c walks CTAs c, c + slots, ... (one CTA per slot up to items x heads =
// slots, several past it). expand_plan_from_lengths below: the same plan for an unsplit decode
// batch, from its lengths alone. Host-facing: no CUDA types.
#pragma once

#include <cstdint>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::flashinfer {

struct PlanExpandParams {
  // [kPlanHeaderWords + bs x kRequestWords + items x kItemWords] (device): WorkPlan::serialize's
  // words.
  const int32_t* work_words = nullptr;
  int bs = 0;       // requests
  int items = 0;    // work items (none padding)
  int heads = 1;    // kv heads
  int q_tiles = 1;  // decode q tiles per request (the partial-row formula)
  int slots = 1;
  // [BalancedPlan::words_for(bs, slots, max(slots, items x heads))] (device): the balanced
  // kernel's plan.
  int32_t* out = nullptr;
};

// The most segments (items x heads) an expansion writes: cta_begin and the segment indices are
// 32-bit.
inline constexpr int64_t kMaxPlanSegments = int64_t{1} << 24;

// Launches the expansion on stream; kInvalidArgument names a field out of range (items x heads
// past kMaxPlanSegments, a count < 0, heads or slots < 1).
Status expand_encoded_plan(const PlanExpandParams& p, StreamHandle stream);

// The same plan with nothing uploaded, for a decode batch that build_work_plan does not split (bs x
// q_tiles >= its per-head CTA target, or no request longer than kMinSplitChunk; split_long off):
// its work plan is then a function of the lengths alone (request r: q_start r, q_len 1, kv_len
// kv_len[r], one unsplit item per q tile), so the lengths travel in the launch's parameters (4 KB,
// no staging buffer, no copy, no event) and the kernel writes what expand_encoded_plan writes for
// that work plan. Up to kPlanLengthsMax requests (a CUDA-graph replay of a larger batch uploads
// its work plan instead).
inline constexpr int kPlanLengthsMax = 1000;
struct PlanFromLengthsParams {
  int bs = 0;
  int heads = 1;    // kv heads
  int q_tiles = 1;  // decode q tiles per request
  int slots = 1;
  int granule = 1;  // cut_plan_from_lengths: BalanceConfig::granule
  // [BalancedPlan::words_for(bs, slots, max(slots, segments))] (device): the balanced kernel's
  // plan.
  int32_t* out = nullptr;
  int32_t kv_len[kPlanLengthsMax] = {};  // [bs] used, each >= 1
};
static_assert(sizeof(PlanFromLengthsParams) <= 4096, "the classic kernel-parameter limit");

// Launches it on stream; kInvalidArgument names a field out of range or a kv_len < 1.
Status expand_plan_from_lengths(const PlanFromLengthsParams& p, StreamHandle stream);

// The cut plan (build_balanced_plan: the batch's keys cut into `slots` chunks of equal size on
// multiples of `granule` from each item's start) of the decode batch whose requests are
// (q_start r, q_len 1, kv_len[r]) with BalanceConfig {heads, group with q_tiles, slots, granule},
// written by one CTA, word for word what BalancedPlan::serialize writes for it: a CUDA-graph
// replay's refresh uploads nothing and plans nothing on the host (ceil(group / 16) = q_tiles).
// Needs floor(T / slots) >= granule, T = q_tiles x heads x sum kv_len (every chunk then holds keys;
// the auto rule cuts only with T / slots >= kMinSplitChunk), and its search arrays in
// cut_plan_smem_bytes(...) <= cut_plan_max_smem() bytes of shared memory (bs 256 at 8 kv heads on
// 2048 slots: 35 KB; bs 1000: 65 KB).
int64_t cut_plan_smem_bytes(int bs, int heads, int q_tiles, int slots);
// The most dynamic shared memory the cut plan's CTA takes on the current device: the device's
// opt-in limit per block (227 KB on SM90, 163 KB on SM80, 99 KB on SM86 / SM89) less
// kCutPlanStaticSmem for the kernel's own, queried once per device; without an answer, the 48 KB a
// launch gets without opting in, less the same.
inline constexpr int64_t kCutPlanStaticSmem = 1024;  // its scans' warp sums take 384 bytes
int64_t cut_plan_max_smem();
// Launches it on stream (opting the kernel in to the shared memory past 48 KB once per device);
// kInvalidArgument names a field out of range, a kv_len < 1, chunks below the granule or the
// shared memory past cut_plan_max_smem().
Status cut_plan_from_lengths(const PlanFromLengthsParams& p, StreamHandle stream);

}  // namespace attnkit::flashinfer
