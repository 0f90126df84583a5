#!/usr/bin/env bash
# Session 60: target verify on decode tiles (paged_decode_ring_kernel's kVerify).
#  1. builds the CLI and the flashinfer / fa3 / verify-graph / NaN-key GPU tests; runs the suites
#     that reach the verify paths on both tile shapes (CTEST_REGEX overrides; CTEST_SKIP=1 skips);
#  2. scripts/device/verify_s60.json on flashinfer: --verify at the default rule, then
#     --launches 10 under each A/B setting (AB overrides, see below), then --graph at the default.
#     Results: $OUT/tests.txt, bench.txt, verify.json, bench_graph.json.
#   run(carry=[".deps"], command="bash scripts/device/s60_verify.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
# (The FlashInferDecode(Balance|DefaultPlan|SplitLong) suites, each the whole case binary, do not
# fit beside these in one 10-minute command: run them in a call of their own.)
regex="${CTEST_REGEX:-FlashInferCase|FlashInferVerify|FlashInferSplitTest|FlashInferGraph|FlashInferCascade|NanKeyCases|Fa3CaseTest|Fa3GraphTest|VerifyGraphs|Sm86Emulated_flashinfer|Sm80Emulated_flashinfer|TritonCase|FlashInferPlanTest}"
stages="build test"
[ "${CTEST_SKIP:-0}" = 1 ] && stages="build"
OUT="$OUT/check" STAGES="$stages" CTEST_JOBS=12 \
  TARGETS="attnkit_cli test_flashinfer_cases test_flashinfer_cascade test_nan_key_cases test_fa3_cases test_verify_graphs test_triton_cases" \
  CTEST_REGEX="$regex" bash scripts/device/check.sh 2>&1 | tail -4
{
  echo "== ctest -R '$regex'"
  grep -E "tests passed|tests failed|Total Test time" "$OUT/check/ctest.log" 2>/dev/null
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)|\*\*\*Failed" "$OUT/check/ctest.log" 2>/dev/null |
    head -30
} | tee "$OUT/tests.txt"
ak=build/device/tools/attnkit/attnkit
cases=scripts/device/verify_s60.json
row='^(flashinfer|fa3|triton) |ceiling'
echo "== --verify (default rule)" | tee "$OUT/bench.txt"
timeout 150 "$ak" bench --backend flashinfer --device cuda --cases "$cases" \
  --verify --json "$OUT/verify.json" 2>&1 | grep -E "$row|mismatch|failed|FAIL" | tee -a "$OUT/bench.txt"
# A/B runs, each "NAME=VALUE ..." (env for one --launches 10 pass; "-" = the defaults): the tile
# rule's bound, then (session 60) the verify CTAs per SM and the soft-cap-checking loop.
# (02:46Z run: 'ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS=0|-|ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS=64|
# ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM=2|ATTNKIT_FLASHINFER_DECODE_LOOP=generic'; then the
# 32-row tiles against 16-row ones.)
# (03:09Z: 'ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS=0|-|ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS=16|
# ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS=64', cut off by the 10 minutes; 03:19Z by hand: 32 vs 16
# rows.) Session 61 (scripts/device/snapshot_s61.sh) measured the 32-row tiles at two CTAs per SM
# (+9% at b16 s_q 8) and made it the default on SM90: the A/B is now against one CTA per SM.
ab_default='ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS=0|-|ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM=1|ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS=16'
IFS='|' read -r -a abs <<< "${AB:-$ab_default}"
for ab in "${abs[@]}"; do
  echo "== --launches 10, $ab" | tee -a "$OUT/bench.txt"
  envs=()
  [ "$ab" != "-" ] && read -r -a envs <<< "$ab"
  env "${envs[@]}" timeout 90 "$ak" bench --backend flashinfer --device cuda --cases "$cases" \
    --launches 10 2>&1 | grep -E "$row" | tee -a "$OUT/bench.txt"
done
echo "== --graph (default rule)" | tee -a "$OUT/bench.txt"
timeout 90 "$ak" bench --backend flashinfer --device cuda --cases "$cases" --graph \
  --json "$OUT/bench_graph.json" 2>&1 | grep -E "$row" | tee -a "$OUT/bench.txt"
# fa3 hands decode and verify to the same kernels (FA3_BENCH=0 skips).
if [ "${FA3_BENCH:-1}" = 1 ]; then
  echo "== fa3 --launches 10" | tee -a "$OUT/bench.txt"
  timeout 90 "$ak" bench --backend fa3 --device cuda --cases "$cases" --launches 10 2>&1 |
    grep -E "$row" | tee -a "$OUT/bench.txt"
fi
