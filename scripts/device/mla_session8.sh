#!/usr/bin/env bash
# Session 8 device script for the 16-row MLA decode kernel (one command, fits timeout_s 360):
# build the MLA targets, every MLA GPU test (default env;
# FlashMlaKernels.Heads16PrefetchAndFp8InputTypes runs the knob combinations), the torch ceilings,
# an A/B of the 16-head cases (mla_decode_16h.json, eager, --warmup 5 --iters 20) alternating
#   s7      ATTNKIT_MLA_MMA_PREFETCH=0 ATTNKIT_MLA_FP8_F16=0 (the session-7 kernels)
#   def     default (bf16 16-row: no prefetch; fp8 16-row: f16 + register prefetch; 32-row bf16:
#           register prefetch)
#   smem    ATTNKIT_MLA_MMA_PREFETCH=smem (page-table ring in shared memory, 16-row tiles)
#   f16nopf ATTNKIT_MLA_MMA_PREFETCH=0 (fp8 cases only: f16 without prefetch)
# the timing-only diagnostic ATTNKIT_MLA_WGMMA_DIAG=noload (no K loads after the prologue), every
# MLA GPU test again with ATTNKIT_MLA_MMA_PREFETCH=smem, and ncu (sections + pipe / stall
# metrics) of one 16-head bf16 and one fp8 launch. One tar.gz back.
# (The run of 07:14 UTC used this script at commit 12394b8: variants base / pf / os / f16 / osf16.)
# Run from the repository root with .deps carried. Knobs: B (build dir), VARIANTS (extra
# "name=ENV=VAL" benches), SKIP_NCU.
set -uo pipefail
FINAL="${OUT:-$PWD/out}"; OUT=${MLA_WORK:-/tmp/mla_s8}; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
B=${B:-build-dev}; T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
. scripts/device/lib.sh
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
attnkit_configure "$B" > "$OUT/build.log" 2>&1
ninja -C "$B" -j16 attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases \
  test_mla_prefix_cache test_fa3_cases test_triton_cases >> "$OUT/build.log" 2>&1
echo "build rc=$? $(el)"; grep -m5 -E "error|C75[0-9][0-9]" "$OUT/build.log"
REGEX='Mla|MLA|mla|FlashMla|CutlassMla|FlashInfer.*[Mm]la'
(cd "$B" && ATTNKIT_MLA_TEST_PT_SMEM=1 timeout 120 ctest -L gpu -R "$REGEX" -j 8 --timeout 60 \
  --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest.log" | head -12
grep -E "Heads16PrefetchAndFp8InputTypes" "$OUT/ctest.log" | head -3
timeout 30 python3 scripts/device/mla_ceilings.py > "$OUT/ceilings.log" 2>&1; tail -2 "$OUT/ceilings.log"
CASES=${CASES:-scripts/device/mla_decode_16h.json}
bench() {  # name, filter ("" = all), env...
  local name=$1 filter=$2; shift 2
  env "$@" timeout 40 "$B/tools/attnkit/attnkit" bench --backend flashmla --cases "$CASES" \
    ${filter:+--filter "$filter"} --device cuda --warmup 5 --iters 20 \
    --json "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$? $(el)"
}
for r in a b; do
  bench s7_$r "" ATTNKIT_MLA_MMA_PREFETCH=0 ATTNKIT_MLA_FP8_F16=0; bench def_$r ""
  bench smem_$r "" ATTNKIT_MLA_MMA_PREFETCH=smem; bench f16nopf_$r kvfp8 ATTNKIT_MLA_MMA_PREFETCH=0
done
for v in ${VARIANTS:-}; do bench "${v%%=*}" "" "${v#*=}"; done
bench noload_def "" ATTNKIT_MLA_WGMMA_DIAG=noload
python3 scripts/device/mla_bench_table.py "$OUT"
# Every MLA GPU test again with the shared-memory page-table ring (page 1 / 128 16-head cases too).
left=$(( 335 - ($(date +%s) - T0) )); [ $left -gt 90 ] && left=90
if [ $left -gt 20 ]; then
  (cd "$B" && ATTNKIT_MLA_MMA_PREFETCH=smem ATTNKIT_MLA_TEST_PT_SMEM=1 timeout $left ctest -L gpu -R "$REGEX" \
    -j 8 --timeout 60 --output-on-failure > "$OUT/ctest_smem.log" 2>&1)
  echo "ctest PREFETCH=smem rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest_smem.log")"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest_smem.log" | head -12
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "${SKIP_NCU:-}" ] && [ -n "$NCU" ]; then
  for dt in bf16 fp8; do
    [ $(( $(date +%s) - T0 )) -gt 305 ] && break
    timeout 40 "$NCU" --clock-control none -k regex:mla_decode_kernel --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section Occupancy \
      --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed' \
      "$B/tools/attnkit/attnkit" bench --backend flashmla --cases "$CASES" --filter "kv4096_p64_h16_d576v512_kv$dt" \
      --device cuda --warmup 3 --iters 3 > "$OUT/ncu_$dt.log" 2>&1
    echo "ncu $dt rc=$? $(el)"
  done
  grep -E "Duration|DRAM Throughput|Memory Throughput|Warp Cycles Per Issued|Issue Slots Busy|stalled_(barrier|long_scoreboard|short_scoreboard|mio_throttle|math_pipe|wait|lg_throttle|not_selected|selected)_per|pipe_tensor.*hmma|pipe_(alu|fma|fmaheavy|xu|lsu)_cycles|inst_executed_pipe_(alu|fma|xu|lsu|fp16)\.|mem_shared" "$OUT"/ncu_*.log | head -80
fi
tar czf "$FINAL/mla_s8.tar.gz" -C "$OUT" . 2>/dev/null
echo "done $(el)"
