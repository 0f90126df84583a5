#!/usr/bin/env bash
# Session 21 (issue 7): the MLA GPU tests and an A/B of the MLA decode: environment variants of this
# tree's CLI and, with BASE, of an older tree's. On the device machine, from the repository root
# with .deps carried (and BASE, made with `rm -rf .wt/base && mkdir -p .wt/base && git archive <rev>
# | tar -x -C .wt/base`):
#   run(carry=[".deps"], command="bash scripts/device/mla_check_ab_s21.sh")
# (1) build: with CTEST_REGEX (default "Mla|MLA|mla") scripts/device/check.sh STAGES="build test"
# with the CLI and the MLA test binaries and `ctest -L gpu -R "$CTEST_REGEX"`; with CTEST_REGEX=""
# the CLI only; with BASE the older tree's CLI at the same time. (2) NCU=1: ncu counters (DRAM
# bytes, L2 -> SM bytes, L2 sectors read by the SMs, L2 hit rate, duration) of one launch of the
# wgmma kernel per variant on NCU_FILTER. (3) ROUNDS alternated rounds of `attnkit bench --backend
# flashmla --cases $CASES` for every entry of VARIANTS ("name:VAR=v,VAR=v"; X=1 = nothing set; the
# name "base" runs BASE's CLI). Writes $OUT/summary.txt (ctest result, ncu lines, the bench table:
# case, ms, TFLOP/s) and the logs under $OUT/check/ and $OUT/logs/.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
CASES="${CASES:-scripts/device/mla_decode_128h_fp8.json}"
ROUNDS="${ROUNDS:-3}"
VARIANTS="${VARIANTS:-default:X=1}"
CTEST_REGEX="${CTEST_REGEX-Mla|MLA|mla}"
BASE="${BASE:-}"
NCU_FILTER="${NCU_FILTER:-mla_decode_b128_kv4096_p64_h128_d576v512_kvbf16}"
S="$OUT/summary.txt"
L="$OUT/logs"
mkdir -p "$L"
t0=$(date +%s)
el() { echo "at $(($(date +%s) - t0)) s"; }
if [ -n "$BASE" ]; then
  (cd "$BASE" && ln -sfn "$root/.deps" .deps && . scripts/device/lib.sh &&
    { attnkit_configure build 90a-real && ninja -C build -j6 attnkit_cli; } > "$L/base_build.log" 2>&1
    echo "base build rc $?" > "$L/base_rc.txt") &
fi
if [ -n "$CTEST_REGEX" ]; then
  OUT=$OUT/check STAGES="build test" CTEST_JOBS="${CTEST_JOBS:-6}" CTEST_REGEX="$CTEST_REGEX" \
    TARGETS="attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases test_mla_prefix_cache" \
    bash scripts/device/check.sh > "$OUT/check.log" 2>&1
else
  OUT=$OUT/check STAGES="build" TARGETS="attnkit_cli" bash scripts/device/check.sh > "$OUT/check.log" 2>&1
fi
wait
{ tail -4 "$OUT/check.log"; cat "$L/base_rc.txt" 2>/dev/null
  grep -E "Failed|FAILED|tests passed" "$OUT/check/ctest.log" 2>/dev/null | head -20; el; } > "$S"
cli() { [ "${1%%:*}" = base ] && echo "$BASE/build/tools/attnkit/attnkit" || echo build/device/tools/attnkit/attnkit; }
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN="$(attnkit_ncu_bin)"
  i=0
  for v in $VARIANTS; do
    e=${v#*:}
    i=$((i + 1))
    echo "== ncu $v" >> "$S"
    env ${e//,/ } timeout 90 "$NCU_BIN" --clock-control none -k "regex:mla_decode_wgmma_kernel" -s 2 -c 1 \
      --metrics dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
      "$(cli "$v")" bench --backend flashmla --cases "$CASES" --filter "$NCU_FILTER" --device cuda \
      --warmup 2 --iters 1 > "$L/ncu_${i}_${v%%:*}.txt" 2>&1
    grep -E "dram__|l1tex__|lts__|gpu__time" "$L/ncu_${i}_${v%%:*}.txt" >> "$S"
  done
  el >> "$S"
fi
for r in $(seq 1 "$ROUNDS"); do
  for v in $VARIANTS; do
    e=${v#*:}
    echo "== round $r ${v%%:*} $e"
    env ${e//,/ } timeout 60 "$(cli "$v")" bench --backend flashmla --cases "$CASES" --device cuda \
      --warmup 5 --iters 30 2>&1 | awk '$1 == "flashmla" {print $2, $3, $6} /rror/'
  done
done >> "$S" 2>&1
el >> "$S"
cat "$S"
