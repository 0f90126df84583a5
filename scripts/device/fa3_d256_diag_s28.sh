#!/usr/bin/env bash
# Session 28 (device, repository root, carry .deps): the d 256 causal forward taken apart with the
# fa3 A/B knobs. Builds the CLI, then times scripts/device/fa3_d256_diag.json (causal 8 x 2048,
# 4 x 4096, 2 x 8192) under each setting, two rounds, printing case / ms / TFLOP/s:
# ATTNKIT_FA3_DIAG 16 (no O stores), 8 (no Q loads: stale Q, a lower bound), 24 (both), no
# ping-pong, no tail split, plain-stride schedule.
set -u
. scripts/device/lib.sh
{ attnkit_configure build/device 90a-real && ninja -C build/device attnkit_cli; } > "$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
C=build/device/tools/attnkit/attnkit
for r in 1 2; do
  for v in X=1 ATTNKIT_FA3_DIAG=16 ATTNKIT_FA3_DIAG=8 ATTNKIT_FA3_DIAG=24 ATTNKIT_FA3_PINGPONG=0 \
    ATTNKIT_FA3_SPLIT=0 ATTNKIT_FA3_SCHED=0; do
    echo "== $r $v"
    env "$v" "$C" bench --backend fa3 --cases scripts/device/fa3_d256_diag.json --device cuda \
      --warmup 3 --iters 10 2>&1 | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $6}'
  done
done
