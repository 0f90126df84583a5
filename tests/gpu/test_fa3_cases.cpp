// The fa3 backend against the fp64 reference: the shared case table (every eligible extend case
// must run on the SM90 wgmma kernel, the rest on the owned flashinfer backend), longer causal /
// bidirectional prefills that cross several query tiles and key blocks, and decode CUDA-graph
// replay through the delegated graph trio (gpu label).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/registry.h"
#include "backends/fa3/fa3_backend.h"
#include "backends/fa3/kernels/fa3_kernels.h"
#include "backends/fa3/kernels/fa3_params.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "backends/mla/mla_prefix_cache.h"
#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

BackendDescriptor fa3_descriptor() {
  BackendDescriptor d = *builtin_registry().find("fa3");
  d.built = true;
  d.not_built_reason.clear();
  d.create = create_fa3_backend;
  return d;
}

DeviceInfo cuda_device() {
  Result<DeviceInfo> dev = detect_cuda(0);
  return dev.is_ok() ? dev.value() : DeviceInfo{};
}

// Whether the case's pool runs the FP8 kernel: fp8_e4m3 KV, bf16 q, d 128 (ATTNKIT_FA3_FP8=0: off).
bool expects_fp8_kernel(const CaseSpec& s) {
  const char* e = std::getenv("ATTNKIT_FA3_FP8");
  const bool off = e != nullptr && std::string(e) == "0";
  return !off && s.kv_dtype == DType::kFP8E4M3 && s.q_dtype == DType::kBF16 && s.head_dim == 128 &&
         s.v_head_dim == 128;
}

// Whether every layer of the case must run on a wgmma kernel: the shared bf16/f16 rule, or the
// fa3-only FP8 kernel under the same mode / device conditions: with a sliding window, sinks or a
// soft-cap only on the FP8 plan that has them (fa3::fp8_plan_takes_variants, for the forward's
// `requests`; without them such a case is not expected on wgmma).
bool expects_wgmma(const CaseSpec& s, const std::vector<fa3::TileRequest>* requests = nullptr) {
  if (!expects_fp8_kernel(s)) return test_support::expects_sm90_wgmma_prefill(s);
  if (s.sliding_window >= 0 || s.sinks || s.logit_cap != 0.f) {
    if (requests == nullptr) return false;
    const fa3::Fp8Variant v =
        fa3::choose_fp8_variant(*requests, s.num_kv_heads, fa3::fp8_knobs_from_env());
    if (!fa3::fp8_plan_takes_variants(v)) return false;
  }
  CaseSpec same_dtype = s;
  same_dtype.kv_dtype = s.q_dtype;
  return test_support::expects_sm90_wgmma_prefill(same_dtype);
}

// Whether the case's layers are non-absorbed MLA prefill layers the wgmma MLA kernel must run.
bool expects_mla_wgmma(const CaseSpec& s) { return test_support::expects_sm90_mla_prefill(s); }

// The passes of the MLA chunked prefix cache the wgmma MLA kernel must run for the case's layers
// (PrefillSm90Engine::why_not_prefix_passes: a layer the kernel would take without the prefix
// cache, expects_mla_wgmma, encoder-only too, with a prefix chunk budget, ATTNKIT_FA3_MLA_PREFIX
// not 0): per layer the new-token pass and one per chunk.
int64_t expected_mla_prefix_passes(const CaseSpec& s, int layers) {
  CaseSpec plain = s;
  plain.mla_prefix_chunk = 0;
  plain.type = AttentionType::kDecoder;
  const char* knob = std::getenv("ATTNKIT_FA3_MLA_PREFIX");
  const bool takes = s.mla_prefix_chunk > 0 && expects_mla_wgmma(plain) &&
                     !(knob != nullptr && std::string(knob) == "0");
  if (!takes) return 0;
  std::vector<int32_t> prefix(s.prefix_lens.begin(), s.prefix_lens.end());
  return static_cast<int64_t>(layers) *
         (1 + mla::plan_prefix_chunks(prefix, s.mla_prefix_chunk).chunks);
}

// Whether the knobs leave the bf16 / f16 kernels their three-warpgroup (192-row) variants:
// ATTNKIT_FA3_WG3=0 and ATTNKIT_FA3_UNIFORM_WG=0 both keep 128 rows (prefill_sm90_engine.cpp).
bool three_warpgroups_allowed() {
  for (const char* knob : {"ATTNKIT_FA3_WG3", "ATTNKIT_FA3_UNIFORM_WG"}) {
    const char* e = std::getenv(knob);
    if (e != nullptr && std::string(e) == "0") return false;
  }
  return true;
}

// The key block the wgmma kernel must have used: ATTNKIT_FA3_BLOCK_N where the run sets it to a
// block instantiated for the head dim (the device script runs the tests again with the
// non-default blocks), else the default for (d, causal).
int expected_block_n(const CaseSpec& s) {
  const char* e = std::getenv("ATTNKIT_FA3_BLOCK_N");
  const int env = e != nullptr ? std::atoi(e) : 0;
  if (fa3::block_n_supported(s.head_dim, env)) return env;
  return fa3::default_block_n(s.head_dim);
}

// The FP8 kernel's cases are held to the harness's bounds of fp8 arithmetic (case_runner.h:
// 0.07 on rel L2, twice that per request, max-abs scaled as the harness scales it, 0.15 on the
// LSE; `attnkit run / bench --verify` apply the same through apply_backend_arithmetic); NaN, pool
// and canary checks are unchanged. Some cases pass their own bounds (Fp8Tolerance).
constexpr double kFp8RelTolerance = harness::kFp8ArithmeticRelTolerance;
constexpr double kFp8LseTolerance = harness::kFp8ArithmeticLseTolerance;
struct Fp8Tolerance {
  double rel = kFp8RelTolerance;  // rel L2, and max-abs scaled as the harness scales it
  double lse = kFp8LseTolerance;
};
bool passes_fp8(const harness::Comparison& c, const Fp8Tolerance& tol = {}) {
  const double abs_scale = c.max_abs_tolerance / c.tolerance;  // kMaxAbsFactor * max(1, max|ref|)
  const bool lse_ok = !std::isfinite(c.lse_tolerance) || c.lse_max_abs <= tol.lse;
  return c.nan_inf_count == 0 && c.rel_l2 <= tol.rel &&
         c.request_rel_l2 <= harness::Comparison::kRequestFactor * tol.rel &&
         c.max_abs <= abs_scale * tol.rel && lse_ok && c.pool_stray_writes == 0 &&
         c.pool_bad_new_values == 0 && c.canaries_damaged == 0;
}

// The FP8 variant a case must run with the default knobs (no ATTNKIT_FA3_FP8_* /
// ATTNKIT_FA3_UNIFORM_WG set): pins the cases below to the path they are meant to cover.
struct Fp8Expect {
  bool vt_pre = false;
  bool spec = false;
  int block_n = 128;
};

bool default_fp8_knobs() {
  const fa3::Fp8Knobs k = fa3::fp8_knobs_from_env(), d;
  return k.vt_pre_mode == d.vt_pre_mode && k.spec == d.spec && k.block_mode == d.block_mode &&
         k.gemm_sum == d.gemm_sum && k.uniform_wg == d.uniform_wg &&
         k.gemm_sum_max_keys == d.gemm_sum_max_keys && k.promote == d.promote &&
         k.promote_late == d.promote_late && k.promote_auto == d.promote_auto && k.wg3 == d.wg3;
}

using test_support::ScopedEnv;

// The partition fa3's engine gives the case's forward (backend/small_extend.h extend_partition):
// the shared rule for a pool of the q dtype; over an fp8_e4m3 pool on the FP8 kernel, the same
// flags while the partitioned FP8 plan takes a window / sinks / soft-cap
// (fa3::choose_fp8_variant_partitioned), else none. An e4m3 q partitions as a bf16 one does.
std::vector<uint8_t> expected_fa3_partition(const CaseSpec& spec, const ForwardBatch& batch) {
  if (!expects_fp8_kernel(spec)) return test_support::expected_extend_partition(spec);
  CaseSpec same_dtype = spec;
  same_dtype.kv_dtype = spec.q_dtype;
  same_dtype.fp8_q = false;
  std::vector<uint8_t> flags = test_support::expected_extend_partition(same_dtype);
  fa3::choose_fp8_variant_partitioned(fa3::tile_requests(batch), &flags, spec.num_kv_heads,
                                      fa3::fp8_knobs_from_env());
  return flags;
}

// What one run of a case on a fresh fa3 backend gave.
struct Fa3Run {
  harness::Comparison cmp;
  Fa3Stats stats;                          // the backend's counters
  int layers = 0;                          // layers run
  std::vector<fa3::TileRequest> requests;  // the forward's tile requests (choose_fp8_variant)
  std::vector<uint8_t> partition;          // expected_fa3_partition
};

void run_fa3(const CaseSpec& spec, bool save_kv, float logit_mult, Fa3Run* out) {
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  for (harness::LayerData& ld : pc->layers) ld.layer.scaling *= logit_mult;
  Result<std::unique_ptr<AttentionBackend>> backend = create_fa3_backend(pc->context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const Status run = harness::run_backend(**backend, *pc, save_kv);
  ASSERT_TRUE(run.is_ok()) << run.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Result<harness::Comparison> c = harness::compare_with_reference(*pc);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Fa3Stats* st = fa3_stats(**backend);
  ASSERT_NE(st, nullptr);
  out->cmp = *c;
  out->stats = *st;
  out->layers = static_cast<int>(pc->layers.size());
  // As the engine plans them: a partitioned mixed forward's few-token requests have q_len 0.
  out->partition = expected_fa3_partition(spec, pc->batch);
  out->requests = fa3::tile_requests(pc->batch, out->partition);
}

// logit_mult scales every layer's softmax scaling (kernel and reference alike): large logits make
// the running row maximum jump between key blocks (the O-rescale paths). fp8_tol: the FP8
// kernel's tolerance (default: kFp8RelTolerance / kFp8LseTolerance).
void run_and_compare(const CaseSpec& spec, bool save_kv, float logit_mult = 1.f,
                     std::optional<Fp8Expect> fp8_expect = std::nullopt,
                     const Fp8Tolerance& fp8_tol = {}, Fa3Stats* stats_out = nullptr) {
  SCOPED_TRACE(spec.describe() + (save_kv ? " save_kv" : " runner writes kv") + " logit x" +
               std::to_string(logit_mult));
  Fa3Run r;
  ASSERT_NO_FATAL_FAILURE(run_fa3(spec, save_kv, logit_mult, &r));
  const harness::Comparison* cmp = &r.cmp;
  const Fa3Stats* stats = &r.stats;
  if (stats_out != nullptr) *stats_out = r.stats;
  if (stats->wgmma_fp8_calls > 0) {
    EXPECT_TRUE(passes_fp8(*cmp, fp8_tol)) << "FP8 kernel (fp8 tolerance " << fp8_tol.rel
                                           << ", LSE " << fp8_tol.lse << "): " << cmp->summary();
  } else {
    EXPECT_TRUE(cmp->passed()) << cmp->summary();
  }
  if (expects_mla_wgmma(spec)) {
    EXPECT_EQ(stats->flashinfer_calls, 0) << "an MLA prefill case ran on the flashinfer path";
    EXPECT_EQ(stats->wgmma_calls, static_cast<int64_t>(r.layers));
    EXPECT_EQ(stats->wgmma_mla_calls, stats->wgmma_calls);
    EXPECT_EQ(stats->wgmma_fp8_calls, 0);
    EXPECT_EQ(stats->last_block_n, fa3::kMlaPrefillBlockN);
    EXPECT_EQ(stats->last_block_m, fa3::kBlockM);
  } else if (expects_wgmma(spec, &r.requests)) {
    // A partitioned mixed forward (backend/small_extend.h extend_partition) also runs its
    // few-token requests on the inner flashinfer's decode tiles, once per layer.
    const int64_t partitioned = r.partition.empty() ? 0 : r.layers;
    EXPECT_EQ(stats->flashinfer_calls, partitioned) << "a wgmma case ran on the flashinfer path";
    EXPECT_EQ(stats->partition_calls, partitioned);
    // An e4m3 q's partitioned layers widen the few-token requests' q rows (kernels/q_widen.h).
    EXPECT_EQ(stats->q_widened_calls, spec.fp8_q ? partitioned : 0);
    EXPECT_EQ(stats->wgmma_calls, static_cast<int64_t>(r.layers));
    EXPECT_EQ(stats->wgmma_fp8_calls, expects_fp8_kernel(spec) ? stats->wgmma_calls : 0);
    if (expects_fp8_kernel(spec)) {
      // The variant choose_fp8_variant gives for this forward under the run's knobs.
      const fa3::Fp8Variant want =
          fa3::choose_fp8_variant(r.requests, spec.num_kv_heads, fa3::fp8_knobs_from_env());
      EXPECT_EQ(stats->last_block_n, want.block_n);
      EXPECT_EQ(stats->last_block_m, want.block_m);
      EXPECT_EQ(stats->last_fp8_vt_pre, want.vt_pre);
      EXPECT_EQ(stats->last_fp8_spec, want.spec);
      EXPECT_EQ(stats->last_fp8_gemm_sum, want.gemm_sum);
      EXPECT_EQ(stats->last_fp8_promote, want.promote ? (want.promote_late ? 2 : 1) : 0);
      if (fp8_expect && default_fp8_knobs()) {
        EXPECT_EQ(want.vt_pre, fp8_expect->vt_pre);
        EXPECT_EQ(want.spec, fp8_expect->spec);
        EXPECT_EQ(want.block_n, fp8_expect->block_n);
      }
    } else {
      EXPECT_EQ(stats->last_block_n, expected_block_n(spec));
      if (spec.head_dim == 128 && stats->last_block_n == 128) {
        // Rows per tile: choose_block_m_d128 unless ATTNKIT_FA3_WG3 / _UNIFORM_WG force them.
        const char* wg3 = std::getenv("ATTNKIT_FA3_WG3");
        const bool forced = wg3 != nullptr && std::string(wg3) == "1";
        const int want = !three_warpgroups_allowed() ? 128
                         : forced
                             ? 192
                             : fa3::choose_block_m_d128(r.requests, fa3::tile_anchor_from_env());
        EXPECT_EQ(stats->last_block_m, want) << spec.name;
      }
    }
  } else {
    EXPECT_EQ(stats->wgmma_calls, 0) << "a case outside the wgmma kernel's scope ran on it";
    // An e4m3 q of a forward with few new tokens per request: widened for flashinfer's tiles.
    EXPECT_EQ(stats->q_widened_calls, spec.fp8_q ? r.layers : 0);
  }
  if (!expects_mla_wgmma(spec)) EXPECT_EQ(stats->wgmma_mla_calls, 0);
  EXPECT_EQ(stats->wgmma_mla_prefix_passes, expected_mla_prefix_passes(spec, r.layers))
      << "the MLA chunked prefix cache's passes on the wgmma MLA kernel";
}

class Fa3CaseTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(Fa3CaseTest, MatchesReference) {
  const CaseSpec& spec = GetParam();
  const DeviceInfo dev = cuda_device();
  ASSERT_EQ(dev.platform, Platform::kCUDA) << "no CUDA device";
  const std::string reason = harness::skip_reason(fa3_descriptor(), spec, dev);
  if (!reason.empty()) GTEST_SKIP() << reason;
  run_and_compare(spec, /*save_kv=*/true);
  run_and_compare(spec, /*save_kv=*/false);
}

INSTANTIATE_TEST_SUITE_P(SharedTable, Fa3CaseTest,
                         ::testing::ValuesIn(harness::shared_case_table()),
                         [](const ::testing::TestParamInfo<CaseSpec>& info) {
                           return info.param.name;
                         });

// ---- several query tiles (128 rows) and key blocks per request ----

CaseSpec prefill(std::string name, std::vector<int> prefix, std::vector<int> fresh, int page,
                 int hq, int hkv, int d) {
  CaseSpec c;
  c.name = std::move(name);
  c.mode = ForwardMode::kExtend;
  c.page_size = page;
  c.prefix_lens = std::move(prefix);
  c.new_lens = std::move(fresh);
  c.num_q_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim = c.v_head_dim = d;
  c.seed = 4242;
  return c;
}

TEST(Fa3LongTest, CausalPrefillAcrossTilesAllHeadDims) {
  for (int d : {64, 128, 256}) {
    // 300 + 437: 4 query tiles, 6 key blocks of 128; 1: one row; 129: a tile of one row.
    run_and_compare(
        prefill("long_d" + std::to_string(d), {300, 0, 0, 77}, {437, 1, 129, 256}, 16, 8, 2, d),
        true);
  }
  run_and_compare(prefill("long_page64", {640, 5}, {300, 200}, 64, 4, 1, 128), false);
  run_and_compare(prefill("long_page1", {100}, {500}, 1, 4, 4, 128), true);
  // d 256 blocks of 80 keys: TMA boxes of 16 rows inside 64-row pages, partial last blocks.
  run_and_compare(prefill("long_d256_page64", {333, 0}, {300, 161}, 64, 4, 2, 256), true);
}

TEST(Fa3LongTest, ThreeWarpgroupsAtD128WithPartialTiles) {
  // ATTNKIT_FA3_WG3=1: 192-row tiles at d 128 however much the tiles pad (the default rule would
  // keep 128 rows for most of these): requests of 1, 129, 245 and 437 rows, a prefix, the page-1
  // gather and the bidirectional mask, bf16 and f16.
  ScopedEnv wg3("ATTNKIT_FA3_WG3", "1");
  run_and_compare(prefill("wg3_d128_causal", {300, 0, 0, 77}, {437, 1, 129, 245}, 16, 8, 2, 128),
                  true);
  CaseSpec c = prefill("wg3_d128_encoder_page1", {0, 0}, {700, 177}, 1, 4, 2, 128);
  c.type = AttentionType::kEncoderOnly;
  run_and_compare(c, true);
  c = prefill("wg3_d128_f16", {200}, {333}, 16, 4, 2, 128);
  c.q_dtype = c.kv_dtype = DType::kF16;
  run_and_compare(c, true, 12.f);
}

TEST(Fa3LongTest, BidirectionalAndF16) {
  CaseSpec c = prefill("long_encoder", {0, 0}, {300, 129}, 16, 8, 2, 128);
  c.type = AttentionType::kEncoderOnly;
  run_and_compare(c, true);
  // Bidirectional, several tiles and key blocks: TMA boxes in 64-row pages, and the page-1 gather.
  for (int page : {64, 1}) {
    c = prefill("long_encoder_page" + std::to_string(page), {0, 0, 0}, {700, 177, 5}, page, 4, 2,
                128);
    c.type = AttentionType::kEncoderOnly;
    run_and_compare(c, page == 64);
  }
  c = prefill("long_f16", {200, 0}, {333, 64}, 16, 8, 2, 128);
  c.q_dtype = c.kv_dtype = DType::kF16;
  run_and_compare(c, true);
  c.head_dim = c.v_head_dim = 256;
  run_and_compare(c, false);
}

// ---- MLA prefill (non-absorbed 192 / 128 layers, K / V from the new tokens' k / v) ----

CaseSpec mla_prefill(std::string name, std::vector<int> fresh, int heads, int page = 64) {
  std::vector<int> none(fresh.size(), 0);  // no prefix (before fresh is moved)
  CaseSpec c = prefill(std::move(name), std::move(none), std::move(fresh), page, heads, heads,
                       fa3::kMlaPrefillDimQK);
  c.v_head_dim = fa3::kMlaPrefillDimV;
  c.mla = true;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  return c;
}

// (save_kv true / false below run alike: a non-absorbed layer never writes the pool, and the
// harness passes it its k / v either way.)
TEST(Fa3MlaPrefillTest, AcrossTilesAndBlocks) {
  // 437: 4 query tiles, 4 key blocks (the last partial: the 24-chunk cp.async gather of K); 1
  // and 129: one-row tiles; 256: whole blocks only (TMA boxes of 128 rows of k / v); 1000 with
  // 16 heads: many units per CTA.
  run_and_compare(mla_prefill("mla_tiles", {437, 1, 129, 256}, 8), true);
  run_and_compare(mla_prefill("mla_long", {1000, 300}, 16), false);
  CaseSpec f16 = mla_prefill("mla_f16", {333, 64}, 8);
  f16.q_dtype = f16.kv_dtype = DType::kF16;
  run_and_compare(f16, true);
  // 128 heads: fewer than two tiles of each head per round of the tile-major order, so the units
  // go head by head (sections of one head) on a GPU of fewer than 256 SMs.
  {
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    Fa3Stats st;
    run_and_compare(mla_prefill("mla_128_heads", {300, 45}, 128), false, 1.f, std::nullopt, {},
                    &st);
    if (std::getenv("ATTNKIT_FA3_L2_SECTION") == nullptr) {  // the knob overrides the rule
      EXPECT_EQ(st.last_section_heads, sms < 2 * 128 ? 1 : 128);
    }
  }
  // Large logits: the running maximum jumps between key blocks (O rescale, lazy and exact).
  run_and_compare(mla_prefill("mla_large_logits", {700}, 4), true, 12.f);
  // (Draft-extend forwards take the kernel as well; the harness builds non-absorbed MLA cases in
  // extend mode only.)
}

TEST(Fa3MlaPrefillTest, KnobsGatherSplitAndSchedule) {
  // Every key block by the cp.async gather (24 chunks per K row, 16 per V row), Q by the gather.
  {
    ScopedEnv tma("ATTNKIT_FA3_TMA", "0");
    ScopedEnv qtma("ATTNKIT_FA3_Q_TMA", "0");
    run_and_compare(mla_prefill("mla_gather", {437, 129}, 8), true);
  }
  // (No tail split: causal over the new tokens only, a forward's last round always holds a
  // request's one-block first tiles, so choose_tail_split never splits, forced or not.)
  {
    ScopedEnv split("ATTNKIT_FA3_SPLIT", "3");
    Fa3Stats st;
    run_and_compare(mla_prefill("mla_split_knob", {1000}, 2), true, 1.f, std::nullopt, {}, &st);
    EXPECT_EQ(st.last_split_units, 0);
  }
  // L2 sections of 1 and 2 heads (the unit order of ATTNKIT_FA3_L2_SECTION).
  for (const char* heads : {"1", "2"}) {
    ScopedEnv section("ATTNKIT_FA3_L2_SECTION", heads);
    run_and_compare(mla_prefill(std::string("mla_section") + heads, {437, 300}, 4), true);
  }
  // One release per stage after its P V (ATTNKIT_FA3_SPLIT_EMPTY=0), in both schedules.
  for (const char* overlap : {"1", "0"}) {
    ScopedEnv split_empty("ATTNKIT_FA3_SPLIT_EMPTY", "0");
    ScopedEnv schedule("ATTNKIT_FA3_OVERLAP", overlap);
    run_and_compare(mla_prefill(std::string("mla_one_release_overlap") + overlap, {437, 129}, 8),
                    true);
  }
  // The consumers decode the plan themselves (no TileInfo in shared memory).
  {
    ScopedEnv unit_smem("ATTNKIT_FA3_UNIT_SMEM", "0");
    run_and_compare(mla_prefill("mla_no_unit_smem", {437, 5}, 8), true);
  }
  // The serial schedule, no ping-pong, the plain stride, 4-byte O stores.
  {
    ScopedEnv overlap("ATTNKIT_FA3_OVERLAP", "0");
    ScopedEnv pingpong("ATTNKIT_FA3_PINGPONG", "0");
    ScopedEnv sched("ATTNKIT_FA3_SCHED", "0");
    ScopedEnv wide("ATTNKIT_FA3_EPI_WIDE", "0");
    run_and_compare(mla_prefill("mla_serial", {437, 5}, 8), true);
  }
}

TEST(Fa3MlaPrefillTest, OtherLayersStayOnTheFlashinferPath) {
  // A soft-cap: the portable kernels (the counters say so), with and without a prefix cache.
  CaseSpec cap = mla_prefill("mla_softcap", {200}, 4);
  cap.logit_cap = 20.f;
  run_and_compare(cap, true);
  cap.name = "mla_softcap_prefix";
  cap.prefix_lens = {300};
  cap.mla_prefix_chunk = 128;
  run_and_compare(cap, true);
  // An encoder-only (bidirectional) MLA layer without a prefix cache: the kernel's plan may take a
  // tail split there, untested at v 128, so it declines it.
  CaseSpec encoder = mla_prefill("mla_encoder_only", {200, 31}, 4);
  encoder.type = AttentionType::kEncoderOnly;
  run_and_compare(encoder, true);
}

// c with cached prefixes read through the MLA chunked prefix cache (a chunk budget of `chunk`
// tokens, filled from the requests' prefixes: mla::plan_prefix_chunks).
CaseSpec with_prefix_cache(CaseSpec c, std::vector<int> prefix, int chunk) {
  c.prefix_lens = std::move(prefix);
  c.mla_prefix_chunk = chunk;
  return c;
}

// The chunked prefix cache's passes on the wgmma MLA kernel (PrefillSm90Engine::run_prefix_pass,
// f32 rows into the runner's slots, merged by LSE): the new-token pass causal, the chunk passes
// bidirectional over each chunk's rows (request word kv_row); run_and_compare checks the pass
// count. Requests without prefix (every chunk empty: no tile in the chunk passes, their rows keep
// pass 0's partial), a prefix that ends before the last chunk, chunks shorter than the new
// tokens, partial and whole 128-key blocks, many tiles per request.
TEST(Fa3MlaPrefillTest, PrefixCachePassesOnWgmma) {
  // bs 2, 128-token budget: request 0 fills the 3 chunks (128, 128, 44), request 1 has no prefix.
  run_and_compare(
      with_prefix_cache(mla_prefill("mla_prefix_empty_req", {64, 31}, 4), {300, 0}, 128), true);
  // 3 requests, 512-token budget, 3 chunks (requests 0 / 1 / 2 take 253 / 252 / 7, 256 / 256 / 0
  // and 491 / 5 / 0 keys): chunk rows shorter than q_len, the short request's prefix ends in the
  // first chunk, 8 heads, many tiles.
  run_and_compare(
      with_prefix_cache(mla_prefill("mla_prefix_ragged", {200, 129, 1}, 8), {1000, 513, 7}, 512),
      true);
  // One request, 4096-token budget: whole 128-key blocks by TMA, 3 chunks (4096, 4096, 1808).
  run_and_compare(with_prefix_cache(mla_prefill("mla_prefix_long", {700}, 4), {10000}, 4096), true);
  // f16, large logits.
  {
    CaseSpec f16 = with_prefix_cache(mla_prefill("mla_prefix_f16", {333, 64}, 4), {500, 129}, 256);
    f16.q_dtype = f16.kv_dtype = DType::kF16;
    run_and_compare(f16, true, 8.f);
  }
  // Encoder-only: the new-token pass bidirectional as well.
  {
    CaseSpec enc =
        with_prefix_cache(mla_prefill("mla_prefix_encoder", {200, 31}, 4), {300, 0}, 128);
    enc.type = AttentionType::kEncoderOnly;
    run_and_compare(enc, true);
  }
  // The gather for every block, the serial schedule, the single release, and the passes off.
  {
    ScopedEnv tma("ATTNKIT_FA3_TMA", "0");
    run_and_compare(
        with_prefix_cache(mla_prefill("mla_prefix_gather", {437, 5}, 4), {700, 300}, 512), true);
  }
  {
    ScopedEnv overlap("ATTNKIT_FA3_OVERLAP", "0");
    ScopedEnv split_empty("ATTNKIT_FA3_SPLIT_EMPTY", "0");
    run_and_compare(
        with_prefix_cache(mla_prefill("mla_prefix_serial", {437, 5}, 4), {700, 300}, 512), true);
  }
  {
    // The chunk passes also plan the requests without keys in their chunk: the kernel's
    // all-masked tiles (O 0, LSE -inf), merged as no-ops.
    ScopedEnv all("ATTNKIT_FA3_MLA_PREFIX_SKIP", "0");
    run_and_compare(
        with_prefix_cache(mla_prefill("mla_prefix_noskip", {200, 129, 1}, 8), {1000, 513, 7}, 512),
        true);
  }
  {
    ScopedEnv off("ATTNKIT_FA3_MLA_PREFIX", "0");  // the SIMT kernel runs them (0 passes expected)
    run_and_compare(with_prefix_cache(mla_prefill("mla_prefix_off", {64, 31}, 4), {300, 0}, 128),
                    true);
  }
}

// c with a sliding window (-1: none), a soft-cap (0: none) and sinks.
CaseSpec with_variant(CaseSpec c, int window, float cap, bool sinks) {
  c.sliding_window = window;
  c.logit_cap = cap;
  c.sinks = sinks;
  return c;
}

// Sliding window, soft-cap and sinks on the bf16 / f16 kernel's variant instantiations
// (PrefillTraits::kVariant): windows that start inside a key block and several blocks past the
// first (decode_tile's nb_begin), every head dim, two and three consumer warpgroups, the
// bidirectional mask, f16, page 1 and large logits (the sinks' max above or below the rows').
// run_and_compare asserts every layer ran on the wgmma kernel.
TEST(Fa3VariantTest, WindowSoftcapSinksMatchReference) {
  const auto with = &with_variant;
  for (int d : {64, 128, 256}) {
    const std::string sd = "_d" + std::to_string(d);
    run_and_compare(with(prefill("window200" + sd, {300, 0, 77}, {437, 700, 129}, 16, 8, 2, d), 200,
                         0.f, false),
                    true);
    run_and_compare(with(prefill("softcap_sinks" + sd, {150, 0}, {333, 260}, 16, 8, 2, d), -1,
                         d == 256 ? 50.f : 5.f, true),
                    false);
    run_and_compare(
        with(prefill("all_three" + sd, {900, 5}, {300, 400}, 64, 4, 1, d), 333, 20.f, true), true,
        4.f);
  }
  {
    ScopedEnv wg3("ATTNKIT_FA3_WG3", "1");  // 192-row tiles at d 128: warpgroup windows differ
    run_and_compare(with(prefill("wg3_window", {0, 64}, {1000, 450}, 16, 8, 2, 128), 70, 0.f, true),
                    true);
  }
  {
    ScopedEnv wg3("ATTNKIT_FA3_WG3", "0");
    run_and_compare(with(prefill("wg2_window", {0, 64}, {1000, 450}, 16, 8, 2, 128), 70, 0.f, true),
                    true);
  }
  // Window 0 (a row sees its own key only), page 1, one-row requests.
  run_and_compare(
      with(prefill("window0_page1", {10, 0, 3}, {300, 1, 2}, 1, 4, 2, 128), 0, 0.f, false), true);
  // Bidirectional (encoder-only): the window bounds both sides (|q - k| <= w), also at w 0.
  CaseSpec c = with(prefill("encoder_window", {0, 0}, {700, 177}, 16, 4, 2, 128), 100, 0.f, true);
  c.type = AttentionType::kEncoderOnly;
  run_and_compare(c, true);
  c.sliding_window = 0;
  run_and_compare(c, false);
  // Windows whose start falls exactly on a key-block boundary for a tile, and one key to either
  // side: 300 new tokens after 256 make 128-row tiles whose first rows sit at 172, 300 and 428, so
  // w 44 starts them at keys 128, 256 and 384 (192-row tiles: 172 -> 128); d 256's 80-key blocks:
  // 200 after 240, a tile's first row at 312, w 72 starts it at key 240.
  for (int w : {43, 44, 45}) {
    run_and_compare(
        with(prefill("window_at_block" + std::to_string(w), {256}, {300}, 16, 8, 2, 128), w, 0.f,
             false),
        true);
  }
  run_and_compare(
      with(prefill("window_at_block_d256", {240}, {200}, 16, 4, 2, 256), 72, 0.f, false), true);
  // The variant kernels under the knobs that change their loop: no lazy rescale, the plan decoded
  // again by the consumers instead of the producer's shared-memory copy.
  for (const char* knob : {"ATTNKIT_FA3_LAZY_RESCALE", "ATTNKIT_FA3_UNIT_SMEM"}) {
    ScopedEnv off(knob, "0");
    run_and_compare(with(prefill(std::string("knob_") + knob, {300, 0}, {437, 700}, 16, 8, 2, 128),
                         200, 5.f, true),
                    true, 4.f);
  }
  // f16, with small logits (sinks above the rows' maxima) and large ones.
  c = with(prefill("f16_all_three", {200, 0}, {333, 64}, 16, 8, 2, 128), 150, 10.f, true);
  c.q_dtype = c.kv_dtype = DType::kF16;
  run_and_compare(c, true, 0.05f);
  run_and_compare(c, false, 8.f);
  // A forced tail split: the variant layers run without it (the engine drops it for them).
  ScopedEnv split("ATTNKIT_FA3_SPLIT", "4");
  run_and_compare(with(prefill("split_window", {0}, {600}, 16, 8, 2, 128), 128, 0.f, true), true);
}

TEST(Fa3LongTest, ManyUnitsPerCta) {
  // 26 tiles x 16 q heads = 416 units: about three per CTA on 132 SMs, so every CTA carries its
  // ring, barrier parities and ping-pong turns across units of different requests, lengths and
  // masks (most tests here have fewer units than SMs); bidirectional, f16 and large logits
  // (rescales) too.
  const CaseSpec base =
      prefill("many_units", {0, 300, 0, 77}, {1024, 700, 512, 900}, 16, 16, 4, 128);
  run_and_compare(base, true);
  CaseSpec c = base;
  c.name = "many_units_encoder";
  c.type = AttentionType::kEncoderOnly;
  run_and_compare(c, false);
  c = base;
  c.name = "many_units_f16";
  c.q_dtype = c.kv_dtype = DType::kF16;
  run_and_compare(c, true, 12.f);
}

TEST(Fa3LongTest, LargeLogitsRescaleAcrossBlocks) {
  // Logits of standard deviation ~12: block maxima differ by far more than the lazy-rescale
  // threshold (8 in log2 units), so both the kept-maximum and the raised-maximum paths run.
  run_and_compare(prefill("large_logits", {200, 0}, {600, 300}, 16, 8, 2, 128), true, 12.f);
  CaseSpec c = prefill("large_logits_encoder", {0}, {500}, 64, 4, 1, 128);
  c.type = AttentionType::kEncoderOnly;
  run_and_compare(c, true, 12.f);
  run_and_compare(prefill("large_logits_d256", {100}, {300}, 16, 4, 2, 256), true, 12.f);
}

// An e4m3 KV cache (the FP8 kernel where the case fits it).
CaseSpec fp8(CaseSpec c) {
  c.kv_dtype = DType::kFP8E4M3;
  return c;
}

// The same with q given in fp8_e4m3 (one AttentionLayer::q_scale): the FP8 kernel takes it as is.
CaseSpec fp8_q(CaseSpec c) {
  c.kv_dtype = DType::kFP8E4M3;
  c.fp8_q = true;
  return c;
}

// c over an fp8_e4m3 pool with bf16 q, or e4m3 q (fp8_q), its name saying which.
CaseSpec fp8_pool_q(CaseSpec c, bool e4m3_q) {
  c = e4m3_q ? fp8_q(c) : fp8(c);
  c.name += e4m3_q ? "_q8" : "_qbf16";
  return c;
}

// run_and_compare, and on a device with the FP8 kernel the stats say c ran there on the plan of
// block_m rows per tile (a wgmma FP8 call per layer; 192: three warpgroups, 128: two): the FP8
// variants' cases.
void run_on_fp8_plan(const CaseSpec& c, bool save_kv, float logit_mult = 1.f, int block_m = 192) {
  const CaseSpec probe = fp8(prefill("probe", {0}, {64}, 16, 1, 1, 128));
  const bool fp8_kernel = expects_fp8_kernel(probe) && expects_wgmma(probe);
  Fa3Stats stats;
  run_and_compare(c, save_kv, logit_mult, std::nullopt, {}, &stats);
  if (fp8_kernel) {
    EXPECT_GT(stats.wgmma_fp8_calls, 0) << c.name << ": not on the FP8 kernel";
    // (A mixed forward's few-token requests: the decode tiles, once per layer.)
    EXPECT_EQ(stats.flashinfer_calls, stats.partition_calls) << c.name;
    EXPECT_EQ(stats.last_block_m, block_m) << c.name << ": not the plan of " << block_m << " rows";
  }
}

// Over an fp8_e4m3 pool, a sliding window and sinks run on the FP8 kernel's kWindowSinks
// instantiations where the forward's plan is the three-warpgroup one (192-row tiles, V^T
// pre-transpose, speculative softmax; promoted past 2048 keys or not, bf16 or e4m3 q); other plans
// leave them to flashinfer's mma.sync kernels (why_not_layer). Soft-caps: Fp8PoolSoftcap.
// run_and_compare asserts which (expects_wgmma with the forward's requests) and, on the FP8 kernel,
// the plan's variant; against the fp64 reference with the FP8 tolerance. Windows that start inside
// a key block and several blocks in (decode_tile's nb_begin, per-warpgroup masks: 64-row warpgroups
// of one tile see different windows), on a block boundary and a key to either side, window 0, the
// bidirectional mask, the half diagonal block, the knobs that change the loop, a forced tail split
// (dropped for these layers).
TEST(Fa3VariantTest, Fp8PoolWindowAndSinks) {
  for (const bool e4m3_q : {false, true}) {
    auto f = [&](const CaseSpec& c) { return fp8_pool_q(c, e4m3_q); };
    run_on_fp8_plan(f(with_variant(prefill("fp8_window100", {300, 0}, {200, 150}, 16, 8, 2, 128),
                                   100, 0.f, false)),
                    true);
    run_on_fp8_plan(
        f(with_variant(prefill("fp8_sinks", {150, 0}, {333, 260}, 16, 8, 2, 128), -1, 0.f, true)),
        false);
    run_on_fp8_plan(f(with_variant(prefill("fp8_window_sinks", {0, 64}, {1000, 450}, 16, 8, 2, 128),
                                   70, 0.f, true)),
                    true);
    // 2400 keys: the promoted kernel.
    run_on_fp8_plan(f(with_variant(prefill("fp8_promoted_window", {2100}, {300}, 16, 4, 2, 128),
                                   333, 0.f, true)),
                    true);
    // The half diagonal block (prefix 37: warpgroups end in both halves) under a window.
    run_on_fp8_plan(
        f(with_variant(prefill("fp8_half_diag_window", {37, 0}, {700, 450}, 16, 4, 2, 128), 150,
                       0.f, false)),
        true);
    CaseSpec enc = f(with_variant(prefill("fp8_encoder_window", {0, 0}, {700, 177}, 16, 4, 2, 128),
                                  100, 0.f, true));
    enc.type = AttentionType::kEncoderOnly;
    run_on_fp8_plan(enc, true);
    enc.sliding_window = 0;
    run_on_fp8_plan(enc, false);
  }
  // Window 0 (a row sees its own key only), page 1, one-row requests.
  run_on_fp8_plan(
      fp8(with_variant(prefill("fp8_window0_page1", {10, 0, 3}, {300, 1, 2}, 1, 4, 2, 128), 0, 0.f,
                       false)),
      true);
  // 192-row tiles of 300 tokens after 256 start at rows 172 and 364 (the first tile's warpgroups
  // at 172, 236, 300): w 43 / 44 / 45 put a warpgroup's window start a key before, on and after
  // the 128-key block boundary at 128 (and 256 for the row at 300).
  for (int w : {43, 44, 45}) {
    run_on_fp8_plan(fp8(with_variant(prefill("fp8_window_at_block" + std::to_string(w), {256},
                                             {300}, 16, 8, 2, 128),
                                     w, 0.f, false)),
                    true);
  }
  // Larger logits (the exact step's rescales; sinks above and below the rows' maxima), e4m3 q.
  run_on_fp8_plan(
      fp8_q(with_variant(prefill("fp8_window_sinks_x4", {200, 0}, {333, 64}, 16, 8, 2, 128), 150,
                         0.f, true)),
      true, 4.f);
  for (const char* knob : {"ATTNKIT_FA3_LAZY_RESCALE", "ATTNKIT_FA3_UNIT_SMEM"}) {
    ScopedEnv off(knob, "0");
    run_on_fp8_plan(fp8(with_variant(prefill(std::string("fp8_knob_") + knob, {300, 0}, {437, 700},
                                             16, 8, 2, 128),
                                     200, 0.f, true)),
                    true);
  }
  {
    ScopedEnv split("ATTNKIT_FA3_SPLIT", "4");
    run_on_fp8_plan(
        fp8(with_variant(prefill("fp8_split_window", {0}, {600}, 16, 8, 2, 128), 128, 0.f, true)),
        true);
  }
  // A few queries over a long prefix (V transposed in the kernel): the two-warpgroup plan's
  // variants (Fp8PoolVariantsFewQueries).
  run_on_fp8_plan(fp8(with_variant(prefill("fp8_window_vt_in_kernel", {2000}, {100}, 16, 4, 2, 128),
                                   100, 0.f, true)),
                  true, 1.f, 128);
}

// A soft-cap over an fp8_e4m3 pool runs on the FP8 kernel's kSoftcap instantiations (the logits
// cap tanh(x scale / cap) after each Q K^T, before the masks and the speculation; window / sinks
// beside it) where the plan has them (fp8_plan_takes_variants: the default plans), else on
// flashinfer's mma.sync kernels:
// caps 2 to 50 (small caps saturate most logits: tanh's flat end), with a window and sinks, the
// promoted kernel, the half diagonal block, the bidirectional mask, bf16 and e4m3 q, logits x 4,
// and lazy rescale off (every rise of a row maximum takes the speculation's recompute, whose S is
// capped again). Against the fp64 reference with the FP8 tolerance.
TEST(Fa3VariantTest, Fp8PoolSoftcap) {
  auto with = [](const CaseSpec& c, float cap, int window = -1, bool sinks = false) {
    return with_variant(c, window, cap, sinks);
  };
  for (const bool e4m3_q : {false, true}) {
    auto f = [&](const CaseSpec& c) { return fp8_pool_q(c, e4m3_q); };
    run_on_fp8_plan(f(with(prefill("fp8_cap10", {300, 0}, {200, 150}, 16, 8, 2, 128), 10.f)), true);
    run_on_fp8_plan(f(with(prefill("fp8_cap2", {0, 64}, {333, 260}, 16, 8, 2, 128), 2.f)), true);
    run_on_fp8_plan(f(with(prefill("fp8_cap50_window_sinks", {0, 64}, {1000, 450}, 16, 8, 2, 128),
                           50.f, 70, true)),
                    true);
    // 2400 keys: the promoted kernel.
    run_on_fp8_plan(
        f(with(prefill("fp8_cap_promoted", {2100}, {300}, 16, 4, 2, 128), 30.f, -1, true)), true);
    // The half diagonal block (prefix 37: warpgroups end in both halves).
    run_on_fp8_plan(f(with(prefill("fp8_cap_half_diag", {37, 0}, {700, 450}, 16, 4, 2, 128), 20.f)),
                    true);
    CaseSpec enc = f(with(prefill("fp8_cap_encoder", {0, 0}, {700, 177}, 16, 4, 2, 128), 5.f));
    enc.type = AttentionType::kEncoderOnly;
    run_on_fp8_plan(enc, true);
  }
  // Larger logits: the cap bounds them (e4m3 q: bf16 q's per-row e4m3 rounding grows the LSE
  // error with the logits, Fa3Fp8Test.HalfDiagonalBlockMatchesReference). The promoted kernel (its
  // speculation checked on the packed P) at cap 3: most logits saturate, so an uncapped S would
  // miss the reference.
  run_on_fp8_plan(fp8_q(with(prefill("fp8_cap3_promoted_x4", {2100}, {300}, 16, 4, 2, 128), 3.f)),
                  true, 4.f);
  run_on_fp8_plan(
      fp8_q(with(prefill("fp8_cap10_x4", {200, 0}, {333, 640}, 16, 8, 2, 128), 10.f, 150, true)),
      true, 4.f);
  {
    ScopedEnv off("ATTNKIT_FA3_LAZY_RESCALE", "0");
    run_on_fp8_plan(
        fp8(with(prefill("fp8_cap_eager_rescale", {300, 0}, {437, 700}, 16, 8, 2, 128), 15.f)),
        true);
    run_on_fp8_plan(
        fp8_q(with(prefill("fp8_cap_eager_rescale_x4", {0}, {900}, 16, 8, 2, 128), 25.f)), true,
        4.f);
  }
  {
    ScopedEnv split("ATTNKIT_FA3_SPLIT", "4");
    run_on_fp8_plan(fp8(with(prefill("fp8_split_cap", {0}, {600}, 16, 8, 2, 128), 12.f)), true);
  }
  // A plan without the variants (the promoted chunks in the early order, a knob): flashinfer's
  // mma.sync kernels.
  {
    ScopedEnv early("ATTNKIT_FA3_FP8_PROMOTE", "1");
    Fa3Stats stats;
    run_and_compare(fp8(with(prefill("fp8_cap_promote_early", {2000}, {100}, 16, 4, 2, 128), 10.f)),
                    true, 1.f, std::nullopt, {}, &stats);
    EXPECT_EQ(stats.wgmma_fp8_calls, 0);
  }
}

// Forwards with few queries per key (chunked prefill over a long prefix: fewer than one query per
// 8 keys) run the two-warpgroup FP8 plan with V^T transposed in the kernel, unpromoted up to 2048
// keys, promoted (late chunk order) past them; its kWindowSinks / kSoftcap instantiations take a
// window, sinks and a soft-cap there. bf16 and e4m3 q, two requests of different lengths, a window
// inside and across key blocks, logits x 4, lazy rescale off.
TEST(Fa3VariantTest, Fp8PoolVariantsFewQueries) {
  for (const bool e4m3_q : {false, true}) {
    auto f = [&](const CaseSpec& c) { return fp8_pool_q(c, e4m3_q); };
    run_on_fp8_plan(
        f(with_variant(prefill("fp8_few_cap", {1500}, {100}, 16, 8, 2, 128), -1, 20.f, false)),
        true, 1.f, 128);
    run_on_fp8_plan(f(with_variant(prefill("fp8_few_window_sinks", {3000}, {200}, 16, 8, 2, 128),
                                   1000, 0.f, true)),
                    true, 1.f, 128);
    run_on_fp8_plan(f(with_variant(prefill("fp8_few_all", {5000, 2500}, {300, 100}, 16, 8, 2, 128),
                                   2048, 30.f, true)),
                    false, 1.f, 128);
    run_on_fp8_plan(
        f(with_variant(prefill("fp8_few_window100", {1800}, {64}, 16, 4, 2, 128), 100, 0.f, false)),
        true, 1.f, 128);
    // Bidirectional (encoder-only) over a long prefix: the window trims key blocks on both sides
    // of each tile (decode_tile's non-causal n_blocks), with sinks.
    CaseSpec enc = f(with_variant(prefill("fp8_few_encoder_window", {3000}, {200}, 16, 8, 2, 128),
                                  500, 0.f, true));
    enc.type = AttentionType::kEncoderOnly;
    run_on_fp8_plan(enc, true, 1.f, 128);
  }
  run_on_fp8_plan(
      fp8_q(with_variant(prefill("fp8_few_cap_x4", {2500}, {150}, 16, 8, 2, 128), 700, 10.f, true)),
      true, 4.f, 128);
  {
    ScopedEnv off("ATTNKIT_FA3_LAZY_RESCALE", "0");
    run_on_fp8_plan(
        fp8(with_variant(prefill("fp8_few_eager", {1900}, {120}, 16, 8, 2, 128), 333, 15.f, true)),
        true, 1.f, 128);
  }
}

TEST(Fa3LongTest, TilesAnchoredAtEitherEnd) {
  // Partial tiles (tile_plan.h, TileAnchor). By default a request's first tile starts before its
  // first token: request 0's before the first row of q / out, so its Q box starts at a negative
  // row (TMA zero-fills it) and its stores are guarded (the harness's canaries sit right before
  // and after out / lse). ATTNKIT_FA3_TILE_ANCHOR=start pads after the last token instead. Both,
  // on the bf16 kernels of every head dim, 192 rows at d 128, the cp.async Q gather, the FP8
  // kernel and tail-split pieces.
  for (const char* anchor : {"end", "start"}) {
    ScopedEnv a("ATTNKIT_FA3_TILE_ANCHOR", anchor);
    const std::string tag = std::string("_") + anchor;
    for (int d : {64, 128, 256}) {
      run_and_compare(
          prefill("anchor_d" + std::to_string(d) + tag, {0, 300, 0}, {437, 129, 1}, 16, 8, 2, d),
          true);
    }
    {
      ScopedEnv wg3("ATTNKIT_FA3_WG3", "1");
      run_and_compare(prefill("anchor_wg3" + tag, {0, 77}, {245, 300}, 16, 4, 2, 128), true);
      CaseSpec c = prefill("anchor_wg3_encoder" + tag, {0, 0}, {245, 70}, 64, 4, 2, 128);
      c.type = AttentionType::kEncoderOnly;
      run_and_compare(c, true);
    }
    {
      ScopedEnv q_tma("ATTNKIT_FA3_Q_TMA", "0");
      run_and_compare(prefill("anchor_q_gather" + tag, {0, 77}, {245, 300}, 1, 4, 2, 128), true);
    }
    run_and_compare(fp8(prefill("anchor_fp8" + tag, {0, 200}, {437, 129}, 16, 4, 2, 128)), true);
    {
      ScopedEnv split("ATTNKIT_FA3_SPLIT", "3");
      Fa3Stats stats;
      ASSERT_NO_FATAL_FAILURE(
          run_and_compare(prefill("anchor_split" + tag, {300, 500}, {300, 100}, 16, 4, 2, 128),
                          true, 1.f, std::nullopt, {}, &stats));
      if (stats.wgmma_calls > 0) EXPECT_GE(stats.last_num_splits, 2) << tag;
    }
  }
}

// ---- tail split: the last round's units in pieces, merged by LSE (fa3::choose_tail_split) ----

// Runs spec (save_kv) against the reference and, where the case runs on a wgmma kernel, checks
// that its layers ran tail-split (at least want_units units of the last round in >= 2 pieces).
void run_split(const CaseSpec& spec, float logit_mult = 1.f, int want_units = 1) {
  Fa3Stats stats;
  ASSERT_NO_FATAL_FAILURE(run_and_compare(spec, true, logit_mult, std::nullopt, {}, &stats));
  if (!expects_wgmma(spec)) return;  // flashinfer ran it (not SM90, or ATTNKIT_FA3_FP8=0)
  EXPECT_GE(stats.last_num_splits, 2) << spec.name << ": expected a tail split";
  EXPECT_GE(stats.last_split_units, want_units) << spec.name;
}

TEST(Fa3TailSplitTest, ChosenForFewUnitsOverALongPrefix) {
  // 128 new tokens after 2048 cached, 8 q heads: 8 units of 17 key blocks in one round; the model
  // splits each (16 pieces on 132 SMs) and merges them. Causal and bidirectional.
  run_split(prefill("split_auto_causal", {2048}, {128}, 16, 8, 2, 128));
  CaseSpec c = prefill("split_auto_encoder", {0}, {2100}, 64, 2, 1, 128);
  c.type = AttentionType::kEncoderOnly;  // 2100 rows: 11 tiles of 192 (17 of 128) x 2 heads
  run_split(c);
}

TEST(Fa3TailSplitTest, ForcedSplitsMatchTheReference) {
  // ATTNKIT_FA3_SPLIT=3: the units of the last round (here every unit: fewer than the SMs) in
  // min(3, fewest key blocks, SMs / units) pieces whenever >= 2.
  ScopedEnv split("ATTNKIT_FA3_SPLIT", "3");
  // Causal with a prefix and a second request: 6 tiles x 4 heads.
  run_split(prefill("split_causal", {300, 700}, {437, 129}, 16, 4, 2, 128));
  // Page 1 (cp.async gather) and page 64 (TMA boxes), bidirectional, large logits (rescales).
  for (int page : {1, 64}) {
    CaseSpec c =
        prefill("split_encoder_page" + std::to_string(page), {0, 0}, {700, 300}, page, 4, 2, 128);
    c.type = AttentionType::kEncoderOnly;
    run_split(c, 12.f);
  }
  // d 256 (80-key blocks) and d 64 (192-row tiles), no prefix: a tile's diagonal pieces hold
  // rows that see no key of the piece (their LSE is -inf and they weigh 0 in the merge). The
  // lengths give every tile >= 2 key blocks under either anchor (tile_plan.h: by default the
  // first tile holds the q_len % block_m remainder, 340 - 256 = 84 keys at d 256 and 520 - 384 =
  // 136 at d 64), else the forced split has nothing to split.
  run_split(prefill("split_d256", {0}, {340}, 16, 4, 2, 256));
  // (With ATTNKIT_FA3_WG3=0 or ATTNKIT_FA3_UNIFORM_WG=0, d 64 runs 128-row tiles whose first tile
  // holds one 128-key block: nothing to split, so the case runs without the split expectation.)
  const CaseSpec d64 = prefill("split_d64", {0, 40}, {520, 300}, 16, 4, 2, 64);
  if (!three_warpgroups_allowed()) {
    run_and_compare(d64, true);
  } else {
    run_split(d64);
  }
  // f16.
  CaseSpec f = prefill("split_f16", {200}, {333}, 16, 4, 2, 128);
  f.q_dtype = f.kv_dtype = DType::kF16;
  run_split(f);
}

TEST(Fa3TailSplitTest, MoreUnitsThanSmsSplitOnlyTheLastRound) {
  // 8 q heads and enough 128-row tiles for SMs + 8..15 units: every CTA runs whole units first,
  // then the last round's units run as 4 pieces each (stores of whole units and of pieces in one
  // launch, the pipeline counters carried across rounds, a zigzag round of pieces).
  const DeviceInfo dev = cuda_device();
  if (dev.platform != Platform::kCUDA || dev.sm_count <= 0) GTEST_SKIP() << "no CUDA device";
  const int fresh = (dev.sm_count + 8 + 7) / 8 * 128;
  ScopedEnv split("ATTNKIT_FA3_SPLIT", "4");
  // d 128: 192-row tiles (three warpgroups) unless ATTNKIT_FA3_WG3=0 / _UNIFORM_WG=0; whole
  // 192-row tiles pad nothing, so choose_block_m_d128 keeps them.
  const int rows128 = three_warpgroups_allowed() ? 192 : 128;
  const int fresh128 = (dev.sm_count + 8 + 7) / 8 * rows128;
  if (rows128 == 192) {
    ASSERT_EQ(fa3::choose_block_m_d128(std::vector<fa3::TileRequest>{{0, fresh128, 256 + fresh128}},
                                       fa3::tile_anchor_from_env()),
              192);
  }
  run_split(prefill("split_rounds_causal", {256}, {fresh128}, 16, 8, 2, 128), 1.f, 8);
  CaseSpec c = prefill("split_rounds_encoder", {0}, {fresh128}, 64, 8, 2, 128);
  c.type = AttentionType::kEncoderOnly;
  run_split(c, 1.f, 8);
  run_split(prefill("split_rounds_d256", {256}, {fresh}, 16, 8, 2, 256), 1.f, 8);
  // The FP8 kernel's tiles: 192 rows with three consumer warpgroups (ATTNKIT_FA3_FP8_WG3).
  const int fp8_rows =
      fa3::choose_fp8_variant(std::vector<fa3::TileRequest>{{0, fresh, 256 + fresh}}, 2,
                              fa3::fp8_knobs_from_env())
          .block_m;
  const int fresh_fp8 = (dev.sm_count + 8 + 7) / 8 * fp8_rows;
  run_split(fp8(prefill("split_rounds_fp8", {256}, {fresh_fp8}, 16, 8, 2, 128)), 1.f, 8);
}

TEST(Fa3TailSplitTest, Fp8KernelSplitsToo) {
  // The FP8 kernel (e4m3 KV, bf16 q, d 128) with its pieces merged the same way: chosen by the
  // model for 128 new tokens after 2048 cached (2176 keys > 2048: promoted, V transposed in the
  // kernel), and forced for the pre-transpose / speculative kernel (causal, bidirectional).
  run_split(fp8(prefill("split_fp8_auto", {2048}, {128}, 16, 8, 2, 128)));
  ScopedEnv split("ATTNKIT_FA3_SPLIT", "3");
  run_split(fp8(prefill("split_fp8_causal", {300, 700}, {437, 129}, 16, 4, 2, 128)));
  // (No large-logit run here: with logits x 12 the e4m3 rounding of Q and K alone moves the LSE
  // past the FP8 tolerance, split or not.)
  CaseSpec c = fp8(prefill("split_fp8_encoder", {0, 0}, {700, 300}, 64, 4, 2, 128));
  c.type = AttentionType::kEncoderOnly;
  run_split(c);
}

// ---- L2 sections (fa3::choose_section_heads): the q heads in sections, all tiles of one first
// ----

TEST(Fa3L2SectionTest, SectionsMatchTheReference) {
  // ATTNKIT_FA3_L2_SECTION=1: one kv head (group q heads) per section, so every case below runs
  // several sections; then with the tail split forced as well (the pieces are the last section's
  // last units).
  ScopedEnv section("ATTNKIT_FA3_L2_SECTION", "1");
  for (const bool split : {false, true}) {
    ScopedEnv force_split("ATTNKIT_FA3_SPLIT", split ? "3" : "0");
    const std::string tag = split ? "_split" : "";
    auto run = [&](const CaseSpec& spec, bool save_kv, int want_section_heads) {
      Fa3Stats stats;
      ASSERT_NO_FATAL_FAILURE(run_and_compare(spec, save_kv, 1.f, std::nullopt, {}, &stats));
      if (!expects_wgmma(spec)) return;
      EXPECT_EQ(stats.last_section_heads, want_section_heads) << spec.name;
      if (split) EXPECT_GE(stats.last_num_splits, 2) << spec.name;
    };
    // At most 66 units each (132 SMs), so that the forced split has >= 2 pieces per unit.
    run(prefill("section_causal" + tag, {300, 77}, {437, 256}, 16, 8, 2, 128), true, 4);
    CaseSpec c = prefill("section_encoder" + tag, {0, 0}, {500, 300}, 64, 8, 4, 128);
    c.type = AttentionType::kEncoderOnly;
    run(c, false, 2);
    // (Prefixes give every tile >= 2 key blocks on 192- and 128-row tiles: see split_d64.)
    run(prefill("section_d64" + tag, {200, 200}, {520, 300}, 16, 8, 2, 64), true, 4);
    run(prefill("section_d256" + tag, {100}, {300}, 16, 8, 2, 256), true, 4);
    run(fp8(prefill("section_fp8" + tag, {300, 700}, {437, 129}, 16, 8, 2, 128)), true, 4);
  }
}

TEST(Fa3TailSplitTest, OffWithTheKnob) {
  ScopedEnv split("ATTNKIT_FA3_SPLIT", "0");
  Fa3Stats stats;
  ASSERT_NO_FATAL_FAILURE(run_and_compare(prefill("split_off", {2048}, {128}, 16, 8, 2, 128), true,
                                          1.f, std::nullopt, {}, &stats));
  EXPECT_EQ(stats.last_split_units, 0);
  EXPECT_EQ(stats.last_num_splits, 1);
}

// ---- FP8 kernel: e4m3 KV cache with bf16 q at d 128 ----

TEST(Fa3Fp8Test, E4m3KvPrefillAcrossTilesAndPages) {
  // Several 128-row tiles and 128-key blocks, rows with one key, partial blocks: TMA boxes of 16 /
  // 64 rows (pages 16, 64) and the cp.async gather (page 1), non-unit k/v scales per layer.
  run_and_compare(
      fp8(prefill("fp8_long_page16", {300, 0, 0, 77}, {437, 1, 129, 256}, 16, 8, 2, 128)), true);
  run_and_compare(fp8(prefill("fp8_long_page64", {640, 5}, {300, 200}, 64, 4, 1, 128)), false);
  run_and_compare(fp8(prefill("fp8_long_page1", {100}, {500}, 1, 4, 4, 128)), true);
  CaseSpec c = fp8(prefill("fp8_encoder", {0, 0, 0}, {700, 177, 5}, 64, 4, 2, 128));
  c.type = AttentionType::kEncoderOnly;
  run_and_compare(c, true);
  // Non-power-of-two pages: every block gathered.
  run_and_compare(fp8(prefill("fp8_page24", {50, 0}, {333, 40}, 24, 8, 2, 128)), true);
}

TEST(Fa3Fp8Test, VariantsOfTheKernel) {
  // The two 8k-key cases: about 2 s each of fp64 reference on the host (2 layers).
  // 7200 + 1036 new: 8236 > kFp8GemmSumMaxKeys (2048) keys -> promoted (the default since session
  // 11): pre-transpose + speculation, GEMM row sums, 128-key blocks. (Unpromoted GEMM row sums,
  // i.e. the session-9 pre-transpose / speculative / 192-key kernels, failed these two cases on an
  // H200 at 11:13Z: LSE error 0.158 / 0.163, rel_l2 0.143 / 0.040, from the e4m3 wgmma's short
  // accumulator; tile_plan.h.)
  run_and_compare(fp8(prefill("fp8_long_page64", {7200}, {1036}, 64, 2, 1, 128)), true, 1.f,
                  Fp8Expect{true, true, 128});
  {
    // The same through the cp.async gather (page 24) with a second, short request, and without
    // lazy rescale (every rise of a row maximum rescales).
    ScopedEnv lazy("ATTNKIT_FA3_LAZY_RESCALE", "0");
    run_and_compare(
        fp8(prefill("fp8_long_page24_eager_rescale", {7200, 0}, {1036, 90}, 24, 2, 1, 128)), false,
        1.f, Fp8Expect{true, true, 128});  // promoted; 1126 x 8 >= 8326 keys: pre-transpose
    // The recompute path at 128 keys per block ((437 + 129) x 8 >= 737 + 129: pre-transpose). The
    // middle request has no new tokens: no V^T units, and the pre-transpose skips it (else it
    // would overwrite the V^T of the request after it).
    run_and_compare(fp8(prefill("fp8_b128_recompute", {300, 500, 0}, {437, 0, 129}, 16, 4, 2, 128)),
                    true, 1.f, Fp8Expect{true, true, 128});
  }
  // A few queries over a long prefix: 100 x 8 < 2100 keys -> V transposed in the kernel (128 keys,
  // exact softmax).
  run_and_compare(fp8(prefill("fp8_vt_in_kernel", {2000}, {100}, 16, 4, 2, 128)), true, 1.f,
                  Fp8Expect{false, false, 128});
}

// ---- FP8 promotion (ATTNKIT_FA3_FP8_PROMOTE=1): long rows, V with a nonzero mean ----
//
// The e4m3 wgmma adds into its f32 accumulator with ~13 bits aligned to the largest term, so O and
// the GEMM row sums kept in the accumulator over a whole 8k-key row lose the low bits of every
// block; with V ~ N(1, 1) (every channel's mean 1) O grows with the row as l does, so the FADD
// row-sum kernel (the unpromoted default past 2048 keys) is as wrong as the GEMM-sum ones.
// docs/perf/fa3_s9/fp8_rowsum_model.py for exactly these cases (prefix 7200 + 1036 new, 2 q heads /
// 1 kv head, d 128, 128-key blocks, the harness's k / v scales, --acc_bits 13 --v_mean 1; the
// worse of the 2 layers):
//   promoted (--promote_every 1), GEMM row sums:    rel_l2 1.9e-3, max_abs 7.3e-3, LSE 0.017
//   promoted, FADD row sums (--gemm_sum 0):          rel_l2 2.2e-3, max_abs 8.1e-3, LSE 0.016
//   promoted, no lazy rescale (--lazy 0):            rel_l2 1.9e-3, max_abs 9.2e-3, LSE 0.016
//   unpromoted, FADD (today's default at 8236 keys): rel_l2 0.095,  max_abs 0.119,  LSE 0.016
//   unpromoted, GEMM row sums:                       rel_l2 0.032,  max_abs 0.060,  LSE 0.157
// (max|ref| ~1.1, so the max-abs bound is 4 x rel x 1.1.) rel 0.01 / LSE 0.05: 4-5x above the
// promoted kernel's modelled rel_l2 and max-abs, 3x above its LSE; the unpromoted FADD kernel is 9x
// over on rel_l2 and 2.7x on max-abs, the unpromoted GEMM-sum kernel 3x on rel_l2 and 3x on LSE.
constexpr Fp8Tolerance kFp8PromotedTolerance{0.01, 0.05};

CaseSpec biased_v(CaseSpec c) {
  c.v_mean = 1.f;
  return c;
}

// Every variant of the FP8 kernel with promotion forced on, each held to kFp8PromotedTolerance, and
// the variant that ran checked (vt_pre / spec / GEMM row sums / 128-key blocks / promoted).
TEST(Fa3Fp8Test, PromotionAtLongRowsWithBiasedV) {
  if (!expects_wgmma(fp8(prefill("probe", {0}, {64}, 16, 1, 1, 128)))) {
    GTEST_SKIP() << "no FP8 wgmma kernel here (ATTNKIT_FA3_FP8=0 or not SM90)";
  }
  if (const char* u = std::getenv("ATTNKIT_FA3_UNIFORM_WG");
      u != nullptr && std::string(u) == "0") {
    GTEST_SKIP() << "ATTNKIT_FA3_UNIFORM_WG=0: the pre-session-7 FP8 kernel has no promotion";
  }
  struct Variant {
    std::string name;
    std::vector<std::pair<const char*, const char*>> env;
    bool vt_pre, spec, gemm_sum;
    std::vector<int> prefix, fresh;
    int page;
    int promote = 1;  // Fa3Params::fp8_promote: 2 = the other order of the two column chunks
  };
  const std::vector<Variant> variants = {
      // 1036 x 8 >= 8236 keys: the pre-transpose kernel (speculative softmax, GEMM row sums),
      // 128-key blocks (the unpromoted choice would be 192). TMA boxes of 64 rows.
      {"pre_spec", {}, true, true, true, {7200}, {1036}, 64},
      // The same with the exact softmax every block.
      {"pre_exact", {{"ATTNKIT_FA3_FP8_SPEC", "0"}}, true, false, true, {7200}, {1036}, 64},
      // Without lazy rescale every rise of a row maximum takes the speculative kernel's recompute
      // path; page 24: the cp.async gather; a second, short request.
      {"pre_spec_recompute_page24",
       {{"ATTNKIT_FA3_LAZY_RESCALE", "0"}},
       true,
       true,
       true,
       {7200, 0},
       {1036, 90},
       24},
      // V transposed in the kernel, GEMM row sums.
      {"in_kernel_gemm_sum",
       {{"ATTNKIT_FA3_FP8_VT_PRE", "0"}},
       false,
       false,
       true,
       {7200},
       {1036},
       64},
      // V transposed in the kernel, fp32 FADD row sums.
      {"in_kernel_fadd",
       {{"ATTNKIT_FA3_FP8_VT_PRE", "0"}, {"ATTNKIT_FA3_FP8_GEMM_SUM", "0"}},
       false,
       false,
       false,
       {7200},
       {1036},
       16},
      // The other chunk order (ATTNKIT_FA3_FP8_PROMOTE=2): pre-transpose + speculation, and the
      // in-kernel transpose with GEMM sums.
      {"pre_spec_late",
       {{"ATTNKIT_FA3_FP8_PROMOTE", "2"}},
       true,
       true,
       true,
       {7200},
       {1036},
       64,
       2},
      // The library default (knob empty = unset): promoted past 2048 keys in the order of 2.
      {"default_auto", {{"ATTNKIT_FA3_FP8_PROMOTE", ""}}, true, true, true, {7200}, {1036}, 64, 2},
      {"in_kernel_gemm_sum_late",
       {{"ATTNKIT_FA3_FP8_PROMOTE", "2"}, {"ATTNKIT_FA3_FP8_VT_PRE", "0"}},
       false,
       false,
       true,
       {7200},
       {1036},
       24,
       2},
  };
  // Pinned when the run's environment sets no FP8 knob but (maybe) the promotion.
  bool pin_variant = false;
  {
    ScopedEnv unset("ATTNKIT_FA3_FP8_PROMOTE", "");  // empty = unset: the default knobs
    pin_variant = default_fp8_knobs();
  }
  ScopedEnv promote("ATTNKIT_FA3_FP8_PROMOTE", "1");
  for (const Variant& v : variants) {
    std::vector<std::unique_ptr<ScopedEnv>> env;
    for (const auto& [name, value] : v.env) env.push_back(std::make_unique<ScopedEnv>(name, value));
    Fa3Stats stats;
    run_and_compare(
        biased_v(fp8(prefill("fp8_promote_" + v.name, v.prefix, v.fresh, v.page, 2, 1, 128))), true,
        1.f, std::nullopt, kFp8PromotedTolerance, &stats);
    SCOPED_TRACE(v.name);
    EXPECT_EQ(stats.last_fp8_promote, v.promote);
    EXPECT_EQ(stats.last_block_n, 128);
    if (pin_variant) {
      EXPECT_EQ(stats.last_fp8_vt_pre, v.vt_pre);
      EXPECT_EQ(stats.last_fp8_spec, v.spec);
      EXPECT_EQ(stats.last_fp8_gemm_sum, v.gemm_sum);
    }
  }
}

// The test above can fail: the unpromoted kernel (today's default at 8236 keys: FADD row sums) is
// outside kFp8PromotedTolerance on the same case, and so is the unpromoted GEMM-sum kernel.
TEST(Fa3Fp8Test, PromotedToleranceRejectsTheUnpromotedKernel) {
  if (!expects_wgmma(fp8(prefill("probe", {0}, {64}, 16, 1, 1, 128)))) {
    GTEST_SKIP() << "no FP8 wgmma kernel here (ATTNKIT_FA3_FP8=0 or not SM90)";
  }
  ScopedEnv promote("ATTNKIT_FA3_FP8_PROMOTE", "0");
  // Whole rows: the tail split would cut these 18 units (9 tiles x 2 heads, one round) into
  // pieces of ~1200 keys, each accumulated on its own, which passes the promoted tolerance
  // unpromoted (H200 2026-11-24 04:30Z: rel_l2 4.7e-3, LSE 0.021).
  ScopedEnv no_split("ATTNKIT_FA3_SPLIT", "0");
  for (const char* max_keys : {"2048", "1000000"}) {  // FADD row sums; GEMM row sums at any length
    ScopedEnv gemm_sum_keys("ATTNKIT_FA3_FP8_GEMM_SUM_MAX_KEYS", max_keys);
    const CaseSpec spec = biased_v(fp8(prefill("fp8_unpromoted", {7200}, {1036}, 64, 2, 1, 128)));
    SCOPED_TRACE(spec.describe() + " gemm_sum_max_keys " + max_keys);
    Fa3Run r;
    ASSERT_NO_FATAL_FAILURE(run_fa3(spec, true, 1.f, &r));
    ASSERT_GT(r.stats.wgmma_fp8_calls, 0);
    EXPECT_EQ(r.stats.last_fp8_promote, 0);
    EXPECT_FALSE(passes_fp8(r.cmp, kFp8PromotedTolerance))
        << "the unpromoted kernel passed the promoted tolerance: " << r.cmp.summary();
    if (!r.stats.last_fp8_gemm_sum) {  // FADD row sums: O alone is wrong, by rel_l2 ~0.095
      EXPECT_GT(r.cmp.rel_l2, kFp8PromotedTolerance.rel) << r.cmp.summary();
    } else {  // GEMM row sums: l too small as well (LSE ~0.16)
      EXPECT_GT(r.cmp.lse_max_abs, kFp8PromotedTolerance.lse) << r.cmp.summary();
    }
  }
}

TEST(Fa3Fp8Test, E4m3KvAtOtherHeadDimsFallsBack) {
  // e4m3 at head dims other than 128: the flashinfer kernels (bf16 tolerance). fp8_e5m2 never
  // reaches fa3 (descriptor: fp8_e4m3_only; selection falls back to triton).
  run_and_compare(fp8(prefill("e4m3_d64", {40, 0}, {60, 17}, 16, 8, 2, 64)), true);
}

// The FP8 three-warpgroup kernels store full 64-row O tiles by TMA (Fa3Params::o_tma) through a
// map built from out's strides. Outputs that are not [T, H, D] contiguous must get the same bits
// as the contiguous run, and the padding between rows must stay as it was:
//  * heads padded to 136 columns;
//  * one spare head per token;
//  * heads-major storage viewed as [T, H, D].
// The LSE of every run must equal the contiguous run's as well. Three runs, each on the 192-row
// kernel with the default knobs:
//  * unpromoted (700 and 64 + 400 tokens): full tiles (TMA stores) and partial ones (register
//    stores);
//  * promoted (2304 keys, past 2048) with the tail split off: 48 full tiles, all TMA-stored;
//  * the same with the split the model picks there (48 units on 132 SMs): every unit a piece,
//    merged into out by the merge kernel.
// ATTNKIT_FA3_O_TMA=0 and the other knob runs check the register stores the same way.
TEST(Fa3Fp8Test, StridedOutMatchesContiguous) {
  struct Run {
    CaseSpec spec;
    const char* split;  // ATTNKIT_FA3_SPLIT for the run, or nullptr: as set
  };
  const Run runs[] = {
      {fp8(prefill("fp8_strided_out", {0, 64}, {700, 400}, 16, 4, 2, 128)), nullptr},
      {fp8(prefill("fp8_strided_out_promoted", {0}, {2304}, 16, 4, 2, 128)), "0"},
      {fp8(prefill("fp8_strided_out_promoted_split", {0}, {2304}, 16, 4, 2, 128)), nullptr},
  };
  for (const Run& run : runs) {
    const CaseSpec& spec = run.spec;
    SCOPED_TRACE(spec.name);
    std::optional<ScopedEnv> split;
    if (run.split != nullptr) split.emplace("ATTNKIT_FA3_SPLIT", run.split);
    if (!expects_wgmma(spec) || !expects_fp8_kernel(spec)) GTEST_SKIP() << "no SM90 FP8 kernel";
    Result<PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    Result<std::unique_ptr<AttentionBackend>> backend = create_fa3_backend(pc->context());
    ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
    AttentionBackend& b = **backend;
    ASSERT_TRUE(harness::run_backend(b, *pc, /*save_kv=*/true).is_ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Result<harness::Comparison> cmp = harness::compare_with_reference(*pc);
    ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
    EXPECT_TRUE(passes_fp8(*cmp)) << cmp->summary();
    const Fa3Stats* st = fa3_stats(b);
    ASSERT_NE(st, nullptr);
    ASSERT_GT(st->wgmma_fp8_calls, 0);
    // Knobs may pick another variant; the layouts must match whichever kernel ran.
    if (three_warpgroups_allowed() && default_fp8_knobs()) {
      EXPECT_EQ(st->last_block_m, 192) << "the TMA-store kernel did not run";
      if (run.split != nullptr) EXPECT_EQ(st->last_split_units, 0) << "split pieces, not tiles";
    }

    const int64_t t = pc->num_tokens, hq = spec.num_q_heads, d = 128;
    struct Layout {
      const char* name;
      int64_t elems;       // bf16 elements of the buffer
      int64_t strides[3];  // token, head, column
    };
    const Layout layouts[] = {
        {"head stride 136", t * hq * 136, {hq * 136, 136, 1}},
        {"a spare head per token", t * (hq + 1) * d, {(hq + 1) * d, d, 1}},
        {"heads-major", t * hq * d, {d, t * d, 1}},
    };
    for (const harness::LayerData& ld : pc->layers) {
      std::vector<uint16_t> want(static_cast<size_t>(t * hq * d));
      ASSERT_EQ(cudaMemcpy(want.data(), ld.out.data, want.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_TRUE(ld.lse.defined());
      const size_t lse_bytes = static_cast<size_t>(ld.lse.storage_bytes());
      std::vector<uint8_t> want_lse(lse_bytes), got_lse(lse_bytes);
      ASSERT_EQ(cudaMemcpy(want_lse.data(), ld.lse.data, lse_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(ld.lse.data, 0xff, lse_bytes), cudaSuccess);  // rewritten by each run
      for (const Layout& lay : layouts) {
        SCOPED_TRACE(lay.name);
        const size_t bytes = static_cast<size_t>(lay.elems) * 2;
        void* buf = nullptr;
        ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
        ASSERT_EQ(cudaMemset(buf, 0xff, bytes), cudaSuccess);  // NaN bf16: the untouched marker
        TensorView out = ld.out;
        out.data = buf;
        for (int i = 0; i < 3; ++i) out.strides[i] = lay.strides[i];
        const Status planned = b.init_forward_metadata(pc->batch);
        ASSERT_TRUE(planned.is_ok()) << planned.to_string();
        const Status s = b.forward(ld.q, {}, {}, out, ld.layer, pc->batch, false, ld.lse);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint16_t> got(static_cast<size_t>(lay.elems));
        const cudaError_t copied = cudaMemcpy(got.data(), buf, bytes, cudaMemcpyDeviceToHost);
        ASSERT_EQ(cudaFree(buf), cudaSuccess);
        ASSERT_EQ(copied, cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got_lse.data(), ld.lse.data, lse_bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(got_lse, want_lse) << "the LSE differs from the contiguous run's";
        ASSERT_EQ(cudaMemset(ld.lse.data, 0xff, lse_bytes), cudaSuccess);
        std::vector<uint8_t> covered(got.size(), 0);
        int64_t bad_rows = 0;
        for (int64_t tok = 0; tok < t; ++tok) {
          for (int64_t h = 0; h < hq; ++h) {
            const int64_t at = tok * lay.strides[0] + h * lay.strides[1];
            bool same = true;
            for (int64_t c = 0; c < d; ++c) {
              covered[static_cast<size_t>(at + c)] = 1;
              same = same && got[static_cast<size_t>(at + c)] ==
                                 want[static_cast<size_t>((tok * hq + h) * d + c)];
            }
            bad_rows += same ? 0 : 1;
          }
        }
        int64_t gap_written = 0;
        for (size_t i = 0; i < got.size(); ++i) gap_written += !covered[i] && got[i] != 0xffff;
        EXPECT_EQ(bad_rows, 0) << "of " << t * hq << " (token, head) rows differ from the "
                               << "contiguous run";
        EXPECT_EQ(gap_written, 0) << "padding elements written";
      }
    }
  }
}

// ---- e4m3 q (AttentionLayer::q_scale): the FP8 kernel takes q already quantised (fp8_q) ----

// q in fp8_e4m3 with one scale per layer (amax / 448), against the fp64 reference over the
// dequantised q: TMA Q boxes and the cp.async gather, the 192-row kernel, promoted and
// unpromoted, the two-warpgroup kernel with the in-kernel V transpose, bidirectional.
TEST(Fa3Fp8Test, E4m3QInputMatchesReference) {
  if (!expects_wgmma(fp8_q(prefill("probe", {0}, {64}, 16, 1, 1, 128))) ||
      !expects_fp8_kernel(fp8_q(prefill("probe", {0}, {64}, 16, 1, 1, 128)))) {
    GTEST_SKIP() << "no SM90 FP8 kernel (ATTNKIT_FA3_FP8=0 or not SM90): e4m3 q is refused there";
  }
  run_and_compare(fp8_q(prefill("fp8q_page16", {300, 0, 0, 77}, {437, 1, 129, 256}, 16, 8, 2, 128)),
                  true);
  run_and_compare(fp8_q(prefill("fp8q_page1", {100}, {500}, 1, 4, 4, 128)), false);
  CaseSpec enc = fp8_q(prefill("fp8q_encoder", {0, 0, 0}, {700, 177, 5}, 64, 4, 2, 128));
  enc.type = AttentionType::kEncoderOnly;
  run_and_compare(enc, true);
  // 2400 keys: past 2048, promoted.
  run_and_compare(fp8_q(prefill("fp8q_promoted", {2100}, {300}, 16, 4, 2, 128)), true);
  // A few queries over a long prefix: V transposed in the kernel.
  run_and_compare(fp8_q(prefill("fp8q_vt_in_kernel", {2000}, {100}, 16, 4, 2, 128)), true, 1.f,
                  Fp8Expect{false, false, 128});
  {
    ScopedEnv q_tma("ATTNKIT_FA3_Q_TMA", "0");  // the cp.async gather of the e4m3 rows
    run_and_compare(fp8_q(prefill("fp8q_gather", {0, 64}, {700, 400}, 16, 4, 2, 128)), true);
  }
}

// Fa3Params::fp8_half_diag: a three-warpgroup FP8 causal tile's warpgroup whose last row ends in
// the first half of its diagonal key block computes S (and, in the e4m3-q kernel, the softmax) of
// that block over its first 64 keys. Prefixes of 2113 and 37 put the rows off the 64-key grid, so
// warpgroups end in both halves; past 2048 keys (the promoted kernel) and below (unpromoted); e4m3
// and bf16 q; the knob off as the control. Against the fp64 reference. Logits x 4 (the diagonal
// block's rows raise the running maximum) with e4m3 q only: with bf16 q the kernel's per-row
// e4m3 rounding of q (the reference keeps the bf16 q) scales with the logits, and at x 4 the LSE
// error is ~0.4 with the knob on or off (H200, 2026-11-28 07:49Z), past the FP8 tolerance.
TEST(Fa3Fp8Test, HalfDiagonalBlockMatchesReference) {
  const CaseSpec probe = fp8_q(prefill("probe", {0}, {64}, 16, 1, 1, 128));
  if (!expects_wgmma(probe) || !expects_fp8_kernel(probe)) {
    GTEST_SKIP() << "no SM90 FP8 kernel (ATTNKIT_FA3_FP8=0 or not SM90)";
  }
  for (const char* knob : {"1", "0"}) {
    ScopedEnv half("ATTNKIT_FA3_FP8_HALF_DIAG", knob);
    for (const bool e4m3_q : {true, false}) {
      for (CaseSpec c : {prefill("half_diag_promoted", {2113, 0}, {333, 1100}, 16, 4, 2, 128),
                         prefill("half_diag", {37, 0}, {700, 450}, 16, 4, 2, 128)}) {
        c = e4m3_q ? fp8_q(c) : fp8(c);
        c.name += std::string(e4m3_q ? "_q8" : "_qbf16") + "_knob" + knob;
        for (const float logit_mult :
             e4m3_q ? std::vector<float>{1.f, 4.f} : std::vector<float>{1.f}) {
          Fa3Stats stats;
          run_and_compare(c, true, logit_mult, std::nullopt, {}, &stats);
          EXPECT_EQ(stats.last_block_m, 192) << c.name << ": not the three-warpgroup kernel";
        }
      }
    }
  }
}

// Device memory freed on every exit of a test (an ASSERT included).
struct CudaBuffer {
  void* p = nullptr;
  explicit CudaBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~CudaBuffer() { cudaFree(p); }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
};

// The e4m3 q path computes what the bf16 path computes when the bf16 q quantises to the same
// codes: q = code x 2^-6 with one +-448 in every (token, head) row makes the kernel's per-row
// quantisation exact (row scale 2^-6), so with q_scale 2^-6 both runs multiply the same e4m3
// operands by the same folded scale and must write the same bits (out and LSE). Three-warpgroup
// kernels unpromoted and promoted (one instantiation per q dtype), the two-warpgroup kernel with
// the in-kernel V transpose (the q dtype chosen at run time), and the cp.async gather of q.
TEST(Fa3Fp8Test, E4m3QEqualsTheBf16QItQuantisesTo) {
  struct Run {
    CaseSpec spec;
    bool gather;  // ATTNKIT_FA3_Q_TMA=0
  };
  const Run runs[] = {
      {fp8_q(prefill("fp8q_same_bits", {0, 64}, {700, 400}, 16, 4, 2, 128)), false},
      {fp8_q(prefill("fp8q_same_bits_promoted", {2100}, {300}, 16, 4, 2, 128)), false},
      {fp8_q(prefill("fp8q_same_bits_vt_in_kernel", {2000}, {100}, 16, 4, 2, 128)), false},
      {fp8_q(prefill("fp8q_same_bits_gather", {0, 64}, {700, 400}, 16, 4, 2, 128)), true},
  };
  for (const Run& run : runs) {
    const CaseSpec& spec = run.spec;
    SCOPED_TRACE(spec.name);
    std::optional<ScopedEnv> gather;
    if (run.gather) gather.emplace("ATTNKIT_FA3_Q_TMA", "0");
    if (!expects_wgmma(spec) || !expects_fp8_kernel(spec)) GTEST_SKIP() << "no SM90 FP8 kernel";
    Result<PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    Result<std::unique_ptr<AttentionBackend>> backend = create_fa3_backend(pc->context());
    ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
    AttentionBackend& b = **backend;
    ASSERT_TRUE(harness::run_backend(b, *pc, /*save_kv=*/true).is_ok());  // writes the new K / V
    const int64_t t = pc->num_tokens, hq = spec.num_q_heads, d = 128, n = t * hq * d;
    constexpr float kQScale = 1.f / 64.f;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 64.f);
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    std::vector<uint16_t> q_bf16(static_cast<size_t>(n));
    for (int64_t row = 0; row < t * hq; ++row) {
      const int64_t peak = (row * 37) % d;  // one +-448 per row: the row's amax
      for (int64_t c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(row * d + c);
        const float x =
            c == peak ? (row % 2 == 0 ? 448.f : -448.f) : std::clamp(normal(rng), -440.f, 440.f);
        codes[i] = float_to_fp8_e4m3(x);
        q_bf16[i] = float_to_bf16_bits(fp8_e4m3_to_float(codes[i]) * kQScale);
      }
    }
    const CudaBuffer q8(codes.size()), qb(q_bf16.size() * 2), out2(q_bf16.size() * 2);
    ASSERT_TRUE(q8.p != nullptr && qb.p != nullptr && out2.p != nullptr);
    ASSERT_EQ(cudaMemcpy(q8.p, codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(qb.p, q_bf16.data(), q_bf16.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    const TensorView q8_view(q8.p, DType::kFP8E4M3, Device::cuda(0), {t, hq, d});
    const TensorView qb_view(qb.p, DType::kBF16, Device::cuda(0), {t, hq, d});
    for (const harness::LayerData& ld : pc->layers) {
      AttentionLayer layer = ld.layer;
      layer.q_scale = kQScale;
      TensorView out_b = ld.out;
      out_b.data = out2.p;
      const size_t lse_bytes = static_cast<size_t>(ld.lse.storage_bytes());
      std::vector<uint8_t> lse8(lse_bytes), lseb(lse_bytes);
      std::vector<uint16_t> o8(static_cast<size_t>(n)), ob(static_cast<size_t>(n));
      ASSERT_EQ(cudaMemset(ld.out.data, 0xff, o8.size() * 2), cudaSuccess);  // NaN poison
      ASSERT_EQ(cudaMemset(out2.p, 0xff, ob.size() * 2), cudaSuccess);
      ASSERT_EQ(cudaMemset(ld.lse.data, 0xff, lse_bytes), cudaSuccess);
      ASSERT_TRUE(b.init_forward_metadata(pc->batch).is_ok());
      Status s = b.forward(q8_view, {}, {}, ld.out, layer, pc->batch, false, ld.lse);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      ASSERT_EQ(cudaMemcpy(lse8.data(), ld.lse.data, lse_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(ld.lse.data, 0xff, lse_bytes), cudaSuccess);
      s = b.forward(qb_view, {}, {}, out_b, layer, pc->batch, false, ld.lse);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(lseb.data(), ld.lse.data, lse_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(o8.data(), ld.out.data, o8.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(ob.data(), out2.p, ob.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t nan_out = 0, diff = 0, nan_lse = 0;
      for (size_t i = 0; i < o8.size(); ++i) {
        nan_out += o8[i] == 0xffff ? 1 : 0;
        diff += o8[i] != ob[i] ? 1 : 0;
      }
      for (size_t i = 0; i + 4 <= lse8.size(); i += 4) {
        nan_lse +=
            lse8[i] == 0xff && lse8[i + 1] == 0xff && lse8[i + 2] == 0xff && lse8[i + 3] == 0xff
                ? 1
                : 0;
      }
      EXPECT_EQ(nan_out, 0) << "outputs left at the NaN poison";
      EXPECT_EQ(nan_lse, 0) << "LSE values left at the NaN poison";
      EXPECT_EQ(diff, 0) << "of " << n << " output elements differ between e4m3 and bf16 q";
      EXPECT_EQ(lse8, lseb) << "the LSE differs between e4m3 and bf16 q";
    }
    const Fa3Stats* st = fa3_stats(b);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->wgmma_fp8_calls, st->wgmma_calls);
    EXPECT_EQ(st->flashinfer_calls, 0);
  }
}

// Extends with few new tokens per request (backend/small_extend.h) leave the wgmma kernel for the
// inner flashinfer's decode tiles (<= 32 packed rows per request) or prefill tiles (<= 16 new
// tokens); run_and_compare checks that no wgmma call ran (expects_wgmma) and the output. An e4m3 q
// over an fp8_e4m3 pool goes there too, widened to bf16 (q_widened_calls).
TEST(Fa3SmallExtendTest, FewNewTokensLeaveTheWgmmaKernel) {
  Fa3Stats stats;
  const CaseSpec tiles = prefill("small_ext", {700, 1500, 33}, {1, 8, 3}, 16, 8, 2, 128);
  run_and_compare(tiles, true, 1.f, std::nullopt, {}, &stats);
  if (test_support::expects_small_extend(tiles)) {
    EXPECT_EQ(stats.flashinfer_calls, 2) << "both layers on the inner flashinfer";
  }
  run_and_compare(prefill("small_ext_q16", {1500, 200}, {16, 9}, 16, 8, 2, 128), true);
  CaseSpec fp8_pool = fp8(prefill("small_ext_fp8", {900, 64}, {2, 5}, 16, 8, 2, 128));
  run_and_compare(fp8_pool, false);
  // An e4m3 q: widened to bf16 for the same tiles (run_and_compare counts q_widened_calls), on the
  // decode tiles, the mma.sync prefill tiles, with a window + sinks and a soft-cap.
  const CaseSpec q8 = fp8_q(prefill("small_ext_fp8q", {900, 64}, {2, 5}, 16, 8, 2, 128));
  if (expects_fp8_kernel(q8)) {
    run_and_compare(q8, true, 1.f, std::nullopt, {}, &stats);
    if (test_support::expects_small_extend(q8)) EXPECT_EQ(stats.q_widened_calls, 2);
    run_and_compare(fp8_q(prefill("small_ext_fp8q_q16", {1500, 200}, {16, 9}, 16, 8, 2, 128)),
                    false);
    run_and_compare(
        fp8_q(with_variant(prefill("small_ext_fp8q_ws", {700, 33}, {3, 1}, 16, 8, 2, 128), 100, 0.f,
                           true)),
        true);
    run_and_compare(
        fp8_q(with_variant(prefill("small_ext_fp8q_cap", {700, 33}, {3, 1}, 1, 8, 2, 128), -1, 20.f,
                           false)),
        true);
  }
}

// A mixed forward of few-token requests beside longer ones (backend/small_extend.h
// extend_partition): the wgmma kernel runs the longer requests, the inner flashinfer's decode
// tiles the others, each writing only its own rows (run_and_compare: every row and the LSE against
// the reference, outputs NaN-poisoned first; wgmma, flashinfer and partition calls one per layer).
// Decode rows around and between the chunks, a window with sinks, a soft-cap on page 1, a
// bidirectional layer, d 64 / 256; ATTNKIT_EXTEND_PARTITION=0 and an fp8 pool run the forward
// whole on the wgmma kernel.
TEST(Fa3PartitionTest, MixedForwardSplitsBetweenTheKernels) {
  CaseSpec base =
      prefill("part_mixed", {300, 0, 5000, 64, 0, 2000}, {1, 200, 1, 7, 1, 65}, 16, 8, 2, 128);
  base.mode = ForwardMode::kMixed;
  if (const std::string why = test_support::partition_test_skip(base, {1, 0, 1, 1, 1, 0});
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  Fa3Stats stats;
  run_and_compare(base, true, 1.f, std::nullopt, {}, &stats);
  EXPECT_EQ(stats.partition_calls, stats.wgmma_calls);
  EXPECT_GT(stats.partition_calls, 0);
  for (const test_support::PartitionVariant& v : test_support::partition_variants(base)) {
    run_and_compare(v.spec, v.save_kv);
  }
  // The two kernels overlapped (backend/small_extend.h): the wgmma grid leaves 1 / 40 / all but
  // one SM to the decode tiles (ATTNKIT_PARTITION_RESERVE, clamped below the SM count), releases
  // them at its start, and the decode tiles' last CTA waits for it before exiting.
  // ATTNKIT_PARTITION_OVERLAP=0: one after the other.
  for (const char* reserve : {"1", "40", "65536"}) {
    SCOPED_TRACE(std::string("ATTNKIT_PARTITION_RESERVE=") + reserve);
    ScopedEnv forced("ATTNKIT_PARTITION_RESERVE", reserve);
    run_and_compare(base, true, 1.f, std::nullopt, {}, &stats);
    EXPECT_GT(stats.partition_overlap_calls, 0);
    EXPECT_EQ(stats.partition_overlap_calls, stats.partition_calls);
    for (const test_support::PartitionVariant& v : test_support::partition_variants(base)) {
      run_and_compare(v.spec, v.save_kv);
    }
  }
  {
    ScopedEnv forced("ATTNKIT_PARTITION_RESERVE", "40");
    ScopedEnv serial("ATTNKIT_PARTITION_OVERLAP", "0");
    run_and_compare(base, true, 1.f, std::nullopt, {}, &stats);
    EXPECT_GT(stats.partition_calls, 0);
    EXPECT_EQ(stats.partition_overlap_calls, 0) << "overlapped with ATTNKIT_PARTITION_OVERLAP=0";
  }
  ScopedEnv off("ATTNKIT_EXTEND_PARTITION", "0");
  run_and_compare(base, true, 1.f, std::nullopt, {}, &stats);
  EXPECT_EQ(stats.partition_calls, 0) << "partitioned with ATTNKIT_EXTEND_PARTITION=0";
  EXPECT_EQ(stats.flashinfer_calls, 0);
}

// The same mixed forward over an fp8_e4m3 pool: the FP8 wgmma kernel runs the longer requests,
// the decode tiles (over the fp8 pool) the few-token ones, overlapped as in the bf16 test; with
// bf16 q and with an e4m3 q, whose few-token rows are widened to bf16 for the decode tiles
// (q_scale folded into the scaling); a window with sinks and a soft-cap on the partitioned plan;
// a bidirectional forward; a knob-forced plan without those variants (FADD row sums) keeps the
// forward whole.
// run_and_compare checks every row and the LSE against the reference (FP8 tolerance) and the
// counters (expected_fa3_partition).
TEST(Fa3PartitionTest, Fp8PoolMixedForwardSplits) {
  CaseSpec base =
      prefill("part_fp8", {300, 0, 5000, 64, 0, 2000}, {1, 200, 1, 7, 1, 65}, 16, 8, 2, 128);
  base.mode = ForwardMode::kMixed;
  if (const std::string why = test_support::partition_test_skip(base, {1, 0, 1, 1, 1, 0});
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  if (!expects_fp8_kernel(fp8(base))) GTEST_SKIP() << "no FP8 kernel (ATTNKIT_FA3_FP8=0)";
  for (const bool e4m3_q : {false, true}) {
    Fa3Stats stats;
    const CaseSpec c = fp8_pool_q(base, e4m3_q);
    run_and_compare(c, true, 1.f, std::nullopt, {}, &stats);
    run_and_compare(c, false);
    // A knob-forced FP8 plan may keep it whole (expected_fa3_partition says, run_and_compare
    // checks); the rest is the default plans'.
    if (!default_fp8_knobs()) continue;
    EXPECT_GT(stats.partition_calls, 0) << "the default plan kept the forward whole";
    EXPECT_EQ(stats.partition_calls, stats.wgmma_fp8_calls);
    for (const test_support::PartitionVariant& v : test_support::partition_variants(base)) {
      if (v.spec.head_dim != 128) continue;  // the FP8 kernel is d 128 only
      run_and_compare(fp8_pool_q(v.spec, e4m3_q), v.save_kv);
    }
    // Overlapped (forced reserves: the FP8 grid leaves 1 / 40 SMs to the decode tiles) and not.
    for (const char* reserve : {"1", "40"}) {
      SCOPED_TRACE(std::string("ATTNKIT_PARTITION_RESERVE=") + reserve);
      ScopedEnv forced("ATTNKIT_PARTITION_RESERVE", reserve);
      run_and_compare(c, true, 1.f, std::nullopt, {}, &stats);
      EXPECT_GT(stats.partition_overlap_calls, 0);
      EXPECT_EQ(stats.partition_overlap_calls, stats.partition_calls);
      run_and_compare(fp8_pool_q(test_support::partition_variants(base)[0].spec, e4m3_q), false);
      ScopedEnv serial("ATTNKIT_PARTITION_OVERLAP", "0");
      run_and_compare(c, true, 1.f, std::nullopt, {}, &stats);
      EXPECT_GT(stats.partition_calls, 0);
      EXPECT_EQ(stats.partition_overlap_calls, 0) << "overlapped with ATTNKIT_PARTITION_OVERLAP=0";
    }
    ScopedEnv fadd("ATTNKIT_FA3_FP8_GEMM_SUM", "0");
    run_and_compare(c, true, 1.f, std::nullopt, {}, &stats);
    EXPECT_EQ(stats.partition_calls, 0) << "partitioned on a plan without the variants";
    CaseSpec window = c;
    window.sliding_window = 300;
    window.sinks = true;
    if (!e4m3_q) run_and_compare(window, true);  // whole, on flashinfer's tiles
  }
}

// The decode tiles of an overlapped split forward complete after the wgmma kernel: copies of out
// and the LSE enqueued right after each layer (no synchronisation) equal the tensors, with a
// 4096-token chunk on 32 SMs of an H200-class part (reserve 100) running far past two short
// decode rows. (It guards the stream order of the whole overlap, e.g. against a decode launch off
// the stream; it does not show the decode grid's final griddepcontrol.wait to be needed: built
// without that wait it passed 5 / 5 on an H200, driver 580, session 75.)
TEST(Fa3PartitionTest, OverlappedKernelsKeepStreamOrder) {
  CaseSpec spec = prefill("part_order", {0, 300, 300}, {4096, 1, 1}, 16, 8, 2, 128);
  spec.mode = ForwardMode::kMixed;
  if (const std::string why = test_support::partition_test_skip(spec, {0, 1, 1}); !why.empty()) {
    GTEST_SKIP() << why;
  }
  test_support::expect_partition_stream_order(
      spec, create_fa3_backend, "100", [](AttentionBackend& b) {
        const Fa3Stats* st = fa3_stats(b);
        ASSERT_NE(st, nullptr);
        EXPECT_GT(st->partition_overlap_calls, 0);
        EXPECT_EQ(st->partition_overlap_calls, st->partition_calls);
      });
  // Over an fp8_e4m3 pool on the FP8 kernel, with an e4m3 q (its few-token rows widened before
  // the FP8 kernel, which releases the decode tiles at its start).
  if (!expects_fp8_kernel(fp8(spec)) || !default_fp8_knobs()) return;
  for (const bool e4m3_q : {false, true}) {
    test_support::expect_partition_stream_order(
        fp8_pool_q(spec, e4m3_q), create_fa3_backend, "100", [e4m3_q](AttentionBackend& b) {
          const Fa3Stats* st = fa3_stats(b);
          ASSERT_NE(st, nullptr);
          EXPECT_GT(st->partition_overlap_calls, 0);
          EXPECT_EQ(st->partition_overlap_calls, st->partition_calls);
          EXPECT_EQ(st->wgmma_fp8_calls, st->wgmma_calls);
          EXPECT_EQ(st->q_widened_calls, e4m3_q ? st->partition_calls : 0);
        });
  }
}

// Outside the FP8 kernel an e4m3 q is refused by name, before anything is written: a bf16 pool,
// head dim 64, a soft-capped layer on a plan without the soft-cap (a few queries over a long
// prefix with the promoted chunks forced into the early order: fp8_plan_takes_variants has
// neither that plan nor, so, the cap; the default plans take it: Fp8PoolSoftcap,
// Fp8PoolVariantsFewQueries), a decode batch. The pool and out stay as they were (the harness's
// checks: no pool writes at all, out and the LSE still the NaN poison).
TEST(Fa3Fp8Test, E4m3QRefusedOffTheFp8Kernel) {
  CaseSpec bf16_pool = fp8_q(prefill("fp8q_bf16_pool", {40}, {60}, 16, 4, 2, 128));
  bf16_pool.kv_dtype = DType::kBF16;
  CaseSpec capped = fp8_q(prefill("fp8q_softcap_promote_early", {2000}, {100}, 16, 4, 2, 128));
  capped.logit_cap = 30.f;
  CaseSpec decode = fp8_q(prefill("fp8q_decode", {100, 37}, {1, 1}, 16, 4, 2, 128));
  decode.mode = ForwardMode::kDecode;
  const CaseSpec specs[] = {bf16_pool, fp8_q(prefill("fp8q_d64", {40}, {60}, 16, 4, 2, 64)), capped,
                            decode};
  for (const CaseSpec& spec : specs) {
    SCOPED_TRACE(spec.name);
    std::optional<ScopedEnv> early;
    if (spec.name == capped.name) early.emplace("ATTNKIT_FA3_FP8_PROMOTE", "1");
    Result<PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    Result<std::unique_ptr<AttentionBackend>> backend = create_fa3_backend(pc->context());
    ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
    const Status s = harness::run_backend(**backend, *pc, /*save_kv=*/true);
    ASSERT_FALSE(s.is_ok()) << "an e4m3 q ran off the FP8 kernel";
    EXPECT_NE(s.message().find("fp8_e4m3"), std::string::npos) << s.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Result<harness::Comparison> c = harness::compare_with_reference(*pc);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->pool_stray_writes, 0);
    // The new tokens' slots were not written either: every (token, kv head) row of every layer
    // still holds the pool's NaN poison, so none matches the new k / v.
    EXPECT_EQ(c->pool_bad_new_values, static_cast<int64_t>(pc->num_tokens) * spec.num_kv_heads *
                                          static_cast<int64_t>(pc->layers.size()))
        << "save_kv wrote the new tokens before the refusal";
    // Every out element and LSE value still the NaN poison.
    const int64_t per_row = spec.v_head_dim + (pc->layers[0].lse.defined() ? 1 : 0);
    EXPECT_EQ(c->nan_inf_count, static_cast<int64_t>(pc->num_tokens) * spec.num_q_heads * per_row *
                                    static_cast<int64_t>(pc->layers.size()))
        << "out or the LSE was written";
  }
}

// ---- CUDA graphs (decode, delegated): replay equals eager bit for bit ----

TEST(Fa3GraphTest, DecodeReplayIsBitIdenticalToEager) {
  const CaseSpec* spec = harness::find_case("decode_batch16_page16");
  ASSERT_NE(spec, nullptr);
  Result<PreparedCase> prepared = harness::prepare_case(*spec, Device::cuda(0));
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  test_support::expect_graph_replay_matches_eager(*prepared, create_fa3_backend,
                                                  ForwardMode::kDecode);
}

}  // namespace
}  // namespace attnkit
