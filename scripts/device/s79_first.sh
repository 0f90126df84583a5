#!/usr/bin/env bash
# Next device session's first call (runs ON the device, carry .deps): session 78's unrun commits.
# Builds everything (check.sh's build stage; any C7511 is noted in the summary), runs the fa3
# suites the trigger move and the fp8 reserve cap touch, then times fa3_prefill.json's d-128 cases
# twice (the e4m3-q FP8 prefill should be back at ~0.615 / 1.12 / 2.11 ms at causal 4k / 8k / 16k,
# under its bf16-q figures) and mixed_extend_fp8.json once (the capped reserve, e4m3 q re-read).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s79_first.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
STAGES=build bash scripts/device/check.sh > "$OUT/build_stage.txt" 2>&1
tail -n 4 "$OUT/build_stage.txt"
. scripts/device/lib.sh
summary="$OUT/summary.txt"
t_start=$(date +%s)
attnkit_run_gtest fa3_touched 240 test_fa3_cases \
  'Fa3PartitionTest.*:Fa3Fp8Test.*:Fa3VariantTest.Fp8Pool*:Fa3SmallExtendTest.*'
ak=build/device/tools/attnkit/attnkit
for r in 1 2; do
  echo "== fa3_prefill d128 round $r" >> "$OUT/bench.txt"
  timeout 120 "$ak" bench --backend fa3 --device cuda --filter d128 \
    --cases bench/cases/fa3_prefill.json 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling" \
    >> "$OUT/bench.txt"
done
echo "== mixed_extend_fp8" >> "$OUT/bench.txt"
timeout 120 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mixed_extend_fp8.json \
  2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling" >> "$OUT/bench.txt"
note "bench done at $(elapsed) s"
cat "$OUT/summary.txt" "$OUT/bench.txt"
