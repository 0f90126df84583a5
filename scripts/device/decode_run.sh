#!/usr/bin/env bash
# Decode experiment on the device machine (carry .deps and .peers like check.sh): builds only the
# CLI and the triton/flashinfer GPU tests, runs those tests, times the decode target shapes
# (scripts/device/decode_targets.json) for triton and flashinfer, then the small decode peers
# (copy ceiling, SDPA cuDNN / FA2 on contiguous KV). Knobs: STAGES="build test bench peers",
# CTEST_REGEX (default '[Tt]riton|[Ff]lash[Ii]nfer'), CASES, CASES_B2B, ARCHS.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
STAGES="${STAGES:-build test bench peers}"
build="$root/build/device"
has() { [[ " $STAGES " == *" $1 "* ]]; }
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) date: $(date -u +%FT%RZ) commit: $(git rev-parse --short HEAD 2>/dev/null)" | tee "$OUT/summary.txt"
if has build; then
  t0=$(date +%s)
  attnkit_configure "$build" "${ARCHS:-90a-real}" > "$OUT/build.log" 2>&1 &&
    ninja -C "$build" -j16 attnkit_cli test_triton_cases test_flashinfer_cases \
      test_triton_cuda_graph >> "$OUT/build.log" 2>&1
  rc=$?
  echo "build: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
fi
if has test; then
  t0=$(date +%s)
  ctest --test-dir "$build" -L gpu -R "${CTEST_REGEX:-[Tt]riton|[Ff]lash[Ii]nfer}" --output-on-failure \
    --timeout 200 -j4 > "$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed" "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/ctest.log" | head -20 | tee -a "$OUT/summary.txt"
  grep -E "Failure|Expected|actual|max_abs|error" "$OUT/ctest.log" | head -20
  echo "ctest: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi
if has bench; then
  timeout 150 "$build/tools/attnkit/attnkit" bench --backend triton,flashinfer \
    --cases "${CASES:-scripts/device/decode_targets.json}" --device cuda \
    --json "$OUT/bench_decode.json" > "$OUT/bench.log" 2>&1
  echo "bench: rc=$?" | tee -a "$OUT/summary.txt"
  timeout 90 "$build/tools/attnkit/attnkit" bench --backend triton,flashinfer \
    --cases "${CASES_B2B:-scripts/device/decode_targets_b2b.json}" --device cuda --launches 10 \
    --json "$OUT/bench_decode_b2b.json" > "$OUT/bench_b2b.log" 2>&1
  echo "bench --launches 10: rc=$?" | tee -a "$OUT/summary.txt"
fi
if has peers; then
  PYTHONUNBUFFERED=1 OUT="$OUT" timeout 90 python3 scripts/device/decode_peers.py > "$OUT/peers.log" 2>&1
  echo "peers: rc=$?" | tee -a "$OUT/summary.txt"
fi
echo "=== bench ==="; grep -E "^(triton|flashinfer) |ceiling" "$OUT/bench.log" 2>/dev/null
echo "=== bench --launches 10 ==="; grep -E "^(triton|flashinfer) |ceiling" "$OUT/bench_b2b.log" 2>/dev/null
if [ -f "$OUT/peers.log" ]; then echo "=== peers ==="; tail -12 "$OUT/peers.log"; fi
exit 0
