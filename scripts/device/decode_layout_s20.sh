#!/usr/bin/env bash
# Session 20 (issue 5): the math-free read ceiling of the b16 decode partition with shuffled pages
# (scripts/device/read_ceiling.cu, rows_* modes) beside the flashinfer decode on the same layouts
# (scripts/device/decode_s20_layout.json: shuffled vs in-order pages), the copy ceiling in both.
# Device machine, repository root, carry .deps and .peers. Writes $OUT/read_ceiling.txt,
# $OUT/layout_graph.txt, $OUT/layout_b2b.txt.
set -uo pipefail
. scripts/device/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
nvcc -O3 -arch=sm_90a -std=c++20 -o /tmp/read_ceiling scripts/device/read_ceiling.cu &&
  /tmp/read_ceiling > "$OUT/read_ceiling.txt" 2>&1
grep -E "rows_|item128x1_512t|ring_4w_3s_spin0 |copy|memcpy" "$OUT/read_ceiling.txt"
t0=$(date +%s)
attnkit_configure build/device 90a-real > "$OUT/build.log" 2>&1 &&
  ninja -C build/device -j16 attnkit_cli >> "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
A=build/device/tools/attnkit/attnkit
for r in 1 2 3; do
  echo "== round $r graph32"
  $A bench --backend flashinfer --cases scripts/device/decode_s20_layout.json --device cuda \
    --graph --launches 32 2>/dev/null | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $4, $5, $6}'
  echo "== round $r b2b10"
  $A bench --backend flashinfer --cases scripts/device/decode_s20_layout.json --device cuda \
    --launches 10 2>/dev/null | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $4, $5, $6}'
done 2>&1 | tee "$OUT/layout.txt"
/tmp/read_ceiling 2>&1 | grep -E "rows_|copy|memcpy" > "$OUT/read_ceiling_again.txt"
cat "$OUT/read_ceiling_again.txt"
