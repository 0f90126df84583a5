#!/usr/bin/env bash
# fa3 unit-boundary timeline (issue 6, the per-unit overhead of docs/perf/fa3_notes.md session 32):
# builds attnkit_cli with -DATTNKIT_FA3_TIMELINE (clock64 stamps at the bf16 / f16 kernel's unit
# boundaries; a diagnostic build, never the default: the default kernels' SASS is unchanged), times
# the d 128 cases of bench/cases/fa3_prefill.json with the stamps off and on, keeps each case's
# last launch's stamps and summarises them (scripts/device/fa3_timeline.py).
# Runs ON the device machine from the repository root with .deps beside it:
#   run(carry=[".deps"], command="bash scripts/device/fa3_timeline.sh")
# Knobs: CASE_INDICES (see below), BENCH_ENV (extra fa3 env settings, "A=1 B=0"), SKIP_BUILD=1.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT/tl"
build="$root/build/device-timeline"
summary="$OUT/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
note "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1) date: $(date -u +%Y-%m-%dT%H:%MZ) commit: $(git rev-parse --short HEAD 2>/dev/null)"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  t0=$(date +%s)
  attnkit_configure "$build" 90a-real "128" -DCMAKE_CUDA_FLAGS=-DATTNKIT_FA3_TIMELINE \
    -DCMAKE_CXX_FLAGS=-DATTNKIT_FA3_TIMELINE > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  ninja -C "$build" -j16 attnkit_cli >> "$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi
cli="$build/tools/attnkit/attnkit"
# One case file per case (CASE_INDICES: indices into bench/cases/fa3_prefill.json; default the d 128
# causal and bidirectional 4k / 8k / 16k), so each timeline file holds its case's last launch.
# FP8 KV cases (10..13) record the three-warpgroup loop's per-block stamps instead, summarised by
# scripts/device/fa3_fp8_timeline.py.
for i in ${CASE_INDICES:-0 1 2 3 4 5}; do
  kind=$(python3 - "$i" "$OUT/case_$i.json" <<'PY'
import json, sys
d = json.load(open("bench/cases/fa3_prefill.json"))
d["cases"] = [d["cases"][int(sys.argv[1])]]
json.dump(d, open(sys.argv[2], "w"))
print("fp8" if d["cases"][0].get("kv_dtype", "").startswith("fp8") else "bf16")
PY
)
  args=(bench --cases "$OUT/case_$i.json" --device cuda --backend fa3 --warmup 3 --iters 10)
  # shellcheck disable=SC2086
  env ${BENCH_ENV:-} timeout 60 "$cli" "${args[@]}" 2>&1 | grep -E "^fa3 " | sed 's/^/stamps off: /' | tee -a "$summary"
  # shellcheck disable=SC2086
  env ${BENCH_ENV:-} ATTNKIT_FA3_TIMELINE="$OUT/tl/case_$i.bin" timeout 60 "$cli" "${args[@]}" 2>&1 |
    grep -E "^fa3 " | sed 's/^/stamps on:  /' | tee -a "$summary"
  [ "$kind" = fp8 ] && mv "$OUT/tl/case_$i.bin" "$OUT/tl/fp8_case_$i.bin" 2>/dev/null
  rm -f "$OUT/case_$i.json"
done
: > "$OUT/timeline.txt"
ls "$OUT"/tl/case_*.bin > /dev/null 2>&1 &&
  python3 scripts/device/fa3_timeline.py "$OUT"/tl/case_*.bin >> "$OUT/timeline.txt" 2>&1
ls "$OUT"/tl/fp8_case_*.bin > /dev/null 2>&1 &&
  python3 scripts/device/fa3_fp8_timeline.py "$OUT"/tl/fp8_case_*.bin >> "$OUT/timeline.txt" 2>&1
cat "$OUT/timeline.txt" >> "$summary"
tar -C "$OUT" -czf "$OUT/tl.tar.gz" tl && rm -rf "$OUT/tl"
