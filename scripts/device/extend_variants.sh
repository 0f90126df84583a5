#!/usr/bin/env bash
# Runs ON the device after scripts/device/check.sh built build/device (see docs/perf/extend_notes.md):
# the GPU case table of the triton and flashinfer extend paths and the d 128 prefill bench once per
# ATTNKIT_EXTEND_TILE override ("64x32", "64x64"; the default shape is what check.sh measured).
# Writes $OUT/bench_<tile>.json and prints one line per result.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
build="$root/build/device"
cli="$build/tools/attnkit/attnkit"
for tile in ${TILES:-64x32 64x64}; do
  ATTNKIT_EXTEND_TILE=$tile ctest --test-dir "$build" -L gpu -j8 --timeout 120 \
    -R 'TritonCases.*(extend|verify)|FlashInferCase.*(extend|verify)' > "$OUT/ctest_$tile.log" 2>&1
  echo "tile $tile ctest rc=$?: $(grep -E 'tests passed|tests failed' "$OUT/ctest_$tile.log")"
  grep -E "\(Failed|\(SEGFAULT|\(Timeout" "$OUT/ctest_$tile.log" | head -10
  ATTNKIT_EXTEND_TILE=$tile timeout "${BENCH_TIMEOUT:-60}" "$cli" bench --backend triton,flashinfer \
    --cases scripts/device/extend_prefill_quick.json --device cuda --filter d128 \
    --json "$OUT/bench_$tile.json" > "$OUT/bench_$tile.log" 2>&1
  echo "tile $tile bench rc=$?"
  python3 - "$OUT/bench_$tile.json" "$tile" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"{sys.argv[2]:6s} {r['backend']:10s} {r['case']:52s} {r.get('ms_median', 0):8.3f} ms "
          f"{r.get('tflops') or 0:7.1f} TF/s {r.get('status')}")
PY
done

# Nsight Compute on one default-shape launch of each extend kernel (when ncu is installed): speed of
# light, warp stall reasons, scheduler and occupancy, for docs/perf/extend_notes.md.
if command -v ncu > /dev/null && [ "${NCU:-1}" = 1 ]; then
  for k in "triton mma_extend_kernel" "flashinfer paged_prefill_sm80_kernel"; do
    set -- $k
    timeout 60 ncu --kernel-name "regex:$2" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      "$cli" bench --backend "$1" --cases scripts/device/extend_prefill_quick.json --device cuda \
      --filter b4_pre0_new4096_p16_h32x8_d128 --warmup 1 --iters 3 > "$OUT/ncu_$1.txt" 2>&1
    echo "ncu $1 rc=$?"
    grep -E "Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|No Eligible|Stall" "$OUT/ncu_$1.txt" | head -14
  done
else
  echo "ncu: not run"
fi
