#!/usr/bin/env bash
# One device run for the MLA backends (issue 7): build only their targets, run their GPU tests
# (every case of flashmla and cutlass_mla, the MLA cases of flashinfer and fa3, the chunked prefix
# cache tests, the graph test) and the MLA decode benchmark with the copy ceiling measured in the
# same process. Run from the repository root with .deps carried:
#   bash scripts/device/mla_run.sh
# Knobs: MLA_PATCH=<file> applies a patch first (e.g. scripts/device/patches/
# mla_decode_q_in_regs.patch, the unverified decode-kernel variant); MLA_BENCH_BACKENDS
# (flashmla), MLA_CASES (scripts/device/mla_decode_quick.json), MLA_SKIP_BENCH=1,
# MLA_TEST_TIMEOUT (120 s per test binary), MLA_BENCH_TIMEOUT (150 s), MLA_BUILD_DIR (build/mla),
# MLA_TARGETS (the build targets), MLA_CTEST_REGEX (run `ctest -L gpu -R <regex>` instead of the
# test binaries; MLA_CTEST_JOBS, default 4), MLA_BENCH_ENV (e.g. ATTNKIT_MLA_WGMMA=0: a second
# bench pass with that environment, written to mla_bench_env.json).
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
B=${MLA_BUILD_DIR:-build/mla}
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
if [ -n "${MLA_PATCH:-}" ]; then
  { git apply "$MLA_PATCH" 2>/dev/null || patch -p1 < "$MLA_PATCH"; } && echo "applied $MLA_PATCH" ||
    { echo "patch $MLA_PATCH failed"; exit 1; }
fi
t0=$(date +%s)
. "$(dirname "$0")/lib.sh"
attnkit_configure "$B" 90a-real > "$OUT/build.log" 2>&1
# shellcheck disable=SC2086
ninja -C $B -j16 ${MLA_TARGETS:-attnkit_cli test_flashmla_cases test_cutlass_mla_cases \
  test_flashinfer_cases test_fa3_cases test_mla_prefix_cache} >> "$OUT/build.log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s"
grep -m8 -E "error" "$OUT/build.log"
if [ -n "${MLA_CTEST_REGEX:-}" ]; then
  t1=$(date +%s)
  (cd $B && timeout "${MLA_TEST_TIMEOUT:-120}" ctest -L gpu -R "$MLA_CTEST_REGEX" \
    -j "${MLA_CTEST_JOBS:-4}" --timeout "${MLA_CTEST_CASE_TIMEOUT:-60}" --output-on-failure \
    > "$OUT/ctest.log" 2>&1)
  echo "ctest rc=$? $(( $(date +%s) - t1 )) s: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest.log" | head -20
  grep -E "rel_l2|Failure|error:" "$OUT/ctest.log" | head -8
fi
for t in ${MLA_TESTS-mla_prefix_cache flashmla_cases cutlass_mla_cases flashinfer_cases fa3_cases}; do
  filter='*'
  case $t in flashinfer_cases | fa3_cases) filter='*mla*:*Mla*' ;; esac
  t1=$(date +%s)
  timeout "${MLA_TEST_TIMEOUT:-120}" "$B/tests/test_$t" --gtest_filter="$filter" > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - t1 )) s $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|tests ran|SKIPPED \] [0-9]' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] .*\." "$OUT/$t.log" | head -12
  grep -E "rel_l2|Failure|error" "$OUT/$t.log" | head -6
done
[ "${MLA_SKIP_BENCH:-0}" = 1 ] && exit 0
# A kernel that hung in the tests would hang the bench too: bench the mma.sync path instead.
if grep -q "Timeout" "$OUT/ctest.log" 2>/dev/null; then
  echo "ctest saw timeouts: bench with ATTNKIT_MLA_WGMMA=0"
  export ATTNKIT_MLA_WGMMA=0
fi
timeout "${MLA_BENCH_TIMEOUT:-150}" "$B/tools/attnkit/attnkit" bench \
  --backend "${MLA_BENCH_BACKENDS:-flashmla}" \
  --cases "${MLA_CASES:-scripts/device/mla_decode_quick.json}" --device cuda --warmup 3 \
  --iters 10 --json "$OUT/mla_bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
tail -32 "$OUT/bench.log"
if [ -n "${MLA_BENCH_ENV:-}" ]; then
  env $MLA_BENCH_ENV timeout "${MLA_BENCH_TIMEOUT:-150}" "$B/tools/attnkit/attnkit" bench \
    --backend "${MLA_BENCH_BACKENDS:-flashmla}" \
    --cases "${MLA_ENV_CASES:-${MLA_CASES:-scripts/device/mla_decode_quick.json}}" --device cuda \
    --warmup 3 --iters 10 --json "$OUT/mla_bench_env.json" > "$OUT/bench_env.log" 2>&1
  echo "bench ($MLA_BENCH_ENV) rc=$?"
  tail -12 "$OUT/bench_env.log"
fi
