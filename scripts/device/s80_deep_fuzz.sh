#!/usr/bin/env bash
# The CUDA batch mutation test as ctest runs it, then longer runs (runs ON the device, carry .deps):
# the test with
# TRIALS trials per case (default 240, ten times the test's 24) under each seed of SEEDS (default
# two seeds other than the test's own), so that mutations the fixed run never draws are tried.
#   run(carry=[".deps"], command="bash scripts/device/s80_deep_fuzz.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
attnkit_script_start
note_device
attnkit_build_targets "test_batch_mutations_cuda"
attnkit_run_gtest batch_mutations_default 200 test_batch_mutations_cuda
grep -E "refused by validate|Failure|trial [0-9]+|^\[  (FAILED|PASSED)" \
  "$OUT/batch_mutations_default.log" | head -60
for seed in ${SEEDS:-31337 90210}; do
  ATTNKIT_TEST_MUTATION_TRIALS=${TRIALS:-240} ATTNKIT_TEST_MUTATION_SEED=$seed \
    attnkit_run_gtest "batch_mutations_seed$seed" 280 test_batch_mutations_cuda
  grep -E "refused by validate|Failure|trial [0-9]+|^\[  (FAILED|PASSED)" \
    "$OUT/batch_mutations_seed$seed.log" | head -60
done
note "done at $(elapsed) s"
cat "$summary"
