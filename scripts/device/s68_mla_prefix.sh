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
  OUT="$OUT/check" STAGES=build HEAD_DIMS="${HEAD_DIMS:-}" \
    TARGETS="attnkit_cli test_fa3_cases test_mla_prefix_cache test_nan_key_cases" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
  grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
fi
if has_stage test; then
  filter="${TEST_FILTER:-Fa3MlaPrefillTest.*:SharedTable/Fa3CaseTest.MatchesReference/mla*}"
  timeout 200 build/device/tests/test_fa3_cases --gtest_filter="$filter" > "$OUT/test_fa3.log" 2>&1
  note "test_fa3_cases ($filter): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_fa3.log" | tr '\n' ' ' | cut -c1-300)"
  grep -E "^\[  FAILED  \]|Failure|rel_l2|Expected|Which|actual" "$OUT/test_fa3.log" | head -30 >> "$summary"
  timeout 120 build/device/tests/test_mla_prefix_cache > "$OUT/test_mla_prefix_cache.log" 2>&1
  note "test_mla_prefix_cache: rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_mla_prefix_cache.log" | tr '\n' ' ' | cut -c1-300)"
  timeout 100 build/device/tests/test_nan_key_cases --gtest_filter='*fa3*' > "$OUT/nan.log" 2>&1
  note "NanKeyCases (fa3): rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/nan.log" | tr '\n' ' ')"
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
