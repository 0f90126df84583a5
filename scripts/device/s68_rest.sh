#!/usr/bin/env bash
# Session 68: the GPU suites with MLA contexts that s68_final.sh did not run (flashinfer now makes
# an MLA prefill engine of its own on SM90): stale plans, graph-replay guards, input checks, KV
# guards, table slots, the whole flashmla / cutlass_mla tables, the verify graphs' MLA cases.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s68_rest.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
t=build/device/tests
bins="test_stale_plan test_graph_replay_guards test_input_checks test_kv_guard test_table_slots test_flashmla_cases test_cutlass_mla_cases test_verify_graphs"
OUT="$OUT/check" STAGES=build HEAD_DIMS="${HEAD_DIMS:-}" TARGETS="$bins" \
  bash scripts/device/check.sh > /dev/null 2>&1
note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
for b in $bins; do
  filter='*'
  [ "$b" = test_verify_graphs ] && filter='*Mla*:*mla*:*MLA*'
  timeout "${LIMIT:-60}" "$t/$b" --gtest_filter="$filter" > "$OUT/$b.log" 2>&1
  note "$b ($filter): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$b.log" | tr '\n' ' ' | cut -c1-250)"
  grep -E "^\[  FAILED  \]" "$OUT/$b.log" | head -8 >> "$summary"
done
note "done at $(elapsed) s"
