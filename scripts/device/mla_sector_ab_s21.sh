#!/usr/bin/env bash
# Session 21 (issue 7): A/B of the 128-head MLA wgmma decode against an older tree, CLI only, both
# trees built at once. On the device machine, from the repository root (carry .deps and BASE; make
# BASE with `rm -rf .wt/base && mkdir -p .wt/base && git archive <rev> | tar -x -C .wt/base`):
#   run(carry=[".deps", ".wt/base"], command="bash scripts/device/mla_sector_ab_s21.sh")
# Then ncu counters (DRAM bytes, L2 -> SM bytes, L2 sectors read by the SMs, L2 hit rate) of one
# launch of each variant, and ROUNDS alternated rounds of `attnkit bench --backend flashmla` on
# CASES for every entry of VARIANTS ("base:VAR=v,VAR=v" / "new:..."; X=1 = nothing set).
# Writes $OUT/summary.txt (build, ncu lines, the bench table: case, ms, TFLOP/s) and $OUT/logs.tgz.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
BASE="${BASE:-.wt/base}"
CASES="${CASES:-scripts/device/mla_decode_128h_fp8.json}"
ROUNDS="${ROUNDS:-3}"
VARIANTS="${VARIANTS:-base:X=1 new:X=1}"
NCU_FILTER="${NCU_FILTER:-mla_decode_b128_kv4096_p64_h128_d576v512_kvbf16}"
L="$OUT/logs"
mkdir -p "$L"
S="$OUT/summary.txt"
t0=$(date +%s)
el() { echo "at $(($(date +%s) - t0)) s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$L/gpu.txt" 2>&1
({ attnkit_configure build/device 90a-real && ninja -C build/device -j10 attnkit_cli; } \
  > "$L/new_build.log" 2>&1; echo "new build rc $?" >> "$L/rc.txt") &
(cd "$BASE" && ln -sfn "$root/.deps" .deps && . scripts/device/lib.sh &&
  { attnkit_configure build 90a-real && ninja -C build -j6 attnkit_cli; } > "$L/base_build.log" 2>&1
  echo "base build rc $?" >> "$L/rc.txt") &
wait
{ cat "$L/rc.txt"; el; } | tee "$S"
N=build/device/tools/attnkit/attnkit
B=$BASE/build/tools/attnkit/attnkit
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)"
for v in $VARIANTS; do
  bin=${v%%:*}
  e=${v#*:}
  [ "$bin" = base ] && C=$B || C=$N
  echo "== ncu $v" >> "$S"
  env ${e//,/ } timeout 90 "$NCU" --clock-control none -k "regex:mla_decode_wgmma_kernel" -s 2 -c 1 \
    --metrics dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
    "$C" bench --backend flashmla --cases "$CASES" --filter "$NCU_FILTER" --device cuda \
    --warmup 2 --iters 1 > "$L/ncu_${bin}_${e//[,=]/_}.txt" 2>&1
  grep -E "dram__|l1tex__|lts__|gpu__time" "$L/ncu_${bin}_${e//[,=]/_}.txt" >> "$S"
done
el >> "$S"
for r in $(seq 1 "$ROUNDS"); do
  for v in $VARIANTS; do
    bin=${v%%:*}
    e=${v#*:}
    [ "$bin" = base ] && C=$B || C=$N
    echo "== round $r $bin $e"
    env ${e//,/ } timeout 60 "$C" bench --backend flashmla --cases "$CASES" --device cuda \
      --warmup 5 --iters 30 2>&1 | awk '$1 == "flashmla" {print $2, $3, $6}'
  done
done >> "$S" 2>&1
el >> "$S"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
cat "$S"
