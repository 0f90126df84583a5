// A NaN K element on every CUDA backend (torch_native, triton, flashinfer, fa3, flashmla,
// cutlass_mla): exactly the rows that see the key are NaN, as in the fp64 reference
// (support/nan_key_check.h). MHA decode (bf16 and fp8_e4m3 KV, page 1 and 16, a window that
// excludes the key, a long request the plan splits, soft-cap) and extend (the SM90 wgmma prefill
// at d 128, a window, soft-cap, over fp8_e4m3 too, a new token's key); absorbed MLA decode and
// extend with the NaN in a rope dim (K only) or a latent dim (K and V); a NaN in an MHA key's V
// (decode: exactly its column of the rows that see the key; extend: those, and possibly that column
// of rows sharing a key block). Cases a backend's descriptor rules out are skipped with the reason.
// cutlass_mla's row keeps SGLang's SM100 rule for selection, but its page-128 kernel runs on SM90
// too: as in test_cutlass_mla_cases, a copy of its row with the floor lowered to SM90 runs the MLA
// cases, at its page size 128 where the case's page is 64.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "attnkit/registry.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"
#include "support/nan_key_check.h"
#include "support/on_backend.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

constexpr int kCutlassMlaKernelMinCc = 90;  // the page-128 MLA kernel's own floor

struct NanCase {
  std::string name;
  ForwardMode mode;
  std::vector<int> prefix, fresh;
  DType kv;
  int page;
  int window;
  float cap;
  bool any_nan;       // some query sees the key
  int mla_dim;        // >= 0: absorbed MLA (16 heads, latent 512 + rope 64), NaN at this latent dim
  bool in_v = false;  // MHA: the NaN in the key's V (its column of the rows that see the key)
};

std::vector<NanCase> nan_cases() {
  const DType bf16 = DType::kBF16, fp8 = DType::kFP8E4M3;
  const ForwardMode dec = ForwardMode::kDecode, ext = ForwardMode::kExtend;
  constexpr int kRope = 512 + 3;  // a rope dim of the latent row: K only
  constexpr int kLora = 7;        // in K and V
  return {
      {"decode_bf16", dec, {300, 41}, {1, 1}, bf16, 16, -1, 0.f, true, -1},
      {"decode_bf16_page1", dec, {300, 41}, {1, 1}, bf16, 1, -1, 0.f, true, -1},
      {"decode_fp8", dec, {300, 41}, {1, 1}, fp8, 16, -1, 0.f, true, -1},
      {"decode_window_excludes", dec, {300, 41}, {1, 1}, bf16, 16, 5, 0.f, false, -1},
      {"decode_long_split", dec, {8000, 41}, {1, 1}, bf16, 16, -1, 0.f, true, -1},
      {"decode_long_split_fp8", dec, {8000, 41}, {1, 1}, fp8, 16, -1, 0.f, true, -1},
      {"decode_softcap", dec, {300, 41}, {1, 1}, bf16, 16, -1, 1.5f, true, -1},
      {"extend_bf16", ext, {295, 64}, {200, 20}, bf16, 16, -1, 0.f, true, -1},
      {"extend_fp8", ext, {295, 64}, {200, 20}, fp8, 16, -1, 0.f, true, -1},
      {"extend_window", ext, {295, 64}, {37, 20}, bf16, 16, 20, 0.f, true, -1},
      {"extend_new_key", ext, {0, 64}, {330, 20}, bf16, 16, -1, 0.f, true, -1},
      {"extend_softcap", ext, {295, 64}, {37, 20}, bf16, 16, -1, 1.5f, true, -1},
      // fa3: the FP8 kernel's kSoftcap, unpromoted here (tanh of a NaN score stays NaN, and so does
      // its P, speculated or exact; the block maximum's fmaxf passes over it).
      {"extend_fp8_softcap", ext, {295, 64}, {200, 20}, fp8, 16, -1, 1.5f, true, -1},
      {"mla_decode_rope", dec, {300, 41}, {1, 1}, bf16, 64, -1, 0.f, true, kRope},
      {"mla_decode_latent", dec, {300, 41}, {1, 1}, bf16, 64, -1, 0.f, true, kLora},
      {"mla_decode_page1", dec, {300, 41}, {1, 1}, bf16, 1, -1, 0.f, true, kRope},
      {"mla_decode_fp8", dec, {300, 41}, {1, 1}, fp8, 64, -1, 0.f, true, kRope},
      {"mla_decode_long_split", dec, {6000, 41}, {1, 1}, bf16, 64, -1, 0.f, true, kRope},
      {"mla_decode_long_split_fp8", dec, {6000, 41}, {1, 1}, fp8, 64, -1, 0.f, true, kRope},
      {"mla_extend", ext, {295, 64}, {37, 20}, bf16, 64, -1, 0.f, true, kRope},
      {"mla_extend_new_key", ext, {0, 64}, {330, 20}, bf16, 64, -1, 0.f, true, kLora},
      {"value_decode_bf16", dec, {300, 41}, {1, 1}, bf16, 16, -1, 0.f, true, -1, true},
      {"value_decode_fp8", dec, {300, 41}, {1, 1}, fp8, 16, -1, 0.f, true, -1, true},
      {"value_decode_long_split_fp8", dec, {8000, 41}, {1, 1}, fp8, 16, -1, 0.f, true, -1, true},
      {"value_extend_bf16", ext, {295, 64}, {200, 20}, bf16, 16, -1, 0.f, true, -1, true},
      {"value_extend_fp8", ext, {295, 64}, {200, 20}, fp8, 16, -1, 0.f, true, -1, true},
      {"value_extend_new_key", ext, {0, 64}, {330, 20}, bf16, 16, -1, 0.f, true, -1, true},
  };
}

class NanKeyCases : public ::testing::TestWithParam<std::tuple<std::string, NanCase>> {};

TEST_P(NanKeyCases, RowsThatSeeTheKeyAreNan) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto& [backend, nc] = GetParam();
  CaseSpec spec;
  spec.name = "nan_key_" + nc.name;
  spec.mode = nc.mode;
  spec.page_size = nc.page;
  spec.prefix_lens = nc.prefix;
  spec.new_lens = nc.fresh;
  spec.num_q_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.v_head_dim = 128;
  test_support::NanKeySpot spot{/*request=*/0, /*position=*/290, /*kv_head=*/5, /*dim=*/7, nc.in_v};
  if (nc.mla_dim >= 0) {
    test_support::use_absorbed_mla(&spec);
    spot.kv_head = 0;
    spot.dim = nc.mla_dim;
  }
  spec.kv_dtype = nc.kv;
  spec.sliding_window = nc.window;
  spec.logit_cap = nc.cap;
  spec.seed = 11;
  const Device device = Device::cuda(0);
  const BackendDescriptor* found = builtin_registry().find(backend);
  ASSERT_NE(found, nullptr);
  BackendDescriptor descriptor = *found;
  if (backend == "cutlass_mla") {
    ASSERT_EQ(descriptor.min_compute_capability, 100) << "selection must keep SGLang's SM100 rule";
    descriptor.min_compute_capability = kCutlassMlaKernelMinCc;
    descriptor.max_compute_capability = 0;
    if (spec.page_size == 64) spec.page_size = 128;
  }
  const std::string reason =
      harness::skip_reason(descriptor, spec, test_support::device_info_for(device));
  if (!reason.empty()) GTEST_SKIP() << reason;
  test_support::expect_nan_key_propagates(spec, device, spot, nc.any_nan,
                                          [&](const harness::PreparedCase& pc) {
                                            return harness::create_backend_for_case(descriptor, pc);
                                          });
}

INSTANTIATE_TEST_SUITE_P(Backends, NanKeyCases,
                         ::testing::Combine(::testing::Values("torch_native", "triton",
                                                              "flashinfer", "fa3", "flashmla",
                                                              "cutlass_mla"),
                                            ::testing::ValuesIn(nan_cases())),
                         test_support::backend_case_name<NanCase>);

}  // namespace
}  // namespace attnkit
