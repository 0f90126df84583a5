// Balanced decode planner of the flashinfer backend (see balanced_plan.h for the rule and worked
// examples).
#include "backends/flashinfer/kernels/balanced_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

namespace attnkit::flashinfer {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Largest 16-bit field value (kv heads, packed rows, parts).
constexpr int kMax16 = std::numeric_limits<int16_t>::max();

struct Item {
  int32_t request;
  int32_t q_row_begin;
  int32_t kv_head;
  int64_t start;  // on the key line
  int32_t len;
};

}  // namespace

void BalancedPlan::serialize(std::vector<int32_t>* words) const {
  words->resize(static_cast<size_t>(serialized_words()));
  serialize(words->data());
}

void BalancedPlan::serialize(int32_t* words) const {
  const int64_t bs = static_cast<int64_t>(requests.size());
  const int64_t n = static_cast<int64_t>(segments.size());
  std::fill(words, words + kPlanHeaderWords, 0);
  words[0] = slots();
  words[1] = static_cast<int32_t>(n);
  words[2] = kBalancedPlanTag;
  // The request and segment records are their words (kRequestWords / kSegmentWords are their
  // sizes in words): one copy per array (none for an empty one, whose data() may be null).
  int32_t* at = words + kPlanHeaderWords;
  if (bs > 0) std::memcpy(at, requests.data(), requests.size() * sizeof(RequestPlan));
  at += bs * kRequestWords;
  std::copy(cta_begin.begin(), cta_begin.end(), at);
  std::fill(at + cta_begin.size(), at + cta_begin_words(), 0);
  at += cta_begin_words();
  if (n > 0) std::memcpy(at, segments.data(), segments.size() * sizeof(Segment));
  // At least one segment per slot (zeros past n): the kernel loads segment blockIdx.x beside
  // cta_begin before it knows its range (paged_decode_balanced_kernel), so it stays in bounds.
  at += n * kSegmentWords;
  std::fill(at, words + serialized_words(), 0);
}

namespace {
// A fresh plan that takes over dst's vector storage (every field, element and scalar, starts at
// its default: the vectors are cleared).
BalancedPlan reuse_storage(BalancedPlan* dst) {
  BalancedPlan plan;
  plan.requests.swap(dst->requests);
  plan.cta_begin.swap(dst->cta_begin);
  plan.segments.swap(dst->segments);
  plan.cuts.swap(dst->cuts);
  plan.requests.clear();
  plan.cta_begin.clear();
  plan.segments.clear();
  plan.cuts.clear();
  return plan;
}
}  // namespace

Result<BalancedPlan> build_balanced_plan(std::span<const PlanRequest> requests,
                                         const BalanceConfig& config) {
  BalancedPlan plan;
  ATTNKIT_RETURN_IF_ERROR(build_balanced_plan(requests, config, &plan));
  return plan;
}

Result<BalancedPlan> balanced_from_work_plan(const WorkPlan& wp, const BalanceConfig& config) {
  BalancedPlan plan;
  ATTNKIT_RETURN_IF_ERROR(balanced_from_work_plan(wp, config, &plan));
  return plan;
}

Status build_balanced_plan(std::span<const PlanRequest> requests, const BalanceConfig& config,
                           BalancedPlan* dst) {
  if (config.num_kv_heads < 1 || config.num_kv_heads > kMax16 || config.group < 1 ||
      config.group > kMax16 || config.slots < 1 || config.slots > kMax16 || config.granule < 1) {
    return Status::invalid_argument(
        "flashinfer balanced plan: num_kv_heads " + std::to_string(config.num_kv_heads) +
        ", group " + std::to_string(config.group) + ", slots " + std::to_string(config.slots) +
        " and granule " + std::to_string(config.granule) +
        " must all be >= 1 (num_kv_heads, group and slots <= 32767: 16-bit segment fields)");
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    const PlanRequest& q = requests[r];
    if (q.q_len < 0 || q.q_len > 1 || q.kv_len < q.q_len || q.q_start < 0) {
      return Status::invalid_argument(
          "flashinfer balanced plan: request " + std::to_string(r) + " has q_start " +
          std::to_string(q.q_start) + ", q_len " + std::to_string(q.q_len) + ", kv_len " +
          std::to_string(q.kv_len) + " (decode only: q_len 0 or 1, kv_len >= q_len, q_start >= 0)");
    }
  }

  BalancedPlan plan = reuse_storage(dst);
  plan.requests.resize(requests.size());
  // Working arrays kept per thread: a CUDA-graph replay's refresh that cuts on the host allocates
  // nothing once they have grown.
  thread_local std::vector<Item> items;
  thread_local std::vector<int32_t> parts, base;
  thread_local std::vector<int64_t> first_item;
  items.clear();
  int64_t total = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const PlanRequest& in = requests[r];
    RequestPlan& out = plan.requests[r];
    out.q_start = in.q_start;
    out.q_len = in.q_len;
    out.kv_len = in.kv_len;
    const int64_t q_tiles =
        ceil_div(static_cast<int64_t>(in.q_len) * config.group, kDecodeTileRows);
    for (int64_t t = 0; t < q_tiles; ++t) {
      for (int h = 0; h < config.num_kv_heads; ++h) {
        items.push_back({static_cast<int32_t>(r), static_cast<int32_t>(t * kDecodeTileRows), h,
                         total, in.kv_len});
        total += in.kv_len;
      }
    }
  }
  plan.total_keys = total;
  plan.items = static_cast<int>(items.size());

  // Cuts: cut_k = the last allowed position <= floor(k T / S) (balanced_plan.h).
  const int64_t slots = config.slots;
  const int64_t g = config.granule;
  plan.cuts.assign(static_cast<size_t>(slots + 1), 0);
  plan.cuts[static_cast<size_t>(slots)] = total;
  size_t it = 0;  // the item holding the ideal position (ideal positions only grow)
  for (int64_t k = 1; k < slots; ++k) {
    // floor(k T / S) without forming k T: T = q S + r gives k q + floor(k r / S).
    const int64_t ideal = k * (total / slots) + k * (total % slots) / slots;
    while (it < items.size() && items[it].start + items[it].len <= ideal) ++it;
    int64_t cut = ideal;
    if (it < items.size() && ideal > items[it].start) {
      cut = items[it].start + (ideal - items[it].start) / g * g;
    }
    plan.cuts[static_cast<size_t>(k)] = cut;
  }

  // Segments: chunk c's keys mapped back onto the items.
  plan.cta_begin.assign(static_cast<size_t>(slots + 1), 0);
  parts.assign(items.size(), 0);
  size_t item = 0;
  for (int64_t c = 0; c < slots; ++c) {
    plan.cta_begin[static_cast<size_t>(c)] = static_cast<int32_t>(plan.segments.size());
    const int64_t lo = plan.cuts[static_cast<size_t>(c)];
    const int64_t hi = plan.cuts[static_cast<size_t>(c + 1)];
    // Skip items that end at or before this chunk's start.
    while (item < items.size() && items[item].start + items[item].len <= lo) ++item;
    for (size_t i = item; i < items.size() && items[i].start < hi; ++i) {
      const Item& w = items[i];
      const int64_t b = std::max(lo, w.start);
      const int64_t e = std::min(hi, w.start + w.len);
      if (e <= b) continue;                       // (every item has >= 1 key: q_len 1 <= kv_len)
      Segment& s = plan.segments.emplace_back();  // in place: no copy of a fresh stack record
      s.request = w.request;
      s.kv_head = static_cast<int16_t>(w.kv_head);
      s.q_row_begin = static_cast<int16_t>(w.q_row_begin);
      s.kv_begin = static_cast<int32_t>(b - w.start);
      s.kv_end = static_cast<int32_t>(e - w.start);
      s.part = static_cast<int16_t>(parts[i]);
      s.req_kv_len = plan.requests[static_cast<size_t>(w.request)].kv_len;
      s.req_q_start = plan.requests[static_cast<size_t>(w.request)].q_start;
      ++parts[i];
    }
  }
  plan.cta_begin[static_cast<size_t>(slots)] = static_cast<int32_t>(plan.segments.size());

  // Part counts and partial rows of the cut items (contiguous per item, in item order).
  base.assign(items.size(), 0);
  int32_t partials = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (parts[i] > kMax16) {
      return Status::internal("flashinfer balanced plan: item " + std::to_string(i) + " has " +
                              std::to_string(parts[i]) + " segments (> 32767)");
    }
    if (parts[i] > 1) {
      base[i] = partials;
      partials += parts[i];
      ++plan.cut_items;
    }
  }
  plan.num_partials = partials;
  // Item index of each segment: items are ordered by (request, q tile, head).
  const int64_t heads = config.num_kv_heads;
  first_item.assign(requests.size() + 1, 0);
  for (size_t r = 0; r < requests.size(); ++r) {
    first_item[r + 1] =
        first_item[r] +
        ceil_div(static_cast<int64_t>(requests[r].q_len) * config.group, kDecodeTileRows) * heads;
  }
  for (Segment& s : plan.segments) {
    const int64_t i = first_item[static_cast<size_t>(s.request)] +
                      (s.q_row_begin / kDecodeTileRows) * heads + s.kv_head;
    s.parts = static_cast<int16_t>(parts[static_cast<size_t>(i)]);
    s.partial_base = s.parts > 1 ? base[static_cast<size_t>(i)] : 0;
  }
  *dst = std::move(plan);
  return Status::ok();
}

BalancedBounds balanced_plan_bounds(int max_bs, const BalanceConfig& config) {
  BalancedBounds b;
  const int64_t q_tiles = ceil_div(config.group, kDecodeTileRows);
  const int64_t items =
      static_cast<int64_t>(std::max(0, max_bs)) * q_tiles * std::max(1, config.num_kv_heads);
  const int64_t cuts = std::max(0, config.slots - 1);
  b.segments = std::max<int64_t>(items + cuts, std::max(1, config.slots));  // >= 1 per slot
  b.partials = std::min(2 * cuts, b.segments);
  b.words = BalancedPlan::words_for(max_bs, config.slots, b.segments);
  return b;
}

namespace {
// Why item_segment refused item i.
[[gnu::noinline, gnu::cold]] Status bad_item(const WorkPlan& wp, int64_t i) {
  const WorkItem& it = wp.items[static_cast<size_t>(i)];
  if (it.request >= static_cast<int32_t>(wp.requests.size()) || it.q_row_begin > kMax16) {
    return Status::invalid_argument("flashinfer encoded plan: item " + std::to_string(i) +
                                    " names request " + std::to_string(it.request) + " (of " +
                                    std::to_string(wp.requests.size()) + ") with q_row_begin " +
                                    std::to_string(it.q_row_begin));
  }
  return Status::invalid_argument(
      "flashinfer encoded plan: request " + std::to_string(it.request) + " has " +
      std::to_string(wp.requests[static_cast<size_t>(it.request)].num_splits) +
      " splits (> 32767)");
}

// Work item i's segment for kv head h (encoded_segment in the header, which the GPU expansion
// shares). Kv heads differ only in kv_head and, for a split item, partial_base (by h x parts:
// to_head). False for an item whose request does not exist or whose fields pass the 16-bit
// segment fields (bad_item says why). A bool and inlined: a Status return or a call per segment
// made the several-CTAs-per-slot loop up to 1.7x slower (dev VM, bs 600).
[[gnu::always_inline]] inline bool item_segment(const WorkPlan& wp, int64_t i, int64_t h,
                                                int64_t q_tiles, int64_t heads, Segment* s) {
  const WorkItem& it = wp.items[static_cast<size_t>(i)];
  if (it.request >= static_cast<int32_t>(wp.requests.size()) || it.q_row_begin > kMax16) {
    return false;
  }
  const RequestPlan& req = wp.requests[static_cast<size_t>(it.request)];
  if (req.num_splits > kMax16) return false;
  encoded_segment(it, req, h, q_tiles, heads, s);  // partial rows < partials: the caller checks
  return true;
}

// Moves kv head 0's segment *s (item_segment) to kv head h.
void to_head(Segment* s, int64_t h) {
  s->kv_head = static_cast<int16_t>(h);
  if (s->parts > 1) s->partial_base += static_cast<int32_t>(h * s->parts);
}
}  // namespace

int64_t encoded_plan_partials(const WorkPlan& wp, const BalanceConfig& config) {
  return int64_t{wp.num_partials} * ceil_div(config.group, kDecodeTileRows) * config.num_kv_heads;
}

Status balanced_from_work_plan(const WorkPlan& wp, const BalanceConfig& config, BalancedPlan* dst) {
  if (config.num_kv_heads < 1 || config.num_kv_heads > kMax16 || config.slots < 1 ||
      config.slots > kMax16) {
    return Status::invalid_argument("flashinfer encoded plan: num_kv_heads " +
                                    std::to_string(config.num_kv_heads) + " and slots " +
                                    std::to_string(config.slots) + " must be in 1..32767");
  }
  if (config.group < 1 || config.group > kMax16) {
    return Status::invalid_argument("flashinfer encoded plan: group " +
                                    std::to_string(config.group) + " must be in 1..32767");
  }
  BalancedPlan plan = reuse_storage(dst);
  plan.requests.assign(wp.requests.begin(), wp.requests.end());
  const int64_t slots = config.slots;
  const int64_t heads = config.num_kv_heads;
  const int64_t q_tiles = ceil_div(config.group, kDecodeTileRows);  // decode: q_len 1
  const int64_t n_items = static_cast<int64_t>(wp.items.size());
  const int64_t ctas = n_items * heads;
  // Slot-major segment order: slot c holds CTAs c, c + slots, ...
  plan.cta_begin.assign(static_cast<size_t>(slots + 1), 0);
  plan.cuts.assign(static_cast<size_t>(slots + 1), 0);
  // Every CTA's segment written in place (padding CTAs get none), the vector cut to size after.
  plan.segments.resize(static_cast<size_t>(ctas));
  Segment* out = plan.segments.data();
  int64_t keys_before = 0;
  int items = 0, cut_items = 0;
  const auto start_slot = [&](int64_t c) {
    plan.cta_begin[static_cast<size_t>(c)] = static_cast<int32_t>(out - plan.segments.data());
    plan.cuts[static_cast<size_t>(c)] = keys_before;
  };
  if (slots >= ctas) {
    // One CTA per slot (slot c = CTA c; uniform batches of 16 <= bs <= 264 requests at 8 kv heads
    // fill the grid exactly): item-major, the item's head-0 segment built once per item. The same
    // plan as the general loop below, in about a third of its host time at bs 256 (a CUDA-graph
    // replay's refresh plans this every step).
    int64_t c = 0;
    for (int64_t i = 0; i < n_items; ++i) {
      if (wp.items[static_cast<size_t>(i)].request < 0) {  // padding: no segments
        for (int64_t h = 0; h < heads; ++h, ++c) start_slot(c);
        continue;
      }
      // Built in place (head 0), then copied for the other heads.
      const Segment* first = out;
      if (!item_segment(wp, i, 0, q_tiles, heads, out)) return bad_item(wp, i);
      const int64_t keys = std::max(0, first->kv_end - first->kv_begin);
      const bool split = first->parts > 1;
      for (int64_t h = 0; h < heads; ++h, ++c) {
        start_slot(c);
        if (h > 0) {
          *out = *first;
          to_head(out, h);
        }
        ++out;
        keys_before += keys;
      }
      items += static_cast<int>(heads);
      cut_items += split ? static_cast<int>(heads) : 0;
    }
    for (; c < slots; ++c) start_slot(c);  // slots past the last CTA: empty
  } else {
    // CTA k = item k / heads, kv head k % heads; the slot's CTAs k, k + slots, ... step the pair by
    // (slots / heads, slots % heads) with a carry, so the loop divides nothing per segment (the
    // divisions were most of a CUDA-graph replay's host refresh at large batches).
    const int64_t item_step = slots / heads, head_step = slots % heads;
    int64_t first_item = 0, first_head = 0;  // slot c's first CTA: c / heads, c % heads
    for (int64_t c = 0; c < slots; ++c, ++first_head) {
      if (first_head == heads) {
        first_head = 0;
        ++first_item;
      }
      start_slot(c);
      int64_t item = first_item, head = first_head;
      for (; item < n_items; item += item_step, head += head_step) {
        if (head >= heads) {
          head -= heads;
          ++item;
          if (item >= n_items) break;
        }
        if (wp.items[static_cast<size_t>(item)].request < 0) continue;  // padding
        Segment* seg = out++;
        if (!item_segment(wp, item, head, q_tiles, heads, seg)) return bad_item(wp, item);
        keys_before += std::max(0, seg->kv_end - seg->kv_begin);
        ++items;
        cut_items += seg->parts > 1 ? 1 : 0;
      }
    }
  }
  plan.segments.resize(static_cast<size_t>(out - plan.segments.data()));
  plan.items = items;
  plan.cut_items = cut_items;
  plan.cta_begin[static_cast<size_t>(slots)] = static_cast<int32_t>(plan.segments.size());
  plan.cuts[static_cast<size_t>(slots)] = keys_before;
  plan.total_keys = keys_before;
  // The kernel indexes partial entries (rows x W) in 32 bits; cut plans stay far below (<= 2
  // (slots - 1) rows of <= 16 entries).
  const int64_t partials = encoded_plan_partials(wp, config);
  const int width = balanced_partial_width(config.group);
  if (partials * width > std::numeric_limits<int32_t>::max()) {
    return Status::invalid_argument("flashinfer encoded plan: " + std::to_string(partials) +
                                    " partial rows of " + std::to_string(width) +
                                    " entries pass 2^31");
  }
  plan.num_partials = static_cast<int>(partials);
  *dst = std::move(plan);
  return Status::ok();
}

int64_t balanced_graph_partial_entries(int64_t items, const BalanceConfig& config,
                                       const BalancedBounds& bounds) {
  const int64_t heads = std::max(1, config.num_kv_heads);
  const int64_t width = balanced_partial_width(config.group);
  const int64_t work_item = items * heads * std::max(1, config.group);  // Hq-wide rows
  return std::max({work_item, bounds.partials * width, items * heads * width});
}

int64_t encoded_plan_words(int max_bs, int64_t items, const BalanceConfig& config) {
  return BalancedPlan::words_for(
      std::max(0, max_bs), config.slots,
      std::max<int64_t>(items * std::max(1, config.num_kv_heads), config.slots));
}

BalanceVerdict judge_balance(const WorkPlan& default_plan, int num_kv_heads, int slots) {
  int64_t items = 0, total = 0, longest = 0;
  for (const WorkItem& it : default_plan.items) {
    if (it.request < 0) continue;
    const int64_t keys = std::max<int64_t>(0, int64_t{it.kv_end} - it.kv_begin);
    total += keys;
    longest = std::max(longest, keys);
    ++items;
  }
  return judge_balance(items, total, longest, num_kv_heads, slots);
}

BalanceVerdict judge_balance(int64_t items, int64_t item_keys, int64_t longest, int num_kv_heads,
                             int slots) {
  constexpr double kMinImbalance = 1.5;
  BalanceVerdict v;
  v.default_ctas = items;
  if (slots < 1 || num_kv_heads < 1 || item_keys == 0) return v;
  v.default_ctas *= num_kv_heads;
  v.total_keys = item_keys * num_kv_heads;
  v.mean_keys = static_cast<double>(v.total_keys) / slots;
  v.imbalance = static_cast<double>(longest) / v.mean_keys;
  v.pays = v.mean_keys >= kMinSplitChunk && v.imbalance >= kMinImbalance;
  return v;
}

int balanced_kernel_slots(int bs, const PlanConfig& config) {
  PlanConfig plain = config;  // the plain split planner's bound
  plain.split_long = false;
  plain.split_ctas = 0;
  const int64_t heads = std::max(1, config.num_kv_heads);
  const int64_t bound = max_decode_items(std::max(1, bs), plain) * heads;
  const int64_t cap =
      static_cast<int64_t>(kMaxBalancedSlotsPerTarget) * std::max(config.target_ctas, 1);
  return static_cast<int>(std::clamp<int64_t>(std::min(bound, cap), 1, kMax16));
}

AutoPlanChoice choose_auto_plan(const WorkPlan& default_plan, int num_kv_heads, int judge_slots,
                                int slots) {
  return choose_auto_plan(judge_balance(default_plan, num_kv_heads, judge_slots), slots);
}

AutoPlanChoice choose_auto_plan(const BalanceVerdict& verdict, int slots) {
  AutoPlanChoice c;
  c.verdict = verdict;
  if (slots < 1 || c.verdict.default_ctas == 0) return c;
  const bool chunks_pay = static_cast<double>(c.verdict.total_keys) / slots >= kMinSplitChunk;
  c.fill = c.verdict.default_ctas < slots && chunks_pay;
  c.cut = (c.verdict.pays || c.fill) && chunks_pay;
  return c;
}

}  // namespace attnkit::flashinfer
