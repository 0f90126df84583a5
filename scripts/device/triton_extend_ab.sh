#!/usr/bin/env bash
# The triton extend A/B of issue #4 on the device, from the repository root (carry .deps, .peers):
#   1. check.sh build (attnkit_cli, test_triton_cases, test_triton_cuda_graph) into BUILD_DIR;
#   2. SDPA FlashAttention-2 / cuDNN peers (scripts/device/prefill_peers.py, PEERS_SHAPES);
#   3. attnkit bench --backend triton on AB_CASES once per VARIANTS entry, in that order; an entry
#      is LABEL or LABEL:VAR=VALUE (that environment variable set for the run), e.g.
#      VARIANTS="new legacy:ATTNKIT_TRITON_EXTEND_LEGACY=1 new";
#   4. in parallel (after the benches, so they do not disturb the timing): ctest -L gpu -R Triton
#      (default kernel; SKIP_CTEST=1: none), per TEST_VARIANTS entry (same form) the extend /
#      verify / mixed / draft cases of test_triton_cases, and with SM80=1 the SM80 path: a second
#      build (ARCHS=80-virtual, BUILD_DIR80, made beside step 1) of test_triton_cases run with
#      ATTNKIT_EMULATE_CC=80 (the driver JIT-compiles the compute_80 PTX) on SM80_FILTER;
#   5. the table (scripts/device/triton_extend_ab.py) last.
# VARIANTS / TEST_VARIANTS empty: that step is skipped. $OUT gets: summary.txt, ab_table.txt, bench_ab.json, prefill_peers.json,
# logs.tar.gz.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
export OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="${BUILD_DIR:-$root/build-dev}"
cases="${AB_CASES:-scripts/device/triton_extend_d128.json}"
variants="${VARIANTS-new legacy:ATTNKIT_TRITON_EXTEND_LEGACY=1 new}"
test_variants="${TEST_VARIANTS-}"
logs=/tmp/ab_logs
rm -rf "$logs" /tmp/ab_bench && mkdir -p "$logs" /tmp/ab_bench
t_start=$(date +%s)
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)"

build80="${BUILD_DIR80:-$root/build-dev80}"
if [ "${SM80:-0}" = 1 ]; then  # the SM80 build goes beside the main one (CPU only, before timing)
  OUT="$logs/sm80" STAGES=build BUILD_DIR="$build80" ARCHS=80-virtual TARGETS=test_triton_cases \
    timeout "${BUILD_TIMEOUT:-150}" bash scripts/device/check.sh > "$logs/check_sm80.log" 2>&1 &
  sm80_build_pid=$!
fi
OUT="$logs/build" STAGES=build BUILD_DIR="$build" ARCHS="${ARCHS:-90a-real}" \
  TARGETS="${TARGETS:-attnkit_cli test_triton_cases test_triton_cuda_graph}" \
  timeout "${BUILD_TIMEOUT:-150}" bash scripts/device/check.sh > "$logs/check_build.log" 2>&1
note "build: rc=$? ($(( $(date +%s) - t_start )) s): $(grep -h 'build:' "$logs/build/summary.txt" 2>/dev/null)"
if [ -n "${sm80_build_pid:-}" ]; then
  wait "$sm80_build_pid"
  note "sm80 build (80-virtual): rc=$? ($(( $(date +%s) - t_start )) s): $(grep -h 'build:' "$logs/sm80/summary.txt" 2>/dev/null)"
fi

if [ -n "${PEERS_SHAPES-4,4096,128 2,8192,128}" ]; then
  PEERS_SHAPES="${PEERS_SHAPES-4,4096,128 2,8192,128}" PYTHONUNBUFFERED=1 \
    timeout "${PEERS_TIMEOUT:-60}" python3 scripts/device/prefill_peers.py > "$logs/peers.log" 2>&1
  note "peers: rc=$? ($(( $(date +%s) - t_start )) s)"
fi

cli="$build/tools/attnkit/attnkit"
i=0
# env_of ENTRY: the VAR=VALUE part of LABEL:VAR=VALUE (ATTNKIT_NONE=1 when there is none).
env_of() { if [[ "$1" == *:* ]]; then echo "${1#*:}"; else echo ATTNKIT_NONE=1; fi; }
for v in $variants; do
  env "$(env_of "$v")" timeout "${BENCH_TIMEOUT:-40}" "$cli" bench --device cuda \
    --backend triton --cases "$cases" --json "/tmp/ab_bench/v${i}_${v%%:*}.json" \
    >> "$logs/bench.log" 2>&1
  note "bench ${v} (#$i): rc=$? ($(( $(date +%s) - t_start )) s)"
  i=$((i + 1))
done

# The table now, so that it comes back even if the tests below run into the command's limit.
python3 scripts/device/triton_extend_ab.py /tmp/ab_bench "$OUT/prefill_peers.json" \
  "$OUT/bench_ab.json" > "$OUT/ab_table.txt" 2>&1
cat "$OUT/ab_table.txt"

if [ "${SKIP_CTEST:-0}" != 1 ]; then
  OUT="$logs/test" STAGES=test BUILD_DIR="$build" CTEST_REGEX="${CTEST_REGEX:-Triton}" \
    CTEST_JOBS="${CTEST_JOBS:-6}" timeout "${TEST_TIMEOUT:-120}" bash scripts/device/check.sh \
    > "$logs/check_test.log" 2>&1 &
  ctest_pid=$!
fi
bin=$(find "$build" -name test_triton_cases -type f -perm -u+x | head -1)
filter="${VARIANT_FILTER:-*extend*:*verify*:*mixed*:*draft*}"
vpids=()
for v in $test_variants; do
  env "$(env_of "$v")" timeout "${TEST_TIMEOUT:-120}" "$bin" --gtest_filter="$filter" \
    --gtest_brief=1 > "$logs/variant_${v%%:*}.log" 2>&1 &
  vpids+=("$!@${v%%:*}")
done
if [ "${SM80:-0}" = 1 ]; then
  bin80=$(find "$build80" -name test_triton_cases -type f -perm -u+x | head -1)
  ATTNKIT_EMULATE_CC=80 timeout "${SM80_TEST_TIMEOUT:-100}" "$bin80" \
    --gtest_filter="${SM80_FILTER:-$filter}" --gtest_brief=1 > "$logs/variant_sm80.log" 2>&1 &
  vpids+=("$!@sm80")
fi
for pv in "${vpids[@]}"; do
  wait "${pv%%@*}"
  rc=$?
  v=${pv##*@}
  note "tests $v: rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/variant_$v.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] ' "$logs/variant_$v.log" | head -5 | tee -a "$OUT/summary.txt"
done
if [ -n "${ctest_pid:-}" ]; then
  wait "$ctest_pid"
  note "ctest -R ${CTEST_REGEX:-Triton}: rc=$? $(cat "$logs/test/summary.txt" 2>/dev/null | grep -v '^device' | tr '\n' ' ')"
fi
note "tests done ($(( $(date +%s) - t_start )) s)"

(cd "$logs" && tar czf "$OUT/logs.tar.gz" . 2>/dev/null)
echo "==================== triton extend A/B ($(( $(date +%s) - t_start )) s) ===================="
cat "$OUT/summary.txt" "$OUT/ab_table.txt"
