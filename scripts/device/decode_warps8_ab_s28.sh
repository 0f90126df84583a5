#!/usr/bin/env bash
# Session 28 (device, repository root, carry .deps): the 8-warp balanced decode CTA
# (ATTNKIT_FLASHINFER_DECODE_WARPS=8, one CTA per SM where the balanced plan has at most one slot
# per SM) against the 4-warp default. Builds the CLI and test_flashinfer_cases, runs the FlashInfer
# GPU tests with the 8-warp CTA, then times scripts/device/decode_targets.json (flashinfer) with
# =4 and =8 alternated: GRAPH_ROUNDS rounds of --graph --launches 32, B2B_ROUNDS of --launches 10.
set -u
. scripts/device/lib.sh
OUT=$OUT/check STAGES="build" TARGETS="attnkit_cli test_flashinfer_cases" \
  bash scripts/device/check.sh > "$OUT/check.log" 2>&1
tail -2 "$OUT/check.log"
ATTNKIT_FLASHINFER_DECODE_WARPS=8 timeout 240 ctest --test-dir build/device -L gpu -R FlashInfer \
  -j8 --timeout 200 > "$OUT/ctest_warps8.log" 2>&1
echo "ctest FlashInfer with DECODE_WARPS=8: rc $?; $(grep -E 'tests passed|tests failed' "$OUT/ctest_warps8.log")"
grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/ctest_warps8.log" | head
C=build/device/tools/attnkit/attnkit
run() {  # label, then bench flags
  local label=$1
  shift
  for w in 4 8; do
    echo "== $label warps $w"
    ATTNKIT_FLASHINFER_DECODE_WARPS=$w timeout 100 "$C" bench --backend flashinfer \
      --cases scripts/device/decode_targets.json --device cuda "$@" 2>&1 |
      awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $5}'
  done
}
{
  for r in $(seq 1 "${GRAPH_ROUNDS:-3}"); do run "graph round $r" --graph --launches 32; done
  for r in $(seq 1 "${B2B_ROUNDS:-2}"); do run "b2b round $r" --launches 10; done
} 2>&1 | tee "$OUT/decode_warps8_ab.txt"
