// The fa3 backend's host planner for the SM90 prefill kernel: turns one forward's host lengths
// into the plan words of fa3_params.h (planned once per forward, shared by every layer). Plain
// C++, unit-tested on the CPU (tests/unit/test_fa3_plan.cpp).
//
// One tile = block_m (128, or 192 on three consumer warpgroups) consecutive new tokens of one
// request; the kernel runs every tile for every q head. By default (TileAnchor::kEnd) a request's
// last tile ends at its last new token, so the remainder q_len % block_m sits in its first tile,
// whose first rows lie before token 0 (m0 < 0: computed, never stored). Tiles are sorted by
// descending key count under the causal mask (stable, so equal tiles keep request order): a
// persistent CTA strides through the list, so the heavy tiles start first and the short ones fill
// the tail.
//
// Worked example: requests (q_len 300, kv_len 300) and (q_len 1, kv_len 77), 128-row tiles:
//   request 0 -> tiles m0 -84, 44, 172 reading 44, 172, 300 keys; request 1 -> tile m0 -127
//   reading 77. Order: (0, 172) 300, (0, 44) 172, (1, -127) 77, (0, -84) 44.
//   TileAnchor::kStart: tiles m0 0, 128, 256 reading 128, 256, 300 keys and m0 0 reading 77;
//   order (0, 256), (0, 128), (0, 0), (1, 0).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attnkit/forward_batch.h"
#include "attnkit/status.h"

namespace attnkit::fa3 {

struct TileRequest {
  int32_t q_start = 0;  // first of its tokens in [0, T)
  int32_t q_len = 0;    // new tokens
  int32_t kv_len = 0;   // keys: cached prefix + new tokens (>= q_len)
};

struct TilePlan {
  std::vector<int32_t> words;  // header + requests + tiles (fa3_params.h layout)
  int num_tiles = 0;
};

// Where a request's tiles sit (the tile word m0 of fa3_params.h).
//  * kEnd (the default): the last tile ends at the last new token; the first holds the remainder
//    and starts block_m - q_len % block_m rows before token 0 (when block_m does not divide q_len).
//  * kStart (ATTNKIT_FA3_TILE_ANCHOR=start): tile 0 starts at token 0; the last holds the
//    remainder, its rows past q_len padded.
// A padded row costs what its tile's last row sees. Under the causal mask that is every key for
// the last tile but only the prefix and the tile's own rows for the first, so kEnd makes the
// padding nearly free: 4096 tokens on 192-row tiles pad 128 rows x 64 keys instead of x 4096
// keys (6.25% of the causal pairs). Bidirectional layers pay the same padding either way.
enum class TileAnchor { kStart, kEnd };

// ATTNKIT_FA3_TILE_ANCHOR: "start" / "end" (unset: kEnd); another value is ignored with a warning.
TileAnchor tile_anchor_from_env();

// The first new token of tile m (0-based among the request's ceil(q_len / block_m) tiles).
constexpr int tile_first_row(int q_len, int m, int block_m, TileAnchor anchor) {
  const int tiles = (q_len + block_m - 1) / block_m;
  return anchor == TileAnchor::kStart ? m * block_m : q_len - (tiles - m) * block_m;
}

// The requests of an MLA kernel plan. `base`: the forward's requests (q_start, q_len). With indptr
// null the new tokens over their own rows (kv_len q_len; kv_rows, the row of each request's key 0
// in the plan's k / v: q_start): the no-prefix layers and the chunked prefix cache's pass 0. Else
// a chunk pass over a prefix chunk's rows: request r's keys are rows [indptr[r], indptr[r + 1])
// of the chunk's k / v, and (skip_empty) a request without keys in the chunk takes no tile (q_len
// 0): the chunk passes merge into the running partial, to which such a request adds nothing, so its
// rows stay as the earlier passes left them (skip_empty false: one all-masked tile per 128 rows,
// as before session 69). max_kv_len: the longest kv_len of a request with tiles.
struct MlaPassRequests {
  std::vector<TileRequest> reqs;
  std::vector<int32_t> kv_rows;
  int64_t max_kv_len = 0;
};
MlaPassRequests mla_pass_requests(std::span<const TileRequest> base, const int32_t* indptr,
                                  bool skip_empty = true);

// kInvalidArgument names the first request with q_len < 0 or kv_len < q_len. block_m: query rows
// per tile (Fa3Params::block_m; 192 on three consumer warpgroups). Requests without new tokens get
// no tiles and no V^T units.
// The MLA prefill kernel's plans: kv_rows (one per request, else empty) replace the request words'
// vt_block with the row of the request's key 0 in the kernel's K / V (fa3_params.h); causal false
// (the chunked prefix cache's chunk passes, bidirectional) allows 0 <= kv_len < q_len and sorts the
// tiles by kv_len (every row sees every key).
Result<TilePlan> build_tile_plan(std::span<const TileRequest> requests, int block_m = 128,
                                 TileAnchor anchor = TileAnchor::kEnd,
                                 std::span<const int32_t> kv_rows = {}, bool causal = true);

// Query rows per tile of a bf16 / f16 forward at d 128 when three consumer warpgroups are allowed:
// 192 unless the rows that pad the requests' 192-row tiles cost more than kWg3MaxPaddingShare (5%)
// of the forward's causal (q, k) pairs beyond what 128-row tiles pad, or, for the bidirectional
// layers a forward may also run (the plan serves both), more than kWg3MaxBidirPaddingShare (8%) of
// its bidirectional pairs; else 128. A causal padded row costs the keys of its tile's last row,
// which depends on where the tiles sit (anchor); a bidirectional one kv_len keys either way. Three
// warpgroups are ~5% faster per useful causal pair (H200 2026-11-27 09:08Z: causal 8k / 16k
// +3.4-4.3% with 1.6% padding, 4096 after a 4096 prefix at page 1 +25%); with the padding in the
// last tile (kStart) a 4096-token prompt pads 6.25% and measured -2.5% on 192 rows. Bidirectional
// 4 x 4096 measured +5.5% on 192 rows with 3.1% more padded pairs (session 47, 11:48Z); 1000-token
// prompts (12.8% more) take 128 rows, which measured level with 192 causal (session 47, 11:44Z).
// The 8% bound itself was not measured at its edge.
//   kStart {q_len 8192, kv 8192}: 42 x 192 + 128 rows, padding 64 x 8192 = 1.6% -> 192
//   kStart {q_len 4096, kv 4096}: padding 128 x 4096 = 6.25% -> 128
//   kEnd   {q_len 4096, kv 4096}: the first tile's 128 padded rows see 64 keys: 0.1% -> 192
//   kEnd   {q_len 100, kv 100}: 92 x 100 padded pairs on 192 rows, 28 x 100 on 128, of 5050 -> 128
//   kEnd   16 x {q_len 1000, kv 1000}: causal 0.7% more, bidirectional 128 / 1000 = 12.8% -> 128
int choose_block_m_d128(std::span<const TileRequest> requests,
                        TileAnchor anchor = TileAnchor::kEnd);

// The requests of a forward from its host lengths (seq_lens counts the new tokens; without
// extend lengths, spec.draft_token_num new tokens per request). elsewhere: the partition of a
// mixed forward (backend/small_extend.h extend_partition; empty: none): the flagged requests run
// on another kernel and get q_len 0 here (no tiles, no rows written).
std::vector<TileRequest> tile_requests(const ForwardBatch& batch,
                                       std::span<const uint8_t> elsewhere = {});

// ---- L2 sections (Fa3Params::section_heads, unit_tile_head in fa3_params.h) ----

// The L2 budget of a section's K / V (FlashAttention-3 takes 32 MiB of the H100's 50 MB L2).
inline constexpr int64_t kL2SectionBytes = int64_t{32} << 20;

// q heads per L2 section for a forward whose longest request (with new tokens) has max_kv_len
// keys of head_dim elements of elem_bytes: the most kv heads S dividing num_kv_heads whose K and V
// (S x max_kv_len x head_dim x elem_bytes x 2) fit kL2SectionBytes (at least 1), times the group.
// forced: -1 that rule (ATTNKIT_FA3_L2_SECTION=auto); 0: one section (num_q_heads; the engine's
// default: the rule measured slower at causal 16k, session 17); n >= 1: n kv heads when n divides
// num_kv_heads (else the rule).
// Worked example: 32 q / 8 kv heads, d 128 bf16: 8k keys = 4 MiB per kv head -> 8 kv heads (one
// section, 32 q heads); 16k = 8 MiB -> 4 kv heads = 16 q heads; 64k = 32 MiB -> 1 kv head = 4 q
// heads; 128k -> 1 kv head (the floor).
int choose_section_heads(int num_q_heads, int num_kv_heads, int64_t max_kv_len, int head_dim,
                         int elem_bytes, int forced = -1);

// ---- tail split (both kernels; Fa3Params::split_units / num_splits) ----

struct TailSplit {
  int split_units = 0;  // the last split_units units of the schedule are split (0: none)
  int num_splits = 1;   // pieces per split unit (>= 2 when split_units > 0)
};

// The tail split of a planned forward (plan_words from build_tile_plan over bs requests) for a
// layer that is causal or not, on the persistent grid of sm_count CTAs (zigzag: Fa3Params::sched).
// The split units are those of the schedule's last, partial round (all units when there are fewer
// than sm_count); each becomes s = min(its fewest key blocks, sm_count / split units) pieces, so
// the pieces fill that round and none is empty. forced (ATTNKIT_FA3_SPLIT): -1 (unset): split when
// a model of the schedule (a unit costs its key blocks + 1, a piece 0.5 more for its partial rows,
// the merge 3, in key-block times) finishes at least 2% sooner; 0: never; n >= 2: whenever
// min(n, s) >= 2.
// Worked example: 4 requests of 4096 new tokens, bidirectional, 32 q heads, block_m = block_n =
// 128, 132 SMs: 4096 units of 32 blocks = 31 full rounds + 4 units; s = min(32, 132 / 4) = 32:
// 4 x 32 pieces of one block in the last round; modelled 32 x 33 = 1056 -> 31 x 33 + 2.5 + 3 =
// 1028.5 block times (-2.6%): split. Causal, the same requests: the last round holds four
// one-block tiles: s = 1, no split.
// section_heads: Fa3Params::section_heads (0: num_q_heads, one section).
TailSplit choose_tail_split(std::span<const int32_t> plan_words, int bs, int num_q_heads,
                            int block_m, int block_n, bool causal, int sm_count, bool zigzag,
                            int forced = -1, int section_heads = 0);

// ---- FP8 kernel variant (prefill_sm90_fp8.cuh) ----

// Row sums through the e4m3 P V GEMM lose accuracy on long rows: the FP8 wgmma accumulates with
// ~13-14 bits, so thousands of small positive P terms added to a large running sum are truncated
// and l comes out too small. H200 2026-11-23 11:13Z, Fa3Fp8Test.VariantsOfTheKernel, 7200 + 1036
// new keys: LSE error 0.158, rel_l2 0.143 with every GEMM-sum variant; a numerical model of the
// kernel (e4m3 rounding + a 13-bit accumulator) reproduces them and gives 0.017 / 0.039 with fp32
// FADD row sums, ~0.07 LSE at 4096 keys. Rows up to this many keys keep the GEMM row sum, unless
// promotion is on (Fp8Knobs::promote: each block's P V from zero, added to O / l in f32; the
// model gives the exact-accumulation error at 8236 keys with it), which needs no such limit.
constexpr int kFp8GemmSumMaxKeys = 2048;

// The FP8 experiment knobs (environment, read once per engine by fp8_knobs_from_env).
struct Fp8Knobs {
  int vt_pre_mode = -1;    // -1: by the forward's shape; 0 / 1: ATTNKIT_FA3_FP8_VT_PRE=0 / 1
  bool spec = true;        // ATTNKIT_FA3_FP8_SPEC=0: off
  int block_mode = 0;      // 0: by the forward; 128 / 192: ATTNKIT_FA3_FP8_BLOCK_N
  bool gemm_sum = true;    // ATTNKIT_FA3_FP8_GEMM_SUM=0: FADD row sums (without vt_pre only)
  bool uniform_wg = true;  // ATTNKIT_FA3_UNIFORM_WG=0: the pre-session-7 kernel (128, in-kernel
                           // transpose, FADD row sums)
  // Longest request (keys) that may take its row sums from the P V GEMM (every pre-transpose /
  // speculative kernel does); longer ones take the FADD kernel (choose_fp8_variant says why).
  // ATTNKIT_FA3_FP8_GEMM_SUM_MAX_KEYS sets it (benchmarks of the fast kernels at long rows).
  int gemm_sum_max_keys = kFp8GemmSumMaxKeys;
  // ATTNKIT_FA3_FP8_PROMOTE=1: promotion (Fa3Params::fp8_promote) in every variant; then no
  // long-row limit (gemm_sum_max_keys is not applied) and 128-key blocks (the 192-key kernel
  // has no registers for it). =2: the same with the other order of the promoted P V's column
  // chunks (promote_late). Unset (promote_auto, the default since session 11, H200-verified):
  // promotion, in the order of 2, for the forwards whose longest request has more than
  // gemm_sum_max_keys keys; shorter ones keep the unpromoted kernels. =0: never (long rows then
  // take the FADD row-sum kernel, whose O is wrong once V has a nonzero mean: docs/PERF.md).
  bool promote = false;
  bool promote_late = false;
  bool promote_auto = true;
  // Three consumer warpgroups (192-row tiles, 128-key blocks) wherever the forward runs the
  // pre-transpose with the speculative softmax (the default; ATTNKIT_FA3_FP8_WG3=0: two, with
  // 192-key blocks from 8192 keys). H200 2026-11-27 08:29Z / 08:34Z, causal 4k / 8k / 16k,
  // bidirectional 8k vs two warpgroups: +3 / +10-11 / +13 / +15% (docs/perf/fa3_notes.md,
  // session 46).
  bool wg3 = true;
};
// Reads the knobs above; a value that is not accepted (e.g. ATTNKIT_FA3_FP8_BLOCK_N=256) is
// ignored with a one-line warning on stderr (core/env_knob.h).
Fp8Knobs fp8_knobs_from_env();

// What the FP8 kernel runs for one forward.
struct Fp8Variant {
  bool vt_pre = false;        // Fa3Params::vt_pre: V^T pre-transposed per layer into the workspace
  bool spec = false;          // Fa3Params::fp8_spec (vt_pre only)
  bool gemm_sum = false;      // row sums through the P V GEMM (always with vt_pre)
  int block_n = 128;          // Fa3Params::fp8_block_n (192: vt_pre and spec only, no promote)
  int block_m = 128;          // query rows per tile (fa3::kBlockM); 192: three consumer warpgroups
  bool promote = false;       // Fa3Params::fp8_promote != 0 (uniform_wg kernels only)
  bool promote_late = false;  // with promote: Fa3Params::fp8_promote 2 (else 1)
  int vt_units = 0;           // V^T units of the plan (vt_units over the requests with new tokens)
  int max_kv_len = 0;        // keys of the longest request with new tokens (the pre-transpose grid)
  int64_t vt_bytes = 0;      // workspace: kv_heads x vt_units x 16 KB (0 without vt_pre)
  std::string not_honoured;  // non-empty: a forced knob this forward cannot follow (why)
};

// The FP8 variant of a forward of `requests` with kv_heads KV heads:
//  * promote with knobs.promote (ATTNKIT_FA3_FP8_PROMOTE=1 or 2; 2: promote_late), or with
//    knobs.promote_auto (the default) when the longest request has > gemm_sum_max_keys keys
//    (then promote_late), unless ATTNKIT_FA3_UNIFORM_WG=0;
//  * vt_pre when the forward has at least one query per kVtPreKeysPerQuery (8) keys (requests
//    with new tokens only), its longest request has <= gemm_sum_max_keys keys (any length with
//    promote) and the workspace stays within kVtPreMaxBytes (1 GiB), or ATTNKIT_FA3_FP8_VT_PRE=1
//    within the same size (=0: never);
//  * row sums by the GEMM with vt_pre, else when the longest request has <= gemm_sum_max_keys
//    keys or promote is on (unless ATTNKIT_FA3_FP8_GEMM_SUM=0); else by fp32 FADDs;
//  * spec with vt_pre unless ATTNKIT_FA3_FP8_SPEC=0;
//  * block_n 192 with vt_pre and spec and without promote when the longest request has >=
//    kFp8Block192MinKeys (8192) keys, or ATTNKIT_FA3_FP8_BLOCK_N=192 (with vt_pre and spec and
//    without promote only); else 128.
// Worked example: one request, prefix 1200 + 800 new tokens: 2000 keys <= 2048, 800 x 8 = 6400
// >= 2000 -> vt_pre, speculation, GEMM row sums, 128 keys per block; vt_units(2000) = 2 x 11 = 22
// units, x 2 kv heads x 16 KB = 704 KiB. Prefix 7200 + 1036 new: 8236 keys > 2048 -> promoted
// (promote_auto, order 2): vt_pre, speculation, GEMM row sums, 128 keys per block (65 blocks).
// With ATTNKIT_FA3_FP8_PROMOTE=0: the in-kernel transpose with FADD row sums, 128 keys per block,
// no speculation (with gemm_sum_max_keys also raised past 8236: vt_pre, and 8236 >= 8192 -> 192
// keys per block, 8236 = 42 x 192 + 172).
Fp8Variant choose_fp8_variant(std::span<const TileRequest> requests, int kv_heads,
                              const Fp8Knobs& knobs);

// Whether the FP8 plan v runs layers with a sliding window, attention sinks or a soft-cap on the
// wgmma kernel: its three-warpgroup plan (192-row tiles, V^T pre-transpose, speculative softmax,
// 128-key blocks) and the two-warpgroup plan of forwards with few queries per key (V^T in the
// kernel, GEMM row sums, 128-key blocks, unpromoted or promoted in the late chunk order) have
// kWindowSinks / kSoftcap instantiations; other plans (knobs) leave such layers to the mma.sync
// kernels (the engine's why_not_layer).
// The same rule over the Fa3Params fields the launcher reads (promote: Fa3Params::fp8_promote, 0
// none, 1 early, 2 late), so that the plan and run_prefill_sm90_fp8 cannot drift apart.
constexpr bool fp8_fields_take_variants(int block_m, int block_n, bool vt_pre, bool spec,
                                        bool gemm_sum, int promote) {
  const bool wg3 = block_m == 3 * 64 && vt_pre && spec && block_n == 128;
  const bool wg2 = block_m == 2 * 64 && !vt_pre && !spec && gemm_sum && block_n == 128 &&
                   (promote == 0 || promote == 2);
  return wg3 || wg2;
}
constexpr bool fp8_plan_takes_variants(const Fp8Variant& v) {
  return fp8_fields_take_variants(v.block_m, v.block_n, v.vt_pre, v.spec, v.gemm_sum,
                                  v.promote ? (v.promote_late ? 2 : 1) : 0);
}

// The FP8 plan of a forward over an fp8_e4m3 pool that may be partitioned (backend/small_extend.h
// extend_partition; *partition: one flag per request, 1 for those left to flashinfer's decode
// tiles, empty for none). requests: every request's tiles (tile_requests without `elsewhere`).
// A partitioned forward's layers must all run on the FP8 kernel (the decode tiles' plan holds only
// the flagged requests), so its plan must take a window / sinks / soft-cap
// (fp8_plan_takes_variants); when the flagged requests' q_len 0 gives a plan without them (a
// knob-forced one: the default knobs' plans all take them), *partition is cleared and the plan is
// the whole forward's. PrefillSm90Engine::plan's rule, shared with the case runner and the tests.
Fp8Variant choose_fp8_variant_partitioned(std::span<const TileRequest> requests,
                                          std::vector<uint8_t>* partition, int kv_heads,
                                          const Fp8Knobs& knobs);

// Whether run_prefill_sm90_fp8 (prefill_sm90_hd128.cu) has a kernel for this combination of
// Fa3Params fields: empty if so, else which rule it breaks. The instantiated kernels:
// uniform_wg 0: one (in-kernel V transpose, FADD row sums, 128-key blocks, no promotion);
// uniform_wg 1, 128-key blocks, promote 0, 1 or 2: in-kernel transpose with FADD or GEMM row sums,
// pre-transpose (GEMM row sums) with the exact or the speculative softmax; 192-key blocks:
// pre-transpose + speculative softmax, promote 0 only.
std::string fp8_kernel_missing(int block_n, bool vt_pre, bool spec, bool gemm_sum, int promote,
                               bool uniform_wg, int block_m = 128);

}  // namespace attnkit::fa3
