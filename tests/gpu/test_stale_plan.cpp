// A forward whose batch has the planned mode and batch size but fewer tokens than the batch that
// init_forward_metadata planned (a target_verify batch with fewer drafts per request and no extend
// lengths, an extend batch with a shorter request) is refused by name on every CUDA backend that
// plans (triton, flashinfer, fa3, flashmla), and writes nothing: the stale plan's query offsets
// index bs x N rows, past the smaller q / out.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "attnkit/registry.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

struct StaleCase {
  std::string name;
  bool verify;
  bool mla;
};

CaseSpec stale_spec(const StaleCase& sc) {
  CaseSpec c;
  c.name = "stale_" + sc.name;
  c.mode = sc.verify ? ForwardMode::kTargetVerify : ForwardMode::kExtend;
  c.page_size = sc.mla ? 64 : 16;
  c.prefix_lens = {300, 41};
  c.new_lens = sc.verify ? std::vector<int>{} : std::vector<int>{9, 3};
  if (sc.verify) {
    c.spec_draft_tokens = 4;
    c.spec_topk = 1;
  }
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = c.v_head_dim = 128;
  if (sc.mla) {
    c.mla = true;
    c.kv_lora_rank = 512;
    c.qk_rope_head_dim = 64;
    c.num_q_heads = 16;
    c.num_kv_heads = 1;
    c.head_dim = 512 + 64;
    c.v_head_dim = 512;
  }
  c.seed = 5;
  return c;
}

class StalePlan : public ::testing::TestWithParam<std::tuple<std::string, StaleCase>> {};

TEST_P(StalePlan, FewerTokensThanPlannedAreRefused) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto& [backend_name, sc] = GetParam();
  const CaseSpec spec = stale_spec(sc);
  const Device device = Device::cuda(0);
  const BackendDescriptor* descriptor = builtin_registry().find(backend_name);
  ASSERT_NE(descriptor, nullptr);
  const std::string reason =
      harness::skip_reason(*descriptor, spec, test_support::device_info_for(device));
  if (!reason.empty()) GTEST_SKIP() << reason;
  Result<harness::PreparedCase> prepared = harness::prepare_case(spec, device);
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  harness::PreparedCase& pc = *prepared;
  Result<std::unique_ptr<AttentionBackend>> backend =
      harness::create_backend_for_case(*descriptor, pc);
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();

  ForwardBatch planned = pc.batch;
  ForwardBatch fewer;
  int64_t tokens = 0;
  if (sc.verify) {
    // A verify batch may leave the extend lengths and a chain's mask out: rows and seq_lens alone
    // do not tell N = 4 from N = 2.
    planned.extend_seq_lens_host.clear();
    planned.extend_prefix_lens_host.clear();
    planned.extend_start_loc_host.clear();
    planned.extend_seq_lens = planned.extend_prefix_lens = planned.extend_start_loc = TensorView();
    planned.spec.custom_mask = planned.spec.mask_indptr = TensorView();
    planned.spec.mask_indptr_host.clear();
    fewer = planned;
    fewer.spec.draft_token_num = 2;
    tokens = 2 * planned.batch_size;
  } else {
    // Request 0's 9 new tokens become 6 (same prefixes): 9 tokens where 12 were planned.
    fewer = planned;
    fewer.extend_seq_lens_host[0] -= 3;
    fewer.seq_lens_host[0] -= 3;
    fewer.seq_lens_sum -= 3;
    fewer.extend_start_loc_host[1] -= 3;
    tokens = planned.num_tokens - 3;
  }
  fewer.num_tokens = static_cast<int>(tokens);
  fewer.out_cache_loc.shape[0] = fewer.positions.shape[0] = tokens;
  ASSERT_TRUE((*backend)->init_forward_metadata(planned).is_ok());
  const harness::LayerData& ld = pc.layers[0];
  TensorView q = ld.q, out = ld.out, lse = ld.lse;
  q.shape[0] = out.shape[0] = tokens;
  if (lse.defined()) lse.shape[0] = tokens;
  const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
  const Status st = (*backend)->forward(q, TensorView(), TensorView(), out, ld.layer, fewer,
                                        /*save_kv=*/false, lse);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("num_tokens " + std::to_string(tokens)), std::string::npos)
      << st.to_string();
  EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
}

INSTANTIATE_TEST_SUITE_P(
    Backends, StalePlan,
    ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3", "flashmla"),
                       ::testing::Values(StaleCase{"verify", true, false},
                                         StaleCase{"extend", false, false},
                                         StaleCase{"mla_verify", true, true})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

}  // namespace
}  // namespace attnkit
