#!/usr/bin/env bash
# Session 67: the MLA prefill wgmma kernel (issue 6 item 1, "192/128 for MLA prefill") and session
# 66's review patch (one FP8 variant rule, a bidirectional window test on the two-warpgroup FP8
# plan), on the device machine's copy of the tree:
#  1. build the CLI and test_fa3_cases (check.sh, build/device); run Fa3MlaPrefillTest, the shared
#     table's MLA cases, Fa3VariantTest and Fa3Fp8Test;
#  2. `attnkit run --verify` of MLA prefill layers on fa3;
#  3. bench/cases/mla_prefill.json on fa3 (ROUNDS rounds), its 4k point on flashinfer (the portable
#     kernels every MLA prefill layer took before), then scripts/device/fa3_peers.py (SDPA cuDNN /
#     FA2 at q / k 192, v 128) in the same command.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s67_mla.sh")
# Knobs: STAGES (default "build test verify bench peers"), ROUNDS (2), TEST_FILTER.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test verify bench peers}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  OUT="$OUT/check" STAGES=build TARGETS="attnkit_cli test_fa3_cases" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
  grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
fi
if has_stage test; then
  filter="${TEST_FILTER:-Fa3MlaPrefillTest.*:SharedTable/Fa3CaseTest.MatchesReference/mla*:Fa3VariantTest.*:Fa3Fp8Test.*}"
  timeout 300 build/device/tests/test_fa3_cases --gtest_filter="$filter" > "$OUT/test_fa3.log" 2>&1
  note "test_fa3_cases ($filter): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_fa3.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|actual" "$OUT/test_fa3.log" | head -30 >> "$summary"
fi
if has_stage verify; then
  for c in mla_prefill_192_128 \
           '{"mode":"extend","prefix_lens":[0,0,0],"new_lens":[1000,333,1],"num_q_heads":16,"num_kv_heads":16,"head_dim":192,"v_head_dim":128,"mla":true,"kv_lora_rank":512,"qk_rope_head_dim":64,"page_size":64}'; do
    echo "$c" | cut -c1-140
    echo "  fa3: $(timeout 60 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^(verify|attnkit:)')"
  done > "$OUT/verify.txt"
  cat "$OUT/verify.txt" >> "$summary"
fi
if has_stage bench; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    echo "== round $r"
    verify=""; [ "$r" = 1 ] && verify=--verify
    timeout 90 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill.json $verify \
      --json "$OUT/mla_prefill_r$r.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
  done > "$OUT/bench.txt"
  echo "== flashinfer (portable MLA prefill), 4k x 16 heads" >> "$OUT/bench.txt"
  timeout 120 "$ak" bench --backend flashinfer --device cuda \
    --cases scripts/device/s67_mla_prefill_4k.json 2>>"$OUT/bench.err" | grep -E "^flashinfer " \
    >> "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  tail -5 "$OUT/bench.err" >> "$summary" 2>/dev/null
  note "bench at $(elapsed) s"
fi
if has_stage peers; then
  PYTHONUNBUFFERED=1 OUT="$OUT" timeout 90 python3 scripts/device/fa3_peers.py > "$OUT/peers.log" 2>&1
  note "peers: rc=$? at $(elapsed) s"
  grep -E "gemm|MLA" "$OUT/peers.log" >> "$summary"
fi
note "done at $(elapsed) s"
