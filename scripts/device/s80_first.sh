#!/usr/bin/env bash
# Next device session's first call (runs ON the device, carry .deps): session 79's GPU changes, not
# yet run on a GPU. Builds the library, tests/gpu/test_batch_mutations_cuda.cpp and
# test_torch_native_cuda in build/device (check.sh's build stage), then runs the new test (random
# malformed batches through every CUDA backend, tests/support/batch_mutations.h, one gtest per
# backend) and torch_native's CUDA tests (its cache write now follows the staged host validation).
#   run(carry=[".deps"], command="bash scripts/device/s80_first.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
attnkit_script_start
note_device
attnkit_build_targets "test_batch_mutations_cuda test_torch_native_cuda"
attnkit_run_gtest torch_native_cuda 240 test_torch_native_cuda
attnkit_run_gtest batch_mutations_cuda 420 test_batch_mutations_cuda
grep -E "refused by validate|Failure|Google Test trace|trial [0-9]+|^\[  (FAILED|PASSED|SKIPPED)" \
  "$OUT/batch_mutations_cuda.log" | head -80
note "done at $(elapsed) s"
cat "$summary"
