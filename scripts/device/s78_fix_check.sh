#!/usr/bin/env bash
# Session 78 (runs ON the device, carry .wt/ab with this tree's stripped d-128 CLI as ak_head.xz):
# the FP8 prefill with an e4m3 q after the trigger moved into the producer warpgroup, beside the
# bf16-q FP8 forwards, fa3_prefill.json's fp8 cases, two rounds.
#   run(carry=[".wt/ab"], command="bash scripts/device/s78_fix_check.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
xz -dc .wt/ab/ak_head.xz > /tmp/ak_head && chmod +x /tmp/ak_head
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r" >> "$OUT/fix.txt"
  timeout 60 /tmp/ak_head bench --backend fa3 --device cuda --filter "${FILTER:-kvfp8}" \
    --cases bench/cases/fa3_prefill.json 2>>"$OUT/fix.err" | grep -E "^fa3 " |
    awk '{print $2, $3, $6}' >> "$OUT/fix.txt"
done
cat "$OUT/fix.txt"
