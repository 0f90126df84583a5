#!/usr/bin/env bash
# Session 69: the MLA chunked prefix cache's chunk passes without the requests that have no keys in
# their chunk (mla_pass_requests' skip). Builds the CLI and the suites the change touches, runs the
# fa3 MLA prefill cases (the prefix-cache passes with and without the skip), test_mla_prefix_cache
# and flashinfer's MLA cases, then the prefix-cache bench on fa3 with ATTNKIT_FA3_MLA_PREFIX_SKIP
# unset / 0, alternated, ROUNDS rounds.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s69_mla_skip.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test bench}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_mla_prefix_cache test_flashinfer_cases"
fi
if has_stage test; then
  attnkit_run_gtest fa3_mla 150 test_fa3_cases 'Fa3MlaPrefillTest.*:*mla*:*Mla*'
  attnkit_run_gtest prefix 120 test_mla_prefix_cache
  attnkit_run_gtest fi_mla 90 test_flashinfer_cases '*mla*:*Mla*'
fi
if has_stage bench; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for skip in 1 0; do
      echo "== round $r skip $skip"
      ATTNKIT_FA3_MLA_PREFIX_SKIP=$skip timeout 90 "$ak" bench --backend fa3 --device cuda \
        --cases bench/cases/mla_prefill_prefix.json --json "$OUT/mla_prefix_r${r}_s${skip}.json" \
        2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
    done
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  note "bench at $(elapsed) s"
fi
note "done at $(elapsed) s"
