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
# Parameters (environment; a variant is NAME=VALUE[,NAME=VALUE...]; lists are space-separated):
#   PREFILL_AB      prefill variants beside the default (2 threads x PREFILL_ROUNDS, all threads x 1)
#   DECODE_AB       decode variants alternated with the default, 2 threads x DECODE_ROUNDS
#                   (default: the session-8 prefetch modes and the vector decode)
#   DECODE_ONCE     decode variants run once at 2 threads after the rounds
#   DECODE_ALLT_AB  decode variants beside the default at all threads (one process each)
#   DEC_ITERS / DEC_PAIRED  --iters / --paired-rounds of the decode benches (15 / 7)
#   TEST_ENVS       extra test_intel_amx *amx* runs, one per variant exported (new defaults)
#   CASES_ALL=0     skips the every-decode-case run with torch_native
#   LIMIT           no bench starts after this many seconds (215)
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

export_variant() {  # export_variant NAME=VALUE[,NAME=VALUE...] (in the calling subshell)
  local kv
  local IFS=','
  for kv in $1; do export "${kv?}"; done
}
timeout 60 "$build/tests/test_intel_amx" --gtest_filter='*amx*' > "$OUT/test_amx.log" 2>&1
echo "test_intel_amx *amx* (AMX decode default): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_amx.log" | tr '\n' ' ')" |
  tee -a "$log"
grep -E '^\[  FAILED' "$OUT/test_amx.log" | head -20 >> "$log"
for tv in ${TEST_ENVS:-}; do
  (
    export_variant "$tv"
    timeout 60 "$build/tests/test_intel_amx" --gtest_filter='*amx*' > "$OUT/test_amx_env.log" 2>&1
    echo "test_intel_amx *amx* with $tv: rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_amx_env.log" | tr '\n' ' ')" |
      tee -a "$log"
    grep -E '^\[  FAILED' "$OUT/test_amx_env.log" | head -20 >> "$log"
  )
done

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
    [ -n "$envs" ] && export_variant "$envs"
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
  --filter b8_kv4096_p16_h32x8_d128_kvbf16 --iters "${DEC_ITERS:-15}" --paired-rounds "${DEC_PAIRED:-7}")
PRE=(--backend intel_amx --cases bench/cases/cpu_prefill.json --filter new2048 --rotate-mib 64
  --iters 15)
# Session 8 run 2 defaults: prefill default vs PREFILL_AB, decode default vs whole-row prefetch
# (ATTNKIT_AMX_DECODE_PF=2), rows one sub-block further (=3) and the vector decode. ~240 s wall.
DECODE_AB="${DECODE_AB-ATTNKIT_AMX_DECODE_PF=2 ATTNKIT_AMX_DECODE_PF=3 ATTNKIT_AMX_DECODE=0}"
DECODE_ALLT_AB="${DECODE_ALLT_AB-ATTNKIT_AMX_DECODE=0 ATTNKIT_AMX_DECODE_PF=2}"
tag() { echo "$1" | tr -c 'A-Za-z0-9\n' '_'; }  # a variant as a file name
for r in $(seq 1 "${PREFILL_ROUNDS:-2}"); do
  bench "prefill base r$r" 2 "" "${PRE[@]}" --json "$J/pre_2t_base_$r.json"
  for v in ${PREFILL_AB:-}; do
    bench "prefill ab r$r" 2 "$v" "${PRE[@]}" --json "$J/pre_2t_$(tag "$v")_$r.json"
  done
done
for r in $(seq 1 "${DECODE_ROUNDS:-2}"); do
  bench "decode amx r$r" 2 "" "${DEC[@]}" --json "$J/dec_2t_amx_$r.json"
  for v in $DECODE_AB; do
    bench "decode ab r$r" 2 "$v" "${DEC[@]}" --json "$J/dec_2t_$(tag "$v")_$r.json"
  done
done
for v in ${DECODE_ONCE:-}; do
  bench "decode once" 2 "$v" "${DEC[@]}" --json "$J/dec_2t_$(tag "$v")_once.json"
done
bench "prefill base r1" all "" "${PRE[@]}" --json "$J/pre_allt_base_1.json"
for v in ${PREFILL_AB:-}; do
  bench "prefill ab r1" all "$v" "${PRE[@]}" --json "$J/pre_allt_$(tag "$v")_1.json"
done
bench "decode amx r1" all "" "${DEC[@]}" --json "$J/dec_allt_amx_1.json"
for v in $DECODE_ALLT_AB; do
  bench "decode ab r1" all "$v" "${DEC[@]}" --json "$J/dec_allt_$(tag "$v")_1.json"
done
if [ "${CASES_ALL:-1}" != 0 ]; then
  # Every decode case, verified, with the reference (>= 5x), all threads.
  bench "decode all cases + torch_native" all "" --backend intel_amx,torch_native \
    --cases bench/cases/cpu_decode.json --verify --warmup 1 --iters 3 --paired-rounds 0 \
    --json "$J/dec_allt_cases.json"
fi
echo "done at $(elapsed) s" >> "$log"
tar -czf "$OUT/results.tar.gz" -C "$OUT" json
rm -rf "$OUT/json/"
grep -E "^(date|Model name|CPU\(s\)|Thread|flags|nproc|build|test_intel|\[  FAILED|2-thread|# ceiling cpu_(copy|read|amx)|#   intel_amx|intel_amx |torch_native |###|rc=|skip|done)" "$log" |
  sed -E 's/  +/ /g' > "$OUT/summary.txt"
