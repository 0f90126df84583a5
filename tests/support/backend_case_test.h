// GoogleTest glue for the shared case table: every backend's test file instantiates the same
// parameterised suite over harness::shared_case_table().
//
//   #include "support/backend_case_test.h"
//   ATTNKIT_BACKEND_CASE_TESTS(IntelAmxCases, "intel_amx", attnkit::Device::cpu());
//
// gives IntelAmxCases/Cases.SaveKv/<case name> and .ReadsPool/<case name> (k/v written by the
// runner, the backend gets empty k/v). Cases the descriptor rules out are skipped with
// GTEST_SKIP() << skip_reason(...), so the reason is visible in the test output.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "attnkit/device.h"
#include "attnkit/tensor.h"
#include "harness/case_runner.h"

namespace attnkit::test_support {

// The gtest parameter name of a case (its CaseSpec::name).
std::string case_param_name(const ::testing::TestParamInfo<harness::CaseSpec>& info);

// What skip_reason is evaluated against: detect_cuda(ordinal) for CUDA devices, else the host CPU.
DeviceInfo device_info_for(Device device);

// Looks `backend` up in builtin_registry(), skips when skip_reason says so, prepares the case on
// `device`, runs it (save_kv as given), compares with the fp64 reference and asserts that the
// comparison passed. Call from a TEST body (uses GTEST_SKIP / ASSERT).
void run_shared_case(std::string_view backend, Device device, const harness::CaseSpec& spec,
                     bool save_kv);

}  // namespace attnkit::test_support

// Instantiates the shared case table for one backend on one device.
#define ATTNKIT_BACKEND_CASE_TESTS(suite, backend_name, device_expr)                        \
  class suite : public ::testing::TestWithParam<::attnkit::harness::CaseSpec> {};           \
  TEST_P(suite, SaveKv) {                                                                   \
    ::attnkit::test_support::run_shared_case(backend_name, device_expr, GetParam(), true);  \
  }                                                                                         \
  TEST_P(suite, ReadsPool) {                                                                \
    ::attnkit::test_support::run_shared_case(backend_name, device_expr, GetParam(), false); \
  }                                                                                         \
  INSTANTIATE_TEST_SUITE_P(Cases, suite,                                                    \
                           ::testing::ValuesIn(::attnkit::harness::shared_case_table()),    \
                           ::attnkit::test_support::case_param_name)
