#!/usr/bin/env bash
# Session 68: the MLA prefix cache's merge folded into the wgmma pass epilogue (Fa3Params::
# part_merge) and the review fixes (flashinfer drops its MLA engine's plan at graph capture /
# replay): HEAD_DIMS (default 64) build; the MLA suites of test_fa3_cases, test_mla_prefix_cache,
# flashinfer's MLA cases, the MLA verify graphs and graph-replay guards; then the prefix benches
# (bench/cases/mla_prefill_prefix.json and scripts/device/s68_mla_chunks.json, one round each).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s68_fold.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
ak=build/device/tools/attnkit/attnkit
t=build/device/tests
OUT="$OUT/check" STAGES=build HEAD_DIMS="${HEAD_DIMS:-64}" \
  TARGETS="attnkit_cli test_fa3_cases test_mla_prefix_cache test_flashinfer_cases test_verify_graphs test_graph_replay_guards" \
  bash scripts/device/check.sh > /dev/null 2>&1
note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
run_test() {  # name timeout binary filter
  timeout "$2" "$t/$3" --gtest_filter="$4" > "$OUT/$1.log" 2>&1
  note "$1 ($3 $4): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$1.log" | tr '\n' ' ' | cut -c1-250)"
  grep -E "^\[  FAILED  \]|Failure$|rel_l2 .*tol" "$OUT/$1.log" | head -12 >> "$summary"
}
run_test fa3 90 test_fa3_cases 'Fa3MlaPrefillTest.*:SharedTable/Fa3CaseTest.MatchesReference/mla*'
run_test prefix 90 test_mla_prefix_cache '*'
run_test fi_mla 60 test_flashinfer_cases '*mla*:*Mla*'
run_test vgraphs 40 test_verify_graphs '*Mla*:*mla*:*MLA*'
run_test guards 30 test_graph_replay_guards '*'
{
  timeout 60 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill_prefix.json \
    --verify --json "$OUT/mla_prefix_fa3.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
  timeout 60 "$ak" bench --backend fa3 --device cuda --cases scripts/device/s68_mla_chunks.json \
    --json "$OUT/chunks.json" 2>>"$OUT/bench.err" | grep -E "^fa3 "
} > "$OUT/bench.txt"
sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
note "done at $(elapsed) s"
