// The flashinfer backend's balanced decode plan (run by paged_decode_balanced_kernel, for every
// decode by default since session 12: ATTNKIT_FLASHINFER_DECODE_BALANCE=auto picks this cut plan
// or the default plan in its format per forward, choose_auto_plan below; =1 this plan always; see
// docs/perf/fidecode_notes.md, sessions 10-12): the total KV work of one decode forward, summed
// over its (request, q tile, kv head) items, is cut into exactly `slots` chunks of equal key counts
// (slots = balanced_kernel_slots below, one CTA per chunk). A chunk may end inside one item and go
// on with the next, so a CTA walks a list of segments; a segment that is not a whole item writes a
// partial (O, LSE), merged by LSE by the last CTA that finishes one of the item's segments (the
// fused split merge of paged_decode_sm80.cuh, with the item's part count and partial base instead
// of the request's).
//
// Items are ordered request-major, then q tile, then kv head (heads fastest: adjacent chunks
// stream the same pool rows at about the same time, as the kv heads of today's grid do). In that
// order the keys of the forward form one line [0, T); cut k (0 < k < slots) lies at the last
// allowed position <= floor(k T / slots), where the allowed positions are the item boundaries and
// every multiple of `granule` keys from an item's start. So chunk c, [cut_c, cut_{c+1}), holds
// floor(T / slots) - granule + 1 ... ceil(T / slots) + granule - 1 keys (exact with granule 1),
// and with T < slots some chunks are empty (their CTAs exit).
//
// Worked examples (H200: 132 slots; 32 q / 8 kv heads, so one q tile; granule 16):
//   * bs 16, kv 4096: T = 524288 keys over 128 items, 3968-3984 keys per chunk (granule 64:
//   3968-4032): chunks are shorter
//     than items, so every item is cut (3 of the 131 cuts fall on item boundaries): 256 segments,
//     all partials (256).
//   * bs 1, kv 32768: T = 262144 keys over 8 items, 1984-2000 keys per chunk: today's plan makes 16
//     splits of 2048 per head (128 CTAs); this one 16-17 parts per head on 132 CTAs (136 segments).
//   * bs 16, one request of 32768 keys and 15 of 1024: today's planner does not split (16 items
//     per head fill its 132 / 8 target), so the long request's 8 CTAs stream 32768 keys each while
//     the other CTAs stream 1024; here every chunk holds 2912-2928 keys.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/status.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "backends/flashinfer/kernels/work_plan.h"
#include "core/host_device.h"

namespace attnkit::flashinfer {

// One segment of a CTA's list (8 int32 words): keys [kv_begin, kv_end) of one (request, q tile,
// kv head) item.
struct Segment {
  int32_t request = -1;
  int16_t kv_head = 0;
  int16_t q_row_begin = 0;  // packed rows [q_row_begin, q_row_begin + 16) of the request
  int32_t kv_begin = 0;
  int32_t kv_end = 0;
  int16_t part = 0;   // index of this segment among its item's segments (in key order)
  int16_t parts = 1;  // segments of the item; 1: the CTA writes out / lse itself
  // parts > 1: the item's partials are rows partial_base + part (0 <= part < parts) of the
  // balanced kernel's partial buffers, [partials, W, D] and [partials, W] with W =
  // balanced_partial_width(group): entry r of a row is the item's packed row q_row_begin + r (the
  // WorkItem kernel's rows are Hq wide, one entry per q head, shared by the kv heads of a split).
  int32_t partial_base = 0;
  // Copies of the request's lengths (the CTA's first page-table loads wait on the segment only).
  int32_t req_kv_len = 0;
  int32_t req_q_start = 0;
};
static_assert(sizeof(Segment) == 32, "a segment is 8 words");
inline constexpr int kSegmentWords = static_cast<int>(sizeof(Segment) / sizeof(int32_t));

// Kv head h's segment of work item `it` of request `req` in the encoded default plan
// (balanced_from_work_plan below; the GPU expansion of kernels/plan_expand.cu writes the same):
// its keys, its split's part / parts, its own partial rows (a split request's rows partial_base ..
// + num_splits of the WorkItem plan become, per (q tile, kv head), num_splits rows of the
// balanced layout), its request's lengths; every field of *s written in place (the host encoder
// writes straight into its plan). The caller checks the 16-bit fields.
ATTNKIT_HOST_DEVICE inline void encoded_segment(const WorkItem& it, const RequestPlan& req,
                                                int64_t h, int64_t q_tiles, int64_t heads,
                                                Segment* s) {
  const bool split = req.num_splits > 1;
  s->request = it.request;
  s->kv_head = static_cast<int16_t>(h);
  s->q_row_begin = static_cast<int16_t>(it.q_row_begin);
  s->kv_begin = it.kv_begin;
  s->kv_end = it.kv_end;
  s->part = static_cast<int16_t>(split ? it.split : 0);
  s->parts = static_cast<int16_t>(split ? req.num_splits : 1);
  s->partial_base = split ? static_cast<int32_t>(int64_t{req.partial_base} * q_tiles * heads +
                                                 ((it.q_row_begin / kDecodeTileRows) * heads + h) *
                                                     int64_t{req.num_splits})
                          : 0;
  s->req_kv_len = req.kv_len;
  s->req_q_start = req.q_start;
}

// Serialised layout (int32 words), in the plan buffer the kernel reads:
//   [kPlanHeaderWords header][bs RequestPlan][cta_begin: slots + 1 words, padded to a multiple
//   of 8][segments]
// header[0] = slots (the kernel does not read it: its grid is never larger, eager grids may be
// smaller, stopping at the last slot with segments), header[1] = segments, header[2] =
// kBalancedPlanTag. CTA c walks segments [cta_begin[c], cta_begin[c + 1]).
inline constexpr int32_t kBalancedPlanTag = 0x42414c31;  // "BAL1"

struct BalanceConfig {
  int num_kv_heads = 1;
  int group = 1;    // q heads per kv head
  int slots = 1;    // chunks = CTAs: SM count x decode CTAs per SM
  int granule = 1;  // cuts inside an item fall on multiples of this many keys from its start
};

struct BalancedPlan {
  std::vector<RequestPlan> requests;  // num_splits / partial_base unused (per item here)
  std::vector<int32_t> cta_begin;     // [slots + 1]
  std::vector<Segment> segments;      // CTA-major
  std::vector<int64_t> cuts;          // [slots + 1] chunk bounds on the key line (tests, stats)
  int64_t total_keys = 0;             // T
  int num_partials = 0;               // partial rows used (sum of parts of the cut items; W wide)
  int items = 0;                      // (request, q tile, kv head) items with rows
  int cut_items = 0;                  // items of more than one segment
  int64_t cta_begin_words() const { return cta_begin_words_for(slots()); }
  int slots() const { return static_cast<int>(cta_begin.size()) - 1; }
  // Serialises into words[0, serialized_words()) (every word written; a CUDA-graph replay writes
  // straight into its pinned staging buffer), or into `words` (resized).
  void serialize(int32_t* words) const;
  void serialize(std::vector<int32_t>* words) const;
  int64_t serialized_words() const {
    const int64_t n = static_cast<int64_t>(segments.size());
    return words_for(static_cast<int64_t>(requests.size()), slots(),
                     n > slots() ? n : int64_t{slots()});
  }
  static constexpr int64_t cta_begin_words_for(int64_t slots) { return (slots + 1 + 7) / 8 * 8; }
  static int64_t words_for(int64_t bs, int64_t slots, int64_t segments) {
    return kPlanHeaderWords + bs * kRequestWords + cta_begin_words_for(slots) +
           segments * kSegmentWords;
  }
};

// Builds the plan; kInvalidArgument names the bad config field or request (decode only: every
// request has q_len 0 or 1 and kv_len >= q_len; q_len 0 requests get no segment).
Result<BalancedPlan> build_balanced_plan(std::span<const PlanRequest> requests,
                                         const BalanceConfig& config);
// The same into *dst, reusing its vectors' storage; *dst is unspecified after an error.
Status build_balanced_plan(std::span<const PlanRequest> requests, const BalanceConfig& config,
                           BalancedPlan* dst);

// Entries per partial row of the balanced kernel: one per packed row of an item (a decode item
// holds min(group, 16) of its request's q heads). A cut item's segments stream one kv head's keys,
// so a row as wide as all Hq q heads (the WorkItem kernel's layout, where the kv heads of a split
// share the row) would leave (Hq - W) / Hq of it unused: 7/8 at 32 q / 8 kv heads.
constexpr int balanced_partial_width(int group) {
  return group < kDecodeTileRows ? (group < 1 ? 1 : group) : kDecodeTileRows;
}

// Workspace bounds for up to max_bs requests (CUDA graphs: the buffers are sized once): each of
// the slots - 1 cuts adds at most one segment to the items, and a cut item has at most (its cuts
// + 1) partials, so partials <= 2 (slots - 1); the serialised plan holds at least one segment per
// slot (BalancedPlan::serialize pads with zeros).
struct BalancedBounds {
  int64_t segments = 0;
  int64_t partials = 0;
  int64_t words = 0;
};
BalancedBounds balanced_plan_bounds(int max_bs, const BalanceConfig& config);

// Partial entries (LSE floats; the O buffer holds head_dim floats per entry) a CUDA-graph
// workspace needs so that every decode plan of up to max_bs requests fits, whichever kernel runs
// it: the WorkItem kernel's plans (at most `items` rows of Hq = kv heads x group entries, items =
// the graph's item bound, target verify included), the cut plans (bounds.partials rows of W) and
// the encoded default plans (at most items x kv heads rows of W, balanced_from_work_plan).
// Worked example (H200, 32 q / 8 kv heads, max_bs 256: 2048 slots, items 256): max(256 x 32,
// 4094 x 4, 2048 x 4) = 16376 entries, 8.0 MiB of O at d 128 (64 MiB in Hq-wide rows).
int64_t balanced_graph_partial_entries(int64_t items, const BalanceConfig& config,
                                       const BalancedBounds& bounds);

// The default (split-KV) plan `wp` in the balanced plan's format, so that
// paged_decode_balanced_kernel runs it: the default grid's CTA k = item x num_kv_heads + kv head
// (heads fastest, as launched) becomes one segment of slot k % slots (round-robin; a slot walks
// k, k + slots, ...). A whole request is one segment of parts 1; a split request's chunk is
// part `split` of its num_splits parts (the same per-(request, q tile, kv head) split counters),
// so every key is streamed and merged with the default plan's arithmetic. Partial rows are per
// item in the balanced layout (balanced_partial_width): split request r (the WorkItem plan's rows
// partial_base .. + num_splits, Hq wide) gives its item (q tile t, kv head h) the rows
// (partial_base x q_tiles x kv_heads + (t x kv_heads + h) x num_splits) + split, so num_partials
// = the WorkItem plan's x q_tiles x kv heads (the same floats when group <= 16). Used with
// ATTNKIT_FLASHINFER_DECODE_BALANCE=auto: eager forwards and CUDA-graph replays then run the same
// kernel whichever plan judge_balance picks, and replays stay bit-identical to eager.
// kInvalidArgument names a config field outside the 16-bit segment fields, an item whose request
// does not exist, or partial entries (rows x W) past 2^31 (the kernel indexes them in 32 bits).
Result<BalancedPlan> balanced_from_work_plan(const WorkPlan& wp, const BalanceConfig& config);
// The same into *dst, reusing its vectors' storage; *dst is unspecified after an error.
Status balanced_from_work_plan(const WorkPlan& wp, const BalanceConfig& config, BalancedPlan* dst);
// The partial rows (W entries each) of balanced_from_work_plan(wp, config)'s plan: the work plan's
// split rows, one set per (q tile, kv head).
int64_t encoded_plan_partials(const WorkPlan& wp, const BalanceConfig& config);

// Workspace bound of balanced_from_work_plan's plans for up to max_bs requests whose default
// plans have at most `items` items (max_decode_items).
int64_t encoded_plan_words(int max_bs, int64_t items, const BalanceConfig& config);

// The judge of choose_auto_plan (ATTNKIT_FLASHINFER_DECODE_BALANCE=auto, the default; eager and
// graph replays alike, both on the balanced kernel, the other choice being the default plan in
// its format, balanced_from_work_plan): the balanced plan where the default (split-KV) plan
// leaves SMs waiting on long items. With T the forward's keys over all its CTAs (items x kv heads),
// mean = T / slots and imbalance = the longest default item's keys / mean, the balanced plan pays
// when mean >= kMinSplitChunk keys (below that the fixed cost dominates both plans) and imbalance
// >= 1.5 (one item far above the per-slot share). H200 2026-11-23 (32 q / 8 kv heads, d 128, page
// 16, one round each; balanced vs default plan): eager back-to-back (15:46Z): b16 32768 + 15 x 1024
// (imbalance 11.2) 364.8 -> 62.3 us; b16 633..7258 keys (1.86) 93.3 -> 85.0 us; b12 / b14 / b15
// kv4k (1.38 / 1.18 / 1.10) 58.9 / 65.0 / 68.4 -> 61.3 / 69.3 / 72.8 us (-4 to -6%: default kept).
// Graph replays (15:34Z, --graph --launches 32): uniform b16 kv4k (1.03) -8%, fp8 -24%, b8 -13%,
// b1 kv32k -18%; b32 438..3779 keys (256 CTAs, 0.94) -10%. (In graphs b12-b15 gained 24-29%, but
// there the default plan's replay is itself 25-30% slower than eager, 76.7 vs 58.9 us at b12: its
// padding CTAs, found in session 12, balanced_kernel_slots.)
struct BalanceVerdict {
  bool pays = false;
  double imbalance = 0;      // longest default item / mean (0 without keys)
  double mean_keys = 0;      // T / slots
  int64_t total_keys = 0;    // T: the default items' keys x kv heads
  int64_t default_ctas = 0;  // default items x kv heads
};
BalanceVerdict judge_balance(const WorkPlan& default_plan, int num_kv_heads, int slots);
// The same from the default plan's totals over its items (padding excluded), kv head 0: `items`
// items, `item_keys` keys summed over them, the longest holding `longest` keys.
BalanceVerdict judge_balance(int64_t items, int64_t item_keys, int64_t longest, int num_kv_heads,
                             int slots);

// The balanced kernel's grid for a decode forward of bs requests (eager and CUDA graphs alike, so
// that a replay plans exactly what eager plans): the default planner's CTA bound for bs requests
// (max_decode_items x kv heads: bs x q tiles x heads once bs fills the target, else the target's
// items x heads), at most kMaxBalancedSlotsPerTarget x config.target_ctas (past that a slot walks
// several of the default plan's CTAs). So the default plan of a uniform batch of 16 <= bs <= 264
// (8 kv heads, 132 SMs) is one segment per slot, the default kernel's launch exactly. The bound is
// that of the plain split planner (config.split_long and config.split_ctas are ignored: the
// experiment knobs would add slots no plan fills). Why a slot must not stay empty (H200
// 2026-11-23 17:44Z, eager `--launches 10` / `--graph --launches 32`, 32 q / 8 kv, d 128, page
// 16): the default plan on 132 slots (4 of them empty at b16) ran b16 kv4k at 89.0 / 93.7 us
// against 68.8 / 67.4 on the default kernel's 128 CTAs; the same plan launched without its
// trailing empty slots (eager) 68.5 us; without PDL 71.4 / 69.6 us. Empty CTAs in a PDL-chained
// grid cost 20-35% (b8-b16, b1); making them wait for the previous grid before they exit does not
// help (77.2 vs 77.6 us at b12).
// Why the cap is 16 (2112 slots on an H200: one slot per default CTA up to bs 264 at 8 kv heads):
// at 4 (528 slots) the encoded default plans of larger batches walked 2-4 CTAs per slot round-robin
// instead of the hardware's dynamic scheduling, H200 2026-11-23 19:19Z, --graph --launches 32:
// uneven b128 U[256, 4096] 308.2 vs 282.2 us on the WorkItem kernel (-9%), b256 U[128, 2048]
// 294.3 vs 278.8 (-5.5%); at 16 (19:42Z, another H200): 286.7 vs 288.0 and 283.7 vs 284.4. Cut
// plans' partials grow with the slots (<= 2 (slots - 1), balanced_plan_bounds).
inline constexpr int kMaxBalancedSlotsPerTarget = 16;
int balanced_kernel_slots(int bs, const PlanConfig& config);

// The plan of a decode forward on the balanced kernel (ATTNKIT_FLASHINFER_DECODE_BALANCE=auto):
// cut (build_balanced_plan over `slots`) where judge_balance (over the device's `judge_slots`,
// one per SM) says the default plan leaves SMs waiting on long items, or where the default plan
// has fewer CTAs than `slots` (fill: bs < 16 with requests too short to split, e.g. b12 kv 4k: 96
// CTAs on a grid of 128), either way only where the cut chunks keep >= kMinSplitChunk keys over
// `slots` (the judge's own guard counts `judge_slots`, fewer at large bs); else the default plan in
// the balanced format (balanced_from_work_plan), which then fills every slot or is too short for
// the cuts to pay. H200 2026-11-23 17:57Z, auto vs the WorkItem kernel (=0), --graph --launches 32
// / --launches 10: uniform b16 kv4k p1/16/64 bf16 and fp8, b1 kv32k, b8, b64 within 1% (b64 fp8
// -1.5%); b12 / b14 / b15 kv4k graphs 59.8 / 67.3 / 70.5 vs 74.6 / 80.0 / 90.0 us (cut to fill;
// eager 4-6% slower: 61.0 / 68.8 / 72.3 vs 58.5 / 65.1 / 67.8); b16 32768 + 15 x 1024 62.4 vs
// 362.3 us; b16 633..7258 84.3 vs 90.8; b32 438..3779 87.0 vs 85.5 (-1.7%, encoded default).
struct AutoPlanChoice {
  bool cut = false;
  bool fill = false;  // cut because the default plan leaves slots empty
  BalanceVerdict verdict;
};
AutoPlanChoice choose_auto_plan(const WorkPlan& default_plan, int num_kv_heads, int judge_slots,
                                int slots);
// The same from judge_balance's verdict (over judge_slots).
AutoPlanChoice choose_auto_plan(const BalanceVerdict& verdict, int slots);

}  // namespace attnkit::flashinfer
