#!/usr/bin/env bash
# Session 78 (runs ON the device): the FP8 prefill with an e4m3 q after the trigger moved into the
# producer warpgroup, beside the bf16-q FP8 forwards: fa3_prefill.json's d-128 cases (FILTER),
# ROUNDS rounds. With .wt/ab/ak_head.xz (this tree's stripped d-128 CLI, built on the development
# machine) it runs that; else it builds the d-128 CLI here first (~160 s, carry .deps).
#   run(carry=[".wt/ab"], command="bash scripts/device/s78_fix_check.sh")
#   run(carry=[".deps"], command="FILTER=d128 bash scripts/device/s78_fix_check.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
if [ -f .wt/ab/ak_head.xz ]; then
  xz -dc .wt/ab/ak_head.xz > /tmp/ak_head && chmod +x /tmp/ak_head
else
  . scripts/device/lib.sh
  attnkit_script_start
  HEAD_DIMS=128 attnkit_build_targets attnkit_cli
  cp build/device/tools/attnkit/attnkit /tmp/ak_head
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r" >> "$OUT/fix.txt"
  timeout 60 /tmp/ak_head bench --backend fa3 --device cuda --filter "${FILTER:-kvfp8}" \
    --cases bench/cases/fa3_prefill.json 2>>"$OUT/fix.err" | grep -E "^fa3 " |
    awk '{print $2, $3, $6}' >> "$OUT/fix.txt"
done
cat "$OUT/fix.txt"
