// The fixture of the GPU tests parameterised over (backend name, case): the case is prepared on
// cuda:0 and a backend made for it in SetUp, or the test is skipped without a CUDA device or where
// the backend's descriptor rules the case out (the reason printed). Used by
// tests/gpu/test_stale_plan.cpp, test_graph_replay_guards.cpp and test_table_slots.cpp:
//
//   struct StaleCase { std::string name; ... };                 // `name` names the parameter
//   harness::CaseSpec stale_spec(const StaleCase& sc);
//   class StalePlan : public test_support::OnBackend<StaleCase, stale_spec> {};
//   INSTANTIATE_TEST_SUITE_P(Backends, StalePlan, ::testing::Combine(backends, cases),
//                            test_support::backend_case_name<StaleCase>);
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "attnkit/device.h"
#include "harness/case_runner.h"
#include "support/gpu_test_helpers.h"
#include "support/plan_check.h"

namespace attnkit::test_support {

// The gtest name of a (backend, case) parameter: "<backend>_<case name>".
template <typename Case>
std::string backend_case_name(const ::testing::TestParamInfo<std::tuple<std::string, Case>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
}

// made_ holds the prepared case and its backend once SetUp has run (and not skipped); kSpecOf
// turns the case parameter into the CaseSpec that is prepared.
template <typename Case, harness::CaseSpec (*kSpecOf)(const Case&)>
class OnBackend : public ::testing::TestWithParam<std::tuple<std::string, Case>> {
 protected:
  void SetUp() override {
    if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
    const auto& [backend_name, c] = this->GetParam();
    std::string skip;
    Result<CaseOnBackend> made = case_on_backend(backend_name, kSpecOf(c), Device::cuda(0), &skip);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    made_ = std::move(made).value();
  }

  std::optional<CaseOnBackend> made_;
};

}  // namespace attnkit::test_support
