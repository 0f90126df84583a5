#!/usr/bin/env bash
# Runs ON the device machine's host CPU (a Xeon with AMX-BF16), from the repository root, carrying
# .deps (see check.sh): builds only the CPU targets (no CUDA), runs the intel_amx tests on the amx
# path, then `attnkit bench --device cpu` (prefill: all cases; decode: batch 8, kv 4096, bf16 and
# fp8_e4m3 KV) with all cores and with 2 threads, and torch_native on the bf16 decode point.
# Prefill 2k runs once per AMX experiment variant (PREFILL_VARIANTS: label=ENV=VALUE,...; the
# backend reads ATTNKIT_AMX_PREPACK / _KEY_BLOCK / _ROWS_PER_ITEM) with all cores and 2 threads.
# Every step has its own time limit so the whole stays under ~290 s. Files back from $OUT (8 at
# most): build.log test_amx.log bench.log summary.txt results.tar.gz (every JSON).
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
  echo "nproc: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)  pin: ${PIN:-1}"
} > "$log"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
. scripts/device/lib.sh
attnkit_configure_cpu "$build" \
  > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "configure FAILED"; exit 1; }
timeout 120 ninja -C "$build" -j16 attnkit_cli test_intel_amx >> "$OUT/build.log" 2>&1
echo "build: rc=$? at $(elapsed) s" | tee -a "$log"
fi

timeout 60 "$build/tests/test_intel_amx" --gtest_filter='*amx*:*Fp8DecodeShapes*' > "$OUT/test_amx.log" 2>&1
echo "test_intel_amx (amx path, fp8 decode shapes on every path): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_amx.log" | tr '\n' ' ')" |
  tee -a "$log"

A="$build/tools/attnkit/attnkit"
# Pinned OpenMP threads (one per core, spread): unpinned 2-thread runs of 2026-11-22 drew AMX peaks
# of 1.9 and 4.6 TFLOP/s in processes seconds apart (threads sharing a core or not). Added after
# that run; not yet run on the device. PIN=0 restores the unpinned runs.
if [ "${PIN:-1}" = 1 ]; then
  export OMP_PROC_BIND="${OMP_PROC_BIND:-spread}" OMP_PLACES="${OMP_PLACES:-cores}"
fi
bench() {  # bench LIMIT_S ARGS...: one attnkit bench run, stdout appended to bench.log
  local limit=$1
  shift
  echo "### $* (at $(elapsed) s, OMP_NUM_THREADS=${OMP_NUM_THREADS:-all})" >> "$log"
  timeout "$limit" "$A" bench --device cpu "$@" >> "$log" 2> >(grep -v '^\[' >> "$log")
  echo "rc=$?" >> "$log"
}
mkdir -p "$OUT/json"
J="$OUT/json"
# Prefill is compute-bound: 64 MiB of rotating inputs keeps the set-up (random data) short.
# Variants first (the point of the run), all cores then 2 threads.
variants="${PREFILL_VARIANTS:-base= perItem=ATTNKIT_AMX_PREPACK=0 kb256=ATTNKIT_AMX_KEY_BLOCK=256 rows512=ATTNKIT_AMX_ROWS_PER_ITEM=512 kb256rows512=ATTNKIT_AMX_KEY_BLOCK=256,ATTNKIT_AMX_ROWS_PER_ITEM=512}"
for threads in all 2; do
  for v in $variants; do
    label="${v%%=*}"
    envs="${v#*=}"
    [ "$(elapsed)" -lt 170 ] || { echo "skip prefill $label $threads (time)" >> "$log"; continue; }
    (
      [ "$threads" = all ] || export OMP_NUM_THREADS=$threads
      IFS=, ; for e in $envs; do [ -n "$e" ] && export "$e"; done; unset IFS
      echo "### variant $label threads $threads env: $envs" >> "$log"
      bench 25 --backend intel_amx --cases bench/cases/cpu_prefill.json --filter new2048 \
        --rotate-mib 64 --iters 15 --json "$J/prefill_${threads}t_${label}.json"
    )
  done
done
# Decode streams from memory: default rotation (> 2 x LLC); paired copy rounds (default 9).
[ "$(elapsed)" -lt 185 ] && bench 30 --backend intel_amx --cases bench/cases/cpu_decode.json \
  --filter b8_kv4096_p16_h32x8_d128_kvbf16 --json "$J/decode_allt.json"
[ "$(elapsed)" -lt 200 ] && OMP_NUM_THREADS=2 bench 75 --backend intel_amx \
  --cases bench/cases/cpu_decode.json --filter b8_kv4096_p16_h32x8_d128 \
  --json "$J/decode_2t.json"
[ "$(elapsed)" -lt 200 ] && bench 25 --backend intel_amx --cases bench/cases/cpu_prefill.json \
  --rotate-mib 64 --json "$J/prefill_allt_all_cases.json"
echo "done at $(elapsed) s" >> "$log"
tar -czf "$OUT/results.tar.gz" -C "$OUT" json
rm -rf "$OUT/json/"
grep -E "^(date|Model name|CPU\(s\)|flags|build|test_intel|# ceiling cpu_(copy|amx)|intel_amx |###|rc=|skip|done)" "$log" |
  sed -E 's/  +/ /g' | tee "$OUT/summary.txt"
