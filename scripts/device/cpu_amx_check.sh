#!/usr/bin/env bash
# Runs ON the device machine's host CPU (a Xeon with AMX-BF16), from the repository root, carrying
# .deps (see check.sh): builds only the CPU targets (no CUDA), runs the intel_amx tests on the amx
# path, then `attnkit bench --device cpu` (prefill: all cases; decode: batch 8, kv 4096, bf16 and
# fp8_e4m3 KV) with all cores and with 2 threads, and torch_native on the bf16 decode point.
# Every step has its own time limit so the whole stays under ~230 s. At most 8 files come back
# from $OUT: build.log test_amx.log bench.log prefill_all.json prefill_2t.json decode_all.json
# decode_2t.json torch_native.json.
#   run(carry=[".deps"], command="bash scripts/device/cpu_amx_check.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="${BUILD_DIR:-$root/build/cpu-device}"  # BUILD_DIR / SKIP_BUILD=1: reuse a build (local dry runs)
log="$OUT/bench.log"
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null)"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L1d cache|L2 cache|L3 cache|CPU max MHz|CPU MHz)'
  echo "flags: $(grep -m1 -o -w -E 'amx_bf16|amx_tile|amx_int8|avx512_bf16|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "nproc: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$log"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=OFF \
  -DCMAKE_PREFIX_PATH="$root/.deps" -DATTNKIT_GTEST_SOURCE_DIR="$root/.deps/googletest" \
  > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "configure FAILED"; exit 1; }
timeout 120 ninja -C "$build" -j16 attnkit_cli test_intel_amx >> "$OUT/build.log" 2>&1
echo "build: rc=$? at $(elapsed) s" | tee -a "$log"
fi

timeout 45 "$build/tests/test_intel_amx" --gtest_filter='*amx*' > "$OUT/test_amx.log" 2>&1
echo "test_intel_amx (amx path): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_amx.log" | tr '\n' ' ')" |
  tee -a "$log"

A="$build/tools/attnkit/attnkit"
bench() {  # bench LIMIT_S ARGS...: one attnkit bench run, stdout appended to bench.log
  local limit=$1
  shift
  echo "### $* (at $(elapsed) s, OMP_NUM_THREADS=${OMP_NUM_THREADS:-all})" >> "$log"
  timeout "$limit" "$A" bench --device cpu "$@" >> "$log" 2> >(grep -v '^\[' >> "$log")
  echo "rc=$?" >> "$log"
}
# Prefill is compute-bound: 64 MiB of rotating inputs keeps the set-up (random data) short.
bench 40 --backend intel_amx --cases bench/cases/cpu_prefill.json --rotate-mib 64 \
  --json "$OUT/prefill_all.json"
OMP_NUM_THREADS=2 bench 25 --backend intel_amx --cases bench/cases/cpu_prefill.json \
  --filter new2048 --rotate-mib 64 --json "$OUT/prefill_2t.json"
# Decode streams from memory: default rotation (> 2 x LLC).
bench 35 --backend intel_amx --cases bench/cases/cpu_decode.json --filter b8_ \
  --json "$OUT/decode_all.json"
OMP_NUM_THREADS=2 bench 30 --backend intel_amx --cases bench/cases/cpu_decode.json --filter b8_ \
  --json "$OUT/decode_2t.json"
if [ "$(elapsed)" -lt 190 ]; then
  bench $(( 225 - $(elapsed) )) --backend torch_native --cases bench/cases/cpu_decode.json \
    --filter b8_kv4096_p16_h32x8_d128_kvbf16 --warmup 0 --iters 1 --json "$OUT/torch_native.json"
fi
echo "done at $(elapsed) s" >> "$log"
grep -E "^(date|Model name|CPU\(s\)|Thread|Core|Socket|flags|build|test_intel|# ceiling|intel_amx |torch_native |###|rc=|done)" "$log"
