#!/usr/bin/env bash
# A/B of this tree against an older one in one device command (device, repository root; carry
# .deps, .peers and BASE, e.g. `rm -rf .wt/base && mkdir -p .wt/base && git archive <rev> | tar -x
# -C .wt/base` on the development machine first). Builds this tree with scripts/device/check.sh
# (STAGES "build test", ctest -L gpu -R "$CTEST_REGEX"), the base tree's CLI, then runs
# `attnkit bench $BENCH_ARGS` for every variant of VARIANTS ("base:ENV=V,ENV=V" / "new:..."; X=1
# = no setting), alternated, ROUNDS rounds, printing case / ms / GB/s / % of the copy ceiling /
# TFLOP/s (the table's columns 2-6) into $OUT/$NAME.txt.
#   BASE=.wt/base  CTEST_REGEX=""  CTEST_JOBS=8  ROUNDS=2  NAME=ab
#   (TARGETS and CTEST_EXCLUDE pass through to check.sh.) SHOW=refresh prints, for `--graph` runs,
#   backend / case / ms per forward / the replay refresh's host median, p90 and idle median, e.g.
#   the planner A/B of session 35: SHOW=refresh ROUNDS=3 CTEST_REGEX="FlashInfer|BenchGraph"
#   TARGETS="attnkit_cli test_flashinfer_cases test_flashinfer_cascade test_bench_graph"
#   BENCH_ARGS="--graph --launches 32 --warmup 3 --iters 10 --backend flashinfer,fa3
#   --cases scripts/device/graph_refresh.json"
#   BENCH_ARGS="--backend fa3 --cases bench/cases/fa3_prefill.json --warmup 3 --iters 10"
#   VARIANTS="base:X=1 new:X=1"  (only "new:..." variants: the base is not built)
set -u
BASE=${BASE:-.wt/base}
NAME=${NAME:-ab}
OUT=$OUT/check STAGES="build test" CTEST_JOBS=${CTEST_JOBS:-8} CTEST_REGEX="${CTEST_REGEX:-}" \
  bash scripts/device/check.sh > "$OUT/check.log" 2>&1
tail -3 "$OUT/check.log"
grep -E "Failed|FAILED" "$OUT/check/ctest.log" | head
. scripts/device/lib.sh
# The base tree's CLI only where a variant runs it (VARIANTS of "new:..." alone: knob A/Bs of this
# tree, no BASE needed).
[[ " ${VARIANTS:-base:X=1 new:X=1}" == *" base:"* ]] && attnkit_build_base_cli "$BASE" "$OUT"
N=build/device/tools/attnkit/attnkit
B=$BASE/build/tools/attnkit/attnkit
read -r -a args <<< "${BENCH_ARGS:---backend fa3 --cases bench/cases/fa3_prefill.json --warmup 3 --iters 10}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-base:X=1 new:X=1}; do
    bin=${v%%:*}
    e=${v#*:}
    [ "$bin" = base ] && C=$B || C=$N
    echo "== round $r $bin $e"
    if [ "${SHOW:-table}" = refresh ]; then  # --graph runs: the replay refresh's host times
      env ${e//,/ } "$C" bench "${args[@]}" --device cuda 2>&1 | grep -E " ok " | sed -E 's/ +/ /g' |
        sed -E 's/^([a-z0-9_]+) ([^ ]+) ([0-9.]+) .*host: median ([0-9.]+) us, p90 ([0-9.]+) us.*median ([0-9.]+) us idle.*/\1 \2 ms \3 refresh median \4 p90 \5 idle \6/'
    else
      env ${e//,/ } "$C" bench "${args[@]}" --device cuda 2>&1 |
        awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $4, $5, $6}'
    fi
  done
done 2>&1 | tee "$OUT/$NAME.txt"
