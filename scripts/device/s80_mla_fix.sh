#!/usr/bin/env bash
# Session 80's MLA fix on the device (runs ON the device, carry .deps): flashinfer's quantised-MLA
# extend ran encoder-only layers causal (flashmla / cutlass_mla send their extends there). Builds
# test_flashmla_cases and test_batch_mutations_cuda; runs the new regression test, then the
# mutation test with its own seed and with seed 31337 at 120 trials per case (the run that found it).
#   run(carry=[".deps"], command="bash scripts/device/s80_mla_fix.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
attnkit_script_start
note_device
attnkit_build_targets "test_batch_mutations_cuda test_flashmla_cases"
attnkit_run_gtest flashmla_bidirectional 60 test_flashmla_cases '*Bidirectional*'
attnkit_run_gtest batch_mutations_default 120 test_batch_mutations_cuda
grep -E "refused by validate|Failure|trial [0-9]+|^\[  (FAILED|PASSED)" \
  "$OUT/batch_mutations_default.log" | head -40
ATTNKIT_TEST_MUTATION_TRIALS=120 ATTNKIT_TEST_MUTATION_SEED=31337 \
  attnkit_run_gtest batch_mutations_seed31337 150 test_batch_mutations_cuda
grep -E "refused by validate|Failure|trial [0-9]+|^\[  (FAILED|PASSED)" \
  "$OUT/batch_mutations_seed31337.log" | head -40
note "done at $(elapsed) s"
cat "$summary"
