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
HEAD_DIMS="${HEAD_DIMS:-64}" attnkit_build_targets \
  "attnkit_cli test_fa3_cases test_mla_prefix_cache test_flashinfer_cases test_verify_graphs test_graph_replay_guards"
attnkit_run_gtest fa3 90 test_fa3_cases 'Fa3MlaPrefillTest.*:SharedTable/Fa3CaseTest.MatchesReference/mla*'
attnkit_run_gtest prefix 90 test_mla_prefix_cache '*'
attnkit_run_gtest fi_mla 60 test_flashinfer_cases '*mla*:*Mla*'
attnkit_run_gtest vgraphs 40 test_verify_graphs '*Mla*:*mla*:*MLA*'
attnkit_run_gtest guards 30 test_graph_replay_guards '*'
{
  timeout 60 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill_prefix.json \
    --verify --json "$OUT/mla_prefix_fa3.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
  timeout 60 "$ak" bench --backend fa3 --device cuda --cases scripts/device/s68_mla_chunks.json \
    --json "$OUT/chunks.json" 2>>"$OUT/bench.err" | grep -E "^fa3 "
} > "$OUT/bench.txt"
sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
note "done at $(elapsed) s"
