#!/usr/bin/env bash
# Session 21 (issue 7): the MLA GPU tests, then an A/B of environment variants of one MLA binary.
# On the device machine, from the repository root with .deps carried:
#   run(carry=[".deps"], command="bash scripts/device/mla_check_ab_s21.sh")
# (1) scripts/device/check.sh STAGES="build test" with the CLI and the MLA test binaries,
# `ctest -L gpu -R "$CTEST_REGEX"`; (2) ROUNDS alternated rounds of `attnkit bench --backend
# flashmla --cases $CASES` for every entry of VARIANTS ("name:VAR=v,VAR=v"; X=1 = nothing set).
# Knobs: CTEST_REGEX (default "Mla|MLA|mla"; empty skips the tests), CASES, ROUNDS (3), VARIANTS.
# Writes $OUT/summary.txt (ctest result, the bench table: case, ms, TFLOP/s) and $OUT/check/.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
CASES="${CASES:-scripts/device/mla_decode_128h_fp8.json}"
ROUNDS="${ROUNDS:-3}"
VARIANTS="${VARIANTS:-default:X=1}"
CTEST_REGEX="${CTEST_REGEX-Mla|MLA|mla}"
S="$OUT/summary.txt"
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "at $(($(date +%s) - t0)) s"; }
if [ -n "$CTEST_REGEX" ]; then
  OUT=$OUT/check STAGES="build test" CTEST_JOBS="${CTEST_JOBS:-6}" CTEST_REGEX="$CTEST_REGEX" \
    TARGETS="attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases test_mla_prefix_cache" \
    bash scripts/device/check.sh > "$OUT/check.log" 2>&1
else
  OUT=$OUT/check STAGES="build" TARGETS="attnkit_cli" bash scripts/device/check.sh > "$OUT/check.log" 2>&1
fi
{ tail -4 "$OUT/check.log"; grep -E "Failed|FAILED|tests passed" "$OUT/check/ctest.log" 2>/dev/null | head -20; el; } > "$S"
C=build/device/tools/attnkit/attnkit
for r in $(seq 1 "$ROUNDS"); do
  for v in $VARIANTS; do
    e=${v#*:}
    echo "== round $r ${v%%:*} $e"
    env ${e//,/ } timeout 60 "$C" bench --backend flashmla --cases "$CASES" --device cuda \
      --warmup 5 --iters 30 2>&1 | awk '$1 == "flashmla" {print $2, $3, $6} /rror/'
  done
done >> "$S" 2>&1
el >> "$S"
cat "$S"
