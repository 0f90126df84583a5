#!/usr/bin/env bash
# Session 55: the fa3 wgmma kernel's window / soft-cap / sinks variants. One device call:
#  1. scripts/device/check.sh builds the CLI and every GPU test (all head dims) and runs
#     `ctest -L gpu -R "Fa3|FlashInfer"` without the decode plan-knob suites (CTEST_* below);
#  2. attnkit bench over scripts/device/fa3_s55_variants.json, ROUNDS alternated rounds of fa3 and
#     of flashinfer with ATTNKIT_FLASHINFER_SM90_PREFILL=0 (its mma.sync prefill, which served
#     these layers before). No --verify: the fp64 reference of these shapes takes minutes; the
#     tests of step 1 check the same kernels against it.
#   run(carry=[".deps"], command="bash scripts/device/s55_variants.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  OUT="$OUT/check" STAGES="build test" CTEST_JOBS="${CTEST_JOBS:-12}" \
    CTEST_REGEX="${CTEST_REGEX:-Fa3|FlashInfer}" \
    CTEST_EXCLUDE="${CTEST_EXCLUDE:-FlashInferDecode(Balance|DefaultPlan|SplitLong)}" \
    bash scripts/device/check.sh 2>&1 | tail -6
fi
ak=build/device/tools/attnkit/attnkit
cases=scripts/device/fa3_s55_variants.json
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r fa3"
  timeout 200 "$ak" bench --backend fa3 --device cuda --cases "$cases" \
    --json "$OUT/fa3_r$r.json" 2>/dev/null | grep -E "^fa3 |ceiling"
  echo "== round $r flashinfer (ATTNKIT_FLASHINFER_SM90_PREFILL=0: mma.sync)"
  ATTNKIT_FLASHINFER_SM90_PREFILL=0 timeout 200 "$ak" bench --backend flashinfer --device cuda \
    --cases "$cases" --json "$OUT/fi_r$r.json" 2>/dev/null | grep -E "^flashinfer "
done | tee "$OUT/variants_bench.txt"
