#!/usr/bin/env bash
# Session 8 (issue 8) check of the intel_amx backend ON the device machine's host CPU (AMX Xeon),
# from the repository root, carrying .deps. CPU-only build; test_intel_amx on the amx path (the
# AMX decode and extend against the fp64 reference); then A/B benches alternated in one process
# tree: decode b8 kv4096 bf16 with the AMX decode (default) vs ATTNKIT_AMX_DECODE=0 (the vector
# decode), 2 threads pinned to 2 distinct cores (taskset) and all threads; prefill 2k causal with
# the default vs the PREFILL_AB variant (an env assignment; empty: base only), 2 threads and all.
# Files back from $OUT: build.log test_amx.log bench.log summary.txt results.tar.gz (every JSON).
#   run(carry=[".wt/amx", ".deps"], command="cd .wt/amx && ln -sfn ../../.deps .deps &&
#       bash scripts/device/cpu_amx_s8.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="${BUILD_DIR:-$root/build/cpu-device}"
log="$OUT/bench.log"
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
LIMIT="${LIMIT:-215}"  # stop starting benches after this many seconds

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  tree: ${TREE_ID:-unknown}"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L1d cache|L2 cache|L3 cache|CPU max MHz)'
  echo "flags: $(grep -m1 -o -w -E 'amx_bf16|amx_tile|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "nproc: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$log"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  . scripts/device/lib.sh
  attnkit_configure_cpu "$build" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  timeout 150 ninja -C "$build" -j16 attnkit_cli test_intel_amx >> "$OUT/build.log" 2>&1
  echo "build: rc=$? at $(elapsed) s" | tee -a "$log"
fi

timeout 60 "$build/tests/test_intel_amx" --gtest_filter='*amx*' > "$OUT/test_amx.log" 2>&1
echo "test_intel_amx *amx* (AMX decode default): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_amx.log" | tr '\n' ' ')" |
  tee -a "$log"
grep -E '^\[  FAILED' "$OUT/test_amx.log" | head -20 >> "$log"

A="$build/tools/attnkit/attnkit"
# Two CPUs on distinct cores (the first CPU of the first two cores).
cpus2="$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | head -2 | cut -d, -f1 | paste -sd,)"
echo "2-thread runs: taskset -c $cpus2" >> "$log"
export OMP_PROC_BIND=true OMP_PLACES=cores
bench() {  # bench LABEL THREADS ENV ARGS...: one attnkit bench process (ENV "" or NAME=VALUE)
  local label=$1 threads=$2 envs=$3
  shift 3
  [ "$(elapsed)" -lt "$LIMIT" ] || { echo "skip $label (time)" >> "$log"; return; }
  echo "### $label threads=$threads env=${envs:-none} load=$(cut -d' ' -f1 /proc/loadavg) (at $(elapsed) s)" >> "$log"
  (
    [ -n "$envs" ] && export "${envs?}"
    if [ "$threads" = 2 ]; then
      OMP_NUM_THREADS=2 timeout 40 taskset -c "$cpus2" "$A" bench --device cpu "$@"
    else
      timeout 40 "$A" bench --device cpu "$@"
    fi
  ) >> "$log" 2> >(grep -v '^\[' >> "$log")
  echo "rc=$?" >> "$log"
}
mkdir -p "$OUT/json"
J="$OUT/json"
DEC=(--backend intel_amx --cases bench/cases/cpu_decode.json
  --filter b8_kv4096_p16_h32x8_d128_kvbf16 --iters 15 --paired-rounds 7)
PRE=(--backend intel_amx --cases bench/cases/cpu_prefill.json --filter new2048 --rotate-mib 64
  --iters 15)
# Run 2 (after run 1 made the no-prefetch AMX decode the default): prefill default vs PREFILL_AB
# (2 threads, then all), then decode default vs whole-row prefetch (ATTNKIT_AMX_DECODE_PF=2) vs
# rows one sub-block further (=3) vs the vector decode (2 threads, then all). ~240 s wall.
for r in 1 2; do
  bench "prefill base r$r" 2 "" "${PRE[@]}" --json "$J/pre_2t_base_$r.json"
  [ -n "${PREFILL_AB:-}" ] && bench "prefill ab r$r" 2 "$PREFILL_AB" "${PRE[@]}" --json "$J/pre_2t_ab_$r.json"
done
bench "prefill base r1" all "" "${PRE[@]}" --json "$J/pre_allt_base_1.json"
[ -n "${PREFILL_AB:-}" ] && bench "prefill ab r1" all "$PREFILL_AB" "${PRE[@]}" --json "$J/pre_allt_ab_1.json"
for r in 1 2; do
  bench "decode amx r$r" 2 "" "${DEC[@]}" --json "$J/dec_2t_amx_$r.json"
  bench "decode amx-pfrows r$r" 2 ATTNKIT_AMX_DECODE_PF=2 "${DEC[@]}" --json "$J/dec_2t_pf2_$r.json"
  bench "decode amx-pffar r$r" 2 ATTNKIT_AMX_DECODE_PF=3 "${DEC[@]}" --json "$J/dec_2t_pf3_$r.json"
  bench "decode vec r$r" 2 ATTNKIT_AMX_DECODE=0 "${DEC[@]}" --json "$J/dec_2t_vec_$r.json"
done
bench "decode amx r1" all "" "${DEC[@]}" --json "$J/dec_allt_amx_1.json"
bench "decode vec r1" all ATTNKIT_AMX_DECODE=0 "${DEC[@]}" --json "$J/dec_allt_vec_1.json"
bench "decode amx-pfrows r1" all ATTNKIT_AMX_DECODE_PF=2 "${DEC[@]}" --json "$J/dec_allt_pf2_1.json"
# Every decode case, verified, with the reference (>= 5x), all threads.
bench "decode all cases + torch_native" all "" --backend intel_amx,torch_native \
  --cases bench/cases/cpu_decode.json --verify --warmup 1 --iters 3 --paired-rounds 0 \
  --json "$J/dec_allt_cases.json"
echo "done at $(elapsed) s" >> "$log"
tar -czf "$OUT/results.tar.gz" -C "$OUT" json
rm -rf "$OUT/json/"
grep -E "^(date|Model name|CPU\(s\)|Thread|flags|nproc|build|test_intel|\[  FAILED|2-thread|# ceiling cpu_(copy|amx)|intel_amx |torch_native |###|rc=|skip|done)" "$log" |
  sed -E 's/  +/ /g' > "$OUT/summary.txt"
