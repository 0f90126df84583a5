#!/usr/bin/env bash
# Session 69: the MLA chunked prefix cache's chunk layout filled to the budget (plan_prefix_chunks:
# a request whose prefix has ended leaves its share to the others). Builds the CLI and every suite
# that runs the chunked prefix cache, runs their MLA prefill / prefix cases, then the prefix-cache
# bench on fa3 and flashinfer, ROUNDS rounds.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s69_layout.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test bench}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_mla_prefix_cache test_flashinfer_cases test_flashmla_cases test_cutlass_mla_cases"
fi
if has_stage test; then
  attnkit_run_gtest fa3_mla 150 test_fa3_cases 'Fa3MlaPrefillTest.*:*mla*:*Mla*'
  attnkit_run_gtest prefix 150 test_mla_prefix_cache
  attnkit_run_gtest fi_mla 90 test_flashinfer_cases '*mla*:*Mla*'
  attnkit_run_gtest flashmla 60 test_flashmla_cases '*mla_prefill*'
  attnkit_run_gtest cutlass 60 test_cutlass_mla_cases '*mla_prefill*'
fi
if has_stage bench; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for b in fa3 flashinfer; do
      echo "== round $r $b"
      timeout 90 "$ak" bench --backend $b --device cuda --cases bench/cases/mla_prefill_prefix.json \
        --json "$OUT/mla_prefix_r${r}_$b.json" 2>>"$OUT/bench.err" | grep -E "^$b |ceiling"
    done
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  note "bench at $(elapsed) s"
fi
note "done at $(elapsed) s"
