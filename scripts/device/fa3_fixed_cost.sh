#!/usr/bin/env bash
# fa3: where the fixed ~80 us of a causal 4k forward goes (docs/perf/fa3_notes.md "Session 53"):
# FP8 (e4m3 q) and bf16 d 128 timed eager (--launches 1: host latency included, as the targets
# are measured) and back to back (--launches 10: kernel time), over
#   scripts/device/fa3_s53_causal_vs_bidir.json (causal / bidirectional 4k, bidirectional 8k) and
#   scripts/device/fa3_s53_unit_counts.json (causal, ~the same FLOPs over 1x to ~8x the units),
# ROUNDS alternated rounds (LAUNCHES: the --launches values, default "1 10"); fit the output with
# `python3 scripts/fa3_cost_fit.py $OUT/fixed_cost.txt`. Builds attnkit_cli for head dim 128 only
# (build/d128; incremental on a warm machine).
#   run(carry=[".deps"], command="bash scripts/device/fa3_fixed_cost.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
attnkit_build_cli_d128 "$OUT" || exit 1
B=build/d128
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for r in $(seq 1 "${ROUNDS:-2}"); do
  for cases in scripts/device/fa3_s53_causal_vs_bidir.json scripts/device/fa3_s53_unit_counts.json; do
    for launches in ${LAUNCHES:-1 10}; do
      echo "== round $r launches $launches $cases"
      timeout 120 "$B/tools/attnkit/attnkit" bench --backend fa3 --device cuda --cases "$cases" \
        --warmup 3 --iters 10 --launches "$launches" 2>/dev/null | awk '$1=="fa3"{print $2, $3, $6}'
    done
  done
done | tee "$OUT/fixed_cost.txt"
