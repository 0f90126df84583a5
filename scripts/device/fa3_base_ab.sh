#!/usr/bin/env bash
# fa3: this tree against an older one (BASE, default .wt/base; on the development machine first:
# `rm -rf .wt/base && mkdir -p .wt/base && git archive <rev> | tar -x -C .wt/base`, then carry
# .deps, .peers and .wt/base), in one device call (issue 6):
#   1. scripts/device/fa3_check.sh on this tree (STAGES, default "build test": the fa3 tests,
#      TEST_SUBSETS; the base tree's CLI builds beside it),
#   2. `attnkit bench --backend fa3` alternated ROUNDS times over RUNS, each "tree:cases[:env]"
#      (tree base or new; cases a file, relative to the repository root; env "A=1,B=0"), and the
#      table of scripts/device/ab_table.py over every run.
#   run(carry=[".deps", ".peers", ".wt/base"], command="RUNS='base:scripts/device/fa3_fp8_ab.json
#       new:scripts/device/fa3_fp8_ab.json' bash scripts/device/fa3_base_ab.sh")
# Knobs: RUNS (required), ROUNDS=3, STAGES, TEST_SUBSETS, HEAD_DIMS (this tree's build).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
BASE="${BASE:-.wt/base}"
mkdir -p "$OUT"
t_start=$(date +%s)
log() { echo "$*" | tee -a "$OUT/ab_summary.txt"; }

attnkit_build_base_cli "$BASE" "$OUT" > "$OUT/base_build.txt" 2>&1 &
base_pid=$!
OUT="$OUT" STAGES="${STAGES:-build test}" HEAD_DIMS="${HEAD_DIMS:-64;128;256}" \
  TEST_SUBSETS="${TEST_SUBSETS:-}" DIAG_VARIANTS="" BENCH_OTHERS="" \
  bash scripts/device/fa3_check.sh > "$OUT/check.log" 2>&1
grep -vE "^\s*$" "$OUT/summary.txt" | tee -a "$OUT/ab_summary.txt"
wait "$base_pid"
log "$(cat "$OUT/base_build.txt") at $(( $(date +%s) - t_start )) s"

N=build/device/tools/attnkit/attnkit
B=$BASE/build/tools/attnkit/attnkit
for r in $(seq 1 "${ROUNDS:-3}"); do
  for run in ${RUNS:?RUNS=\"tree:cases[:env] ...\"}; do
    IFS=: read -r tree cases env_list <<< "$run"
    envs=()
    [ -n "$env_list" ] && IFS=, read -r -a envs <<< "$env_list"
    C=$N
    [ "$tree" = base ] && C=$B
    echo "== round $r $run"
    env "${envs[@]}" timeout 90 "$C" bench --backend fa3 --cases "$cases" --device cuda \
      --warmup 3 --iters 10 2>&1 | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $6}'
  done
done > "$OUT/ab_bench.txt" 2>&1
log "bench done at $(( $(date +%s) - t_start )) s"
python3 scripts/device/ab_table.py "$OUT/ab_bench.txt" | tee -a "$OUT/ab_summary.txt"
