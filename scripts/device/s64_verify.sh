#!/usr/bin/env bash
# Session 64: the GPU tests of session 63's MLA barrier change (f73150d), which only synccheck had
# run: the whole build, the racecheck probe (scripts/device/probes/racecheck_two_role_barrier.cu,
# PROBE_VARIANTS, default every variant 0-10; session 64 ran 0-2 here), then `ctest -L gpu` over the MLA suites and the synccheck ctests. Runs ON the
# device machine from the repository root:
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s64_verify.sh")
#   STAGES="build probe test bench"   CTEST_REGEX (default below)   CTEST_LIMIT_S (default 330)
# Files back from $OUT: summary.txt build.log ctest.log probe.log bench_mla.txt
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
build="${BUILD_DIR:-$root/build/device}"
STAGES="${STAGES:-build probe test bench}"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)"

if has_stage build; then
  OUT="$OUT/b" STAGES=build bash scripts/device/check.sh > /dev/null 2>&1
  cat "$OUT/b/summary.txt" >> "$summary"
  mv "$OUT/b/build.log" "$OUT/build.log"
  rm -rf "$OUT/b"
  note "build stage done at $(elapsed) s"
fi

if has_stage probe; then
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  nvcc -arch=sm_90a -o /tmp/rc scripts/device/probes/racecheck_two_role_barrier.cu > "$OUT/probe.log" 2>&1
  for v in ${PROBE_VARIANTS:-0 1 2 3 4 5 6 7 8 9 10}; do
    echo "=== variant $v" >> "$OUT/probe.log"
    timeout 60 "$cs" --tool racecheck /tmp/rc "$v" >> "$OUT/probe.log" 2>&1
    note "racecheck probe variant $v: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/probe.log" | tail -1)"
  done
fi

if has_stage test; then
  regex="${CTEST_REGEX:-FlashMla|CutlassMla|Mla|GpuSynccheck}"
  timeout "${CTEST_LIMIT_S:-330}" ctest --test-dir "$build" -L gpu -R "$regex" --output-on-failure \
    --timeout 300 -j"${CTEST_JOBS:-12}" > "$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|Total Test time" "$OUT/ctest.log" | tee -a "$summary"
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/ctest.log" | head -40 | tee -a "$summary"
  note "ctest -R '$regex': rc=$rc skipped=$(grep -c '\*\*\*Skipped' "$OUT/ctest.log") at $(elapsed) s"
fi

if has_stage bench; then
  # The MLA decode targets (issue 7's 600 TFLOP/s shapes), two rounds: the barrier change's cost.
  for round in 1 2; do
    timeout 90 "$build/tools/attnkit/attnkit" bench --backend flashmla --device cuda \
      --cases scripts/device/mla_decode_128h.json >> "$OUT/bench_mla.txt" 2>&1
    note "mla bench round $round: rc=$? at $(elapsed) s"
  done
  grep -E "^flashmla " "$OUT/bench_mla.txt" | sed -E 's/ +/ /g' | head -20 >> "$summary"
fi
