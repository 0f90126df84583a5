// Malformed batches through every CUDA backend, by random mutation of valid ones: the contract of
// tests/support/batch_mutations.h on cuda:0 (a batch validate() refuses is refused before any
// kernel reads it, a refused call leaves the KV pool alone, an accepted mutation matches the fp64
// reference, a backend that refused still serves the valid batch). One test per backend the
// registry builds for CUDA (MHA and MLA cases; tests/support/batch_mutations.h lists them).
// The seeds are fixed (ATTNKIT_TEST_MUTATION_TRIALS / _SEED for a longer run elsewhere).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/registry.h"
#include "support/batch_mutations.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

constexpr int kTrialsPerCase = 24;

std::vector<std::string> cuda_backends() {
  std::vector<std::string> names;
  for (const BackendDescriptor& d : builtin_registry().all()) {
    if (d.built && d.runs_on(Platform::kCUDA)) names.push_back(d.name);
  }
  return names;
}

class BatchMutationsCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchMutationsCuda, RefusesWhatValidateRefusesAndKeepsThePool) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const BackendDescriptor* desc = builtin_registry().find(GetParam());
  ASSERT_NE(desc, nullptr);
  test_support::MutationOutcome outcome;
  const int cases = test_support::fuzz_batch_mutation_cases(
      *desc, Device::cuda(0), test_support::mutation_seed(20261402),
      test_support::mutation_trials(kTrialsPerCase), desc->name, &outcome);
  if (cases < 0) return;
  if (cases == 0) GTEST_SKIP() << desc->name << " takes none of the mutation cases";
  std::printf(
      "%s: %d cases, %d refused by validate, %d accepted and matched the reference, %d accepted "
      "but refused by the backend\n",
      desc->name.c_str(), cases, outcome.refused_by_validate, outcome.accepted_and_ran,
      outcome.accepted_but_refused);
  EXPECT_GT(outcome.refused_by_validate, 2 * cases) << desc->name;
  EXPECT_GT(outcome.accepted_and_ran, 0) << desc->name;
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchMutationsCuda, ::testing::ValuesIn(cuda_backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace attnkit
