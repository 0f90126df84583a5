// The shared case table run by cutlass_mla (page 128) against the fp64 reference. The registry
// row keeps SGLang's SM100 requirement for selection; the shared MLA kernel family behind it (the
// page-128 loader) also runs on SM90, so this test lowers only the compute-capability floor of a
// copy of the row and skips exactly what the rest of the row excludes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "attnkit/registry.h"
#include "backends/mla/mla_paged_backend.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"

namespace attnkit {
namespace {

constexpr int kKernelMinCc = 90;

class CutlassMlaCases : public ::testing::TestWithParam<harness::CaseSpec> {};

void run(const harness::CaseSpec& spec, bool save_kv) {
  BackendDescriptor d = *builtin_registry().find("cutlass_mla");
  EXPECT_EQ(d.min_compute_capability, 100) << "selection must keep SGLang's SM100 rule";
  d.min_compute_capability = kKernelMinCc;
  d.max_compute_capability = 0;
  const std::string reason =
      harness::skip_reason(d, spec, test_support::device_info_for(Device::cuda(0)));
  if (!reason.empty()) GTEST_SKIP() << reason;
  Result<harness::PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  Result<std::unique_ptr<AttentionBackend>> b = create_cutlass_mla_backend(pc->context());
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const Status s = harness::run_backend(**b, *pc, save_kv);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  Result<harness::Comparison> cmp = harness::compare_with_reference(*pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_EQ(cmp->nan_inf_count, 0) << cmp->summary();
  EXPECT_TRUE(cmp->passed()) << spec.describe() << "\n" << cmp->summary();
}

TEST_P(CutlassMlaCases, SaveKv) { run(GetParam(), true); }
TEST_P(CutlassMlaCases, ReadsPool) { run(GetParam(), false); }

// 128 heads with a bf16 cache (then fp8): 64-row tiles, the page-128 instantiation of the SM90
// wgmma kernel (the default since it passed on an H200, session 5; "all" is still accepted) and the
// mma.sync one (ATTNKIT_MLA_WGMMA=0); decode with split requests and verify s_q 2.
TEST(CutlassMlaKernels, Heads128Bf16BothKernels) {
  harness::CaseSpec c;
  c.name = "h128_page128";
  c.mode = ForwardMode::kDecode;
  c.page_size = 128;
  c.prefix_lens = {2900, 1, 300, 128};
  c.new_lens.assign(c.prefix_lens.size(), 1);
  c.mla = true;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.num_q_heads = 128;
  c.num_kv_heads = 1;
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.kv_dtype = DType::kBF16;
  c.seed = 5;
  harness::CaseSpec v = c;
  v.name = "h128_page128_verify2";
  v.mode = ForwardMode::kTargetVerify;
  v.prefix_lens = {700, 64, 129};
  v.new_lens.clear();
  v.spec_draft_tokens = 2;
  v.spec_topk = 1;
  // "blocksN": "1" + ATTNKIT_MLA_WGMMA_BLOCKS=N (the wgmma kernel's variants; 3 the seesaw; 6 the
  // seesaw without the phantom tile; 7 6 + the early S0, 8 7 + P1 in its own buffer; unset = auto:
  // 8 for 128 heads, else 6).
  for (const char* wgmma : {"1", "all", "0", "blocks0", "blocks1", "blocks2", "blocks3", "blocks6",
                            "blocks7", "blocks8"}) {
    SCOPED_TRACE(std::string("ATTNKIT_MLA_WGMMA=") + wgmma);
    const std::string w = wgmma;
    const bool blocks = w.rfind("blocks", 0) == 0;
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA", blocks ? "1" : wgmma, 1), 0);
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA_BLOCKS", blocks ? w.c_str() + 6 : "", 1), 0);
    run(c, true);
    run(v, true);
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA"), 0);
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA_BLOCKS"), 0);
  // fp8 cache: the page-128 instantiation of the wgmma kernel's fp8 path (default) and
  // the mma.sync kernel (ATTNKIT_MLA_WGMMA_FP8=0).
  c.kv_dtype = v.kv_dtype = DType::kFP8E4M3;
  for (const char* fp8 : {"", "0"}) {
    SCOPED_TRACE(std::string("ATTNKIT_MLA_WGMMA_FP8=") + fp8);
    ASSERT_EQ(setenv("ATTNKIT_MLA_WGMMA_FP8", fp8, 1), 0);
    run(c, true);
    run(v, true);
  }
  ASSERT_EQ(unsetenv("ATTNKIT_MLA_WGMMA_FP8"), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, CutlassMlaCases, ::testing::ValuesIn(harness::shared_case_table()),
                         test_support::case_param_name);

}  // namespace
}  // namespace attnkit
