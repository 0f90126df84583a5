#!/usr/bin/env bash
# Window / sinks / soft-cap over an fp8_e4m3 pool on the FP8 kernel's two-warpgroup plan of
# forwards with few queries per key (V^T in the kernel, GEMM row sums, unpromoted or promoted
# late). Written in session 65 as a patch, landed in session 66 after this script passed on an
# H200 (docs/perf/s66). On the device machine's copy of the tree:
#  1. build the CLI, test_fa3_cases and test_nan_key_cases (check.sh, build/device) and run
#     test_fa3_cases whole (Fa3VariantTest.Fp8PoolVariantsFewQueries among them) and the
#     NaN-key cases;
#  2. `attnkit run --verify` of few-query variant layers;
#  3. ROUNDS alternated bench rounds of scripts/device/fa3_s65_fp8_few_variants.json: this tree,
#     and ATTNKIT_FA3_FP8=0 (the mma.sync path such layers took before).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/fa3_fp8_variants_2wg_check.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
ak=build/device/tools/attnkit/attnkit
OUT="$OUT/check" STAGES=build TARGETS="attnkit_cli test_fa3_cases test_nan_key_cases" \
  bash scripts/device/check.sh > /dev/null 2>&1
note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
timeout 330 build/device/tests/test_fa3_cases > "$OUT/test_fa3.log" 2>&1
note "test_fa3_cases: rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_fa3.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]" "$OUT/test_fa3.log" | head -20 >> "$summary"
timeout 200 build/device/tests/test_nan_key_cases --gtest_filter='*fa3*:*flashinfer*' > "$OUT/nan.log" 2>&1
note "NanKeyCases (fa3, flashinfer): rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/nan.log" | tr '\n' ' ')"
for c in '{"mode":"extend","prefix_lens":[3000],"new_lens":[200],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","logit_cap":30,"sliding_window":1000,"sinks":true}' \
         '{"mode":"extend","prefix_lens":[1500,700],"new_lens":[100,40],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","logit_cap":20}'; do
  echo "$c" | cut -c1-160
  echo "  fa3:         $(timeout 120 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^verify|error')"
done > "$OUT/verify.txt"
cat "$OUT/verify.txt" >> "$summary"
cases=scripts/device/fa3_s65_fp8_few_variants.json
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r (this tree)"
  timeout 150 "$ak" bench --backend fa3 --device cuda --cases "$cases" 2>/dev/null | grep -E "^fa3 "
  echo "== round $r (ATTNKIT_FA3_FP8=0: mma.sync)"
  ATTNKIT_FA3_FP8=0 timeout 150 "$ak" bench --backend fa3 --device cuda --cases "$cases" \
    2>/dev/null | grep -E "^fa3 "
done > "$OUT/bench.txt"
sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
note "done at $(elapsed) s"
