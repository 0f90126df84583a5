#!/usr/bin/env bash
# Next device session's first call (runs ON the device, carry .deps): session 79's GPU test, not
# yet run on a GPU. Builds the library and tests/gpu/test_batch_mutations_cuda.cpp in build/device
# (check.sh's build stage; a C7511 is noted in the summary), then runs it: random malformed batches
# through every CUDA backend (tests/support/batch_mutations.h), one gtest per backend.
#   run(carry=[".deps"], command="bash scripts/device/s80_first.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
attnkit_script_start
note_device
attnkit_build_targets "test_batch_mutations_cuda"
attnkit_run_gtest batch_mutations_cuda 420 test_batch_mutations_cuda
grep -E "refused by validate|Failure|Google Test trace|trial [0-9]+|^\[  (FAILED|PASSED|SKIPPED)" \
  "$OUT/batch_mutations_cuda.log" | head -80
note "done at $(elapsed) s"
cat "$summary"
