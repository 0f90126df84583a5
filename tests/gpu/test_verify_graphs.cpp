// Target-verify CUDA graphs on every backend whose row claims both CUDA graphs and speculative
// decoding: the case's verify step is run eagerly (checked against the fp64 reference), captured,
// replayed twice after init_forward_metadata_replay_cuda_graph, and every layer's out and lse
// must equal the eager run bit for bit. Before this file only flashinfer's MHA verify graphs
// were checked that way (test_flashinfer_cascade.cpp); triton, fa3 and flashmla verify graphs,
// and every MLA verify graph, were captured only by the refusal tests of
// test_graph_replay_guards.cpp, which never look at the outputs. Cases the descriptor rules out
// (page size, topk > 1 with pages, MLA / MHA, the platform) are skipped with its reason.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "attnkit/registry.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

class VerifyGraphs : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(VerifyGraphs, ReplayIsBitIdenticalToEager) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto& [backend_name, case_name] = GetParam();
  const harness::CaseSpec* spec = harness::find_case(case_name);
  ASSERT_NE(spec, nullptr) << case_name;
  ASSERT_EQ(spec->mode, ForwardMode::kTargetVerify) << case_name;
  const BackendDescriptor* descriptor = builtin_registry().find(backend_name);
  ASSERT_NE(descriptor, nullptr) << backend_name;
  const std::string skip =
      harness::skip_reason(*descriptor, *spec, test_support::device_info_for(Device::cuda(0)));
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_TRUE(descriptor->cuda_graph) << backend_name << " claims no CUDA graphs";
  SCOPED_TRACE(spec->describe());
  Result<harness::PreparedCase> prepared = harness::prepare_case(*spec, Device::cuda(0));
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  test_support::expect_graph_replay_matches_eager(*prepared, descriptor->create,
                                                  ForwardMode::kTargetVerify);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, VerifyGraphs,
    ::testing::Combine(::testing::Values("triton", "flashinfer", "fa3", "flashmla"),
                       ::testing::Values("verify_topk1_page1", "verify_topk1_page16",
                                         "verify_topk4_page1", "verify_topk4_page16",
                                         "verify_topk1_page16_d80", "mla_verify_topk1_page1",
                                         "mla_verify_topk4_page1", "mla_verify_topk1_page64")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace attnkit
