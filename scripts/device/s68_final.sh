#!/usr/bin/env bash
# Session 68's closing call: every head dim built, then the suites this session's code touches:
# test_fa3_cases whole (the MLA prefix-cache passes on wgmma among them), flashinfer's shared-table
# MLA cases (its non-absorbed prefill now on the wgmma MLA kernel on SM90), test_mla_prefix_cache
# (flashinfer / fa3 / flashmla prefix caches, every chunk size), the flashmla / cutlass_mla tables'
# MLA prefill cases, the NaN-key cases of fa3 / flashinfer; then the MLA prefill benches on fa3 and
# flashinfer (one round each).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s68_final.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test bench}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_flashinfer_cases test_mla_prefix_cache test_nan_key_cases test_flashmla_cases test_cutlass_mla_cases"
fi
if has_stage test; then
  attnkit_run_gtest fa3 200 test_fa3_cases
  attnkit_run_gtest fi_mla 90 test_flashinfer_cases '*mla*:*Mla*'
  attnkit_run_gtest prefix 120 test_mla_prefix_cache
  attnkit_run_gtest flashmla 60 test_flashmla_cases '*mla_prefill*'
  attnkit_run_gtest cutlass 60 test_cutlass_mla_cases '*mla_prefill*'
  attnkit_run_gtest nan 90 test_nan_key_cases '*fa3*:*flashinfer*'
fi
if has_stage bench; then
  {
    for b in fa3 flashinfer; do
      timeout 60 "$ak" bench --backend $b --device cuda --cases bench/cases/mla_prefill_prefix.json \
        --json "$OUT/mla_prefix_$b.json" 2>>"$OUT/bench.err" | grep -E "^$b |ceiling"
    done
    timeout 60 "$ak" bench --backend flashinfer --device cuda --cases bench/cases/mla_prefill.json \
      --json "$OUT/mla_prefill_flashinfer.json" 2>>"$OUT/bench.err" | grep -E "^flashinfer "
  } > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  note "bench at $(elapsed) s"
fi
note "done at $(elapsed) s"
