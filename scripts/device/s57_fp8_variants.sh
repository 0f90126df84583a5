#!/usr/bin/env bash
# Session 57: a sliding window and sinks over an fp8_e4m3 pool on fa3's FP8 wgmma kernel.
#  1. builds the CLI and every GPU test (scripts/device/check.sh) and runs the fa3 / flashinfer /
#     triton suites and their NaN-key cases (`ctest -R`; CTEST_REGEX overrides) without the decode
#     plan-knob suites (the triton / flashinfer pre-write launch checks of this session run there);
#  2. `attnkit run --verify` of FP8 window / sinks cases (errors against the fp64 reference);
#  3. ROUNDS alternated bench rounds of scripts/device/fa3_s57_fp8_variants.json: this tree, and
#     ATTNKIT_FA3_FP8=0 (fp8 pools on flashinfer's mma.sync kernels, which served these layers).
#   run(carry=[".deps"], command="bash scripts/device/s57_fp8_variants.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
OUT="$OUT/check" STAGES="build test" CTEST_JOBS=12 \
  CTEST_REGEX="${CTEST_REGEX:-Fa3|FlashInfer|Triton|NanKeyCases}" \
  CTEST_EXCLUDE="FlashInferDecode(Balance|DefaultPlan|SplitLong)|TritonCudaGraphSplits" \
  bash scripts/device/check.sh 2>&1 | tail -4
ak=build/device/tools/attnkit/attnkit
echo "== run --verify"
for c in '{"mode":"extend","prefix_lens":[300,0],"new_lens":[700,1024],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","sliding_window":200}' \
         '{"mode":"extend","prefix_lens":[0,100],"new_lens":[900,500],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","sliding_window":127,"sinks":true}' \
         '{"mode":"extend","prefix_lens":[2000],"new_lens":[1500],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","sliding_window":1023,"sinks":true}'; do
  echo "$(timeout 120 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^verify|error')"
done | tee "$OUT/verify.txt"
cases=scripts/device/fa3_s57_fp8_variants.json
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r (this tree)"
  timeout 200 "$ak" bench --backend fa3 --device cuda --cases "$cases" \
    --json "$OUT/fa3_r$r.json" 2>/dev/null | grep -E "^fa3 "
  echo "== round $r (ATTNKIT_FA3_FP8=0: mma.sync)"
  ATTNKIT_FA3_FP8=0 timeout 200 "$ak" bench --backend fa3 --device cuda --cases "$cases" \
    --json "$OUT/fa3_mma_r$r.json" 2>/dev/null | grep -E "^fa3 "
done | tee "$OUT/bench.txt"
