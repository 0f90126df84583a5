// Malformed batches through every CPU backend, by random mutation of valid ones: the contract of
// tests/support/batch_mutations.h (a batch validate() refuses is refused, a refused call leaves
// the KV pool alone, an accepted mutation matches the fp64 reference, a backend that refused still
// serves the valid batch). intel_amx runs it at its best instruction-set level and at each lower
// one this CPU provides. The seeds are fixed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "attnkit/device.h"
#include "attnkit/registry.h"
#include "backends/intel_amx/intel_amx_backend.h"
#include "support/batch_mutations.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

constexpr int kTrialsPerCase = 48;

TEST(BatchMutations, EveryCpuBackendRefusesWhatValidateRefusesAndKeepsThePool) {
  const int trials = test_support::mutation_trials(kTrialsPerCase);
  int backends = 0;
  for (const BackendDescriptor& desc : builtin_registry().all()) {
    if (!desc.built || !desc.runs_on(Platform::kCPU)) continue;
    ++backends;
    test_support::MutationOutcome outcome;
    if (test_support::fuzz_batch_mutation_cases(desc, Device::cpu(),
                                                test_support::mutation_seed(20261202), trials,
                                                desc.name, &outcome) < 0)
      return;
    // The mutations reach both sides of validate(): a run that only ever saw refusals would not
    // test the backend's own checks.
    // (At the default 48 trials: more than 50 and 5; scaled for ATTNKIT_TEST_MUTATION_TRIALS.)
    EXPECT_GT(outcome.refused_by_validate, 50 * trials / kTrialsPerCase) << desc.name;
    EXPECT_GT(outcome.accepted_and_ran, 5 * trials / kTrialsPerCase) << desc.name;
    std::printf(
        "%s: %d refused by validate, %d accepted and matched the reference, %d accepted "
        "but refused by the backend\n",
        desc.name.c_str(), outcome.refused_by_validate, outcome.accepted_and_ran,
        outcome.accepted_but_refused);
  }
  EXPECT_GE(backends, 2) << "torch_native and intel_amx run on the CPU";
}

// intel_amx's lower instruction-set levels (ATTNKIT_CPU_ISA, read when the backend is made) run
// kernels of their own: the same contract at each level this CPU provides below its best, which
// the test above runs.
TEST(BatchMutations, IntelAmxAtEveryLowerIsaLevel) {
  const DeviceInfo cpu = detect_cpu();
  const BackendDescriptor* desc = builtin_registry().find("intel_amx");
  ASSERT_NE(desc, nullptr);
  if (!desc->built) GTEST_SKIP() << "intel_amx is not built";
  const CpuIsa best = best_cpu_isa(cpu);
  const int trials = test_support::mutation_trials(kTrialsPerCase / 2);
  int levels = 0;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (isa >= best || !cpu_isa_supported(isa, cpu)) continue;
    ++levels;
    test_support::ScopedEnv env("ATTNKIT_CPU_ISA", cpu_isa_name(isa));
    test_support::MutationOutcome outcome;
    if (test_support::fuzz_batch_mutation_cases(
            *desc, Device::cpu(),
            test_support::mutation_seed(20261302) + 100 * static_cast<uint32_t>(isa), trials,
            std::string("intel_amx at ") + cpu_isa_name(isa), &outcome) < 0)
      return;
    // (At the default 24 trials: more than 25 and 2, scaled as above.)
    EXPECT_GT(outcome.refused_by_validate, 25 * trials / (kTrialsPerCase / 2)) << cpu_isa_name(isa);
    EXPECT_GT(outcome.accepted_and_ran, 2 * trials / (kTrialsPerCase / 2)) << cpu_isa_name(isa);
  }
  if (levels == 0) GTEST_SKIP() << "this CPU's best level is the lowest (scalar)";
}

}  // namespace
}  // namespace attnkit
