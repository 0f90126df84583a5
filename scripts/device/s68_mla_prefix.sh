#!/usr/bin/env bash
# Session 68: the MLA chunked prefix cache's attention passes on fa3's SM90 wgmma MLA kernel
# (PrefillSm90Engine::run_prefix_pass through the flashinfer backend's MlaPrefixCacheRunner).
#  1. build (build/device, HEAD_DIMS as given: empty = every head dim; the MLA kernel always);
#  2. test_fa3_cases (TEST_FILTER, default the MLA suites and the shared table's mla cases),
#     test_mla_prefix_cache (the runner's own tests on flashinfer), the NaN-key cases of fa3;
#  3. bench/cases/mla_prefill_prefix.json on fa3 (--verify in round 1), then with
#     ATTNKIT_FA3_MLA_PREFIX=0 (the passes on the portable SIMT kernel; PORTABLE_FILTER) for the
#     speed-up; bench/cases/mla_prefill.json (the kernel's new-token cases after the kv_row change).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s68_mla_prefix.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test bench}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_mla_prefix_cache test_nan_key_cases"
fi
if has_stage test; then
  filter="${TEST_FILTER:-Fa3MlaPrefillTest.*:SharedTable/Fa3CaseTest.MatchesReference/mla*}"
  attnkit_run_gtest test_fa3 200 test_fa3_cases "$filter"
  attnkit_run_gtest test_mla_prefix_cache 120 test_mla_prefix_cache
  attnkit_run_gtest nan 100 test_nan_key_cases '*fa3*'
fi
if has_stage bench; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    echo "== round $r (wgmma passes)"
    verify=""; [ "$r" = 1 ] && verify=--verify
    timeout 150 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill_prefix.json \
      $verify --json "$OUT/mla_prefix_r$r.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
  done > "$OUT/bench.txt"
  echo "== ATTNKIT_FA3_MLA_PREFIX=0 (the passes on the portable SIMT kernel)" >> "$OUT/bench.txt"
  ATTNKIT_FA3_MLA_PREFIX=0 timeout 150 "$ak" bench --backend fa3 --device cuda \
    --cases bench/cases/mla_prefill_prefix.json --filter "${PORTABLE_FILTER:-b4_pre4096}" \
    --warmup 1 --iters 3 2>>"$OUT/bench.err" | grep -E "^fa3 " >> "$OUT/bench.txt"
  echo "== bench/cases/mla_prefill.json (no prefix)" >> "$OUT/bench.txt"
  timeout 60 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill.json \
    2>>"$OUT/bench.err" | grep -E "^fa3 " >> "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  note "bench at $(elapsed) s"
fi
note "done at $(elapsed) s"
