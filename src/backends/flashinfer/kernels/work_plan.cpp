// Host planner of the flashinfer backend (see work_plan.h for the heuristic and worked examples).
#include "backends/flashinfer/kernels/work_plan.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace attnkit::flashinfer {
namespace {

// a >= 0, b > 0. The planner's common quotients are 0 or 1 (a decode's q heads in one tile, a
// request within the chunk): answered without the division, which took about half of a bs-256
// CUDA-graph replay's work plan on the host.
int64_t ceil_div(int64_t a, int64_t b) {
  if (a <= b) return a > 0 ? 1 : 0;
  return (a + b - 1) / b;
}

int tile_rows(TileShape shape) {
  return shape == TileShape::kDecode ? kDecodeTileRows : kPrefillTileRows;
}

// CTAs per kv head when every request is cut into chunks of `chunk` keys.
int64_t chunked_items(std::span<const PlanRequest> requests, int group, int rows_per_tile,
                      int64_t chunk) {
  int64_t n = 0;
  for (const PlanRequest& r : requests) {
    const int64_t q_tiles = ceil_div(static_cast<int64_t>(r.q_len) * group, rows_per_tile);
    n += q_tiles * std::max<int64_t>(1, ceil_div(r.kv_len, chunk));
  }
  return n;
}

}  // namespace

void WorkPlan::serialize(std::vector<int32_t>* words) const {
  words->resize(static_cast<size_t>(serialized_words()));
  serialize(words->data());
}

void WorkPlan::serialize(int32_t* words) const {
  const int64_t bs = static_cast<int64_t>(requests.size());
  const int64_t n = static_cast<int64_t>(items.size());
  std::fill(words, words + kPlanHeaderWords, 0);
  words[0] = static_cast<int32_t>(n);
  // The request and item records are their words (kRequestWords / kItemWords are their sizes in
  // words; no copy for an empty batch, whose data() may be null).
  int32_t* at = words + kPlanHeaderWords;
  if (bs > 0) std::memcpy(at, requests.data(), requests.size() * sizeof(RequestPlan));
  at += bs * kRequestWords;
  for (WorkItem w : items) {
    if (w.request >= 0 && w.request < bs) {
      const RequestPlan& r = requests[static_cast<size_t>(w.request)];
      w.req_kv_len = r.kv_len;
      w.req_q_start = r.q_start;
      w.req_q_len = r.q_len;
    }
    std::memcpy(at, &w, sizeof(WorkItem));
    at += kItemWords;
  }
}

Result<WorkPlan> build_work_plan(std::span<const PlanRequest> requests, const PlanConfig& config) {
  WorkPlan plan;
  ATTNKIT_RETURN_IF_ERROR(build_work_plan(requests, config, &plan));
  return plan;
}

Status build_work_plan(std::span<const PlanRequest> requests, const PlanConfig& config,
                       WorkPlan* dst) {
  if (config.split_long_pct < 100) {
    return Status::invalid_argument("flashinfer plan: split_long_pct " +
                                    std::to_string(config.split_long_pct) + " must be >= 100");
  }
  if (config.num_kv_heads < 1 || config.group < 1 || config.target_ctas < 1) {
    return Status::invalid_argument("flashinfer plan: num_kv_heads " +
                                    std::to_string(config.num_kv_heads) + ", group " +
                                    std::to_string(config.group) + " and target_ctas " +
                                    std::to_string(config.target_ctas) + " must all be >= 1");
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    const PlanRequest& q = requests[r];
    if (q.q_len < 0 || q.kv_len < 0 || q.q_start < 0 || q.q_len > q.kv_len) {
      return Status::invalid_argument(
          "flashinfer plan: request " + std::to_string(r) + " has q_start " +
          std::to_string(q.q_start) + ", q_len " + std::to_string(q.q_len) + ", kv_len " +
          std::to_string(q.kv_len) + " (needs 0 <= q_len <= kv_len, q_start >= 0)");
    }
  }
  if (config.tile_rows < 0) {
    return Status::invalid_argument("flashinfer plan: tile_rows " +
                                    std::to_string(config.tile_rows) + " must be >= 0");
  }
  const int rows_per_tile = config.tile_rows > 0 ? config.tile_rows : tile_rows(config.shape);
  // A fresh plan that takes over dst's vector storage (every field, element and scalar, starts at
  // its default: clear() before resize()).
  WorkPlan plan;
  plan.requests.swap(dst->requests);
  plan.items.swap(dst->items);
  plan.requests.clear();
  plan.items.clear();
  plan.requests.resize(requests.size());

  // Decode (and verify on prefill tiles) split: the smallest tile-aligned chunk that keeps the
  // grid within target_ctas.
  int64_t chunk = 0;
  if (config.allow_split && !requests.empty()) {
    int64_t max_len = 0;
    for (const PlanRequest& r : requests) max_len = std::max<int64_t>(max_len, r.kv_len);
    const int64_t per_head_target = config.target_ctas / config.num_kv_heads;
    const int64_t unsplit =
        chunked_items(requests, config.group, rows_per_tile, std::max<int64_t>(max_len, 1));
    if (unsplit < per_head_target && max_len > kMinSplitChunk) {
      const int64_t split_target =
          config.split_ctas > 0 ? config.split_ctas / config.num_kv_heads : per_head_target;
      int64_t lo = kMinSplitChunk / kDecodeTileKeys;  // in tiles
      int64_t hi = ceil_div(max_len, kDecodeTileKeys);
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (chunked_items(requests, config.group, rows_per_tile, mid * kDecodeTileKeys) <=
            split_target) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      if (lo * kDecodeTileKeys < max_len) chunk = lo * kDecodeTileKeys;
    }
  }
  // Split-long (work_plan.h): per-request chunks where a CTA would hold much more than the share.
  // chunk_of[r] > 0: request r's chunk; empty: the uniform `chunk` above for every request.
  std::vector<int64_t> chunk_of;
  if (config.shape == TileShape::kDecode && config.allow_split && config.split_long &&
      !requests.empty()) {
    int64_t work = 0;  // keys per kv head, summed over (request, q tile) items
    int64_t max_len = 0;
    for (const PlanRequest& r : requests) {
      const int64_t q_tiles = ceil_div(static_cast<int64_t>(r.q_len) * config.group, rows_per_tile);
      work += q_tiles * r.kv_len;
      if (q_tiles > 0) max_len = std::max<int64_t>(max_len, r.kv_len);
    }
    // len > pct % of share  <=>  len * target * 100 > pct * work * heads (exact: 128-bit products).
    const int64_t heads = config.num_kv_heads;
    const auto much_longer = [&](int64_t len) {
      __extension__ typedef __int128 Wide;
      return static_cast<Wide>(len) * config.target_ctas * 100 >
             static_cast<Wide>(config.split_long_pct) * work * heads;
    };
    const int64_t longest_cta = chunk > 0 ? std::min(chunk, max_len) : max_len;
    // (A CTA of <= kMinSplitChunk keys cannot be cut further: today's plan stays.)
    if (work > 0 && longest_cta > kMinSplitChunk && much_longer(longest_cta)) {
      const int64_t share = std::max<int64_t>(1, ceil_div(work * heads, config.target_ctas));
      chunk_of.assign(requests.size(), 0);
      chunk = 0;
      for (size_t r = 0; r < requests.size(); ++r) {
        const int64_t len = requests[r].kv_len;
        if (requests[r].q_len == 0 || !much_longer(len)) continue;  // q_len 0: no items
        const int64_t k = ceil_div(len, share);
        const int64_t c = std::max<int64_t>(
            kMinSplitChunk, ceil_div(ceil_div(len, k), kDecodeTileKeys) * kDecodeTileKeys);
        if (c < len) {
          chunk_of[r] = c;
          chunk = std::max(chunk, c);
        }
      }
      plan.split_long = true;
    }
  }
  plan.chunk = static_cast<int>(chunk);

  int32_t partials = 0;
  plan.items.reserve(requests.size());  // at least one item per request with rows
  for (size_t r = 0; r < requests.size(); ++r) {
    const PlanRequest& in = requests[r];
    RequestPlan& out = plan.requests[r];
    out.q_start = in.q_start;
    out.q_len = in.q_len;
    out.kv_len = in.kv_len;
    const int64_t rows = static_cast<int64_t>(in.q_len) * config.group;
    const int64_t q_tiles = ceil_div(rows, rows_per_tile);
    const int64_t req_chunk = chunk_of.empty() ? chunk : chunk_of[r];
    // (A request without rows, q_len 0, has no items and so no splits or partial rows: the
    // requests a partitioned mixed forward leaves to the wgmma kernel, flashinfer_backend.cpp.)
    const int64_t splits =
        req_chunk > 0 && q_tiles > 0 ? std::max<int64_t>(1, ceil_div(in.kv_len, req_chunk)) : 1;
    out.num_splits = static_cast<int32_t>(splits);
    if (splits > 1) {
      // Partial rows: one per (split, token), row partial_base + split * q_len + token offset
      // (decode: one query token; verify on decode tiles: the kernel's fused merge reads them;
      // on prefill tiles the merge after the kernel, which reads the split count from
      // reserved[0], as cascade_merge reads the cascade's pass-2 plans).
      const bool prefill = config.shape == TileShape::kPrefill;
      out.partial_base = partials;
      partials +=
          static_cast<int32_t>(splits * (prefill ? in.q_len : std::max<int32_t>(in.q_len, 1)));
      if (prefill) out.reserved[0] = static_cast<int32_t>(splits);
      plan.any_split = true;
    }
    for (int64_t t = 0; t < q_tiles; ++t) {
      for (int64_t s = 0; s < splits; ++s) {
        // Written in place: a WorkItem built on the stack and copied in was read back as 16-byte
        // words right after its 4-byte field stores, a failed store forward per item (~65% of a
        // bs-256 plan's time on the dev VM).
        WorkItem& w = plan.items.emplace_back();
        w.request = static_cast<int32_t>(r);
        w.q_row_begin = static_cast<int32_t>(t * rows_per_tile);
        w.kv_begin = static_cast<int32_t>(splits > 1 ? s * req_chunk : 0);
        w.kv_end = static_cast<int32_t>(
            splits > 1 ? std::min<int64_t>(in.kv_len, (s + 1) * req_chunk) : in.kv_len);
        w.split = static_cast<int32_t>(s);
      }
    }
  }
  plan.num_partials = partials;
  *dst = std::move(plan);
  return Status::ok();
}

int64_t max_decode_items(int max_bs, const PlanConfig& config) {
  // Unsplit: one item per (request, q tile). Split: the chunk keeps num_kv_heads * items within
  // target_ctas.
  // Split-long: the unsplit items plus at most ceil(target_ctas / num_kv_heads) extra chunks
  // (sum_r ceil(len_r / share) <= sum_r len_r / share + (long requests), and sum_r len_r <= work).
  const int64_t q_tiles = ceil_div(config.group, kDecodeTileRows);
  const int64_t heads = std::max(1, config.num_kv_heads);
  const int64_t unsplit = static_cast<int64_t>(max_bs) * q_tiles;
  const int64_t bound =
      std::max<int64_t>(unsplit, std::max(config.target_ctas, config.split_ctas) / heads);
  if (!config.split_long) return bound;
  return std::max<int64_t>(bound, unsplit + ceil_div(config.target_ctas, heads));
}

}  // namespace attnkit::flashinfer
