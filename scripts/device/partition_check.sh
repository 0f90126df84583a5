#!/usr/bin/env bash
# Partitioned mixed forwards (backend/small_extend.h extend_partition) on the device: builds the
# CLI and the fa3 / flashinfer case binaries, runs the partition tests, times
# bench/cases/mixed_extend.json with the partition on (its two kernels overlapped by default), on
# with the kernels one after the other (ATTNKIT_PARTITION_OVERLAP=0), and off
# (ATTNKIT_EXTEND_PARTITION=0) for fa3 and flashinfer, then the shared tables and the small-extend
# tests that route by the same rules.
# Every stage writes under $OUT as it goes (a command cut by its time limit still returns them).
#   STAGES="build test bench table" VARIANTS CASES FA3_FILTER (space-separated gtest filters)
#   TEST_LIMIT / BENCH_LIMIT (seconds per test run / bench variant; 120 / 100)
# Without the build stage the binaries may come prebuilt (a local 90a-real build's test binaries
# and CLI, carried): PREBUILT=DIR copies DIR/test_* and DIR/attnkit into build/device first; a test
# binary that is not there is skipped.
#   run(carry=[".deps"], command="bash scripts/device/partition_check.sh")
#   run(carry=[".dbg/s76"], command="PREBUILT=.dbg/s76 STAGES='test bench' ... bash scripts/...")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start
note_device
STAGES="${STAGES:-build test bench table}"
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_flashinfer_cases"
fi
if [ -n "${PREBUILT:-}" ] && ! has_stage build; then
  mkdir -p build/device/tests build/device/tools/attnkit
  cp "$PREBUILT"/test_* build/device/tests/ 2>/dev/null
  cp "$PREBUILT"/attnkit build/device/tools/attnkit/ 2>/dev/null
  note "prebuilt: $(ls "$PREBUILT" | tr '\n' ' ')"
fi
if has_stage test; then
  # FA3_FILTER: space-separated gtest filters, each its own run (fa3_partition, _2, ...).
  n=0
  set -f  # the filters' * are gtest's
  for f in ${FA3_FILTER:-Fa3PartitionTest.*}; do
    n=$((n + 1))
    [ -x build/device/tests/test_fa3_cases ] &&
      attnkit_run_gtest "fa3_partition$([ $n -gt 1 ] && echo _$n)" "${TEST_LIMIT:-120}" \
        test_fa3_cases "$f"
  done
  set +f
  [ -x build/device/tests/test_flashinfer_cases ] &&
    attnkit_run_gtest fi_partition 90 test_flashinfer_cases 'FlashInferPartitionTest.*'
fi
if has_stage bench; then
  # VARIANTS: space-separated BACKEND[:ENV=V,ENV=V], each timed over CASES in turn.
  ak=build/device/tools/attnkit/attnkit
  i=0
  for v in ${VARIANTS:-fa3 fa3:ATTNKIT_PARTITION_OVERLAP=0 fa3:ATTNKIT_EXTEND_PARTITION=0 \
    flashinfer flashinfer:ATTNKIT_PARTITION_OVERLAP=0 flashinfer:ATTNKIT_EXTEND_PARTITION=0}; do
    b=${v%%:*}
    e=""
    [[ "$v" == *:* ]] && e=${v#*:}
    i=$((i + 1))
    echo "== $v" >> "$OUT/bench.txt"
    env ${e//,/ } timeout "${BENCH_LIMIT:-100}" "$ak" bench --backend "$b" --device cuda \
      --cases "${CASES:-bench/cases/mixed_extend.json}" --json "$OUT/bench_v$i.json" \
      2>>"$OUT/bench.err" | grep -E "^$b |ceiling" >> "$OUT/bench.txt"
  done
  note "bench done at $(elapsed) s"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
fi
if has_stage table; then
  attnkit_run_gtest fa3_table 150 test_fa3_cases 'SharedTable/*:Fa3SmallExtendTest.*'
  attnkit_run_gtest fi_table 120 test_flashinfer_cases \
    'SharedTable/*:FlashInferExtendDecodeTilesTest.*'
fi
note "done at $(elapsed) s"
