#!/usr/bin/env bash
# The triton extend A/B of issue #4 on the device, from the repository root (carry .deps, .peers):
#   1. check.sh build (attnkit_cli, test_triton_cases, test_triton_cuda_graph) into BUILD_DIR;
#   2. SDPA FlashAttention-2 / cuDNN peers (scripts/device/prefill_peers.py, PEERS_SHAPES);
#   3. attnkit bench --backend triton on AB_CASES once per VARIANTS value (in that order; "-" =
#      the variable unset, i.e. the default kernel);
#   4. in parallel (after the benches, so they do not disturb the timing): ctest -L gpu -R Triton
#      (default kernel; SKIP_CTEST=1: none) and, per TEST_VARIANTS value, the extend / verify /
#      mixed / draft cases of test_triton_cases with ATTNKIT_TRITON_EXTEND_VARIANT;
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
variants="${VARIANTS-0 1 0}"
test_variants="${TEST_VARIANTS-}"
logs=/tmp/ab_logs
rm -rf "$logs" /tmp/ab_bench && mkdir -p "$logs" /tmp/ab_bench
t_start=$(date +%s)
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)"

OUT="$logs/build" STAGES=build BUILD_DIR="$build" ARCHS="${ARCHS:-90a-real}" \
  TARGETS="${TARGETS:-attnkit_cli test_triton_cases test_triton_cuda_graph}" \
  timeout "${BUILD_TIMEOUT:-150}" bash scripts/device/check.sh > "$logs/check_build.log" 2>&1
note "build: rc=$? ($(( $(date +%s) - t_start )) s): $(grep -h 'build:' "$logs/build/summary.txt" 2>/dev/null)"

if [ -n "${PEERS_SHAPES-4,4096,128 2,8192,128}" ]; then
  PEERS_SHAPES="${PEERS_SHAPES-4,4096,128 2,8192,128}" PYTHONUNBUFFERED=1 \
    timeout "${PEERS_TIMEOUT:-60}" python3 scripts/device/prefill_peers.py > "$logs/peers.log" 2>&1
  note "peers: rc=$? ($(( $(date +%s) - t_start )) s)"
fi

cli="$build/tools/attnkit/attnkit"
i=0
for v in $variants; do
  [ "$v" = "-" ] && v=""
  ATTNKIT_TRITON_EXTEND_VARIANT=$v timeout "${BENCH_TIMEOUT:-40}" "$cli" bench --device cuda \
    --backend triton --cases "$cases" --json "/tmp/ab_bench/v${i}_${v:-default}.json" \
    >> "$logs/bench.log" 2>&1
  note "bench variant ${v:-default} (#$i): rc=$? ($(( $(date +%s) - t_start )) s)"
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
vpids=()
for v in $test_variants; do
  ATTNKIT_TRITON_EXTEND_VARIANT=$v timeout "${TEST_TIMEOUT:-120}" "$bin" \
    --gtest_filter="${VARIANT_FILTER:-*extend*:*verify*:*mixed*:*draft*}" --gtest_brief=1 \
    > "$logs/variant_$v.log" 2>&1 &
  vpids+=("$!:$v")
done
for pv in "${vpids[@]}"; do
  wait "${pv%%:*}"
  rc=$?
  v=${pv##*:}
  note "variant $v tests: rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/variant_$v.log" | tr '\n' ' ')"
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
