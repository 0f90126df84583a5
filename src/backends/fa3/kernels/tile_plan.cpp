// The fa3 host planner (see tile_plan.h).
#include "backends/fa3/kernels/tile_plan.h"

#include <algorithm>
#include <limits>
#include <string>

#include "backends/fa3/kernels/fa3_params.h"
#include "core/env_knob.h"

namespace attnkit::fa3 {

MlaPassRequests mla_pass_requests(std::span<const TileRequest> base, const int32_t* indptr,
                                  bool skip_empty) {
  MlaPassRequests m;
  m.reqs.assign(base.begin(), base.end());
  m.kv_rows.resize(base.size());
  for (size_t r = 0; r < base.size(); ++r) {
    TileRequest& q = m.reqs[r];
    q.kv_len = indptr == nullptr ? q.q_len : indptr[r + 1] - indptr[r];
    m.kv_rows[r] = indptr == nullptr ? q.q_start : indptr[r];
    if (skip_empty && indptr != nullptr && q.kv_len == 0) q.q_len = 0;  // nothing to merge
    if (q.q_len > 0) m.max_kv_len = std::max<int64_t>(m.max_kv_len, q.kv_len);
  }
  return m;
}

Result<TilePlan> build_tile_plan(std::span<const TileRequest> requests, int block_m,
                                 TileAnchor anchor, std::span<const int32_t> kv_rows, bool causal) {
  struct Tile {
    int32_t request, m0, work;
  };
  std::vector<Tile> tiles;
  TilePlan plan;
  plan.words.assign(kPlanHeaderWords, 0);
  if (!kv_rows.empty() && kv_rows.size() != requests.size()) {
    return Status::invalid_argument("fa3: " + std::to_string(kv_rows.size()) + " kv_rows for " +
                                    std::to_string(requests.size()) + " requests");
  }
  int32_t vt_blocks = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const TileRequest& q = requests[r];
    if (q.q_len < 0 || q.kv_len < (causal ? q.q_len : 0)) {
      return Status::invalid_argument(
          "fa3: request " + std::to_string(r) + " has " + std::to_string(q.q_len) +
          " new tokens but kv_len " + std::to_string(q.kv_len) +
          (causal ? " (needs 0 <= new tokens <= kv_len)" : " (needs new tokens, kv_len >= 0)"));
    }
    plan.words.insert(plan.words.end(),
                      {q.q_start, q.q_len, q.kv_len, kv_rows.empty() ? vt_blocks : kv_rows[r]});
    if (q.q_len > 0) vt_blocks += vt_units(q.kv_len);
    for (int32_t m = 0; m * block_m < q.q_len; ++m) {
      const int32_t m0 = tile_first_row(q.q_len, m, block_m, anchor);
      // The keys the tile sees under the layers' mask (its sort key).
      tiles.push_back(
          {static_cast<int32_t>(r), m0, tile_key_end(q.kv_len, q.q_len, m0, block_m, causal)});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.work > b.work; });
  plan.words[0] = static_cast<int32_t>(tiles.size());
  plan.words[1] = vt_blocks;
  for (const Tile& t : tiles) plan.words.insert(plan.words.end(), {t.request, t.m0});
  plan.num_tiles = static_cast<int>(tiles.size());
  return plan;
}

int choose_section_heads(int num_q_heads, int num_kv_heads, int64_t max_kv_len, int head_dim,
                         int elem_bytes, int forced) {
  if (num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0) return num_q_heads;
  const int group = num_q_heads / num_kv_heads;
  if (forced == 0) return num_q_heads;
  if (forced > 0 && num_kv_heads % forced == 0) return forced * group;
  const int64_t per_head = std::max<int64_t>(1, max_kv_len) * head_dim * elem_bytes * 2;
  int best = 1;
  for (int s = 1; s <= num_kv_heads; ++s) {
    if (num_kv_heads % s == 0 && s * per_head <= kL2SectionBytes) best = s;
  }
  return best * group;
}

TailSplit choose_tail_split(std::span<const int32_t> plan_words, int bs, int num_q_heads,
                            int block_m, int block_n, bool causal, int sm_count, bool zigzag,
                            int forced, int section_heads) {
  // Model costs in key-block times (tile_plan.h).
  constexpr double kUnitCost = 1.0, kPieceCost = 0.5, kMergeCost = 3.0, kMinGain = 0.02;
  TailSplit none;
  if (forced == 0 || sm_count <= 0 || num_q_heads <= 0 || block_m <= 0 || block_n <= 0 ||
      plan_words.size() < static_cast<size_t>(kPlanHeaderWords)) {
    return none;
  }
  const int64_t tiles = plan_words[0];
  const size_t tile_base = kPlanHeaderWords + static_cast<size_t>(bs) * kRequestWords;
  if (plan_words.size() < tile_base + static_cast<size_t>(tiles) * kTileWords) return none;
  const int64_t units = tiles * num_q_heads;
  if (section_heads <= 0) section_heads = num_q_heads;
  if (num_q_heads % section_heads != 0) return none;
  auto blocks_of_unit = [&](int64_t u) {
    const TileHead th = unit_tile_head(static_cast<int>(u), static_cast<int>(tiles), section_heads);
    const size_t tw = tile_base + static_cast<size_t>(th.tile) * kTileWords;
    const size_t rw = kPlanHeaderWords + static_cast<size_t>(plan_words[tw]) * kRequestWords;
    const int n_end =
        tile_key_end(plan_words[rw + 2], plan_words[rw + 1], plan_words[tw + 1], block_m, causal);
    return (n_end + block_n - 1) / block_n;  // as decode_tile
  };
  const int64_t rem = units >= sm_count ? units % sm_count : units;
  if (units == 0 || rem == 0) return none;
  const int64_t first = units - rem;
  int fewest = std::numeric_limits<int>::max();
  for (int64_t u = first; u < units; ++u) fewest = std::min(fewest, blocks_of_unit(u));
  int s = static_cast<int>(std::min<int64_t>(fewest, sm_count / rem));
  if (forced > 0) s = std::min(s, forced);
  if (s < 2) return none;
  const TailSplit split{static_cast<int>(rem), s};
  if (forced > 0) return split;
  // The zigzag (or plain-stride) schedule of n units on min(n, sm_count) CTAs; cost(v): unit v's.
  auto makespan = [&](int64_t n, auto&& cost) {
    const int64_t grid = std::min<int64_t>(n, sm_count);
    std::vector<double> load(static_cast<size_t>(grid), 0.0);
    for (int64_t v = 0; v < n; ++v) {
      const int64_t round = v / grid, pos = v % grid;
      const int64_t cta = zigzag && (round & 1) ? grid - 1 - pos : pos;
      load[static_cast<size_t>(cta)] += cost(v);
    }
    return *std::max_element(load.begin(), load.end());
  };
  const double whole = makespan(units, [&](int64_t u) { return blocks_of_unit(u) + kUnitCost; });
  const double pieces = makespan(first + rem * s, [&](int64_t v) {
    if (v < first) return blocks_of_unit(v) + kUnitCost;
    const int64_t j = v - first;
    const int n = blocks_of_unit(first + j / s);
    const int k = static_cast<int>(j % s);
    return (split_block_begin(n, s, k + 1) - split_block_begin(n, s, k)) + kUnitCost + kPieceCost;
  });
  return pieces + kMergeCost <= (1.0 - kMinGain) * whole ? split : none;
}

std::vector<TileRequest> tile_requests(const ForwardBatch& batch,
                                       std::span<const uint8_t> elsewhere) {
  std::vector<TileRequest> reqs(static_cast<size_t>(batch.batch_size));
  int32_t start = 0;
  const bool have_extend = !batch.extend_seq_lens_host.empty();
  for (size_t r = 0; r < reqs.size(); ++r) {
    TileRequest& q = reqs[r];
    q.q_len = have_extend ? batch.extend_seq_lens_host[r] : batch.spec.draft_token_num;
    q.q_start = have_extend && !batch.extend_start_loc_host.empty() ? batch.extend_start_loc_host[r]
                                                                    : start;
    q.kv_len = batch.seq_lens_host[r];
    start += q.q_len;
    if (r < elsewhere.size() && elsewhere[r] != 0) q.q_len = 0;
  }
  return reqs;
}

namespace {

constexpr int kFp8HeadDim = 128;  // the FP8 kernel's head dim

}  // namespace

TileAnchor tile_anchor_from_env() {
  return env_choice("ATTNKIT_FA3_TILE_ANCHOR", {"start", "end"}, "end") == "start"
             ? TileAnchor::kStart
             : TileAnchor::kEnd;
}

int choose_block_m_d128(std::span<const TileRequest> requests, TileAnchor anchor) {
  constexpr double kWg3MaxPaddingShare = 0.05;
  constexpr double kWg3MaxBidirPaddingShare = 0.08;
  // Rows that pad the request's tiles of `rows`. Bidirectional layers of the same forward: every
  // row, padded or not, sees kv_len keys.
  auto padded_rows = [](const TileRequest& r, int64_t rows) -> int64_t {
    return (int64_t{r.q_len} + rows - 1) / rows * rows - r.q_len;
  };
  // Pairs a causal tile set pads beyond the request's rows, for tiles of `rows`: the padded rows
  // see what the last row of their tile sees (the first tile under kEnd, the last under kStart).
  auto padding = [anchor, &padded_rows](const TileRequest& r, int64_t rows) -> double {
    const int64_t tiles = (int64_t{r.q_len} + rows - 1) / rows;
    const int64_t padded_tile = anchor == TileAnchor::kEnd ? 0 : tiles - 1;
    const int64_t last_row =
        tile_first_row(r.q_len, static_cast<int>(padded_tile), static_cast<int>(rows), anchor) +
        rows - 1;
    const int64_t keys = std::min<int64_t>(r.kv_len, r.kv_len - r.q_len + last_row + 1);
    return static_cast<double>(padded_rows(r, rows)) * keys;
  };
  double useful = 0, extra = 0, useful_bidir = 0, extra_bidir = 0;
  for (const TileRequest& r : requests) {
    if (r.q_len <= 0) continue;
    // Causal pairs of the request's rows: row i sees kv_len - q_len + i + 1 keys.
    useful += static_cast<double>(r.q_len) * (r.kv_len - r.q_len) +
              0.5 * static_cast<double>(r.q_len) * (r.q_len + 1);
    extra += padding(r, 192) - padding(r, 128);
    useful_bidir += static_cast<double>(r.q_len) * r.kv_len;
    extra_bidir += static_cast<double>(padded_rows(r, 192) - padded_rows(r, 128)) * r.kv_len;
  }
  return useful > 0 && extra <= kWg3MaxPaddingShare * useful &&
                 extra_bidir <= kWg3MaxBidirPaddingShare * useful_bidir
             ? 192
             : 128;
}

Fp8Knobs fp8_knobs_from_env() {
  Fp8Knobs k;
  k.spec = env_flag("ATTNKIT_FA3_FP8_SPEC", true);
  k.gemm_sum = env_flag("ATTNKIT_FA3_FP8_GEMM_SUM", true);
  k.uniform_wg = env_flag("ATTNKIT_FA3_UNIFORM_WG", true);
  const std::string vt = env_choice("ATTNKIT_FA3_FP8_VT_PRE", {"0", "1"}, "the forward's shape");
  if (vt == "0" || vt == "1") k.vt_pre_mode = vt == "1" ? 1 : 0;
  k.gemm_sum_max_keys = env_int_range("ATTNKIT_FA3_FP8_GEMM_SUM_MAX_KEYS", k.gemm_sum_max_keys, 1,
                                      std::numeric_limits<int>::max());
  // Unset: promotion for the forwards with a request past gemm_sum_max_keys (promote_auto); 0:
  // never (the FADD row-sum kernel at long rows, as before session 11); 1 / 2: in every forward.
  const std::string promote =
      env_choice("ATTNKIT_FA3_FP8_PROMOTE", {"0", "1", "2"}, "2 past 2048 keys");
  k.promote_auto = promote != "0" && promote != "1" && promote != "2";
  k.promote = promote == "1" || promote == "2";
  k.promote_late = promote == "2";
  k.block_mode = env_int("ATTNKIT_FA3_FP8_BLOCK_N", k.block_mode, {128, 192});
  k.wg3 = env_flag("ATTNKIT_FA3_FP8_WG3", true);
  return k;
}

std::string fp8_kernel_missing(int block_n, bool vt_pre, bool spec, bool gemm_sum, int promote,
                               bool uniform_wg, int block_m) {
  if (block_m != 128 && block_m != 3 * 64) {
    return "block_m " + std::to_string(block_m) + " (128 or 192)";
  }
  if (block_m == 3 * 64 && !(vt_pre && spec && gemm_sum && block_n == 128)) {
    return "192-row tiles without vt_pre, spec and 128-key blocks";
  }
  if (block_n != 128 && block_n != 192) {
    return "block_n " + std::to_string(block_n) + " (128 or 192)";
  }
  if (promote < 0 || promote > 2) return "promote " + std::to_string(promote) + " (0, 1 or 2)";
  if (!uniform_wg && (vt_pre || spec || gemm_sum || promote != 0 || block_n != 128)) {
    return "uniform_wg 0 has one kernel: no vt_pre, spec, gemm_sum, promote; 128-key blocks";
  }
  if (spec && !vt_pre) return "spec without vt_pre";
  if (vt_pre && !gemm_sum) return "vt_pre without gemm_sum";
  if (block_n == 192 && !(vt_pre && spec)) return "192-key blocks without vt_pre and spec";
  if (block_n == 192 && promote != 0) return "192-key blocks with promote (not instantiated)";
  return {};
}

Fp8Variant choose_fp8_variant(std::span<const TileRequest> requests, int kv_heads,
                              const Fp8Knobs& knobs) {
  constexpr int64_t kVtPreKeysPerQuery = 8;
  constexpr int64_t kVtPreMaxBytes = int64_t{1} << 30;
  constexpr int64_t kVtUnitBytes = int64_t{kVtBlockKeys} * kFp8HeadDim;
  // 192-key blocks: H200 10:11Z, one sample each, vs 128 keys: causal 8k +2.3%, 16k +3.8%, bidir
  // 8k +1.6-2.3%, causal 4k -1.2% (fewer, longer blocks per tile); so from 8192 keys on.
  constexpr int kFp8Block192MinKeys = 8192;
  Fp8Variant v;
  int64_t q_total = 0, kv_total = 0;
  for (const TileRequest& q : requests) {
    if (q.q_len <= 0) continue;  // no tiles, no V^T units
    q_total += q.q_len;
    kv_total += q.kv_len;
    v.max_kv_len = std::max(v.max_kv_len, q.kv_len);
    v.vt_units += vt_units(q.kv_len);
  }
  const int64_t bytes = static_cast<int64_t>(kv_heads) * v.vt_units * kVtUnitBytes;
  const bool shape_ok = q_total * kVtPreKeysPerQuery >= kv_total;
  const bool fits = v.vt_units > 0 && bytes <= kVtPreMaxBytes;
  // Long rows without promotion: fp32 FADD row sums (kFp8GemmSumMaxKeys, tile_plan.h), so neither
  // the pre-transpose nor the speculative kernels (both sum by the GEMM) unless
  // ATTNKIT_FA3_FP8_VT_PRE=1 forces it. With promotion the GEMM sums are exact enough at any
  // length.
  // promote_auto (the default): long rows only, in the faster chunk order (H200 2026-11-23 15:14Z:
  // promote 2 over 1 +2-5%; the short rows keep the unpromoted kernels, 192-key blocks included).
  const bool past_limit = v.max_kv_len > knobs.gemm_sum_max_keys;
  v.promote = knobs.uniform_wg && (knobs.promote || (knobs.promote_auto && past_limit));
  v.promote_late = v.promote && (knobs.promote ? knobs.promote_late : true);
  const bool long_rows = !v.promote && past_limit;
  v.vt_pre = knobs.uniform_wg && fits &&
             (knobs.vt_pre_mode == 1 || (knobs.vt_pre_mode == -1 && shape_ok && !long_rows));
  v.spec = v.vt_pre && knobs.spec;
  v.gemm_sum = knobs.uniform_wg && (v.vt_pre || (knobs.gemm_sum && !long_rows));
  const int want_block =
      knobs.block_mode != 0 ? knobs.block_mode : (v.max_kv_len >= kFp8Block192MinKeys ? 192 : 128);
  v.block_n = v.spec && !v.promote ? want_block : 128;
  // Three consumer warpgroups: the pre-transpose and speculative kernels at 128-key blocks
  // (promoted or not), unless 192-key blocks were forced and are followed.
  if (knobs.wg3 && v.vt_pre && v.spec && (knobs.block_mode != 192 || v.block_n == 128)) {
    v.block_n = 128;
    v.block_m = 3 * 64;
  }
  v.vt_bytes = v.vt_pre ? bytes : 0;
  if (knobs.vt_pre_mode == 1 && !v.vt_pre && v.vt_units > 0) {
    v.not_honoured =
        "ATTNKIT_FA3_FP8_VT_PRE=1 not followed: " +
        std::string(!knobs.uniform_wg ? "ATTNKIT_FA3_UNIFORM_WG=0"
                                      : "V^T workspace " + std::to_string(bytes) + " bytes > " +
                                            std::to_string(kVtPreMaxBytes));
  } else if (knobs.promote && !v.promote && v.vt_units > 0) {
    v.not_honoured =
        std::string("ATTNKIT_FA3_FP8_PROMOTE=") + (knobs.promote_late ? "2" : "1") +
        " not followed: ATTNKIT_FA3_UNIFORM_WG=0 (the pre-session-7 kernel has no promotion)";
  } else if (knobs.block_mode == 192 && v.block_n != 192 && v.vt_units > 0) {
    v.not_honoured =
        "ATTNKIT_FA3_FP8_BLOCK_N=192 not followed: 192-key blocks need the V^T "
        "pre-transpose and the speculative softmax, without promotion (vt_pre " +
        std::to_string(v.vt_pre) + ", spec " + std::to_string(v.spec) + ", promote " +
        std::to_string(v.promote) + ")";
  } else if (!knobs.gemm_sum && v.gemm_sum) {
    v.not_honoured =
        "ATTNKIT_FA3_FP8_GEMM_SUM=0 not followed: the V^T pre-transpose kernels "
        "always take the row sums from the GEMM";
  }
  return v;
}

Fp8Variant choose_fp8_variant_partitioned(std::span<const TileRequest> requests,
                                          std::vector<uint8_t>* partition, int kv_heads,
                                          const Fp8Knobs& knobs) {
  if (!partition->empty()) {
    std::vector<TileRequest> mine(requests.begin(), requests.end());
    for (size_t r = 0; r < mine.size() && r < partition->size(); ++r) {
      if ((*partition)[r] != 0) mine[r].q_len = 0;
    }
    const Fp8Variant v = choose_fp8_variant(mine, kv_heads, knobs);
    if (fp8_plan_takes_variants(v)) return v;
    partition->clear();
  }
  return choose_fp8_variant(requests, kv_heads, knobs);
}

}  // namespace attnkit::fa3
