#!/usr/bin/env bash
# The MLA chunked prefix cache on the device: builds the CLI and every suite that runs it, runs
# their MLA prefill / prefix-cache cases (fa3's, test_mla_prefix_cache, flashinfer's MLA cases,
# the flashmla / cutlass_mla tables' MLA prefill cases), then `attnkit bench` over
# bench/cases/mla_prefill_prefix.json for each of VARIANTS, alternated, ROUNDS rounds.
#   VARIANTS="fa3 flashinfer"   space-separated BACKEND[:ENV=V,ENV=V] (e.g. session 69's A/B of
#                               the skip: "fa3:ATTNKIT_FA3_MLA_PREFIX_SKIP=1
#                               fa3:ATTNKIT_FA3_MLA_PREFIX_SKIP=0")
#   ROUNDS=2  STAGES="build test bench"
#   run(carry=[".deps", ".peers"], command="bash scripts/device/mla_prefix.sh")
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
    i=0
    for v in ${VARIANTS:-fa3 flashinfer}; do
      b=${v%%:*}
      e=""
      [[ "$v" == *:* ]] && e=${v#*:}
      i=$((i + 1))
      echo "== round $r $v"
      env ${e//,/ } timeout 90 "$ak" bench --backend "$b" --device cuda \
        --cases bench/cases/mla_prefill_prefix.json --json "$OUT/mla_prefix_r${r}_v$i.json" \
        2>>"$OUT/bench.err" | grep -E "^$b |ceiling"
    done
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  note "bench at $(elapsed) s"
fi
note "done at $(elapsed) s"
