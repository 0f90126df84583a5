#!/usr/bin/env bash
# Session 21 (issue 7): does the launch order of the MLA decode grid decide how well the two
# 64-row tiles of a 128-head request share its latent rows through L2? On the device machine,
# from the repository root with .deps carried:
#   run(carry=[".deps"], command="OUT=$OUT/mla bash scripts/device/mla_grid_order_s21.sh")
# Builds attnkit_cli, then (1) ncu counters of one wgmma decode launch (DRAM bytes read, L2 hit
# rate, L2 sectors read by the SMs) with the default grid (parts fastest) and with
# ATTNKIT_MLA_GRID_ORDER=rows, (2) ROUNDS alternated rounds of `attnkit bench --backend flashmla`
# on CASES with each order. Knobs: CASES (default the 128-head bf16 + fp8 file), ROUNDS (3),
# NCU_FILTER (case of the ncu stage), ENVS (extra "name:VAR=v,VAR=v" entries benched beside the
# two orders), B (build dir).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
B="${B:-build/device}"
CASES="${CASES:-scripts/device/mla_decode_128h_fp8.json}"
ROUNDS="${ROUNDS:-3}"
NCU_FILTER="${NCU_FILTER:-mla_decode_b128_kv4096_p64_h128_d576v512_kvbf16}"
ENVS="${ENVS:-parts:ATTNKIT_MLA_GRID_ORDER=parts rows:ATTNKIT_MLA_GRID_ORDER=rows}"
mkdir -p "$OUT"
S="$OUT/summary.txt"
t_start=$(date +%s)
el() { echo "at $(($(date +%s) - t_start)) s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
{ attnkit_configure "$B" 90a-real && ninja -C "$B" -j16 attnkit_cli; } > "$OUT/build.log" 2>&1
echo "build rc=$? $(el)" | tee "$S"
C="$B/tools/attnkit/attnkit"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)"
for e in $ENVS; do
  name=${e%%:*}
  env $(echo "${e#*:}" | tr ',' ' ') timeout 90 "$NCU" --clock-control none \
    -k "regex:mla_decode_wgmma_kernel" -s 2 -c 1 \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    "$C" bench --backend flashmla --cases "$CASES" --filter "$NCU_FILTER" --device cuda \
    --warmup 2 --iters 1 > "$OUT/ncu_$name.txt" 2>&1
  echo "ncu $name rc=$? $(el)" | tee -a "$S"
  grep -E "dram__|lts__|gpu__time|sm__throughput" "$OUT/ncu_$name.txt" | tee -a "$S"
done
for r in $(seq 1 "$ROUNDS"); do
  for e in $ENVS; do
    name=${e%%:*}$r
    env $(echo "${e#*:}" | tr ',' ' ') timeout 60 "$C" bench --backend flashmla --cases "$CASES" \
      --device cuda --warmup 5 --iters 30 --json "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1
    echo "bench $name rc=$? $(el)" | tee -a "$S"
    grep -E "mla_decode_b" "$OUT/bench_$name.log" | tee -a "$S"
  done
done
echo "done $(el)" | tee -a "$S"
