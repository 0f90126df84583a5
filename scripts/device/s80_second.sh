#!/usr/bin/env bash
# Session 80's second call (runs ON the device, carry .deps): the batch mutation test after its
# fix (s80_first found flashinfer / fa3 reading a page-16 table with one stray entry in a page as
# the page: the fuzzer now moves whole pages, and ATTNKIT_CHECK_INDICES=1 refuses such tables).
# Builds test_batch_mutations_cuda and test_kv_guard (the pool's slot guard, CHECK_INDICES on and
# off) and runs both.
#   run(carry=[".deps"], command="bash scripts/device/s80_second.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
attnkit_script_start
note_device
attnkit_build_targets "test_batch_mutations_cuda test_kv_guard"
attnkit_run_gtest kv_guard 120 test_kv_guard
attnkit_run_gtest batch_mutations_cuda 420 test_batch_mutations_cuda
grep -E "refused by validate|Failure|Google Test trace|trial [0-9]+|^\[  (FAILED|PASSED|SKIPPED)" \
  "$OUT/batch_mutations_cuda.log" | head -80
note "done at $(elapsed) s"
cat "$summary"
