#!/usr/bin/env bash
# Session 77 call A (runs ON the device, carry .deps .peers): build everything (check.sh), then the
# small-extend e4m3-q suites and their bench:
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s77_check.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGES=build bash scripts/device/check.sh
. scripts/device/lib.sh
summary="$OUT/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
timeout 240 build/device/tests/test_fa3_cases \
  --gtest_filter='Fa3SmallExtendTest.*:Fa3PartitionTest.*:Fa3Fp8Test.*:Fa3VariantTest.Fp8Pool*' \
  > "$OUT/s77_fa3_targeted.log" 2>&1
note "targeted fa3: rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|tests ran" "$OUT/s77_fa3_targeted.log" | head -20 | tee -a "$summary"
ak=build/device/tools/attnkit/attnkit
for f in "small_extend.json fp8" "mixed_extend_fp8.json qfp8" "mixed_extend_fp8.json b63"; do
  set -- $f
  echo "== $1 $2" >> "$OUT/s77_bench.txt"
  timeout 100 "$ak" bench --backend fa3 --device cuda --cases "bench/cases/$1" --filter "$2" \
    --json "$OUT/s77_bench_${1%.json}_$2.json" 2>>"$OUT/s77_bench.err" >> "$OUT/s77_bench.txt"
  note "bench $1 $2 rc=$?"
done
cat "$OUT/s77_bench.txt"
