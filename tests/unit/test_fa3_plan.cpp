// The fa3 host planner: plan layout, longest-first tile order (the header's worked example), empty
// requests, the error for inconsistent lengths; key blocks, TMA box rows and the persistent
// schedule (fa3_params.h); the FP8 kernel variant (choose_fp8_variant), promotion and its knobs;
// the FP8 kernel's check of a speculative step on packed e4m3 P (fp8_spec_check.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/dtype.h"
#include "backends/fa3/kernels/fa3_params.h"
#include "backends/fa3/kernels/fp8_spec_check.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "support/scoped_env.h"

namespace attnkit::fa3 {
namespace {

struct TileWords {
  int32_t request, m0;
  bool operator==(const TileWords&) const = default;
};

std::vector<TileWords> tiles_of(const TilePlan& plan, int bs) {
  std::vector<TileWords> t;
  const size_t first = kPlanHeaderWords + static_cast<size_t>(bs) * kRequestWords;
  for (size_t i = first; i + 1 < plan.words.size(); i += kTileWords) {
    t.push_back({plan.words[i], plan.words[i + 1]});
  }
  return t;
}

// The MLA prefill kernel's plans (the chunked prefix cache's passes): kv_rows in the request
// words' fourth slot, and bidirectional passes whose chunks hold fewer keys than new tokens (none
// at all included), their tiles sorted by kv_len.
TEST(Fa3PlanTest, MlaPassPlansTakeKvRowsAndShortChunks) {
  const std::vector<TileRequest> reqs = {{0, 300, 64}, {300, 31, 0}, {331, 1, 500}};
  const std::vector<int32_t> rows = {0, 64, 64};
  Result<TilePlan> plan = build_tile_plan(reqs, 128, TileAnchor::kEnd, rows, /*causal=*/false);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->num_tiles, 5);
  for (int r = 0; r < 3; ++r) {
    const int32_t* w = plan->words.data() + kPlanHeaderWords + r * kRequestWords;
    EXPECT_EQ(w[0], reqs[static_cast<size_t>(r)].q_start);
    EXPECT_EQ(w[1], reqs[static_cast<size_t>(r)].q_len);
    EXPECT_EQ(w[2], reqs[static_cast<size_t>(r)].kv_len);
    EXPECT_EQ(w[3], rows[static_cast<size_t>(r)]) << "request " << r;
  }
  // Longest first: request 2 (500 keys), request 0's three tiles (64 each, request order kept),
  // request 1 (no key: still a tile here, whose rows the kernel writes as O 0, LSE -inf; the
  // chunk passes' requests leave such a request out, mla_pass_requests below).
  const std::vector<TileWords> expected = {{2, -127}, {0, -84}, {0, 44}, {0, 172}, {1, -97}};
  EXPECT_EQ(tiles_of(*plan, 3), expected);
  // The same requests under the causal mask are refused (kv_len < q_len), as is a negative
  // kv_len when bidirectional and a kv_rows list of another length.
  EXPECT_EQ(build_tile_plan(reqs, 128, TileAnchor::kEnd, rows).status().code(),
            StatusCode::kInvalidArgument);
  const std::vector<TileRequest> negative = {{0, 4, -1}};
  const std::vector<int32_t> one = {0};
  EXPECT_EQ(build_tile_plan(negative, 128, TileAnchor::kEnd, one, false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(build_tile_plan(reqs, 128, TileAnchor::kEnd, one, false).status().code(),
            StatusCode::kInvalidArgument);
  // Without kv_rows the fourth word stays the V^T block (the MHA / FP8 kernels).
  Result<TilePlan> vt = build_tile_plan(reqs, 128, TileAnchor::kEnd, {}, false);
  ASSERT_TRUE(vt.is_ok());
  EXPECT_EQ(vt->words[kPlanHeaderWords + kRequestWords + 3], vt_units(64));
}

// The requests of the MLA plans (mla_pass_requests): the new tokens over their own rows (pass 0,
// the no-prefix layers), and a chunk pass over its chunk's rows without the requests that have no
// keys in the chunk (they add nothing to the running partial the pass merges into).
TEST(Fa3PlanTest, MlaPassRequestsLeaveRequestsWithoutChunkKeysOut) {
  const std::vector<TileRequest> base = {{0, 300, 0}, {300, 31, 0}, {331, 0, 0}, {331, 5, 0}};
  const MlaPassRequests own = mla_pass_requests(base, nullptr);
  ASSERT_EQ(own.reqs.size(), base.size());
  for (size_t r = 0; r < base.size(); ++r) {
    EXPECT_EQ(own.reqs[r].q_start, base[r].q_start) << "request " << r;
    EXPECT_EQ(own.reqs[r].q_len, base[r].q_len) << "request " << r;
    EXPECT_EQ(own.reqs[r].kv_len, base[r].q_len) << "request " << r;
    EXPECT_EQ(own.kv_rows[r], base[r].q_start) << "request " << r;
  }
  EXPECT_EQ(own.max_kv_len, 300);

  // The chunk: request 0 has 64 keys (rows 0..63), request 1 none, request 2 (no new tokens) 10,
  // request 3 seven.
  const std::vector<int32_t> indptr = {0, 64, 64, 74, 81};
  const MlaPassRequests chunk = mla_pass_requests(base, indptr.data());
  const std::vector<std::vector<int32_t>> expected_reqs = {
      {0, 300, 64}, {300, 0, 0}, {331, 0, 10}, {331, 5, 7}};
  ASSERT_EQ(chunk.reqs.size(), base.size());
  for (size_t r = 0; r < base.size(); ++r) {
    const std::vector<int32_t> got = {chunk.reqs[r].q_start, chunk.reqs[r].q_len,
                                      chunk.reqs[r].kv_len};
    EXPECT_EQ(got, expected_reqs[r]) << "request " << r;
  }
  EXPECT_EQ(chunk.kv_rows, (std::vector<int32_t>{0, 64, 64, 74}));
  EXPECT_EQ(chunk.max_kv_len, 64);  // request 2's 10 keys have no query
  Result<TilePlan> plan =
      build_tile_plan(chunk.reqs, 128, TileAnchor::kEnd, chunk.kv_rows, /*causal=*/false);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  // Request 0's three tiles, then request 3's; request 1 has none.
  const std::vector<TileWords> expected = {{0, -84}, {0, 44}, {0, 172}, {3, -123}};
  EXPECT_EQ(tiles_of(*plan, 4), expected);

  // skip_empty false (ATTNKIT_FA3_MLA_PREFIX_SKIP=0): request 1 keeps its 31 rows over no key,
  // one all-masked tile, last by work.
  const MlaPassRequests all = mla_pass_requests(base, indptr.data(), /*skip_empty=*/false);
  EXPECT_EQ(all.reqs[1].q_len, 31);
  EXPECT_EQ(all.reqs[1].kv_len, 0);
  EXPECT_EQ(all.max_kv_len, 64);
  Result<TilePlan> with_empty =
      build_tile_plan(all.reqs, 128, TileAnchor::kEnd, all.kv_rows, /*causal=*/false);
  ASSERT_TRUE(with_empty.is_ok()) << with_empty.status().to_string();
  const std::vector<TileWords> expected_all = {{0, -84}, {0, 44}, {0, 172}, {3, -123}, {1, -97}};
  EXPECT_EQ(tiles_of(*with_empty, 4), expected_all);
}

TEST(Fa3PlanTest, WorkedExampleOfTheHeader) {
  const std::vector<TileRequest> reqs = {{0, 300, 300}, {300, 1, 77}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->num_tiles, 4);
  EXPECT_EQ(plan->words[0], 4);
  ASSERT_EQ(plan->words.size(),
            static_cast<size_t>(kPlanHeaderWords + 2 * kRequestWords + 4 * kTileWords));
  // V^T units (vt_units: 2 per 192 keys): 2 * 2 + 2 * 1.
  EXPECT_EQ(plan->words[1], 6);
  // Requests: q_start, q_len, kv_len, first V^T block.
  EXPECT_EQ(plan->words[kPlanHeaderWords + 0], 0);
  EXPECT_EQ(plan->words[kPlanHeaderWords + 1], 300);
  EXPECT_EQ(plan->words[kPlanHeaderWords + 2], 300);
  EXPECT_EQ(plan->words[kPlanHeaderWords + 3], 0);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 0], 300);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 2], 77);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 3], 4);
  // Tiles end at each request's last token (TileAnchor::kEnd): request 0's 300 rows as -84..43,
  // 44..171, 172..299 (44 / 172 / 300 keys), request 1's one row as the last of -127..0 (77 keys).
  const std::vector<TileWords> expected = {{0, 172}, {0, 44}, {1, -127}, {0, -84}};
  EXPECT_EQ(tiles_of(*plan, 2), expected);
  // TileAnchor::kStart (ATTNKIT_FA3_TILE_ANCHOR=start): 0..127, 128..255, 256..383 and 0..127.
  Result<TilePlan> start = build_tile_plan(reqs, 128, TileAnchor::kStart);
  ASSERT_TRUE(start.is_ok());
  const std::vector<TileWords> expected_start = {{0, 256}, {0, 128}, {0, 0}, {1, 0}};
  EXPECT_EQ(tiles_of(*start, 2), expected_start);
}

// Every new token of every request lies in exactly one tile; no tile lies wholly outside its
// request; kEnd ends each request's last tile at its last token.
TEST(Fa3PlanTest, TilesCoverEveryRowOnceUnderBothAnchors) {
  for (const TileAnchor anchor : {TileAnchor::kStart, TileAnchor::kEnd}) {
    for (const int block_m : {128, 192}) {
      std::vector<TileRequest> reqs;
      int start = 0;
      for (const int q : {1, 63, 64, 127, 128, 129, 191, 192, 193, 300, 4096, 4097, 0, 8191}) {
        reqs.push_back({start, q, q + 17});
        start += q;
      }
      Result<TilePlan> plan = build_tile_plan(reqs, block_m, anchor);
      ASSERT_TRUE(plan.is_ok());
      std::vector<std::vector<int>> hits(reqs.size());
      for (size_t r = 0; r < reqs.size(); ++r) hits[r].assign(reqs[r].q_len, 0);
      std::vector<int> last_row(reqs.size(), -1);
      for (const TileWords& t : tiles_of(*plan, static_cast<int>(reqs.size()))) {
        const int q_len = reqs[t.request].q_len;
        ASSERT_GT(t.m0, -block_m);
        ASSERT_LT(t.m0, q_len);
        if (anchor == TileAnchor::kStart) EXPECT_GE(t.m0, 0);
        for (int row = std::max(t.m0, 0); row < std::min(t.m0 + block_m, q_len); ++row) {
          ++hits[t.request][row];
        }
        last_row[t.request] = std::max(last_row[t.request], t.m0 + block_m - 1);
      }
      for (size_t r = 0; r < reqs.size(); ++r) {
        for (int row = 0; row < reqs[r].q_len; ++row) {
          ASSERT_EQ(hits[r][row], 1) << "request " << r << " row " << row << " block_m " << block_m
                                     << " anchor " << static_cast<int>(anchor);
        }
        if (anchor == TileAnchor::kEnd && reqs[r].q_len > 0) {
          EXPECT_EQ(last_row[r], reqs[r].q_len - 1) << r;
        }
      }
    }
  }
}

TEST(Fa3PlanTest, PrefixRaisesEveryTileAndEmptyRequestsHaveNone) {
  // A 1000-key prefix: every tile of request 2 reads more keys than request 0's longest tile
  // (tiles at 1 and -127 read 1129 and 1001 keys; request 0's at 72 and -56, 200 and 72).
  const std::vector<TileRequest> reqs = {{0, 200, 200}, {200, 0, 5}, {200, 129, 1129}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_TRUE(plan.is_ok());
  const std::vector<TileWords> expected = {{2, 1}, {2, -127}, {0, 72}, {0, -56}};
  EXPECT_EQ(tiles_of(*plan, 3), expected);
  // V^T units only for requests with new tokens: vt_units(200) + vt_units(1129) = 4 + 12.
  EXPECT_EQ(plan->words[1], vt_units(200) + vt_units(1129));
  EXPECT_EQ(plan->words[1], 16);
  EXPECT_EQ(plan->words[kPlanHeaderWords + kRequestWords + 3], 4);      // request 1: none
  EXPECT_EQ(plan->words[kPlanHeaderWords + 2 * kRequestWords + 3], 4);  // request 2 follows 0
}

TEST(Fa3PlanTest, RequestsFromTheForwardBatch) {
  ForwardBatch b;
  b.batch_size = 2;
  b.seq_lens_host = {500, 7};
  b.extend_seq_lens_host = {100, 7};
  std::vector<TileRequest> reqs = tile_requests(b);
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].q_start, 0);
  EXPECT_EQ(reqs[0].q_len, 100);
  EXPECT_EQ(reqs[0].kv_len, 500);
  EXPECT_EQ(reqs[1].q_start, 100);
  EXPECT_EQ(reqs[1].q_len, 7);
  EXPECT_EQ(reqs[1].kv_len, 7);
  b.extend_seq_lens_host.clear();  // draft extend: draft_token_num per request
  b.spec.draft_token_num = 4;
  reqs = tile_requests(b);
  EXPECT_EQ(reqs[1].q_start, 4);
  EXPECT_EQ(reqs[1].q_len, 4);
}

// ---- FP8 variant ----

// Knobs that let every request take the GEMM row sums (the fast kernels at any row length), on
// two consumer warpgroups (ATTNKIT_FA3_FP8_WG3=0: the 192-key rule applies).
Fp8Knobs fast_at_any_length() {
  Fp8Knobs k;
  k.gemm_sum_max_keys = 1 << 30;
  k.wg3 = false;
  return k;
}

// ATTNKIT_FA3_FP8_PROMOTE=0: no promotion, so long rows take the FADD row-sum kernel.
Fp8Knobs unpromoted() {
  Fp8Knobs k;
  k.promote_auto = false;
  return k;
}

TEST(Fa3Fp8VariantTest, WorkedExampleOfTheHeader) {
  // Prefix 1200 + 800 new: 2000 <= 2048 keys, 800 x 8 = 6400 >= 2000 -> pre-transpose, 128.
  const std::vector<TileRequest> short_rows = {{0, 800, 2000}};
  const Fp8Variant s = choose_fp8_variant(short_rows, 2, Fp8Knobs{});
  EXPECT_TRUE(s.vt_pre);
  EXPECT_TRUE(s.spec);
  EXPECT_TRUE(s.gemm_sum);
  EXPECT_EQ(s.block_n, 128);
  EXPECT_EQ(s.vt_units, 22);
  EXPECT_EQ(s.vt_bytes, int64_t{2} * 22 * kVtBlockKeys * 128);
  EXPECT_TRUE(s.not_honoured.empty()) << s.not_honoured;

  // Prefix 7200 + 1036 new: 8236 > 2048 keys -> by default promoted (order 2): pre-transpose,
  // speculation, GEMM row sums, 128-key blocks.
  const std::vector<TileRequest> reqs = {{0, 1036, 8236}};
  const Fp8Variant a = choose_fp8_variant(reqs, 2, Fp8Knobs{});
  EXPECT_TRUE(a.promote && a.promote_late && a.vt_pre && a.spec && a.gemm_sum);
  EXPECT_EQ(a.block_n, 128);
  EXPECT_TRUE(a.not_honoured.empty()) << a.not_honoured;
  // The short request is not promoted by default.
  EXPECT_FALSE(s.promote);

  // Without promotion (ATTNKIT_FA3_FP8_PROMOTE=0): FADD row sums: in-kernel transpose, 128, exact.
  const Fp8Variant d = choose_fp8_variant(reqs, 2, unpromoted());
  EXPECT_FALSE(d.vt_pre);
  EXPECT_FALSE(d.spec);
  EXPECT_FALSE(d.gemm_sum);
  EXPECT_EQ(d.block_n, 128);
  EXPECT_EQ(d.vt_bytes, 0);
  EXPECT_TRUE(d.not_honoured.empty()) << d.not_honoured;

  // The same with the GEMM row sums allowed at any length: 1036 x 8 = 8288 >= 8236 keys ->
  // pre-transpose; 8236 >= 8192 -> 192.
  const Fp8Variant v = choose_fp8_variant(reqs, 2, fast_at_any_length());
  EXPECT_TRUE(v.vt_pre);
  EXPECT_TRUE(v.spec);
  EXPECT_TRUE(v.gemm_sum);
  EXPECT_EQ(v.block_n, 192);
  EXPECT_EQ(v.vt_units, 86);
  EXPECT_EQ(v.max_kv_len, 8236);
  EXPECT_EQ(v.vt_bytes, int64_t{2} * 86 * kVtBlockKeys * 128);
  EXPECT_TRUE(v.not_honoured.empty()) << v.not_honoured;
  // The plan reserves the same units.
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->words[1], v.vt_units);

  // Prefix 2000 + 100 new: 800 < 2100 -> the in-kernel transpose, 128 keys, exact softmax (GEMM
  // row sums where allowed).
  const std::vector<TileRequest> few = {{0, 100, 2100}};
  const Fp8Variant w = choose_fp8_variant(few, 2, fast_at_any_length());
  EXPECT_FALSE(w.vt_pre);
  EXPECT_FALSE(w.spec);
  EXPECT_TRUE(w.gemm_sum);
  EXPECT_EQ(w.block_n, 128);
  EXPECT_EQ(w.vt_bytes, 0);
  EXPECT_FALSE(choose_fp8_variant(few, 2, unpromoted()).gemm_sum);  // 2100 > 2048 keys
}

TEST(Fa3Fp8VariantTest, LongRowsArePromotedByDefault) {
  // 2048 keys: unpromoted GEMM row sums (and the pre-transpose for a prefill); 2049: promoted
  // (order 2), same kernel family, 128-key blocks.
  Fp8Variant v = choose_fp8_variant(std::vector<TileRequest>{{0, 2048, 2048}}, 1, {});
  EXPECT_TRUE(v.vt_pre && v.spec && v.gemm_sum);
  EXPECT_FALSE(v.promote);
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 2049, 2049}}, 1, {});
  EXPECT_TRUE(v.promote && v.promote_late && v.vt_pre && v.spec && v.gemm_sum);
  EXPECT_EQ(v.block_n, 128);
  // 16k prefill: promoted on 128-key blocks (192 only without promotion).
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 16384, 16384}}, 8, {});
  EXPECT_TRUE(v.promote && v.vt_pre && v.spec);
  EXPECT_EQ(v.block_n, 128);
  // One long request decides for the whole forward.
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 100, 100}, {0, 16, 4096}}, 1, {});
  EXPECT_TRUE(v.promote && v.gemm_sum);
  // The old guard moved with gemm_sum_max_keys: raised, nothing is promoted.
  Fp8Knobs raised;
  raised.gemm_sum_max_keys = 1 << 30;
  EXPECT_FALSE(choose_fp8_variant(std::vector<TileRequest>{{0, 16, 4096}}, 1, raised).promote);
  // ATTNKIT_FA3_UNIFORM_WG=0 has no promotion: the FADD kernel, nothing reported (not forced).
  Fp8Knobs old_kernel;
  old_kernel.uniform_wg = false;
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 4096, 4096}}, 1, old_kernel);
  EXPECT_FALSE(v.promote || v.gemm_sum);
  EXPECT_TRUE(v.not_honoured.empty()) << v.not_honoured;
}

TEST(Fa3TilePlanTest, RowsPerTileAtD128FollowThePadding) {
  using R = std::vector<TileRequest>;
  constexpr TileAnchor kStart = TileAnchor::kStart;
  // Padding in the last tile (kStart), where it sees every key.
  // 8192 = 42 x 192 + 128: 64 padded rows x 8192 keys = 1.6% of the causal pairs -> 192.
  EXPECT_EQ(choose_block_m_d128(R{{0, 8192, 8192}}, kStart), 192);
  EXPECT_EQ(choose_block_m_d128(R{{0, 16384, 16384}}, kStart), 192);  // 128 padded rows, 1.6%
  // 4096 = 21 x 192 + 64: 128 padded rows x 4096 keys = 6.25% -> 128.
  EXPECT_EQ(choose_block_m_d128(R{{0, 4096, 4096}}, kStart), 128);
  EXPECT_EQ(choose_block_m_d128(R{{0, 4096, 4096}, {4096, 4096, 4096}}, kStart), 128);
  // Whole 192-row tiles pad nothing.
  EXPECT_EQ(choose_block_m_d128(R{{0, 2304, 2560}}, kStart), 192);
  // 4096 new tokens after a 4096 prefix: 128 x 8192 padded of 25.2M pairs (4.2%) -> 192.
  EXPECT_EQ(choose_block_m_d128(R{{0, 4096, 8192}}, kStart), 192);
  // A short extend pads most of its one tile: 128.
  EXPECT_EQ(choose_block_m_d128(R{{0, 128, 2176}}, kStart), 128);
  EXPECT_EQ(choose_block_m_d128(R{{0, 100, 100}}, kStart), 128);
  // Requests without new tokens count nowhere; none at all: 128.
  EXPECT_EQ(choose_block_m_d128(R{{0, 0, 9000}, {0, 8192, 8192}}, kStart), 192);
  EXPECT_EQ(choose_block_m_d128(R{{0, 0, 9000}}, kStart), 128);
  EXPECT_EQ(choose_block_m_d128(R{}, kStart), 128);

  // Padding in the first tile (kEnd, the default), where the padded rows see the prefix and the
  // tile's real rows: 4096 on 192 rows pads 128 rows x 64 keys (0.1%) -> 192.
  EXPECT_EQ(choose_block_m_d128(R{{0, 4096, 4096}}), 192);
  EXPECT_EQ(choose_block_m_d128(R{{0, 4096, 4096}, {4096, 4096, 4096}}), 192);
  EXPECT_EQ(choose_block_m_d128(R{{0, 8192, 8192}}), 192);
  // After a prefix the padded rows see it: 128 new tokens after 2048 pad 64 x 2176 keys of 270k
  // pairs on 192 rows, none on 128 -> 128; 4096 after 4096: 128 x 4160 of 25.2M (2.1%) -> 192.
  EXPECT_EQ(choose_block_m_d128(R{{0, 128, 2176}}), 128);
  EXPECT_EQ(choose_block_m_d128(R{{0, 4096, 8192}}), 192);
  // One short prompt: 92 x 100 padded pairs on 192 rows, 28 x 100 on 128, of 5050 -> 128.
  EXPECT_EQ(choose_block_m_d128(R{{0, 100, 100}}), 128);
  // Many 1000-token prompts: causal 152 rows x 40 keys on 192, 24 x 104 on 128 (0.7% more), but
  // a bidirectional layer of the forward would pad 128 more rows of 1000 keys per 1000 rows
  // (12.8% > 8%) -> 128. At 3000 tokens neither tile size pads more than the other -> 192.
  EXPECT_EQ(choose_block_m_d128(R(16, TileRequest{0, 1000, 1000})), 128);
  EXPECT_EQ(choose_block_m_d128(R(5, TileRequest{0, 3000, 3000})), 192);
  // 4096: bidirectional 128 more padded rows of 4096 (3.1%) -> 192, as measured (+5.5%).
  EXPECT_EQ(choose_block_m_d128(R(4, TileRequest{0, 4096, 4096})), 192);
  EXPECT_EQ(choose_block_m_d128(R{}), 128);
}

TEST(Fa3Fp8SpecCheckTest, PackedBytesReachTheLimitExactlyWhereTheValuesDo) {
  // Every e4m3 byte a P can take (0x00..0x7f: P >= 0, NaN 0x7f) in every byte of every word,
  // among other bytes just below the limit (the worst case for a carry), against the plain
  // comparison.
  for (const uint32_t limit : {kE4m3SpecLimitLazy, kE4m3SpecLimitEager}) {
    for (uint32_t b = 0; b < 0x80; ++b) {
      for (int word = 0; word < 16; ++word) {
        for (int byte = 0; byte < 4; ++byte) {
          uint32_t w[4][4];
          for (auto& row : w) {
            for (uint32_t& x : row) x = (limit - 1) * 0x01010101u;
          }
          uint32_t& x = w[word / 4][word % 4];
          x = (x & ~(0xffu << (8 * byte))) | (b << (8 * byte));
          ASSERT_EQ(e4m3_words_reach<4>(w, limit), b >= limit)
              << "limit " << limit << " byte " << b << " at word " << word << " byte " << byte;
        }
      }
    }
    const uint32_t zeros[4][4] = {};
    EXPECT_FALSE(e4m3_words_reach<4>(zeros, limit));
  }
  // What the limits mean: with lazy rescale, P >= 248 (a rise of the row maximum by about 8 in
  // log2 units) rounds to 256 = 0x78 and fails; 240 passes. Without, anything that rounds above
  // 1.0 fails; 1.0 and the tie 1.0625 (rounded to even: 1.0) pass.
  EXPECT_EQ(float_to_fp8_e4m3(248.f), kE4m3SpecLimitLazy);
  EXPECT_EQ(float_to_fp8_e4m3(256.f), kE4m3SpecLimitLazy);
  EXPECT_LT(float_to_fp8_e4m3(240.f), kE4m3SpecLimitLazy);
  EXPECT_GE(float_to_fp8_e4m3(1e30f), kE4m3SpecLimitLazy);  // saturated (448)
  EXPECT_LT(float_to_fp8_e4m3(1.0f), kE4m3SpecLimitEager);
  EXPECT_LT(float_to_fp8_e4m3(1.0625f), kE4m3SpecLimitEager);
  EXPECT_EQ(float_to_fp8_e4m3(1.125f), kE4m3SpecLimitEager);
}

TEST(Fa3Fp8VariantTest, ThreeConsumerWarpgroupsOnlyWithThePreTransposeAndSpeculation) {
  // On by default; ATTNKIT_FA3_FP8_WG3=0: 128-row tiles.
  Fp8Knobs two;
  two.wg3 = false;
  EXPECT_EQ(choose_fp8_variant(std::vector<TileRequest>{{0, 4096, 4096}}, 1, two).block_m, 128);
  const Fp8Knobs wg3;
  EXPECT_EQ(choose_fp8_variant(std::vector<TileRequest>{{0, 4096, 4096}}, 1, wg3).block_m, 192);
  // A promoted prefill (4096 keys) and an unpromoted one at 192 keys by default (16k with the
  // GEMM sums allowed at any length): both 192-row tiles on 128-key blocks.
  Fp8Variant v = choose_fp8_variant(std::vector<TileRequest>{{0, 4096, 4096}}, 1, wg3);
  EXPECT_EQ(v.block_m, 192);
  EXPECT_EQ(v.block_n, 128);
  EXPECT_TRUE(v.promote && v.vt_pre && v.spec);
  Fp8Knobs fast = fast_at_any_length();
  fast.wg3 = true;
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 16384, 16384}}, 1, fast);
  EXPECT_EQ(v.block_m, 192);
  EXPECT_EQ(v.block_n, 128);
  EXPECT_FALSE(v.promote);
  // Without the pre-transpose (a decode-like extend), without speculation or with 192-key blocks
  // forced: two warpgroups.
  EXPECT_EQ(choose_fp8_variant(std::vector<TileRequest>{{0, 16, 4096}}, 1, wg3).block_m, 128);
  Fp8Knobs no_spec = wg3;
  no_spec.spec = false;
  EXPECT_EQ(choose_fp8_variant(std::vector<TileRequest>{{0, 4096, 4096}}, 1, no_spec).block_m, 128);
  Fp8Knobs forced192 = fast;
  forced192.block_mode = 192;
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 16384, 16384}}, 1, forced192);
  EXPECT_EQ(v.block_m, 128);
  EXPECT_EQ(v.block_n, 192);
  // The kernels that exist: 192 rows only with vt_pre, spec, the GEMM sums and 128 keys.
  EXPECT_EQ(fp8_kernel_missing(128, true, true, true, 2, true, 192), "");
  EXPECT_EQ(fp8_kernel_missing(128, true, true, true, 0, true, 192), "");
  EXPECT_NE(fp8_kernel_missing(192, true, true, true, 0, true, 192), "");
  EXPECT_NE(fp8_kernel_missing(128, true, false, true, 0, true, 192), "");
  EXPECT_NE(fp8_kernel_missing(128, true, true, true, 0, true, 256), "");
}

TEST(Fa3Fp8VariantTest, LongRowsTakeFaddRowSumsWithoutPromotion) {
  // ATTNKIT_FA3_FP8_PROMOTE=0: 2048 keys: GEMM row sums (and the pre-transpose for a prefill);
  // 2049: FADD.
  Fp8Variant v = choose_fp8_variant(std::vector<TileRequest>{{0, 2048, 2048}}, 1, unpromoted());
  EXPECT_TRUE(v.vt_pre && v.spec && v.gemm_sum);
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 2049, 2049}}, 1, unpromoted());
  EXPECT_FALSE(v.vt_pre || v.spec || v.gemm_sum || v.promote);
  EXPECT_EQ(v.block_n, 128);
  // One long request decides for the whole forward.
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 100, 100}, {0, 16, 4096}}, 1, unpromoted());
  EXPECT_FALSE(v.gemm_sum);
  // ATTNKIT_FA3_FP8_VT_PRE=1 still forces the pre-transpose kernel (GEMM sums) at any length.
  Fp8Knobs k = unpromoted();
  k.vt_pre_mode = 1;
  v = choose_fp8_variant(std::vector<TileRequest>{{0, 4096, 4096}}, 1, k);
  EXPECT_TRUE(v.vt_pre && v.gemm_sum);
}

TEST(Fa3Fp8VariantTest, ThresholdsAndRequestsWithoutNewTokens) {
  // With GEMM row sums allowed at any length: 8191 keys: 128; 8192: 192 (prefill).
  const Fp8Knobs fast = fast_at_any_length();
  EXPECT_EQ(choose_fp8_variant(std::vector<TileRequest>{{0, 8191, 8191}}, 1, fast).block_n, 128);
  EXPECT_EQ(choose_fp8_variant(std::vector<TileRequest>{{0, 8192, 8192}}, 1, fast).block_n, 192);
  // Exactly one query per 8 keys still pre-transposes; one key more does not.
  EXPECT_TRUE(choose_fp8_variant(std::vector<TileRequest>{{0, 100, 800}}, 1, {}).vt_pre);
  EXPECT_FALSE(choose_fp8_variant(std::vector<TileRequest>{{0, 100, 801}}, 1, {}).vt_pre);
  // A request without new tokens counts nowhere: not in the shape rule (its 9000 keys would make
  // it 300 queries for 9300 keys: the in-kernel transpose), the units or the longest request
  // (192 from 8192 keys).
  const std::vector<TileRequest> reqs = {{0, 0, 9000}, {0, 300, 300}};
  const Fp8Variant v = choose_fp8_variant(reqs, 4, {});
  EXPECT_TRUE(v.vt_pre);
  EXPECT_EQ(v.block_n, 128);
  EXPECT_EQ(v.max_kv_len, 300);
  EXPECT_EQ(v.vt_units, vt_units(300));
  // Only requests without new tokens: nothing to transpose.
  EXPECT_FALSE(choose_fp8_variant(std::vector<TileRequest>{{0, 0, 50}}, 4, {}).vt_pre);
}

TEST(Fa3Fp8VariantTest, KnobsAndWhatCannotBeFollowed) {
  const std::vector<TileRequest> long_req = {{0, 1036, 8236}};
  const std::vector<TileRequest> few = {{0, 100, 2100}};
  Fp8Knobs k = fast_at_any_length();
  k.block_mode = 128;
  EXPECT_EQ(choose_fp8_variant(long_req, 2, k).block_n, 128);
  k = fast_at_any_length();
  k.vt_pre_mode = 1;
  Fp8Variant v = choose_fp8_variant(few, 2, k);
  EXPECT_TRUE(v.vt_pre);
  EXPECT_TRUE(v.spec);
  EXPECT_EQ(v.max_kv_len, 2100);
  k.vt_pre_mode = 0;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_FALSE(v.vt_pre);
  EXPECT_EQ(v.block_n, 128);
  // 192 forced but the speculative softmax off: 128, reported.
  k = fast_at_any_length();
  k.block_mode = 192;
  k.spec = false;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_TRUE(v.vt_pre);
  EXPECT_FALSE(v.spec);
  EXPECT_EQ(v.block_n, 128);
  EXPECT_NE(v.not_honoured.find("ATTNKIT_FA3_FP8_BLOCK_N=192"), std::string::npos);
  // FADD row sums asked for, but the pre-transpose kernels sum by the GEMM: reported.
  k = fast_at_any_length();
  k.gemm_sum = false;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_TRUE(v.gemm_sum);
  EXPECT_NE(v.not_honoured.find("ATTNKIT_FA3_FP8_GEMM_SUM=0"), std::string::npos);
  EXPECT_FALSE(choose_fp8_variant(few, 2, k).gemm_sum);  // in-kernel transpose: FADD sums
  // Workspace over 1 GiB: 8 kv heads x vt_units(800000) = 8334 units x 16 KB; forced: reported.
  const std::vector<TileRequest> huge = {{0, 800000, 800000}};
  EXPECT_FALSE(choose_fp8_variant(huge, 8, {}).vt_pre);
  k = fast_at_any_length();
  k.vt_pre_mode = 1;
  v = choose_fp8_variant(huge, 8, k);
  EXPECT_FALSE(v.vt_pre);
  EXPECT_NE(v.not_honoured.find("ATTNKIT_FA3_FP8_VT_PRE=1"), std::string::npos);
  // The pre-session-7 kernel: nothing of the above.
  k = fast_at_any_length();
  k.uniform_wg = false;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_FALSE(v.vt_pre);
  EXPECT_FALSE(v.gemm_sum);
  EXPECT_EQ(v.block_n, 128);
}

Fp8Knobs promoted() {
  Fp8Knobs k;
  k.promote = true;
  return k;
}

TEST(Fa3Fp8VariantTest, PromotionKeepsTheFastKernelsAtLongRows) {
  // Prefix 7200 + 1036 new (the header's worked example): 8236 > 2048 keys, yet with promotion
  // the pre-transpose / speculative / GEMM-sum kernel, on 128-key blocks (not 192: no registers).
  const std::vector<TileRequest> long_req = {{0, 1036, 8236}};
  Fp8Variant v = choose_fp8_variant(long_req, 2, promoted());
  EXPECT_TRUE(v.promote);
  EXPECT_TRUE(v.vt_pre);
  EXPECT_TRUE(v.spec);
  EXPECT_TRUE(v.gemm_sum);
  EXPECT_EQ(v.block_n, 128);
  EXPECT_EQ(v.vt_units, 86);
  EXPECT_TRUE(v.not_honoured.empty()) << v.not_honoured;
  EXPECT_FALSE(v.promote_late);
  // Without promotion the same forward takes the FADD kernel (the 2048-key guard).
  EXPECT_FALSE(choose_fp8_variant(long_req, 2, unpromoted()).promote);
  EXPECT_FALSE(choose_fp8_variant(long_req, 2, unpromoted()).gemm_sum);
  // 16k prefill: 192 without promotion (guard lifted), 128 with it.
  const std::vector<TileRequest> p16k = {{0, 16384, 16384}};
  Fp8Knobs fast = fast_at_any_length();
  EXPECT_EQ(choose_fp8_variant(p16k, 8, fast).block_n, 192);
  fast.promote = true;
  v = choose_fp8_variant(p16k, 8, fast);
  EXPECT_TRUE(v.promote && v.vt_pre && v.spec && v.gemm_sum);
  EXPECT_EQ(v.block_n, 128);
  // A long extend with few queries per key: the in-kernel transpose, GEMM row sums (the long-row
  // limit no longer applies), promoted; with ATTNKIT_FA3_FP8_GEMM_SUM=0: FADD sums, promoted.
  const std::vector<TileRequest> few = {{0, 100, 2100}};
  v = choose_fp8_variant(few, 2, promoted());
  EXPECT_TRUE(v.promote && v.gemm_sum);
  EXPECT_FALSE(v.vt_pre || v.spec);
  Fp8Knobs k = promoted();
  k.gemm_sum = false;
  v = choose_fp8_variant(few, 2, k);
  EXPECT_TRUE(v.promote);
  EXPECT_FALSE(v.gemm_sum);
  // The exact-softmax pre-transpose kernel, promoted (ATTNKIT_FA3_FP8_SPEC=0).
  k = promoted();
  k.spec = false;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_TRUE(v.promote && v.vt_pre && v.gemm_sum);
  EXPECT_FALSE(v.spec);
}

TEST(Fa3Fp8VariantTest, PromotionKnobsThatCannotBeFollowed) {
  const std::vector<TileRequest> long_req = {{0, 1036, 8236}};
  // 192 forced with promotion: 128, reported.
  Fp8Knobs k = promoted();
  k.block_mode = 192;
  Fp8Variant v = choose_fp8_variant(long_req, 2, k);
  EXPECT_TRUE(v.promote);
  EXPECT_EQ(v.block_n, 128);
  EXPECT_NE(v.not_honoured.find("ATTNKIT_FA3_FP8_BLOCK_N=192"), std::string::npos);
  EXPECT_NE(v.not_honoured.find("promote 1"), std::string::npos);
  // The pre-session-7 kernel has no promotion: reported; the long-row guard applies again.
  k = promoted();
  k.uniform_wg = false;
  k.promote_late = true;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_FALSE(v.promote || v.promote_late || v.vt_pre || v.gemm_sum);
  EXPECT_NE(v.not_honoured.find("ATTNKIT_FA3_FP8_PROMOTE=2 not followed"), std::string::npos)
      << v.not_honoured;
  k.promote_late = false;
  v = choose_fp8_variant(long_req, 2, k);
  EXPECT_NE(v.not_honoured.find("ATTNKIT_FA3_FP8_PROMOTE=1 not followed"), std::string::npos)
      << v.not_honoured;
}

// The plans that take a window / sinks / soft-cap on the FP8 kernel (fp8_plan_takes_variants;
// run_prefill_sm90_fp8 instantiates kWindowSinks / kSoftcap kernels for exactly these): under the
// default knobs, the three-warpgroup plan and the two-warpgroup plan of few queries per key
// (chunked prefill over a long prefix), unpromoted up to gemm_sum_max_keys keys and promoted past
// them; not with the promoted chunks forced into the early order, nor with FADD row sums.
TEST(Fa3Fp8VariantTest, VariantPlans) {
  const Fp8Knobs defaults;
  const std::vector<TileRequest> many = {{0, 1036, 4236}};  // >= 1 query per 8 keys
  const std::vector<TileRequest> few = {{0, 100, 1600}};    // < 1 per 8, <= 2048 keys
  const std::vector<TileRequest> few_long = {{0, 100, 2100}, {0, 30, 900}};
  Fp8Variant v = choose_fp8_variant(many, 2, defaults);
  EXPECT_EQ(v.block_m, 192);
  EXPECT_TRUE(fp8_plan_takes_variants(v));
  v = choose_fp8_variant(few, 2, defaults);
  EXPECT_EQ(v.block_m, 128);
  EXPECT_FALSE(v.vt_pre);
  EXPECT_FALSE(v.promote);
  EXPECT_TRUE(fp8_plan_takes_variants(v));
  v = choose_fp8_variant(few_long, 2, defaults);
  EXPECT_TRUE(v.promote && v.promote_late);
  EXPECT_TRUE(fp8_plan_takes_variants(v));
  Fp8Knobs early = defaults;
  early.promote = true;
  early.promote_late = false;
  EXPECT_FALSE(fp8_plan_takes_variants(choose_fp8_variant(few_long, 2, early)));
  Fp8Knobs fadd = defaults;
  fadd.gemm_sum = false;
  EXPECT_FALSE(fp8_plan_takes_variants(choose_fp8_variant(few, 2, fadd)));
  Fp8Knobs old_kernel = defaults;
  old_kernel.uniform_wg = false;
  EXPECT_FALSE(fp8_plan_takes_variants(choose_fp8_variant(few, 2, old_kernel)));
}

// A partitioned forward over an fp8_e4m3 pool (choose_fp8_variant_partitioned, the engine's
// rule): the FP8 plan is the long requests' alone where it takes a window / sinks / soft-cap (its
// layers cannot leave for flashinfer one by one); else the partition is dropped and the plan is
// the whole forward's.
TEST(Fa3Fp8VariantTest, PartitionedPlansKeepTheVariants) {
  const Fp8Knobs defaults;
  // Two decode rows over 4000 keys beside a 256-token chunk over 1800: the chunk alone has >= 1
  // query per 8 keys (the three-warpgroup plan); with the decode rows it would not.
  const std::vector<TileRequest> mixed = {{0, 1, 4001}, {1, 256, 1800}, {257, 1, 4001}};
  std::vector<uint8_t> flags = {1, 0, 1};
  const Fp8Variant v = choose_fp8_variant_partitioned(mixed, &flags, 2, defaults);
  EXPECT_EQ(flags, (std::vector<uint8_t>{1, 0, 1}));
  const std::vector<TileRequest> chunk_only = {{0, 0, 4001}, {1, 256, 1800}, {257, 0, 4001}};
  const Fp8Variant want = choose_fp8_variant(chunk_only, 2, defaults);
  EXPECT_EQ(v.block_m, want.block_m);
  EXPECT_EQ(v.block_m, 192);
  EXPECT_TRUE(v.vt_pre);
  EXPECT_EQ(v.vt_units, want.vt_units);  // the decode rows' keys get no V^T units
  EXPECT_LT(v.vt_units, choose_fp8_variant(mixed, 2, defaults).vt_units);
  EXPECT_EQ(v.max_kv_len, 1800);
  EXPECT_TRUE(fp8_plan_takes_variants(v));
  // No partition: the whole forward's plan.
  std::vector<uint8_t> none;
  const Fp8Variant whole = choose_fp8_variant_partitioned(mixed, &none, 2, defaults);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(whole.max_kv_len, 4001);
  EXPECT_EQ(whole.vt_pre, choose_fp8_variant(mixed, 2, defaults).vt_pre);
  // FADD row sums forced (ATTNKIT_FA3_FP8_GEMM_SUM=0): a chunk with few queries per key gets the
  // two-warpgroup plan without the variants, so the forward stays whole.
  Fp8Knobs fadd = defaults;
  fadd.gemm_sum = false;
  const std::vector<TileRequest> few = {{0, 1, 4001}, {1, 100, 1600}};
  std::vector<uint8_t> few_flags = {1, 0};
  const Fp8Variant f = choose_fp8_variant_partitioned(few, &few_flags, 2, fadd);
  EXPECT_TRUE(few_flags.empty()) << "a partition kept on a plan without the variants";
  const Fp8Variant f_whole = choose_fp8_variant(few, 2, fadd);
  EXPECT_EQ(f.max_kv_len, f_whole.max_kv_len);
  EXPECT_EQ(f.block_m, f_whole.block_m);
  EXPECT_EQ(f.vt_pre, f_whole.vt_pre);
  EXPECT_EQ(f.gemm_sum, f_whole.gemm_sum);
}

// Every variant choose_fp8_variant gives, over the knob combinations and request shapes, has a
// kernel in run_prefill_sm90_fp8 (fp8_kernel_missing is the dispatcher's own check, which fails
// the forward rather than run another kernel): in particular never 192-key blocks with promotion.
TEST(Fa3Fp8VariantTest, EveryChosenVariantHasAKernel) {
  const std::vector<std::vector<TileRequest>> shapes = {
      {{0, 1036, 8236}},
      {{0, 16384, 16384}},
      {{0, 100, 2100}},
      {{0, 800, 2000}},
      {{0, 1, 9000}},
      {{0, 1036, 8236}, {1036, 90, 90}},
      {{0, 0, 4000}, {0, 64, 64}},
  };
  int checked = 0, promoted_192 = 0, k192 = 0, promoted = 0, rows192 = 0;
  for (int mask = 0; mask < (1 << 9); ++mask) {
    Fp8Knobs k;
    k.spec = (mask & 1) != 0;
    k.gemm_sum = (mask & 2) != 0;
    k.uniform_wg = (mask & 4) != 0;
    k.promote = (mask & 8) != 0;
    k.promote_late = (mask & 16) != 0;
    k.block_mode = (mask & 32) != 0 ? 192 : 0;
    k.gemm_sum_max_keys = (mask & 64) != 0 ? 1 << 30 : kFp8GemmSumMaxKeys;
    k.promote_auto = (mask & 128) != 0;
    k.wg3 = (mask & 256) != 0;
    for (int vt_mode : {-1, 0, 1}) {
      k.vt_pre_mode = vt_mode;
      for (const auto& reqs : shapes) {
        const Fp8Variant v = choose_fp8_variant(reqs, 2, k);
        const int promote = v.promote ? (v.promote_late ? 2 : 1) : 0;
        const std::string why = fp8_kernel_missing(v.block_n, v.vt_pre, v.spec, v.gemm_sum, promote,
                                                   k.uniform_wg, v.block_m);
        EXPECT_TRUE(why.empty()) << why << " (knob mask " << mask << ", vt_pre mode " << vt_mode
                                 << ", first request " << reqs[0].kv_len << " keys)";
        ++checked;
        k192 += v.block_n == 192;
        promoted += promote != 0;
        promoted_192 += promote != 0 && v.block_n == 192;
        rows192 += v.block_m == 192;
      }
    }
  }
  EXPECT_EQ(checked, 512 * 3 * 7);
  EXPECT_GT(rows192, 0);   // three warpgroups (192-row tiles), promoted or not
  EXPECT_GT(k192, 0);      // the sweep reaches 192-key blocks (unpromoted) ...
  EXPECT_GT(promoted, 0);  // ... and promotion, never together
  EXPECT_EQ(promoted_192, 0);
  // The dispatcher's check itself: what has no kernel.
  EXPECT_EQ(fp8_kernel_missing(128, true, true, true, 1, true), "");
  EXPECT_EQ(fp8_kernel_missing(192, true, true, true, 0, true), "");
  EXPECT_EQ(fp8_kernel_missing(128, false, false, false, 2, true), "");
  EXPECT_EQ(fp8_kernel_missing(128, false, false, false, 0, false), "");
  EXPECT_NE(fp8_kernel_missing(192, true, true, true, 1, true), "");  // not instantiated
  EXPECT_NE(fp8_kernel_missing(192, true, true, true, 2, true), "");
  EXPECT_NE(fp8_kernel_missing(192, true, false, true, 0, true), "");  // 192 needs spec
  EXPECT_NE(fp8_kernel_missing(192, false, false, true, 0, true), "");
  EXPECT_NE(fp8_kernel_missing(128, false, true, true, 0, true), "");     // spec needs vt_pre
  EXPECT_NE(fp8_kernel_missing(128, true, false, false, 0, true), "");    // vt_pre: GEMM sums
  EXPECT_NE(fp8_kernel_missing(128, false, false, false, 1, false), "");  // uniform_wg 0
  EXPECT_NE(fp8_kernel_missing(128, false, false, true, 0, false), "");
  EXPECT_NE(fp8_kernel_missing(128, true, true, true, 3, true), "");
  EXPECT_NE(fp8_kernel_missing(256, true, true, true, 0, true), "");
}

using test_support::ScopedEnv;

TEST(Fa3Fp8VariantTest, KnobsFromTheEnvironment) {
  {
    ScopedEnv b("ATTNKIT_FA3_FP8_BLOCK_N", "256");  // not accepted: ignored (warning)
    ScopedEnv s("ATTNKIT_FA3_FP8_SPEC", "0");
    testing::internal::CaptureStderr();
    const Fp8Knobs k = fp8_knobs_from_env();
    EXPECT_NE(testing::internal::GetCapturedStderr().find(
                  "attnkit: ignoring ATTNKIT_FA3_FP8_BLOCK_N=256 (accepted: 128, 192); using 0"),
              std::string::npos);
    EXPECT_EQ(k.block_mode, 0);
    EXPECT_FALSE(k.spec);
  }
  {
    // default: promotion past gemm_sum_max_keys only (the environment may set it)
    EXPECT_FALSE(Fp8Knobs{}.promote);
    EXPECT_TRUE(Fp8Knobs{}.promote_auto);
    ScopedEnv pr("ATTNKIT_FA3_FP8_PROMOTE", "1");
    EXPECT_TRUE(fp8_knobs_from_env().promote);
    EXPECT_FALSE(fp8_knobs_from_env().promote_auto);
  }
  {
    ScopedEnv pr("ATTNKIT_FA3_FP8_PROMOTE", "2");  // the other chunk order
    const Fp8Knobs k = fp8_knobs_from_env();
    EXPECT_TRUE(k.promote && k.promote_late);
    const Fp8Variant v = choose_fp8_variant(std::vector<TileRequest>{{0, 1036, 8236}}, 2, k);
    EXPECT_TRUE(v.promote && v.promote_late && v.vt_pre);
    EXPECT_EQ(v.block_n, 128);
  }
  {
    ScopedEnv pr("ATTNKIT_FA3_FP8_PROMOTE", "l");  // a typo of 1: ignored (warning)
    ScopedEnv mk("ATTNKIT_FA3_FP8_GEMM_SUM_MAX_KEYS", "4096x");
    testing::internal::CaptureStderr();
    const Fp8Knobs k = fp8_knobs_from_env();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(k.promote);
    EXPECT_TRUE(k.promote_auto);
    EXPECT_EQ(k.gemm_sum_max_keys, Fp8Knobs{}.gemm_sum_max_keys);
    EXPECT_NE(err.find("attnkit: ignoring ATTNKIT_FA3_FP8_PROMOTE=l (accepted: 0, 1, 2); using 2 "
                       "past 2048 keys"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("attnkit: ignoring ATTNKIT_FA3_FP8_GEMM_SUM_MAX_KEYS=4096x"),
              std::string::npos)
        << err;
  }
  ScopedEnv b("ATTNKIT_FA3_FP8_BLOCK_N", "192");
  ScopedEnv v("ATTNKIT_FA3_FP8_VT_PRE", "0");
  ScopedEnv pr("ATTNKIT_FA3_FP8_PROMOTE", "0");
  const Fp8Knobs k = fp8_knobs_from_env();
  EXPECT_EQ(k.block_mode, 192);
  EXPECT_EQ(k.vt_pre_mode, 0);
  EXPECT_FALSE(k.promote || k.promote_auto);
}

TEST(Fa3PlanTest, TilesOf192RowsForThreeConsumerWarpgroups) {
  // block_m 192 (three consumer warpgroups): 300 new tokens -> tiles at m0 -84, 108 (rows
  // 0..107, 108..299), a 1000-key prefix request of 129 tokens -> one tile at -63; longest first.
  const std::vector<TileRequest> reqs = {{0, 300, 300}, {300, 129, 1129}};
  Result<TilePlan> plan = build_tile_plan(reqs, 192);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->num_tiles, 3);
  const std::vector<TileWords> expected = {{1, -63}, {0, 108}, {0, -84}};
  EXPECT_EQ(tiles_of(*plan, 2), expected);
  Result<TilePlan> start = build_tile_plan(reqs, 192, TileAnchor::kStart);
  ASSERT_TRUE(start.is_ok());
  const std::vector<TileWords> expected_start = {{1, 0}, {0, 192}, {0, 0}};
  EXPECT_EQ(tiles_of(*start, 2), expected_start);
}

TEST(Fa3PlanTest, RejectsInconsistentLengths) {
  const std::vector<TileRequest> reqs = {{0, 4, 4}, {4, 9, 3}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("request 1"), std::string::npos)
      << plan.status().message();
}

TEST(Fa3PlanTest, KeyBlockFollowsTheHeadDim) {
  EXPECT_EQ(default_block_n(64), 128);  // three consumer warpgroups (ATTNKIT_FA3_WG3)
  EXPECT_EQ(default_block_n(128), 128);
  EXPECT_EQ(default_block_n(256), 80);
  for (int d : {64, 128, 256}) EXPECT_TRUE(block_n_supported(d, default_block_n(d)));
  EXPECT_TRUE(block_n_supported(256, 64));
  EXPECT_TRUE(block_n_supported(64, 128));
  EXPECT_FALSE(block_n_supported(128, 192));
  EXPECT_FALSE(block_n_supported(128, 176));
  EXPECT_FALSE(block_n_supported(128, 80));
  EXPECT_FALSE(block_n_supported(96, 128));
}

TEST(Fa3PlanTest, TmaBoxesNeverCrossAPage) {
  EXPECT_EQ(tma_rows_for(16, 128), 16);
  EXPECT_EQ(tma_rows_for(64, 128), 64);
  EXPECT_EQ(tma_rows_for(256, 128), 128);  // one key block of a larger page
  EXPECT_EQ(tma_rows_for(64, 80), 16);     // 80 = 5 x 16: 16-row boxes inside 64-row pages
  EXPECT_EQ(tma_rows_for(8, 80), 8);
  EXPECT_EQ(tma_rows_for(16, 192), 16);  // d 64 blocks of 192 = 3 x 64
  EXPECT_EQ(tma_rows_for(256, 192), 64);
  EXPECT_EQ(tma_rows_for(1, 128), 0);  // gathered
  EXPECT_EQ(tma_rows_for(4, 128), 0);
  EXPECT_EQ(tma_rows_for(24, 128), 0);  // not a power of two
  for (int page : {8, 16, 32, 64, 128, 256, 1024}) {
    for (int block : {64, 80, 128}) {
      const int rows = tma_rows_for(page, block);
      ASSERT_GT(rows, 0);
      EXPECT_EQ(block % rows, 0) << page << " " << block;  // boxes tile the key block
      EXPECT_EQ(page % rows, 0) << page << " " << block;   // and stay inside one page
    }
  }
}

TEST(Fa3PlanTest, PersistentScheduleCoversEveryUnitOnce) {
  for (bool zigzag : {false, true}) {
    for (int grid : {1, 2, 7, 132}) {
      for (int units : {0, 1, 5, 131, 132, 133, 263, 264, 1000, 4096}) {
        std::vector<int> seen(static_cast<size_t>(units), 0);
        for (int cta = 0; cta < grid; ++cta) {
          int prev = -1;
          for (int r = 0, u = schedule_unit(0, cta, grid, zigzag); u < units;
               u = schedule_unit(++r, cta, grid, zigzag)) {
            EXPECT_GT(u, prev);
            prev = u;
            ++seen[static_cast<size_t>(u)];
          }
        }
        for (int u = 0; u < units; ++u) {
          EXPECT_EQ(seen[static_cast<size_t>(u)], 1)
              << "unit " << u << " of " << units << " grid " << grid << " zigzag " << zigzag;
        }
      }
    }
  }
  // Zigzag: CTA 0 takes units 0, 2G - 1, 2G, ...
  EXPECT_EQ(schedule_unit(1, 0, 132, true), 263);
  EXPECT_EQ(schedule_unit(2, 0, 132, true), 264);
}

// ---- tail split (choose_tail_split) ----

// The plan of `n` requests with `fresh` new tokens after `prefix` cached ones each.
TilePlan equal_requests(int n, int fresh, int prefix = 0, int block_m = 128) {
  std::vector<TileRequest> reqs;
  for (int r = 0; r < n; ++r) reqs.push_back({r * fresh, fresh, prefix + fresh});
  Result<TilePlan> plan = build_tile_plan(reqs, block_m);
  EXPECT_TRUE(plan.is_ok());
  return plan.is_ok() ? *plan : TilePlan{};
}

TEST(Fa3TailSplitTest, WorkedExampleOfTheHeader) {
  const TilePlan plan = equal_requests(4, 4096);
  // Bidirectional: 4096 units of 32 blocks on 132 SMs = 31 rounds + 4 units -> 4 x 32 pieces.
  const TailSplit bidir = choose_tail_split(plan.words, 4, 32, 128, 128, false, 132, true);
  EXPECT_EQ(bidir.split_units, 4);
  EXPECT_EQ(bidir.num_splits, 32);
  // Causal: the last round's units are the one-block diagonal tiles: nothing to split.
  const TailSplit causal = choose_tail_split(plan.words, 4, 32, 128, 128, true, 132, true);
  EXPECT_EQ(causal.split_units, 0);
  EXPECT_EQ(causal.num_splits, 1);
  // The 8k / 16k bidirectional shapes of the benchmark: 33 pieces (132 / 4) of 64 / 128 blocks.
  for (const auto& [n, len] : {std::pair{2, 8192}, std::pair{1, 16384}}) {
    const TailSplit t =
        choose_tail_split(equal_requests(n, len).words, n, 32, 128, 128, false, 132, true);
    EXPECT_EQ(t.split_units, 4) << len;
    EXPECT_EQ(t.num_splits, 33) << len;
  }
}

TEST(Fa3TailSplitTest, FewUnitsOverALongPrefixSplitEveryUnit) {
  // One 128-token chunk after a 16k prefix, 32 heads: 32 units of 129 blocks on 132 SMs (one
  // round, 100 CTAs idle): each unit in 132 / 32 = 4 pieces of 32-33 blocks, modelled 130 -> 37.5.
  const TilePlan plan = equal_requests(1, 128, 16384);
  for (const bool causal : {true, false}) {
    const TailSplit t = choose_tail_split(plan.words, 1, 32, 128, 128, causal, 132, true);
    EXPECT_EQ(t.split_units, 32);
    EXPECT_EQ(t.num_splits, 4);
  }
  // Extend with a prefix, causal: equal tiles, so the last partial round splits too (8 x 512-token
  // chunks after 8k: 32 tiles x 32 heads = 1024 units = 7 rounds + 100 units of 68-69 blocks; s =
  // 132 / 100 = 1: nothing to gain from pieces that do not fit the round).
  const TailSplit t8 =
      choose_tail_split(equal_requests(8, 512, 8192).words, 8, 32, 128, 128, true, 132, true);
  EXPECT_EQ(t8.split_units, 0);
  // 2 x 512 after 8k on 32 heads: 256 units = 1 round + 124 (s 1); on 8 heads: 64 units of
  // 65-68 blocks, one round: 132 / 64 = 2 pieces each.
  const TailSplit t2 =
      choose_tail_split(equal_requests(2, 512, 8192).words, 2, 8, 128, 128, true, 132, true);
  EXPECT_EQ(t2.split_units, 64);
  EXPECT_EQ(t2.num_splits, 2);
}

// The MLA prefill engine's plans (causal, keys = the new tokens: kv_len = q_len) never split,
// forced or not: a request's tile holding its first token sees at most 128 keys (one block), and
// the longest-first order puts such one-block units in the last round. Ragged batches, any head
// count, both anchors, SM counts of an H100 / H200 and smaller.
TEST(Fa3TailSplitTest, NewTokenOnlyCausalPlansNeverSplit) {
  const std::vector<std::vector<int>> batches = {
      {437, 1, 129, 256}, {1000, 300}, {16384}, {4096, 4096, 4096, 4096}, {77, 5000, 128}};
  for (const std::vector<int>& lens : batches) {
    std::vector<TileRequest> reqs;
    int32_t start = 0;
    for (int n : lens) {
      reqs.push_back({start, n, n});
      start += n;
    }
    for (const TileAnchor anchor : {TileAnchor::kEnd, TileAnchor::kStart}) {
      Result<TilePlan> plan = build_tile_plan(reqs, 128, anchor);
      ASSERT_TRUE(plan.is_ok());
      for (int heads : {1, 16, 128}) {
        for (int sms : {16, 132}) {
          for (int forced : {-1, 3, 1024}) {
            EXPECT_EQ(choose_tail_split(plan->words, static_cast<int>(lens.size()), heads, 128, 128,
                                        /*causal=*/true, sms, true, forced)
                          .split_units,
                      0)
                << lens.size() << " requests, " << heads << " heads, " << sms << " SMs, forced "
                << forced;
          }
        }
      }
    }
  }
}

TEST(Fa3TailSplitTest, NoSplitWhereTheModelGainsLittle) {
  // Exactly full rounds: no tail.
  EXPECT_EQ(choose_tail_split(equal_requests(1, 128 * 33).words, 1, 4, 128, 128, false, 132, true)
                .split_units,
            0);
  // Short units: 40 units of 3 / 2 blocks: pieces of 2 blocks + the merge cost more than they save.
  const std::vector<TileRequest> reqs = {{0, 300, 300}, {300, 129, 129}};
  Result<TilePlan> plan = build_tile_plan(reqs);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(choose_tail_split(plan->words, 2, 8, 128, 128, false, 132, true).split_units, 0);
  // ... unless forced: s = min(forced, fewest blocks (2), 132 / 40 (3)) = 2.
  const TailSplit forced = choose_tail_split(plan->words, 2, 8, 128, 128, false, 132, true, 8);
  EXPECT_EQ(forced.split_units, 40);
  EXPECT_EQ(forced.num_splits, 2);
  // forced 0: never; a unit of one key block cannot be split even when forced.
  EXPECT_EQ(choose_tail_split(equal_requests(4, 4096).words, 4, 32, 128, 128, false, 132, true, 0)
                .split_units,
            0);
  const std::vector<TileRequest> one_block = {{0, 5, 5}};
  Result<TilePlan> small = build_tile_plan(one_block);
  ASSERT_TRUE(small.is_ok());
  EXPECT_EQ(choose_tail_split(small->words, 1, 8, 128, 128, false, 132, true, 4).split_units, 0);
}

TEST(Fa3SectionTest, WorkedExampleOfTheHeader) {
  // 32 q / 8 kv heads, d 128 bf16.
  EXPECT_EQ(choose_section_heads(32, 8, 8192, 128, 2), 32);
  EXPECT_EQ(choose_section_heads(32, 8, 16384, 128, 2), 16);
  EXPECT_EQ(choose_section_heads(32, 8, 65536, 128, 2), 4);
  EXPECT_EQ(choose_section_heads(32, 8, 131072, 128, 2), 4);
  // e4m3 halves the bytes: 16k fits 8 kv heads; 10 kv heads at 16k bf16: 4 fit, 2 (the largest
  // divisor of 10 up to 4) taken.
  EXPECT_EQ(choose_section_heads(32, 8, 16384, 128, 1), 32);
  EXPECT_EQ(choose_section_heads(40, 10, 16384, 128, 2), 8);
  // Knob: 0 one section, n kv heads when n divides them (3 does not divide 8: the rule).
  EXPECT_EQ(choose_section_heads(32, 8, 16384, 128, 2, 0), 32);
  EXPECT_EQ(choose_section_heads(32, 8, 1024, 128, 2, 1), 4);
  EXPECT_EQ(choose_section_heads(32, 8, 16384, 128, 2, 3), 16);
}

TEST(Fa3SectionTest, UnitsMapOntoEveryTileAndHeadOnce) {
  for (int tiles : {1, 3, 64}) {
    for (int heads : {4, 32}) {
      for (int section : {heads / 4, heads / 2, heads}) {
        std::vector<int> seen(static_cast<size_t>(tiles * heads), 0);
        int prev_section_tile = -1;
        for (int u = 0; u < tiles * heads; ++u) {
          const TileHead th = unit_tile_head(u, tiles, section);
          ASSERT_GE(th.tile, 0);
          ASSERT_LT(th.tile, tiles);
          ASSERT_GE(th.head, 0);
          ASSERT_LT(th.head, heads);
          ++seen[static_cast<size_t>(th.tile * heads + th.head)];
          // Within a section, tiles run in plan order (longest first), heads fastest.
          if (u % (tiles * section) != 0) EXPECT_GE(th.tile, prev_section_tile);
          prev_section_tile = th.tile;
        }
        for (int v : seen) EXPECT_EQ(v, 1) << tiles << " tiles, " << heads << " heads, " << section;
      }
    }
  }
  // One section is today's tile-major order.
  EXPECT_EQ(unit_tile_head(70, 64, 32).tile, 2);
  EXPECT_EQ(unit_tile_head(70, 64, 32).head, 6);
  // Two sections of 16 heads over 64 tiles: unit 64 x 16 + 5 is tile 0, head 21.
  EXPECT_EQ(unit_tile_head(64 * 16 + 5, 64, 16).tile, 0);
  EXPECT_EQ(unit_tile_head(64 * 16 + 5, 64, 16).head, 21);
}

TEST(Fa3TailSplitTest, PiecesCoverEveryKeyBlockOnceAndNoneIsEmpty) {
  for (int n : {2, 3, 7, 32, 129}) {
    for (int s = 2; s <= n && s <= 40; ++s) {
      EXPECT_EQ(split_block_begin(n, s, 0), 0);
      EXPECT_EQ(split_block_begin(n, s, s), n);
      for (int k = 0; k < s; ++k) {
        EXPECT_GE(split_block_begin(n, s, k + 1) - split_block_begin(n, s, k), 1)
            << n << " blocks, " << s << " pieces, piece " << k;
      }
    }
  }
  // The virtual schedule: 4096 units, 4 of them in 32 pieces -> 4092 + 128 = 4220 = 31 x 132 + 128.
  EXPECT_EQ(virtual_units(4096, 4, 32), 4220);
  EXPECT_EQ(virtual_units(4096, 0, 1), 4096);
}

}  // namespace
}  // namespace attnkit::fa3
