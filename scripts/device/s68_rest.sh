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
bins="test_stale_plan test_graph_replay_guards test_input_checks test_kv_guard test_table_slots test_flashmla_cases test_cutlass_mla_cases test_verify_graphs"
attnkit_build_targets "$bins"
for b in $bins; do
  filter='*'
  [ "$b" = test_verify_graphs ] && filter='*Mla*:*mla*:*MLA*'
  attnkit_run_gtest "$b" "${LIMIT:-60}" "$b" "$filter"
done
note "done at $(elapsed) s"
