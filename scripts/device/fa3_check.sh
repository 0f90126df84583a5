#!/usr/bin/env bash
# One device call for the fa3 backend (issue 6): build the fa3 test + CLI, run the fa3 GPU tests,
# time fa3 (ping-pong on and off) and flashinfer with `attnkit bench` on
# bench/cases/fa3_prefill.json, then the trimmed torch peers (scripts/device/fa3_peers.py).
# Runs ON the device machine from the repository root with .deps and .peers beside it:
#   cd .wt/fa3 && ln -sfn ../../.deps .deps && bash scripts/device/fa3_check.sh
# Knobs: STAGES="build test ctest bench ncu peers", HEAD_DIMS="64;128;256", TEST_TIMEOUT=90,
#   BUILD_TARGETS (default "test_fa3_cases attnkit_cli"), CTEST_REGEX (ctest stage, label gpu,
#   default 'Fa3|FlashInfer'; build the flashinfer test binaries for it; CTEST_TIMEOUT per test,
#   default 300 s as check.sh: TritonInputs.TokensPastTheGridZLimitRun's host reference took 197 s
#   under -j12 and timed out at 200 s under -j8 in session 52), CTEST_ENV (env
#   settings of the ctest stage only, comma-joined "A=1,B=0"; e.g. ATTNKIT_FA3_FP8_PROMOTE=1),
#   TEST_ENV="ATTNKIT_FA3_FENCE_TMA=1" (environment of the full test run), TEST_SUBSETS (extra
#   test runs "ENV=VALUE:gtest_filter ..."), BENCH_VARIANTS (fa3 env settings timed one after
#   another, "default" = none; "ENV=VALUE@filter" times only the cases whose name contains
#   filter; "A=1,B=0" sets several), BENCH_CASES (default bench/cases/fa3_prefill.json; several
#   files: one bench per file and variant), DIAG_VARIANTS (ATTNKIT_FA3_DIAG bit sets timed at S 8k d 128; "" = none), BENCH_OTHERS (other
#   backends at S 8k; "" = none), BENCH_TIMEOUT=60, NCU_FILTER (case of the ncu stage: one launch
#   of fa3 under Nsight Compute, --clock-control none), NCU_ARGS (extra ncu arguments, e.g.
#   "--section SourceCounters --print-details all"), NCU_TIMEOUT=60.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage
STAGES="${STAGES:-build test bench peers}"
build="$root/build/device"
note "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1) date: $(date -u +%Y-%m-%dT%H:%MZ)"

if has_stage build; then
  t0=$(date +%s)
  attnkit_configure "$build" 90a-real "${HEAD_DIMS:-64;128;256}" > "$OUT/build.log" 2>&1 || {
    tail -30 "$OUT/build.log"; exit 1; }
  # shellcheck disable=SC2086
  ninja -C "$build" -j16 ${BUILD_TARGETS:-test_fa3_cases attnkit_cli} >> "$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi

tests="$build/tests/test_fa3_cases"
[ -x "$tests" ] || tests=$(find "$build" -name test_fa3_cases -type f | head -1)
if has_stage test; then
  t0=$(date +%s)
  # shellcheck disable=SC2086
  env ${TEST_ENV:-} timeout "${TEST_TIMEOUT:-90}" "$tests" --gtest_brief=1 > "$OUT/test.log" 2>&1
  rc=$?
  note "test (${TEST_ENV:-default}): rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/test.log" | head -20 | tee -a "$summary"
  [ $rc -ne 0 ] && grep -E "rel_l2|Failure|Expected|differs|ran on" "$OUT/test.log" | head -20 | tee -a "$summary"
  set -f  # gtest filters hold '*'
  for subset in ${TEST_SUBSETS-ATTNKIT_FA3_OVERLAP=0:*Long*:*d128*:*d256*:*page16* ATTNKIT_FA3_TMA=0:*Long*:*page64*:*page128*:*page16*}; do
    env_kv=${subset%%:*}
    filt=${subset#*:}
    t0=$(date +%s)
    env "$env_kv" timeout 60 "$tests" --gtest_brief=1 --gtest_filter="$filt" > "$OUT/test_subset.log" 2>&1
    note "test ($env_kv, $filt): rc=$? in $(( $(date +%s) - t0 )) s; $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_subset.log" | tr '\n' ' ')"
    grep -E "rel_l2|Failure|Expected|Which is" "$OUT/test_subset.log" | head -8 | tee -a "$summary"
  done
  set +f
fi

# ctest over the built test binaries (CTEST_REGEX, e.g. 'Fa3|FlashInfer'; label gpu).
if has_stage ctest; then
  t0=$(date +%s)
  ctest_envs=()
  [ -n "${CTEST_ENV:-}" ] && IFS=, read -r -a ctest_envs <<< "$CTEST_ENV"
  env "${ctest_envs[@]}" ctest --test-dir "$build" -L gpu -R "${CTEST_REGEX:-Fa3|FlashInfer}" \
    --timeout "${CTEST_TIMEOUT:-300}" -j"${CTEST_JOBS:-4}" --output-on-failure > "$OUT/ctest.log" 2>&1
  rc=$?
  note "ctest (${CTEST_REGEX:-Fa3|FlashInfer}${CTEST_ENV:+, $CTEST_ENV}): rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/ctest.log" | head -20 | tee -a "$summary"
  [ $rc -ne 0 ] && grep -E "rel_l2|Failure|Expected|Which is|FP8 kernel" "$OUT/ctest.log" | head -24 | tee -a "$summary"
fi

cli="$build/tools/attnkit/attnkit"
if has_stage bench && [ -x "$cli" ]; then
  # One bench.log: fa3 with each schedule variant (env knobs of the fa3 backend), then flashinfer.
  args=(bench --device cuda --warmup 3 --iters 10)
  : > "$OUT/bench.log"
  for variant in ${BENCH_VARIANTS:-default ATTNKIT_FA3_TMA=0 ATTNKIT_FA3_OVERLAP=0}; do
    filt=()
    if [[ "$variant" == *@* ]]; then filt=(--filter "${variant#*@}"); variant=${variant%@*}; fi
    if [ "$variant" = default ]; then envs=(); else IFS=, read -r -a envs <<< "$variant"; fi
    for cases in ${BENCH_CASES:-bench/cases/fa3_prefill.json}; do
      echo "=== fa3 $variant ($cases)" >> "$OUT/bench.log"
      env "${envs[@]}" timeout "${BENCH_TIMEOUT:-60}" "$cli" "${args[@]}" --cases "$cases" \
        "${filt[@]}" --backend fa3 2>&1 | grep -E "^fa3 |ceiling|rror" >> "$OUT/bench.log"
      note "bench fa3 $variant ${filt[*]} ($cases): rc=${PIPESTATUS[0]}"
    done
  done
  # Time decomposition (wrong results): loads off, softmax off, GEMMs off, at 8k d 128.
  for diag in ${DIAG_VARIANTS-1 2 3 12 13}; do
    echo "=== fa3 ATTNKIT_FA3_DIAG=$diag" >> "$OUT/bench.log"
    ATTNKIT_FA3_DIAG=$diag timeout 30 "$cli" "${args[@]}" --cases bench/cases/fa3_prefill.json --backend fa3 --filter new8192_p16_h32x8_d128 2>&1 |
      grep -E "^fa3 " >> "$OUT/bench.log"
  done
  if [ -n "${BENCH_OTHERS-flashinfer}" ]; then
    echo "=== ${BENCH_OTHERS-flashinfer}" >> "$OUT/bench.log"
    timeout 60 "$cli" "${args[@]}" --cases bench/cases/fa3_prefill.json --backend "${BENCH_OTHERS-flashinfer}" --filter "${OTHERS_FILTER:-new8192}" 2>&1 |
      grep -vE "^\[" >> "$OUT/bench.log"
    note "bench ${BENCH_OTHERS-flashinfer}: rc=${PIPESTATUS[0]}"
  fi
fi

if has_stage peers; then
  PYTHONUNBUFFERED=1 OUT="$OUT" timeout 60 python3 scripts/device/fa3_peers.py > "$OUT/peers.log" 2>&1
  note "peers: rc=$?"
fi

if has_stage ncu && [ -x "$cli" ]; then
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -n "$ncu_bin" ]; then
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout "${NCU_TIMEOUT:-60}" "$ncu_bin" --clock-control none -k regex:prefill_sm90 -c 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis ${NCU_ARGS:-} \
      "$cli" bench --cases bench/cases/fa3_prefill.json --device cuda --warmup 0 --iters 1 \
      --backend fa3 --filter "${NCU_FILTER:-new8192_p16_h32x8_d128_kvbf16}" > "$OUT/ncu.log" 2>&1
    note "ncu: rc=$? in $(( $(date +%s) - t0 )) s"
  else
    note "ncu: not found"
  fi
fi

echo "==================== summary ===================="
cat "$summary"
[ -f "$OUT/bench.log" ] && { echo "--- bench.log ---"; grep -vE "^\s*$" "$OUT/bench.log" | tail -50; }
[ -f "$OUT/ncu.log" ] && { echo "--- ncu ---"; grep -E "Throughput|Pipe|Stall|Issued|Eligible|Active Warps|L2 Hit|Duration|SM Frequency|Warp Cycles|No Eligible|One or More" "$OUT/ncu.log" | head -40; }
[ -f "$OUT/peers.log" ] && { echo "--- peers ---"; cat "$OUT/peers.log"; }
exit 0
