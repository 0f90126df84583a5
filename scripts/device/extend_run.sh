#!/usr/bin/env bash
# The extend engineer's device run (issues #4 / #5), from the repository root on the device:
#   1. scripts/device/check.sh: build (CLI + the flashinfer / fa3 / triton GPU tests), ctest subset,
#      SDPA FA2 / cuDNN prefill peers, extend bench of triton, flashinfer (SM90: wgmma prefill) and fa3;
#   2. flashinfer's cascade A/B on bench/cases/cascade.json (ATTNKIT_FLASHINFER_CASCADE=0 / 1);
#   3. flashinfer with its SM90 prefill routing off (ATTNKIT_FLASHINFER_SM90_PREFILL=0: mma.sync);
#   4. the summary table (scripts/device/extend_summary.py) last.
# Knobs: EXTEND_CASES (default scripts/device/extend_prefill_quick.json), CTEST_REGEX, STAGES (of
# check.sh), SKIP_AB=1 (no step 3), CASCADE=0 (no step 2), PREBUILT=attnkit.gz (a CLI built
# elsewhere: no build / tests, peers + benches only; BENCH_BACKENDS then names the extend bench's
# backends, none when unset), CASCADE_TIMEOUT / MMASYNC_TIMEOUT (s per bench). Every bench runs
# under one timeout level (a nested `timeout` keeps its child alive when the outer one fires, so
# check.sh's own bench limit is the one that counts). $OUT gets at most 8 files: summary.txt,
# bench_extend.json, prefill_peers.json, bench_cascade_off.json, bench_cascade_on.json,
# bench_mmasync.json, summary_table.txt, logs.tar.gz (build, ctest, bench, peers logs).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
export OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
cases="${EXTEND_CASES:-scripts/device/extend_prefill_quick.json}"
t_start=$(date +%s)

cli=build/device/tools/attnkit/attnkit
# PREBUILT=file.gz: a gzipped attnkit CLI built elsewhere (same sources, sm_90a, CUDA 13): no build,
# no tests; the peers and the benches only (falls back to check.sh when it does not run here).
if [ -n "${PREBUILT:-}" ]; then
  mkdir -p "$(dirname "$cli")" && gunzip -c "$PREBUILT" > "$cli" && chmod +x "$cli"
  if ! "$cli" --help > /dev/null 2>&1; then
    echo "prebuilt CLI does not run here: building" | tee -a "$OUT/summary.txt"
    PREBUILT=""
  fi
fi
if [ -z "${PREBUILT:-}" ]; then
  STAGES="${STAGES:-build test peers bench}" \
    TARGETS="attnkit_cli test_flashinfer_cases test_flashinfer_cascade test_fa3_cases test_triton_cases test_triton_cuda_graph" \
    CTEST_REGEX="${CTEST_REGEX:-FlashInfer|Fa3|Triton}" BENCH_KINDS=extend EXTEND_CASES="$cases" \
    BENCH_BACKENDS="${BENCH_BACKENDS:-triton,flashinfer,fa3}" BENCH_TIMEOUT="${BENCH_TIMEOUT:-100}" \
    PEERS_SCRIPT=scripts/device/prefill_peers.py PEERS_TIMEOUT=60 \
    timeout "${CHECK_TIMEOUT:-205}" bash scripts/device/check.sh > "$OUT/check.log" 2>&1
  echo "check.sh: rc=$? ($(( $(date +%s) - t_start )) s)" | tee -a "$OUT/summary.txt"
else
  echo "prebuilt CLI: $(date -u +%Y-%m-%dT%H:%MZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> "$OUT/summary.txt"
  PYTHONUNBUFFERED=1 timeout 60 python3 scripts/device/prefill_peers.py > "$OUT/peers.log" 2>&1
  echo "peers: rc=$?" >> "$OUT/summary.txt"
  : > "$OUT/build.log"; : > "$OUT/ctest.log"; : > "$OUT/check.log"
fi

bench() {  # bench LABEL TIMEOUT ENV... -- ARGS...
  local label=$1 limit=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "=== $label: ${envs[*]} attnkit bench $*" >> "$OUT/bench.log"
  env "${envs[@]}" timeout "$limit" "$cli" bench --device cuda --json "$OUT/bench_$label.json" "$@" \
    >> "$OUT/bench.log" 2>&1
  echo "bench $label: rc=$? ($(( $(date +%s) - t_start )) s)" | tee -a "$OUT/summary.txt"
}
if [ -x "$cli" ]; then
  if [ -n "${PREBUILT:-}" ] && [ -n "${BENCH_BACKENDS:-}" ]; then
    bench extend "${BENCH_TIMEOUT:-100}" ATTNKIT_NONE=1 -- --backend "$BENCH_BACKENDS" --cases "$cases"
  fi
  if [ "${CASCADE:-1}" = 1 ]; then
    bench cascade_off "${CASCADE_TIMEOUT:-25}" ATTNKIT_FLASHINFER_CASCADE=0 -- --backend flashinfer --cases bench/cases/cascade.json
    bench cascade_on "${CASCADE_TIMEOUT:-25}" ATTNKIT_FLASHINFER_CASCADE=1 -- --backend flashinfer --cases bench/cases/cascade.json
  fi
  if [ "${SKIP_AB:-0}" != 1 ]; then
    bench mmasync "${MMASYNC_TIMEOUT:-25}" ATTNKIT_FLASHINFER_SM90_PREFILL=0 -- --backend flashinfer --cases "$cases"
  fi
fi

python3 scripts/device/extend_summary.py > "$OUT/summary_table.txt" 2>&1
(cd "$OUT" && tar czf logs.tar.gz build.log ctest.log bench.log peers.log check.log 2>/dev/null &&
  rm -f build.log ctest.log bench.log peers.log check.log torch_peers.json)
echo "==================== extend run ($(( $(date +%s) - t_start )) s) ===================="
cat "$OUT/summary.txt"
cat "$OUT/summary_table.txt"
