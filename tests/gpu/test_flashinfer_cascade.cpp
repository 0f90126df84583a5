// The flashinfer backend's shared-prefix cascade and its target-verify CUDA graphs (gpu label):
//  * batches whose page tables share a prefix run the cascade (pass over the shared prefix for all
//    queries at once, per-request suffix pass, LSE merge), match the fp64 reference and the plain
//    (non-cascade) path of the same backend;
//  * target-verify capture + replay gives outputs bit-identical to eager verify.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/kv_cache.h"
#include "backends/flashinfer/cascade.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Rewrites requests 1.. so that their first `shared` keys are request 0's (the pages a radix cache
// hands to requests with a common prompt). shared must not exceed any request's cached prefix.
void share_prefix(PreparedCase& pc, int shared) {
  const int32_t* row0 = pc.req_to_token->host_row(pc.rows[0]);
  const std::vector<int64_t> slots(row0, row0 + shared);
  for (size_t r = 1; r < pc.rows.size(); ++r) {
    ASSERT_TRUE(pc.req_to_token->write(pc.rows[r], 0, slots).is_ok());
  }
}

std::vector<float> host_floats(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::vector<uint8_t> raw(static_cast<size_t>(t.storage_bytes()));
  EXPECT_TRUE(copy_bytes(raw.data(), Device::cpu(), t.data, t.device, t.storage_bytes()).is_ok());
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(load_as_float(raw.data(), t.dtype, static_cast<int64_t>(i)));
  }
  return v;
}

struct RunResult {
  std::vector<std::vector<float>> out, lse;
  FlashInferStats stats;
};

// Runs the case (already prepared, prefix shared) with the cascade on or off and checks it
// against the fp64 reference.
// cascade: set_flashinfer_cascade with every forward mode, fp8 KV, batches >= 2 and prefixes >=
// min_shared_prefix (the mechanism under test); defaults: the backend as created (the default
// policy of FlashInferCascadeOptions).
RunResult run_case(PreparedCase& pc, bool cascade, int min_shared_prefix = 256,
                   bool defaults = false, const FlashInferCascadeOptions* policy = nullptr) {
  RunResult r;
  for (harness::LayerData& ld : pc.layers) {
    EXPECT_TRUE(fill_float(ld.out, kNaN).is_ok());
    EXPECT_TRUE(fill_float(ld.lse, kNaN).is_ok());
  }
  Result<std::unique_ptr<AttentionBackend>> made = create_flashinfer_backend(pc.context());
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  if (!made.is_ok()) return r;
  if (policy != nullptr) {
    EXPECT_TRUE(set_flashinfer_cascade(**made, *policy).is_ok());
  } else if (!defaults) {
    FlashInferCascadeOptions opt;
    opt.enabled = cascade;
    opt.min_batch = 2;
    opt.min_shared_prefix = min_shared_prefix;
    opt.fp8_kv = true;
    opt.all_modes = true;
    EXPECT_TRUE(set_flashinfer_cascade(**made, opt).is_ok());
  }
  const Status run = harness::run_backend(**made, pc, /*save_kv=*/false);
  EXPECT_TRUE(run.is_ok()) << run.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Result<harness::Comparison> cmp = harness::compare_with_reference(pc);
  EXPECT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  if (cmp.is_ok())
    EXPECT_TRUE(cmp->passed()) << (cascade ? "cascade: " : "plain: ") << cmp->summary();
  r.stats = *flashinfer_stats(**made);
  for (const harness::LayerData& ld : pc.layers) {
    r.out.push_back(host_floats(ld.out));
    r.lse.push_back(host_floats(ld.lse));
  }
  return r;
}

// The cascade runs (shared prefix detected), matches the reference, and agrees with the plain path
// to within one bf16/f16 rounding of the output (the two differ only in summation order).
void cascade_matches_plain(const CaseSpec& spec, int shared, bool expect_cascade = true) {
  SCOPED_TRACE(spec.describe() + " shared " + std::to_string(shared));
  Result<PreparedCase> prepared = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  PreparedCase& pc = *prepared;
  share_prefix(pc, shared);
  const RunResult plain = run_case(pc, false);
  const RunResult cas = run_case(pc, true);
  EXPECT_EQ(plain.stats.cascade_calls, 0);
  if (!expect_cascade) {
    EXPECT_EQ(cas.stats.cascade_calls, 0);
    return;
  }
  // On SM90 the wgmma prefill kernel takes the eligible extend layers before the cascade
  // (flashinfer_backend.h; unless ATTNKIT_FLASHINFER_SM90_PREFILL=0); the cascade serves the rest.
  const int64_t layers = static_cast<int64_t>(pc.layers.size());
  const char* sm90_env = std::getenv("ATTNKIT_FLASHINFER_SM90_PREFILL");
  const bool sm90_prefill = sm90_env == nullptr || std::string(sm90_env) != "0";
  EXPECT_EQ(cas.stats.wgmma_calls,
            sm90_prefill && test_support::expects_sm90_wgmma_prefill(spec) ? layers : 0);
  EXPECT_EQ(cas.stats.cascade_calls, layers - cas.stats.wgmma_calls);
  if (cas.stats.cascade_calls == 0) return;
  EXPECT_GE(cas.stats.cascade_shared_prefix, shared - spec.page_size + 1);
  EXPECT_LE(cas.stats.cascade_shared_prefix, shared + spec.page_size - 1);
  const double ulp = spec.q_dtype == DType::kF16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  for (size_t l = 0; l < plain.out.size(); ++l) {
    double worst = 0, worst_lse = 0;
    // Relative to the element, floored at the layer's RMS output (elements near 0 come from
    // cancelling partials of about that size); a floor of 1 was ~25x the outputs here.
    double sum2 = 0;
    for (double a : plain.out[l]) sum2 += a * a;
    const double rms =
        std::sqrt(sum2 / static_cast<double>(std::max<size_t>(1, plain.out[l].size())));
    for (size_t i = 0; i < plain.out[l].size(); ++i) {
      const double a = plain.out[l][i], b = cas.out[l][i];
      ASSERT_TRUE(std::isfinite(b)) << "layer " << l << " element " << i;
      worst = std::max(worst, std::abs(a - b) / std::max(rms, std::abs(a)));
    }
    for (size_t i = 0; i < plain.lse[l].size(); ++i) {
      worst_lse =
          std::max(worst_lse, static_cast<double>(std::abs(plain.lse[l][i] - cas.lse[l][i])));
    }
    EXPECT_LE(worst, 2 * ulp) << "layer " << l << ": cascade vs plain output";
    EXPECT_LE(worst_lse, 1e-3) << "layer " << l << ": cascade vs plain lse";
  }
}

CaseSpec base(std::string name, ForwardMode mode, int page, std::vector<int> prefix,
              std::vector<int> fresh) {
  CaseSpec c;
  c.name = std::move(name);
  c.mode = mode;
  c.page_size = page;
  c.prefix_lens = std::move(prefix);
  c.new_lens = std::move(fresh);
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.seed = 1234;
  return c;
}

TEST(FlashInferCascadeTest, DecodeSharedPrefix) {
  cascade_matches_plain(
      base("casc_decode_p16", ForwardMode::kDecode, 16,
           {1500, 1800, 1300, 2047, 1100, 1600, 1240, 1999}, std::vector<int>(8, 1)),
      1024);
  // Long shared prefix, short private suffixes (parallel sampling of one prompt).
  cascade_matches_plain(
      base("casc_decode_p1_long", ForwardMode::kDecode, 1, {4100, 4097, 4130, 4096}, {1, 1, 1, 1}),
      4096);
}

TEST(FlashInferCascadeTest, DecodeFp8SinksSoftcapGqa8) {
  CaseSpec c = base("casc_decode_fp8", ForwardMode::kDecode, 64, {900, 1400, 777}, {1, 1, 1});
  c.kv_dtype = DType::kFP8E4M3;
  c.sinks = true;
  cascade_matches_plain(c, 768);
  c.name = "casc_decode_softcap_g8_d256";
  c.kv_dtype = DType::kBF16;
  c.sinks = false;
  c.logit_cap = 5.f;
  c.num_q_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 256;
  cascade_matches_plain(c, 704);
}

TEST(FlashInferCascadeTest, ExtendAndF16) {
  cascade_matches_plain(base("casc_extend", ForwardMode::kExtend, 16, {700, 512, 900}, {37, 64, 5}),
                        512);
  CaseSpec c = base("casc_extend_f16_d64", ForwardMode::kExtend, 1, {300, 333}, {70, 1});
  c.q_dtype = c.kv_dtype = DType::kF16;
  c.head_dim = c.v_head_dim = 64;
  cascade_matches_plain(c, 300);
  // The same with the SM90 prefill off (it takes soft-capped layers too since session 55): the
  // extend cascade runs on every device, soft-capped.
  test_support::ScopedEnv no_sm90("ATTNKIT_FLASHINFER_SM90_PREFILL", "0");
  CaseSpec cap =
      base("casc_extend_softcap", ForwardMode::kExtend, 16, {700, 512, 900}, {37, 64, 5});
  cap.logit_cap = 30.f;
  cascade_matches_plain(cap, 512);
  cap.name = "casc_extend_softcap_f16_d64";
  cap.page_size = 1;
  cap.prefix_lens = {300, 333};
  cap.new_lens = {70, 1};
  cap.q_dtype = cap.kv_dtype = DType::kF16;
  cap.head_dim = cap.v_head_dim = 64;
  cascade_matches_plain(cap, 300);
}

TEST(FlashInferCascadeTest, TargetVerifyTreeMask) {
  const CaseSpec* v = harness::find_case("verify_topk4_page16");
  ASSERT_NE(v, nullptr);
  CaseSpec c = *v;
  c.name = "casc_verify_topk4";
  c.prefix_lens = {600, 700, 650};
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  cascade_matches_plain(c, 592);
}

TEST(FlashInferCascadeTest, WindowShortPrefixAndSingleRequestStayPlain) {
  CaseSpec c = base("casc_window", ForwardMode::kDecode, 16, {1500, 1700}, {1, 1});
  c.sliding_window = 300;
  cascade_matches_plain(c, 1024, /*expect_cascade=*/false);
  cascade_matches_plain(base("casc_short", ForwardMode::kDecode, 16, {1500, 1700}, {1, 1}), 128,
                        /*expect_cascade=*/false);
  cascade_matches_plain(base("casc_single", ForwardMode::kDecode, 16, {1500}, {1}), 1024,
                        /*expect_cascade=*/false);
}

// The policy: off as created (no set_flashinfer_cascade call); enabled with the default thresholds,
// decode batches of >= 16 requests sharing >= 4096 keys of a bf16 pool cascade; fp8 pools, extend
// forwards and smaller batches stay plain.
TEST(FlashInferCascadeTest, DefaultPolicy) {
  // Off as created (graph replay must equal eager); switched on, the thresholds decide.
  const FlashInferCascadeOptions defaults;
  EXPECT_FALSE(defaults.enabled);
  FlashInferCascadeOptions on;
  on.enabled = true;
  auto run_policy = [](const CaseSpec& spec, int shared, const FlashInferCascadeOptions* policy,
                       bool expect) {
    SCOPED_TRACE(spec.describe() + (policy ? " policy enabled" : " as created") + ", shared " +
                 std::to_string(shared));
    Result<PreparedCase> prepared = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
    share_prefix(*prepared, shared);
    const RunResult r = run_case(*prepared, true, 0, /*defaults=*/policy == nullptr, policy);
    const int64_t layers = static_cast<int64_t>(prepared->layers.size());
    EXPECT_EQ(r.stats.cascade_calls, expect ? layers : 0);
  };
  CaseSpec c = base("casc_default_b16", ForwardMode::kDecode, 16, std::vector<int>(16, 4351),
                    std::vector<int>(16, 1));
  c.prefix_lens[3] = 4200;
  run_policy(c, 4096, nullptr, false);  // as created: off
  run_policy(c, 4096, &on, true);
  c.name = "casc_default_b16_short";
  run_policy(c, 2048, &on, false);  // shared prefix below 4096 keys
  c.name = "casc_default_fp8";
  c.kv_dtype = DType::kFP8E4M3;
  run_policy(c, 4096, &on, false);  // fp8 KV
  CaseSpec small = base("casc_default_b8", ForwardMode::kDecode, 16, std::vector<int>(8, 4351),
                        std::vector<int>(8, 1));
  run_policy(small, 4096, &on, false);  // fewer than 16 requests
  CaseSpec ext = base("casc_default_extend", ForwardMode::kExtend, 16, std::vector<int>(16, 4100),
                      std::vector<int>(16, 3));
  ext.logit_cap = 30.f;
  {
    // The SM90 prefill off, so that only the policy decides on every device.
    test_support::ScopedEnv no_sm90("ATTNKIT_FLASHINFER_SM90_PREFILL", "0");
    run_policy(ext, 4096, &on, false);  // extend forward
  }
}

// ---- target-verify CUDA graphs: replay equals eager bit for bit ----

void verify_graph_matches_eager(const CaseSpec& spec) {
  SCOPED_TRACE(spec.describe());
  Result<PreparedCase> prepared = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  PreparedCase& pc = *prepared;
  test_support::expect_graph_replay_matches_eager(
      pc, create_flashinfer_backend, ForwardMode::kTargetVerify, 2, [&](AttentionBackend& b) {
        // A batch size that was not captured is refused.
        EXPECT_FALSE(b.init_forward_metadata_replay_cuda_graph(
                          pc.batch.batch_size + 1, pc.batch.req_pool_indices, pc.batch.seq_lens,
                          pc.batch.seq_lens_sum, TensorView(), ForwardMode::kTargetVerify,
                          &pc.batch.spec, pc.batch.seq_lens_host.data())
                         .is_ok());
      });
}

TEST(FlashInferVerifyGraphTest, ReplayIsBitIdenticalToEager) {
  for (const char* name :
       {"verify_topk1_page1", "verify_topk1_page16", "verify_topk4_page1", "verify_topk4_page16"}) {
    const CaseSpec* c = harness::find_case(name);
    ASSERT_NE(c, nullptr) << name;
    verify_graph_matches_eager(*c);
  }
  CaseSpec wide = *harness::find_case("verify_topk4_page16");
  wide.name = "verify_graph_gqa4_long";
  wide.prefix_lens = {3000, 17, 1200, 640};
  wide.num_q_heads = 32;
  wide.num_kv_heads = 8;
  verify_graph_matches_eager(wide);
  // Split plans (the long prefixes) beside a whole request, with sinks over fp8: the captured
  // merge joins the split requests and leaves the whole one.
  wide.name = "verify_graph_split_fp8_sinks";
  wide.prefix_lens = {6000, 10, 2500};
  wide.kv_dtype = DType::kFP8E4M3;
  wide.sinks = true;
  verify_graph_matches_eager(wide);
}

// A verify graph captured with more drafts than init_cuda_graph_state sized (no
// speculative_num_draft_tokens: N = max_num_tokens / max_bs = 4) is refused at the capture, naming
// the workspace init sized, not at a replay whose plan splits. Eight drafts of group 4 are 32 rows:
// on 32-row decode tiles of an SM90 device the plan's target is two CTAs per SM, so the grid (33
// items per kv head against the 16 sized for four drafts) is refused first; at one CTA per SM
// (ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM=1), on 16-row tiles and on prefill tiles the grids agree
// and the split partials (splits x N rows) are what does not fit.
TEST(FlashInferVerifyGraphTest, CaptureRefusesDraftsPastThePartialWorkspace) {
  const CaseSpec* c = harness::find_case("verify_topk4_page16");
  ASSERT_NE(c, nullptr);
  CaseSpec spec = *c;
  spec.num_q_heads = 32;
  spec.num_kv_heads = 8;
  Result<PreparedCase> prepared = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  PreparedCase& pc = *prepared;
  BackendContext ctx = pc.context();
  ctx.speculative_num_draft_tokens = 0;
  // The capture of N drafts on a backend made now (the knobs are read at creation).
  auto check = [&](const char* what, const char* expected) {
    SCOPED_TRACE(what);
    Result<std::unique_ptr<AttentionBackend>> made = create_flashinfer_backend(ctx);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    AttentionBackend& b = **made;
    ASSERT_TRUE(b.init_cuda_graph_state(16, 64).is_ok());
    const int bs = pc.batch.batch_size;
    SpecInfo drafts = pc.batch.spec;
    drafts.draft_token_num = 8;
    const Status s = b.init_forward_metadata_capture_cuda_graph(
        bs, bs * 8, pc.batch.req_pool_indices, pc.batch.seq_lens, TensorView(),
        ForwardMode::kTargetVerify, &drafts);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(expected), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("init_cuda_graph_state sized"), std::string::npos) << s.to_string();
    // Four drafts, as sized: accepted.
    drafts.draft_token_num = 4;
    EXPECT_TRUE(b.init_forward_metadata_capture_cuda_graph(bs, bs * 4, pc.batch.req_pool_indices,
                                                           pc.batch.seq_lens, TensorView(),
                                                           ForwardMode::kTargetVerify, &drafts)
                    .is_ok());
  };
  // The tile shape this process's environment picks for 32 rows (ctest runs this binary with
  // ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS / _TILE_ROWS set), as the backend decides it.
  const bool decode_tiles = test_support::flashinfer_verify_decode_rows() >= 32;
  const bool rows32 = decode_tiles && test_support::flashinfer_verify_tile_rows() == 32;
  const Result<DeviceInfo> dev = detect_cuda(0);  // as the backend sees it (emulation too)
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  {
    // The rule itself, whatever CTAs-per-SM setting the environment carries (0 = the rule).
    test_support::ScopedEnv rule("ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM", "0");
    const bool two_ctas =
        test_support::flashinfer_verify_ctas_per_sm(rows32, dev->compute_capability) == 2;
    check("the default rule", two_ctas ? "work items" : "split partial entries");
  }
  test_support::ScopedEnv one_cta("ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM", "1");
  check("one CTA per SM", "split partial entries");
}

// ---- the shared-prefix detector (host) ----

TEST(FlashInferCascadePlanTest, SharedPrefixFromPageStarts) {
  const std::vector<int32_t> a = {16, 17, 18, 19, 32, 33, 34, 35, 48, 49};
  std::vector<int32_t> b = a;
  b[8] = 64;  // third page differs
  const std::vector<const int32_t*> rows = {a.data(), b.data()};
  EXPECT_EQ(flashinfer::shared_prefix_len(rows, 10, 4), 8);
  EXPECT_EQ(flashinfer::shared_prefix_len(rows, 6, 4), 6);  // capped by the shortest prefix
  b[1] = 99;  // not a page start: ignored by the kernels, so still shared at page 4
  EXPECT_EQ(flashinfer::shared_prefix_len(rows, 10, 4), 8);
  EXPECT_EQ(flashinfer::shared_prefix_len(rows, 10, 1), 1);
  const std::vector<const int32_t*> one = {a.data()};
  EXPECT_EQ(flashinfer::shared_prefix_len(one, 10, 4), 0);
}

}  // namespace
}  // namespace attnkit
