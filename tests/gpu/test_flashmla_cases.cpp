// The shared case table (src/harness/case_runner.h) run by the flashmla backend (page 64) on the
// CUDA device against the fp64 reference, plus MLA-specific checks of the shared tensor-core MLA
// decode kernels: long uneven batches that the tile scheduler splits, 128 heads with s_q 1..3
// (verify chains), the fp8 cache, and CUDA-graph replay bit-identical to eager execution.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "backends/mla/kernels/mla_decode.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"
#include "backends/mla/mla_decode_engine.h"
#include "backends/mla/mla_paged_backend.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/scoped_env.h"

ATTNKIT_BACKEND_CASE_TESTS(FlashMlaCases, "flashmla", ::attnkit::Device::cuda(0));

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

CaseSpec mla_case(std::string name, ForwardMode mode, int page, std::vector<int> prefix, int heads,
                  DType kv) {
  CaseSpec c;
  c.name = std::move(name);
  c.mode = mode;
  c.page_size = page;
  c.prefix_lens = std::move(prefix);
  c.new_lens.assign(c.prefix_lens.size(), 1);
  c.mla = true;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.num_q_heads = heads;
  c.num_kv_heads = 1;
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.kv_dtype = kv;
  c.seed = 31;
  return c;
}

// Whether this GPU runs 64-row MLA tiles on the sm_90a wgmma kernel by default: compute
// capability 9.x and the kernel compiled into this build (mla::wgmma_available).
bool runs_mla_wgmma() {
  int cc_major = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  return cc_major == 9 && mla::wgmma_available();
}

// 150 short requests (0-260 keys of history): many segments per CTA, odd and even tile counts.
std::vector<int> short_lens() {
  std::vector<int> lens;
  for (int b = 0; b < 150; ++b) lens.push_back((b * 37) % 260 + (b % 7 == 0 ? 0 : 1));
  return lens;
}

// A target-verify chain of 2 draft tokens (topk 1) over histories 700, 129 and 64.
CaseSpec verify_case(std::string name, int heads, DType kv) {
  CaseSpec c = mla_case(std::move(name), ForwardMode::kTargetVerify, 64, {700, 129, 64}, heads, kv);
  c.new_lens.clear();
  c.spec_draft_tokens = 2;
  c.spec_topk = 1;
  return c;
}

// `stats_out`, when set, receives the backend's MLA engine counters; `outs`, the layers' outputs
// (bytes).
void run_and_compare(const CaseSpec& spec, bool save_kv, mla::MlaDecodeStats* stats_out = nullptr,
                     std::vector<std::vector<uint8_t>>* outs = nullptr) {
  SCOPED_TRACE(spec.describe());
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  Result<std::unique_ptr<AttentionBackend>> backend = create_flashmla_backend(pc->context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const Status run = harness::run_backend(**backend, *pc, save_kv);
  ASSERT_TRUE(run.is_ok()) << run.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Result<harness::Comparison> cmp = harness::compare_with_reference(*pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_EQ(cmp->nan_inf_count, 0) << cmp->summary();
  EXPECT_TRUE(cmp->passed()) << cmp->summary();
  if (stats_out != nullptr) {
    const mla::MlaDecodeStats* stats = mla_paged_stats(**backend);
    ASSERT_NE(stats, nullptr);
    *stats_out = *stats;
  }
  if (outs != nullptr) {
    outs->clear();
    for (const harness::LayerData& ld : pc->layers) {
      std::vector<uint8_t> host(static_cast<size_t>(ld.out.storage_bytes()));
      ASSERT_EQ(cudaMemcpy(host.data(), ld.out.data, host.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      outs->push_back(std::move(host));
    }
  }
}

// Whether the engine's schedule of a decode case splits some request: the host copy of the
// device schedule (mla_tile_scheduler.h) over this device's CTA-parts.
bool decode_schedule_splits(const CaseSpec& spec) {
  const Result<DeviceInfo> dev = detect_cuda(0);
  EXPECT_TRUE(dev.is_ok());
  const int bs = spec.batch_size();
  const int rows = spec.num_q_heads;
  const int parts = mla::num_parts(dev.is_ok() ? dev->sm_count : 1, rows);
  std::vector<int32_t> sched(static_cast<size_t>(parts) * mla::kSchedWords);
  std::vector<int32_t> split(static_cast<size_t>(bs) + 1);
  mla::build_schedule(
      bs, parts, mla::schedule_min_parts(parts, rows),
      [&](int b) { return spec.prefix_lens[static_cast<size_t>(b)] + 1; }, sched.data(),
      split.data());
  for (int b = 0; b < bs; ++b) {
    if (split[static_cast<size_t>(b) + 1] - split[static_cast<size_t>(b)] > 1) return true;
  }
  return false;
}

TEST(FlashMlaKernels, LongUnevenBatchSplitsAndMatches) {
  // 4000 keys next to tiny requests: the scheduler splits the long one across many CTA-parts.
  run_and_compare(
      mla_case("long_h16", ForwardMode::kDecode, 64, {4000, 3, 64, 130, 0}, 16, DType::kBF16),
      true);
  run_and_compare(
      mla_case("long_h128", ForwardMode::kDecode, 64, {3000, 1, 640}, 128, DType::kBF16), false);
  run_and_compare(
      mla_case("long_h64_fp8", ForwardMode::kDecode, 64, {2500, 77}, 64, DType::kFP8E4M3), true);
  run_and_compare(mla_case("h40_rows_not_tile_multiple", ForwardMode::kDecode, 64, {300, 900}, 40,
                           DType::kBF16),
                  true);
}

// An encoder-only (bidirectional) layer over a quantised latent pool: flashmla sends the extend to
// flashinfer's quantised-MLA path, which ran it causal whatever the layer's type until session 80
// (the batch mutation test found it: rel L2 1.3 against the reference).
TEST(FlashMlaKernels, BidirectionalExtendOverQuantisedPool) {
  for (DType kv : {DType::kFP8E4M3, DType::kFP4E2M1}) {
    CaseSpec c = mla_case("extend_bidirectional", ForwardMode::kExtend, 64, {70, 0, 130}, 16, kv);
    c.new_lens = {9, 33, 5};
    c.type = AttentionType::kEncoderOnly;
    run_and_compare(c, true);
    run_and_compare(c, false);
  }
}

TEST(FlashMlaKernels, VerifyChainsMultiTokenQueries) {
  for (int n : {2, 3}) {
    for (int heads : {16, 128}) {
      CaseSpec c = mla_case("verify", ForwardMode::kTargetVerify, 64, {1100, 7, 64}, heads,
                            heads == 16 ? DType::kFP8E4M3 : DType::kBF16);
      c.new_lens.clear();
      c.spec_draft_tokens = n;
      c.spec_topk = 1;
      run_and_compare(c, true);
    }
  }
}

// 64-row tiles (128 heads) run the sm_90a wgmma kernel on SM90 unless ATTNKIT_MLA_WGMMA=0: many
// short requests per CTA-part (several segments per CTA: the Q reload and the alternation of the
// two consumer warpgroups restart per segment, with odd and even tile counts), on both kernels
// and the wgmma kernel's variants (ATTNKIT_MLA_WGMMA_BLOCKS 0 = tile barriers, 1 = block
// barriers, 2 = + split release, 3 = the seesaw: odd and even tile counts, i.e. with and without
// the phantom tile; 6 = the seesaw that skips the phantom tile, 7 = 6 + the next pair's S0
// issued behind P1 V1L, 8 = 7 + P1 in its own buffer; unset = auto: 8 where a request's rows fill
// two or more 64-row tiles (128 heads), else 6).
TEST(FlashMlaKernels, ManySegmentsPerCtaBothKernels) {
  const std::vector<int> lens = short_lens();
  for (const char* variant : {"1", "1+blocks0", "1+blocks1", "1+blocks2", "1+blocks3", "1+blocks6",
                              "1+blocks7", "1+blocks8", "0"}) {
    const std::string v = variant;
    const char* wgmma = v == "0" ? "0" : "1";
    SCOPED_TRACE(std::string("ATTNKIT_MLA_WGMMA=") + variant);
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA", wgmma, 1), 0);
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA_BLOCKS",
                     v == "1+blocks0"   ? "0"
                     : v == "1+blocks1" ? "1"
                     : v == "1+blocks2" ? "2"
                     : v == "1+blocks3" ? "3"
                     : v == "1+blocks6" ? "6"
                     : v == "1+blocks7" ? "7"
                     : v == "1+blocks8" ? "8"
                                        : "",
                     1),
              0);
    run_and_compare(mla_case("many_h128", ForwardMode::kDecode, 64, lens, 128, DType::kBF16), true);
    run_and_compare(
        mla_case("long_h128", ForwardMode::kDecode, 64, {3000, 1, 640}, 128, DType::kBF16), false);
    CaseSpec c =
        mla_case("verify_h64", ForwardMode::kTargetVerify, 64, {700, 64, 65}, 64, DType::kBF16);
    c.new_lens.clear();
    c.spec_draft_tokens = 2;
    c.spec_topk = 1;
    run_and_compare(c, true);
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA"), 0);
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA_BLOCKS"), 0);
}

// The launch order of the decode grid (ATTNKIT_MLA_GRID_ORDER: "parts" = (parts, row tiles),
// "rows" = (row tiles, parts), unset = auto: rows for the wgmma kernel, parts for mma.sync) only
// moves CTAs: on both kernels (ATTNKIT_MLA_WGMMA unset / 0), many short requests per CTA with a
// bf16 cache and a 128-head x s_q 2 verify chain (four 64-row tiles) with an fp8 cache each match
// the reference, every order writes the same bits as the auto one, and the engine's counters say
// which kernel and which order ran (MlaDecodeStats::wgmma_fp8_runs / grid_rows_runs).
TEST(FlashMlaKernels, GridOrdersMatchBitwise) {
  const CaseSpec verify = verify_case("verify_h128_fp8", 128, DType::kFP8E4M3);
  const CaseSpec many =
      mla_case("many_h128", ForwardMode::kDecode, 64, short_lens(), 128, DType::kBF16);
  const bool sm90 = runs_mla_wgmma();
  const int64_t layers = harness::PrepareOptions{}.num_layers;
  ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA_FP8", "", 1), 0);
  for (const char* wgmma : {"", "0"}) {
    SCOPED_TRACE(std::string("ATTNKIT_MLA_WGMMA=") + wgmma);
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA", wgmma, 1), 0);
    const bool on_wgmma = sm90 && *wgmma == '\0';
    for (const CaseSpec* c : {&many, static_cast<const CaseSpec*>(&verify)}) {
      const bool fp8 = c->kv_dtype == DType::kFP8E4M3;
      std::vector<std::vector<uint8_t>> auto_out;
      for (const char* order : {"", "parts", "rows"}) {
        SCOPED_TRACE(std::string("ATTNKIT_MLA_GRID_ORDER=") + order);
        ASSERT_EQ(setenv("ATTNKIT_MLA_GRID_ORDER", order, 1), 0);
        mla::MlaDecodeStats stats;
        std::vector<std::vector<uint8_t>> out;
        run_and_compare(*c, true, &stats, &out);
        EXPECT_EQ(stats.wgmma_fp8_runs, fp8 && on_wgmma ? layers : 0);
        const std::string o = order;
        const bool rows = o == "rows" || (o.empty() && on_wgmma);
        EXPECT_EQ(stats.grid_rows_runs, rows ? layers : 0);
        if (o.empty()) {
          auto_out = std::move(out);
          continue;
        }
        ASSERT_EQ(out.size(), auto_out.size());
        for (size_t l = 0; l < out.size(); ++l) EXPECT_TRUE(out[l] == auto_out[l]) << "layer " << l;
      }
    }
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_GRID_ORDER"), 0);
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA"), 0);
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA_FP8"), 0);
}

// Whole bf16 K tiles by TMA (the default on the SM90 wgmma seesaw; MlaDecodeParams::kv_tma_ok),
// issued by the releasing consumer (default) or by the producer (ATTNKIT_MLA_K_TMA=1), load the
// same bytes as the cp.async path (ATTNKIT_MLA_K_TMA=0): many short requests per CTA
// (partial last tiles on cp.async beside TMA tiles in one pair, odd segments), a long split request
// with a partial last tile, segments of several pairs (consumer refills in a row, odd segments
// ending on a whole tile) and a 128-head x s_q 2 verify chain each match the reference, both
// paths write the same bits, and MlaDecodeStats::k_tma_runs says where TMA ran (every layer on an
// SM90 GPU with the wgmma kernel, none with the knob off or on other GPUs). The variant is pinned
// to the auto choice with the consumers' TMA (default_wgmma_variant: 8 at 128 heads, 6 at 64):
// without them auto takes 6, whose S1 sums its k-steps in another order than 8's (rope block
// first), so other bits.
TEST(FlashMlaKernels, KTmaMatchesCpAsyncBitwise) {
  const CaseSpec verify = verify_case("verify_h128", 128, DType::kBF16);
  const CaseSpec many =
      mla_case("many_h128", ForwardMode::kDecode, 64, short_lens(), 128, DType::kBF16);
  const CaseSpec long_req =
      mla_case("long_h128", ForwardMode::kDecode, 64, {3000, 1, 640, 64}, 128, DType::kBF16);
  // 40 requests of 16-20 tiles at 64 heads (one row tile each): ~7 tiles per plan part, so
  // segments of several pairs whose later pairs are refilled by the consumers one after another,
  // and odd segments whose last tile is whole (kv_len a multiple of 64 for even b).
  std::vector<int> mid_lens;
  for (int b = 0; b < 40; ++b) mid_lens.push_back(64 * (16 + b % 5) + (b % 2 == 0 ? -1 : 30));
  const CaseSpec segments =
      mla_case("long_segments_h64", ForwardMode::kDecode, 64, mid_lens, 64, DType::kBF16);
  const bool sm90 = runs_mla_wgmma();
  const int64_t layers = harness::PrepareOptions{}.num_layers;
  for (const CaseSpec* c : {&many, &long_req, &segments, static_cast<const CaseSpec*>(&verify)}) {
    const int s_q = c->spec_draft_tokens > 0 ? c->spec_draft_tokens : 1;
    const std::string variant =
        std::to_string(mla::default_wgmma_variant(c->num_q_heads * s_q, /*consumer_tma=*/true));
    const test_support::ScopedEnv pin("ATTNKIT_MLA_WGMMA_BLOCKS", variant.c_str());
    std::vector<std::vector<uint8_t>> tma_out;
    for (const char* knob : {"", "0", "1"}) {
      SCOPED_TRACE(std::string("ATTNKIT_MLA_K_TMA=") + knob + " variant " + variant);
      const test_support::ScopedEnv k_tma("ATTNKIT_MLA_K_TMA", knob);
      mla::MlaDecodeStats stats;
      std::vector<std::vector<uint8_t>> out;
      run_and_compare(*c, true, &stats, &out);
      const bool on = *knob == '\0';
      EXPECT_EQ(stats.k_tma_runs, *knob != '0' && sm90 ? layers : 0);
      if (on) {
        tma_out = std::move(out);
        continue;
      }
      ASSERT_EQ(out.size(), tma_out.size());
      for (size_t l = 0; l < out.size(); ++l) EXPECT_TRUE(out[l] == tma_out[l]) << "layer " << l;
    }
  }
}

// Q by TMA (MlaDecodeParams::q_tma_ok, the default where q is dense and a request's rows are whole
// 64-row tiles) loads the same bytes as the producer's cp.async (ATTNKIT_MLA_Q_TMA=0): 128 heads
// (many short requests: many segments per CTA; a long split request), 128 heads x s_q 2 verify,
// 64 heads x s_q 2 and the fp8 cache each match the reference and write the same bits both ways;
// MlaDecodeStats::q_tma_runs counts every layer on an SM90 GPU with the wgmma kernel and none with
// the knob off, for 16 heads (16-row tiles, the mma.sync kernel) or for 48 heads x s_q 2 (96 rows:
// the wgmma kernel with a padded second tile, Q by cp.async).
TEST(FlashMlaKernels, QTmaMatchesCpAsyncBitwise) {
  const std::vector<int> lens = short_lens();
  const std::vector<CaseSpec> specs = {
      mla_case("many_h128", ForwardMode::kDecode, 64, lens, 128, DType::kBF16),
      mla_case("long_h128", ForwardMode::kDecode, 64, {3000, 1, 640, 64}, 128, DType::kBF16),
      verify_case("verify_h128", 128, DType::kBF16),
      verify_case("verify_h64", 64, DType::kBF16),
      verify_case("verify_h48", 48, DType::kBF16),
      mla_case("many_h128_fp8", ForwardMode::kDecode, 64, lens, 128, DType::kFP8E4M3),
      mla_case("many_h16", ForwardMode::kDecode, 64, lens, 16, DType::kBF16)};
  const bool sm90 = runs_mla_wgmma();
  const int64_t layers = harness::PrepareOptions{}.num_layers;
  for (const CaseSpec& c : specs) {
    std::vector<std::vector<uint8_t>> tma_out;
    for (const char* knob : {"", "0"}) {
      SCOPED_TRACE(std::string("ATTNKIT_MLA_Q_TMA=") + knob);
      const test_support::ScopedEnv q_tma("ATTNKIT_MLA_Q_TMA", knob);
      mla::MlaDecodeStats stats;
      std::vector<std::vector<uint8_t>> out;
      run_and_compare(c, true, &stats, &out);
      const bool on = *knob == '\0';
      const bool whole_tiles = c.num_q_heads == 64 || c.num_q_heads == 128;
      EXPECT_EQ(stats.q_tma_runs, on && sm90 && whole_tiles ? layers : 0) << c.name;
      if (on) {
        tma_out = std::move(out);
        continue;
      }
      ASSERT_EQ(out.size(), tma_out.size());
      for (size_t l = 0; l < out.size(); ++l) {
        EXPECT_TRUE(out[l] == tma_out[l]) << c.name << " layer " << l;
      }
    }
  }
}

// fp8 cache with 64-row tiles (128 heads; 64 heads x s_q 2): by default on an SM90 GPU the wgmma
// kernel (raw e4m3 bytes by cp.async into the 16-bit stage, converted in place to f16 by the
// consumer whose S reads the block, Q converted to f16 x 2^-8 per segment, P f16;
// MlaDecodeStats::wgmma_fp8_runs counts every layer), with
// ATTNKIT_MLA_WGMMA_FP8=0 or ATTNKIT_MLA_WGMMA=0 the mma.sync kernel: many short requests per CTA
// (segment restarts with odd and even tile counts, phantom pairs), a long split
// request, verify chains (64 heads x 2 tokens, 128 heads x 2 tokens), each against the reference.
TEST(FlashMlaKernels, Fp8Heads128BothKernels) {
  const std::vector<int> lens = short_lens();
  const bool wgmma = runs_mla_wgmma();
  const int64_t layers = harness::PrepareOptions{}.num_layers;
  for (const char* knob : {"", "WGMMA_FP8=0", "WGMMA=0"}) {
    const std::string k = knob;
    SCOPED_TRACE("ATTNKIT_MLA_" + (k.empty() ? std::string("(defaults)") : k));
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA_FP8", k == "WGMMA_FP8=0" ? "0" : "", 1), 0);
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA", k == "WGMMA=0" ? "0" : "", 1), 0);
    const bool on = wgmma && k.empty();
    CaseSpec v = mla_case("verify_h64_fp8", ForwardMode::kTargetVerify, 64, {700, 64, 65}, 64,
                          DType::kFP8E4M3);
    v.new_lens.clear();
    v.spec_draft_tokens = 2;
    v.spec_topk = 1;
    // 128 heads x s_q 2 (four 64-row tiles per request), the benchmarked verify shape.
    CaseSpec v128 = v;
    v128.name = "verify_h128_fp8";
    v128.num_q_heads = 128;
    v128.prefix_lens = {300, 129, 64};
    for (const CaseSpec& c :
         {mla_case("many_h128_fp8", ForwardMode::kDecode, 64, lens, 128, DType::kFP8E4M3),
          mla_case("long_h128_fp8", ForwardMode::kDecode, 64, {3000, 1, 640, 64}, 128,
                   DType::kFP8E4M3),
          v, v128}) {
      SCOPED_TRACE(c.name);
      mla::MlaDecodeStats stats;
      run_and_compare(c, true, &stats);
      EXPECT_EQ(stats.wgmma_fp8_runs, on ? layers : 0);
    }
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA_FP8"), 0);
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA"), 0);
}

// 16-row tiles (<= 16 heads, s_q 1) on the mma.sync kernel under the knobs of session 8: the
// page-table prefetch (ATTNKIT_MLA_MMA_PREFETCH unset = per tile size and page, "1" always, "0"
// never, "smem" through a shared-memory ring) and for the fp8 cache the f16 tensor-core inputs
// (ATTNKIT_MLA_FP8_F16 unset = f16, "0" = bf16); split requests, an empty one, one of exactly one
// tile, 8 heads (padding rows).
TEST(FlashMlaKernels, Heads16PrefetchAndFp8InputTypes) {
  struct Knobs {
    const char *prefetch, *f16;
  };
  // "smem": the shared-memory page-table ring (the default at page 64 since session 8).
  const std::vector<Knobs> knobs = {Knobs{"", ""},     Knobs{"1", ""},  Knobs{"0", ""},
                                    Knobs{"0", "0"},   Knobs{"1", "0"}, Knobs{"smem", ""},
                                    Knobs{"smem", "0"}};
  for (const Knobs k : knobs) {
    SCOPED_TRACE(std::string("ATTNKIT_MLA_MMA_PREFETCH=") + k.prefetch +
                 " ATTNKIT_MLA_FP8_F16=" + k.f16);
    ASSERT_EQ(setenv("ATTNKIT_MLA_MMA_PREFETCH", k.prefetch, 1), 0);
    ASSERT_EQ(setenv("ATTNKIT_MLA_FP8_F16", k.f16, 1), 0);
    for (DType kv : {DType::kFP8E4M3, DType::kBF16}) {
      run_and_compare(
          mla_case("long_h16", ForwardMode::kDecode, 64, {4000, 3, 64, 130, 0, 1500}, 16, kv),
          true);
      run_and_compare(mla_case("h8", ForwardMode::kDecode, 64, {700, 65, 2}, 8, kv), true);
    }
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_MMA_PREFETCH"), 0);
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_FP8_F16"), 0);
}

// Session 9: the combine launch skipped when the host schedule splits nothing (the default;
// ATTNKIT_MLA_COMBINE_SKIP=0 launches it always): 16 and 8 heads, split / empty / one-tile
// requests, many requests that split on no part, bf16 and fp8.
// The counters: every layer launches the combine exactly when the schedule splits a request (or
// with the skip off); many_h16 splits nothing (1-tile requests: total 140 * (1 + 5) tiles over 132
// parts gives each part 7 + 5 = 12, room for whole requests only), long_h16 splits its 4000-key
// request.
TEST(FlashMlaKernels, Heads16CombineSkip) {
  const auto long_h16 = [](DType kv) {
    return mla_case("long_h16", ForwardMode::kDecode, 64, {4000, 3, 64, 130, 0, 1500}, 16, kv);
  };
  const auto many_h16 = [](DType kv) {
    // more requests than parts (132 SMs): one or two whole requests per part, no split
    return mla_case("many_h16", ForwardMode::kDecode, 64, std::vector<int>(140, 63), 16, kv);
  };
  EXPECT_TRUE(decode_schedule_splits(long_h16(DType::kBF16)));
  EXPECT_FALSE(decode_schedule_splits(many_h16(DType::kBF16)));
  for (const char* skip : {"", "0"}) {
    SCOPED_TRACE(std::string("ATTNKIT_MLA_COMBINE_SKIP=") + skip);
    ASSERT_EQ(setenv("ATTNKIT_MLA_COMBINE_SKIP", skip, 1), 0);
    const bool skip_on = std::strcmp(skip, "0") != 0;
    for (DType kv : {DType::kFP8E4M3, DType::kBF16}) {
      for (const CaseSpec& c :
           {long_h16(kv), mla_case("h8", ForwardMode::kDecode, 64, {700, 65, 2}, 8, kv),
            many_h16(kv),
            mla_case("many_long_h16", ForwardMode::kDecode, 64, std::vector<int>(160, 299), 16,
                     kv)}) {
        SCOPED_TRACE(c.name);
        mla::MlaDecodeStats stats;
        run_and_compare(c, true, &stats);
        const int64_t layers = harness::PrepareOptions{}.num_layers;
        EXPECT_EQ(stats.runs, layers);
        const bool combine = !skip_on || decode_schedule_splits(c);
        EXPECT_EQ(stats.combine_launches, combine ? layers : 0);
      }
    }
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_COMBINE_SKIP"), 0);
}

TEST(FlashMlaKernels, RejectsOtherPageSizes) {
  Result<PreparedCase> pc = harness::prepare_case(
      mla_case("page16", ForwardMode::kDecode, 16, {10}, 16, DType::kBF16), Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  Result<std::unique_ptr<AttentionBackend>> backend = create_flashmla_backend(pc->context());
  ASSERT_FALSE(backend.is_ok());
  EXPECT_NE(backend.status().message().find("page_size 16"), std::string::npos)
      << backend.status().to_string();
}

// A softmax scale that fp32 cannot carry through the kernels (layer.scaling passes the generic
// positive-finite check, but times log2(e) and the f16 paths' 2^8 it overflows) is an error
// naming layer.scaling, returned before the forward writes the new token's row to the pool.
TEST(FlashMlaKernels, RejectsSoftmaxScaleOutsideFp32) {
  Result<PreparedCase> pc = harness::prepare_case(
      mla_case("scale_overflow", ForwardMode::kDecode, 64, {100, 7}, 128, DType::kBF16),
      Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  for (harness::LayerData& ld : pc->layers) ld.layer.scaling = 3e38f;
  Result<std::unique_ptr<AttentionBackend>> backend = create_flashmla_backend(pc->context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const Status run = harness::run_backend(**backend, *pc, /*save_kv=*/true);
  ASSERT_FALSE(run.is_ok());
  EXPECT_NE(run.message().find("layer.scaling"), std::string::npos) << run.to_string();
  // Layer 0's pool rows, the new tokens' slots included, are the bytes prepare_case left there.
  const TensorView kv = static_cast<const MLAKVPool&>(*pc->kv_pool).kv_buffer(0);
  std::vector<uint8_t> after(static_cast<size_t>(kv.storage_bytes()));
  ASSERT_EQ(cudaMemcpy(after.data(), kv.data, after.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const std::vector<uint8_t>& snap = pc->pool_snapshot.at(0);
  ASSERT_GE(snap.size(), after.size());
  EXPECT_TRUE(std::equal(after.begin(), after.end(), snap.begin()));
}

// The output and lse through strided views over NaN-filled buffers: head stride 520, token stride
// q_heads x 520 (16-byte aligned rows, as the engine requires) equals the contiguous run bit for
// bit and leaves the gap columns 512.. of every row and the lse gaps NaN, for many short whole
// requests (written by the decode kernels), a long split request (written by the combine), 128
// heads x s_q 2 and 16 heads; head stride 516 (8-byte aligned rows) is rejected as unsupported,
// naming out, before anything is written.
TEST(FlashMlaKernels, StridedOutputMatchesContiguousBitwise) {
  std::vector<int> lens;
  for (int b = 0; b < 150; ++b) lens.push_back((b * 53) % 300 + 1);
  const std::vector<CaseSpec> specs = {
      mla_case("many_h128", ForwardMode::kDecode, 64, lens, 128, DType::kBF16),
      mla_case("split_h128", ForwardMode::kDecode, 64, {6000, 5, 900}, 128, DType::kBF16),
      verify_case("verify_h128", 128, DType::kBF16),
      mla_case("many_h16", ForwardMode::kDecode, 64, lens, 16, DType::kBF16)};
  for (const CaseSpec& spec : specs) {
    SCOPED_TRACE(spec.describe());
    Result<PreparedCase> pcr = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(pcr.is_ok()) << pcr.status().to_string();
    PreparedCase& pc = *pcr;
    Result<std::unique_ptr<AttentionBackend>> br = create_flashmla_backend(pc.context());
    ASSERT_TRUE(br.is_ok()) << br.status().to_string();
    AttentionBackend& backend = **br;
    const Status first = harness::run_backend(backend, pc, /*save_kv=*/true);
    ASSERT_TRUE(first.is_ok()) << first.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Result<harness::Comparison> cmp = harness::compare_with_reference(pc);
    ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
    EXPECT_TRUE(cmp->passed()) << cmp->summary();
    const int64_t t = pc.num_tokens, hq = spec.num_q_heads, dv = 512;
    for (const harness::LayerData& ld : pc.layers) {
      std::vector<uint8_t> want_out(static_cast<size_t>(ld.out.storage_bytes()));
      std::vector<float> want_lse(static_cast<size_t>(t * hq));
      ASSERT_EQ(cudaMemcpy(want_out.data(), ld.out.data, want_out.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(want_lse.data(), ld.lse.data, want_lse.size() * 4, cudaMemcpyDeviceToHost),
          cudaSuccess);
      for (const int64_t hs : {int64_t{520}, int64_t{516}}) {
        SCOPED_TRACE("head stride " + std::to_string(hs));
        const size_t out_bytes = static_cast<size_t>(t * hq * hs * 2);
        const size_t lse_bytes = static_cast<size_t>(t * (hq + 3) * 4);
        void* buf = nullptr;
        void* lbuf = nullptr;
        ASSERT_EQ(cudaMalloc(&buf, out_bytes), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&lbuf, lse_bytes), cudaSuccess);
        ASSERT_EQ(cudaMemset(buf, 0xff, out_bytes), cudaSuccess);
        ASSERT_EQ(cudaMemset(lbuf, 0xff, lse_bytes), cudaSuccess);
        TensorView out = ld.out;
        out.data = buf;
        out.strides = {hq * hs, hs, 1};
        TensorView lse = ld.lse;
        lse.data = lbuf;
        lse.strides = {hq + 3, 1};
        const Status planned = backend.init_forward_metadata(pc.batch);
        ASSERT_TRUE(planned.is_ok()) << planned.to_string();
        const Status s = backend.forward(ld.q, {}, {}, out, ld.layer, pc.batch, false, lse);
        if (hs % 8 != 0) {
          EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
          EXPECT_NE(s.to_string().find("out bf16["), std::string::npos) << s.to_string();
        } else {
          ASSERT_TRUE(s.is_ok()) << s.to_string();
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint16_t> got(out_bytes / 2);
        std::vector<float> got_lse(lse_bytes / 4);
        ASSERT_EQ(cudaMemcpy(got.data(), buf, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got_lse.data(), lbuf, lse_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(buf);
        cudaFree(lbuf);
        const auto* want = reinterpret_cast<const uint16_t*>(want_out.data());
        int64_t bad = 0, gap_written = 0, bad_lse = 0;
        for (int64_t r = 0; r < t * hq; ++r) {
          if (std::memcmp(&got[static_cast<size_t>(r * hs)], &want[r * dv], dv * 2) != 0) ++bad;
          for (int64_t c = dv; c < hs; ++c) {
            gap_written += got[static_cast<size_t>(r * hs + c)] != 0xffff;
          }
          const int64_t tok = r / hq, h = r % hq;
          bad_lse += std::memcmp(&got_lse[static_cast<size_t>(tok * (hq + 3) + h)],
                                 &want_lse[static_cast<size_t>(r)], 4) != 0;
        }
        for (int64_t tok = 0; tok < t; ++tok) {
          for (int64_t h = hq; h < hq + 3; ++h) {
            uint32_t bits = 0;
            std::memcpy(&bits, &got_lse[static_cast<size_t>(tok * (hq + 3) + h)], 4);
            gap_written += bits != 0xffffffffu;
          }
        }
        if (hs % 8 != 0) {
          EXPECT_EQ(bad, t * hq) << "a rejected forward wrote rows";
          EXPECT_EQ(bad_lse, t * hq) << "a rejected forward wrote lse";
        } else {
          EXPECT_EQ(bad, 0) << "rows differing from the contiguous run";
          EXPECT_EQ(bad_lse, 0) << "lse entries differing from the contiguous run";
        }
        EXPECT_EQ(gap_written, 0) << "writes outside the view";
      }
    }
  }
}

// CUDA graphs: a 2-layer decode step captured once, replayed after the lengths change in place;
// every replay equals an eager run of the same batch bit for bit.
TEST(FlashMlaKernels, GraphReplayMatchesEagerBitwise) {
  CaseSpec spec =
      mla_case("graph", ForwardMode::kDecode, 64, {2000, 5, 900, 300}, 128, DType::kBF16);
  harness::PrepareOptions opt;
  opt.request_lse = false;
  opt.snapshot_pool = false;
  Result<PreparedCase> pcr = harness::prepare_case(spec, Device::cuda(0), opt);
  ASSERT_TRUE(pcr.is_ok()) << pcr.status().to_string();
  PreparedCase& pc = *pcr;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  BackendContext ctx = pc.context();
  ctx.stream = stream;
  Result<std::unique_ptr<AttentionBackend>> br = create_flashmla_backend(ctx);
  ASSERT_TRUE(br.is_ok()) << br.status().to_string();
  AttentionBackend& backend = **br;
  const int bs = spec.batch_size();
  ForwardBatch batch = pc.batch;
  batch.stream = stream;
  // The runner wrote the new tokens' k into the pool: every forward reads the pool.
  const Status first = harness::run_backend(backend, pc, /*save_kv=*/false);
  ASSERT_TRUE(first.is_ok()) << first.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const auto snapshot = [&](std::vector<std::vector<uint8_t>>* outs) {
    outs->clear();
    for (const harness::LayerData& ld : pc.layers) {
      std::vector<uint8_t> host(static_cast<size_t>(ld.out.storage_bytes()));
      ASSERT_EQ(cudaMemcpy(host.data(), ld.out.data, host.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      outs->push_back(std::move(host));
    }
  };
  const auto eager = [&](std::vector<std::vector<uint8_t>>* outs) {
    const Status planned = backend.init_forward_metadata(batch);
    ASSERT_TRUE(planned.is_ok()) << planned.to_string();
    // Poisoned first: an eager run that wrote nothing must not equal the replay's output left
    // in the same buffers.
    for (const harness::LayerData& ld : pc.layers) {
      ASSERT_EQ(
          cudaMemsetAsync(ld.out.data, 0xff, static_cast<size_t>(ld.out.storage_bytes()), stream),
          cudaSuccess);
    }
    for (harness::LayerData& ld : pc.layers) {
      const Status s = backend.forward(ld.q, {}, {}, ld.out, ld.layer, batch, false, {});
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    snapshot(outs);
  };

  ASSERT_TRUE(backend.init_cuda_graph_state(bs, bs).is_ok());
  ASSERT_TRUE(backend
                  .init_forward_metadata_capture_cuda_graph(bs, bs, batch.req_pool_indices,
                                                            batch.seq_lens, {}, batch.mode, nullptr)
                  .is_ok());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (harness::LayerData& ld : pc.layers) {
    const Status s = backend.forward(ld.q, {}, {}, ld.out, ld.layer, batch, false, {});
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // New lengths (at most the prepared history) written in place.
  for (const std::vector<int32_t>& lens :
       {std::vector<int32_t>{1999, 6, 450, 301}, std::vector<int32_t>{64, 3, 1, 200}}) {
    ASSERT_EQ(cudaMemcpy(batch.seq_lens.data, lens.data(), lens.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    batch.seq_lens_host = lens;
    batch.seq_lens_sum = 0;
    for (int32_t n : lens) batch.seq_lens_sum += n;
    for (const harness::LayerData& ld : pc.layers) {
      ASSERT_EQ(
          cudaMemsetAsync(ld.out.data, 0xff, static_cast<size_t>(ld.out.storage_bytes()), stream),
          cudaSuccess);
    }
    ASSERT_TRUE(backend
                    .init_forward_metadata_replay_cuda_graph(bs, batch.req_pool_indices,
                                                             batch.seq_lens, 0, {}, batch.mode,
                                                             nullptr, lens.data())
                    .is_ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<std::vector<uint8_t>> replayed, eager_out;
    snapshot(&replayed);
    eager(&eager_out);
    if (HasFatalFailure()) break;
    ASSERT_EQ(replayed.size(), eager_out.size());
    for (size_t l = 0; l < replayed.size(); ++l) {
      EXPECT_EQ(std::memcmp(replayed[l].data(), eager_out[l].data(), replayed[l].size()), 0)
          << "layer " << l << " lengths " << lens[0] << "," << lens[1];
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace attnkit
