#!/usr/bin/env bash
# Session 65: a soft-cap over an fp8_e4m3 pool on fa3's FP8 wgmma kernel (kSoftcap).
#  1. builds the CLI and test_fa3_cases (scripts/device/check.sh, build/device, every head dim)
#     and runs test_fa3_cases whole (Fa3VariantTest.Fp8PoolSoftcap among them);
#  2. `attnkit run --verify` of soft-capped FP8 cases (errors against the fp64 reference);
#  3. ROUNDS alternated bench rounds of scripts/device/fa3_s65_fp8_softcap.json: this tree, and
#     ATTNKIT_FA3_FP8=0 (fp8 pools on flashinfer's mma.sync kernels, which served these layers).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s65_fp8_softcap.sh")
# Files back from $OUT: summary.txt check/ test_fa3.log verify.txt bench.txt fa3_*.json
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
STAGES="${STAGES:-build test verify bench}"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  OUT="$OUT/check" STAGES=build TARGETS="attnkit_cli test_fa3_cases" bash scripts/device/check.sh \
    > /dev/null 2>&1
  note "build: $(tail -1 "$OUT/check/summary.txt" 2>/dev/null) at $(elapsed) s"
fi
if has_stage test; then
  timeout "${TEST_LIMIT_S:-330}" build/device/tests/test_fa3_cases > "$OUT/test_fa3.log" 2>&1
  note "test_fa3_cases: rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]|tests ran' "$OUT/test_fa3.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/test_fa3.log" | head -20 >> "$summary"
fi
if has_stage verify; then
  for c in '{"mode":"extend","prefix_lens":[300,0],"new_lens":[700,1024],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","logit_cap":50}' \
           '{"mode":"extend","prefix_lens":[0,100],"new_lens":[900,500],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","logit_cap":10,"sliding_window":127,"sinks":true}' \
           '{"mode":"extend","prefix_lens":[2000],"new_lens":[1500],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","logit_cap":30}'; do
    echo "$c" | cut -c1-160
    echo "  fa3:         $(timeout 120 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^verify|error')"
    echo "  FP8=0 (mma): $(ATTNKIT_FA3_FP8=0 timeout 120 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^verify|error')"
  done > "$OUT/verify.txt"
  cat "$OUT/verify.txt" >> "$summary"
  note "verify at $(elapsed) s"
fi
if has_stage bench; then
  cases=scripts/device/fa3_s65_fp8_softcap.json
  for r in $(seq 1 "${ROUNDS:-2}"); do
    echo "== round $r (this tree)"
    timeout 150 "$ak" bench --backend fa3 --device cuda --cases "$cases" \
      --json "$OUT/fa3_r$r.json" 2>/dev/null | grep -E "^fa3 "
    echo "== round $r (ATTNKIT_FA3_FP8=0: mma.sync)"
    ATTNKIT_FA3_FP8=0 timeout 150 "$ak" bench --backend fa3 --device cuda --cases "$cases" \
      --json "$OUT/fa3_mma_r$r.json" 2>/dev/null | grep -E "^fa3 "
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
  note "bench at $(elapsed) s"
fi
