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
t=build/device/tests
if has_stage build; then
  OUT="$OUT/check" STAGES=build HEAD_DIMS="${HEAD_DIMS:-}" \
    TARGETS="attnkit_cli test_fa3_cases test_flashinfer_cases test_mla_prefix_cache test_nan_key_cases test_flashmla_cases test_cutlass_mla_cases" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
  grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
fi
run_test() {  # name timeout binary [filter]
  local name=$1 limit=$2 bin=$3 filter=${4:-*}
  timeout "$limit" "$t/$bin" --gtest_filter="$filter" > "$OUT/$name.log" 2>&1
  note "$name ($bin $filter): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-300)"
  grep -E "^\[  FAILED  \]|Failure$|rel_l2 .*tol" "$OUT/$name.log" | head -12 >> "$summary"
}
if has_stage test; then
  run_test fa3 200 test_fa3_cases
  run_test fi_mla 90 test_flashinfer_cases '*mla*:*Mla*'
  run_test prefix 120 test_mla_prefix_cache
  run_test flashmla 60 test_flashmla_cases '*mla_prefill*'
  run_test cutlass 60 test_cutlass_mla_cases '*mla_prefill*'
  run_test nan 90 test_nan_key_cases '*fa3*:*flashinfer*'
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
