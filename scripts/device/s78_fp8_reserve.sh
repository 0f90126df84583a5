#!/usr/bin/env bash
# Session 78 (runs ON the device, carry .deps): session 76's "left (2)": the overlap model's
# reserve for split mixed forwards over an fp8_e4m3 pool against forced reserves. Builds the CLI
# (head dim 128 only), then two alternated
# rounds of bench/cases/mixed_extend_fp8.json on fa3 with the model's reserve, forced reserves and
# the two kernels one after the other; then a graph snapshot of the decode targets (flashinfer).
#   run(carry=[".deps"], command="bash scripts/device/s78_fp8_reserve.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
. scripts/device/lib.sh
attnkit_script_start
HEAD_DIMS=128 attnkit_build_targets attnkit_cli
V="fa3 fa3:ATTNKIT_PARTITION_OVERLAP=0 fa3:ATTNKIT_PARTITION_RESERVE=8 \
fa3:ATTNKIT_PARTITION_RESERVE=22 fa3:ATTNKIT_PARTITION_RESERVE=44 fa3:ATTNKIT_PARTITION_RESERVE=66 \
fa3:ATTNKIT_PARTITION_RESERVE=88"
for r in 1 2; do
  STAGES=bench OUT="$OUT/r$r" VARIANTS="$V" BENCH_LIMIT=60 CASES=bench/cases/mixed_extend_fp8.json \
    bash scripts/device/partition_check.sh > "$OUT/r$r.txt" 2>&1
  echo "round $r rc=$?"
done
ak=build/device/tools/attnkit/attnkit
timeout 120 "$ak" bench --backend flashinfer --device cuda --graph --launches 32 \
  --cases scripts/device/decode_targets.json --json "$OUT/decode_targets.json" \
  > "$OUT/decode_targets.txt" 2>&1
echo "decode targets rc=$?"
for r in 1 2; do echo "== round $r"; cat "$OUT/r$r/bench.txt"; done
grep -E "^flashinfer |ceiling" "$OUT/decode_targets.txt"
