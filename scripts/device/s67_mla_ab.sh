#!/usr/bin/env bash
# Session 67, second call: the MLA prefill kernel's schedule A/B (after s67_mla.sh measured
# 0.77-0.80x SDPA cuDNN with two K / V stages and the overlapped loop). Builds the CLI and
# test_fa3_cases with HEAD_DIMS (default "64": the MLA kernel is compiled whatever the list, and
# the long head-dim-128 FP8 unit is left out), runs TEST_FILTER (default Fa3MlaPrefillTest.*), then
# ROUNDS alternated rounds of bench/cases/mla_prefill.json over the VARIANTS (env assignments,
# "-" for none): the default (split K / V release, overlapped loop), ATTNKIT_FA3_SPLIT_EMPTY=0,
# ATTNKIT_FA3_OVERLAP=0 with and without it, ATTNKIT_FA3_L2_SECTION=auto; CASES: another case file.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s67_mla_ab.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test bench}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  OUT="$OUT/check" STAGES=build HEAD_DIMS="${HEAD_DIMS-64}" TARGETS="attnkit_cli test_fa3_cases" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
  grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
fi
if has_stage test; then
  filter="${TEST_FILTER:-Fa3MlaPrefillTest.*:SharedTable/Fa3CaseTest.MatchesReference/mla*}"
  timeout 200 build/device/tests/test_fa3_cases --gtest_filter="$filter" > "$OUT/test_fa3.log" 2>&1
  note "test_fa3_cases ($filter): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_fa3.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|actual|rel_l2" "$OUT/test_fa3.log" | head -30 >> "$summary"
fi
if has_stage bench; then
  VARIANTS="${VARIANTS:--;ATTNKIT_FA3_SPLIT_EMPTY=0;ATTNKIT_FA3_OVERLAP=0;ATTNKIT_FA3_OVERLAP=0 ATTNKIT_FA3_SPLIT_EMPTY=0;ATTNKIT_FA3_L2_SECTION=auto}"
  IFS=';' read -r -a variants <<< "$VARIANTS"
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "${variants[@]}"; do
      echo "== round $r: $v"
      envs=(); [ "$v" != "-" ] && read -r -a envs <<< "$v"
      env "${envs[@]}" timeout 60 "$ak" bench --backend fa3 --device cuda \
        --cases "${CASES:-bench/cases/mla_prefill.json}" 2>>"$OUT/bench.err" | grep -E "^fa3 "
    done
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g; s/extend_b([0-9]+)_pre0_new([0-9]+)_p64_h([0-9]+)x[0-9]+_d192v128_mla_kvbf16/b\1 s\2 h\3/' \
    "$OUT/bench.txt" >> "$summary"
  tail -3 "$OUT/bench.err" >> "$summary" 2>/dev/null
fi
note "done at $(elapsed) s"
