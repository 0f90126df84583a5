#!/usr/bin/env bash
# Session 7 fidecode device command: decode_variants.sh (FlashInfer GPU tests, targets default /
# b2b / graph, b1 variants b2b) + an ncu source-level (SASS) profile of the b1 kv32k bf16 kernel
# (NCU_CASE: bench filter; NCU_CACHE=none keeps the caches warm between the profiled launches).
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
echo "ncu: ${NCU_BIN:-none}"
BUDGET_S="${BUDGET_S:-250}" CTEST_TIMEOUT="${CTEST_TIMEOUT:-90}" SKIP_PEERS=1 \
  TEST_TARGETS="test_flashinfer_cases test_flashinfer_cascade" CTEST_REGEX='FlashInfer' \
  CASES_B2B=scripts/device/decode_targets.json GRAPH=1 VARIANT_BACKENDS=flashinfer \
  VARIANT_ARGS="--launches 10" VARIANT_CASES=scripts/device/decode_b1.json \
  bash scripts/device/decode_variants.sh > "$OUT/run.txt" 2>&1
cli=build/device/tools/attnkit/attnkit
if [ -n "$NCU_BIN" ] && [ -n "${NCU_CASE:-}" ]; then
  timeout "${NCU_TIMEOUT:-70}" "$NCU_BIN" --clock-control none --cache-control "${NCU_CACHE:-all}" \
    --launch-skip "${NCU_SKIP:-3}" --launch-count 1 \
    -k regex:paged_decode_ring --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section SchedulerStats -f -o "$OUT/prof" \
    "$cli" bench --device cuda --backend flashinfer --cases scripts/device/decode_b1.json \
    --filter "$NCU_CASE" --warmup 2 --iters 3 > "$OUT/ncu.log" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu.log"
  "$NCU_BIN" -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass > "$OUT/sass.csv" 2>>"$OUT/ncu.log"
  "$NCU_BIN" -i "$OUT/prof.ncu-rep" --page details > "$OUT/details.txt" 2>>"$OUT/ncu.log"
fi
cd "$OUT" && tar czf all.tgz *.txt *.json *.log *.csv prof.ncu-rep 2>/dev/null; ls -la "$OUT"
tail -60 "$OUT/run.txt"; tail -3 "$OUT/ncu.log" 2>/dev/null
grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued" "$OUT/details.txt" 2>/dev/null | head
