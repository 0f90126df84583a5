#!/usr/bin/env bash
# Decode experiment in one device command (carry .deps and .peers like check.sh): build the CLI and
# the triton/flashinfer GPU tests, run those tests, time the decode targets (default and
# --launches 10), the decode peers (copy ceiling, SDPA cuDNN/FA2), then VARIANTS (env settings,
# each timed on scripts/device/decode_variants.json) and NCU (kernel profiles), each skipped once
# the run nears BUDGET_S seconds. At most 7 files under $OUT.
#   VARIANTS="ATTNKIT_DECODE_BLOCKS_PER_SM=1 ATTNKIT_TRITON_SPLIT=request ..." (one env per entry;
#            "A=1,B=2" sets two)
#   VARIANT_CASES=scripts/device/decode_variants.json  the case file the variants are timed on
#            (an entry "ENV=x@cases.json" uses its own case file)
#   NCU="backend:filter ..."  e.g. "flashinfer:b16_kv4096_p16_h32x8_d128_kvbf16"
#   VARIANT_ARGS="--launches 10"  extra bench flags of the variant runs (default: none)
#   GRAPH=1  also time the b2b cases with --graph (CUDA graph replay)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
t_start=$(date +%s)
BUDGET_S="${BUDGET_S:-270}"
left() { echo $(( BUDGET_S - ($(date +%s) - t_start) )); }
build="$root/build/device"
S="$OUT/summary.txt"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) date: $(date -u +%FT%RZ)" | tee "$S"
. scripts/device/lib.sh
attnkit_configure "$build" "${ARCHS:-90a-real}" > "$OUT/bench.log" 2>&1 &&
  ninja -C "$build" -j16 attnkit_cli ${TEST_TARGETS:-test_triton_cases test_flashinfer_cases test_triton_cuda_graph} >> "$OUT/bench.log" 2>&1
rc=$?
echo "build: rc=$rc at $(( $(date +%s) - t_start )) s" | tee -a "$S"
[ $rc -ne 0 ] && { grep -E "error" "$OUT/bench.log" | head -20; exit 1; }
cli="$build/tools/attnkit/attnkit"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${CTEST_TIMEOUT:-110}" ctest --test-dir "$build" -L gpu -R "${CTEST_REGEX:-[Tt]riton|[Ff]lash[Ii]nfer}" \
    --output-on-failure --timeout 100 -j8 > "$OUT/ctest.log" 2>&1
  echo "ctest: rc=$? at $(( $(date +%s) - t_start )) s" | tee -a "$S"
  grep -E "tests passed|tests failed" "$OUT/ctest.log" | tee -a "$S"
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/ctest.log" | head -20 | tee -a "$S"
fi
bench() {  # bench LABEL JSON ARGS...
  local label=$1 json=$2; shift 2
  echo "=== $label" >> "$OUT/bench.log"
  timeout 100 "$cli" bench --device cuda --json "$json" "$@" >> "$OUT/bench.log" 2>&1
  echo "bench $label: rc=$? at $(( $(date +%s) - t_start )) s" | tee -a "$S"
}
bench default "$OUT/bench_default.json" --backend triton,flashinfer --cases "${CASES:-scripts/device/decode_targets.json}"
bench b2b "$OUT/bench_b2b.json" --backend triton,flashinfer --cases "${CASES_B2B:-scripts/device/decode_targets_b2b.json}" --launches 10
# GRAPH=1: the same cases as b2b, each forward replayed from a CUDA graph (--graph)
if [ "${GRAPH:-0}" = 1 ]; then
  bench graph "$OUT/bench_graph.json" --backend triton,flashinfer --cases "${CASES_B2B:-scripts/device/decode_targets_b2b.json}" --graph
fi
if [ "${SKIP_PEERS:-0}" != 1 ]; then
  (cd scripts/device && PYTHONUNBUFFERED=1 OUT="$OUT" timeout "${PEERS_TIMEOUT:-80}" python3 decode_peers.py) > "$OUT/peers.log" 2>&1
  echo "peers: rc=$? at $(( $(date +%s) - t_start )) s" | tee -a "$S"
fi
for spec in ${VARIANTS:-}; do
  v=${spec%%@*}; vcases="${VARIANT_CASES:-scripts/device/decode_variants.json}"
  [ "$v" != "$spec" ] && vcases=${spec#*@}
  [ "$(left)" -lt 40 ] && { echo "variant $spec: skipped (time)" | tee -a "$S"; continue; }
  timeout "${VARIANT_TIMEOUT:-100}" env ${v//,/ } "$cli" bench --device cuda --backend "${VARIANT_BACKENDS:-triton,flashinfer}" \
    --cases "$vcases" ${VARIANT_ARGS:-} > "$OUT/v.log" 2>&1
  echo "=== variant $v" >> "$OUT/bench.log"; cat "$OUT/v.log" >> "$OUT/bench.log"
  echo "variant $v: at $(( $(date +%s) - t_start )) s" | tee -a "$S"
  grep -E "^(triton|flashinfer) " "$OUT/v.log" | awk -v v="$v" '{sub("decode_","",$2); sub("_h32x8_d128","",$2); print "  [" v "]", $1, $2, $3, $5}' | tee -a "$S"
done
rm -f "$OUT/v.log"
for spec in ${NCU:-}; do
  [ "$(left)" -lt 35 ] && { echo "ncu $spec: skipped (time)" | tee -a "$S"; continue; }
  be=${spec%%:*}; filt=${spec#*:}
  echo "=== ncu $spec" >> "$OUT/ncu.txt"
  timeout 60 ncu --clock-control none --launch-skip 3 --launch-count 1 \
    -k "regex:paged_decode_ring|mma_decode_kernel" --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats ${NCU_ARGS:---print-details all} \
    "$cli" bench --device cuda --backend "$be" --cases scripts/device/decode_variants.json \
    --filter "$filt" --warmup 2 --iters 3 >> "$OUT/ncu.txt" 2>&1
  echo "ncu $spec: rc=$? at $(( $(date +%s) - t_start )) s" | tee -a "$S"
done
for j in default b2b graph; do
  [ -f "$OUT/bench_$j.json" ] || continue
  echo "=== $j"
  python3 scripts/device/decode_summary.py "$OUT/bench_$j.json" 2>&1 | head -30
done
if [ -f "$OUT/peers.log" ]; then echo "=== peers"; tail -10 "$OUT/peers.log"; fi
echo "=== summary"; cat "$S"
if [ -f "$OUT/ncu.txt" ]; then
  echo "=== ncu (key lines)"
  grep -E "^=== ncu|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|L2 Hit" "$OUT/ncu.txt" | head -40
fi
exit 0
