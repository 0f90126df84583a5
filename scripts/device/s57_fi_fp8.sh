#!/usr/bin/env bash
# Session 57: flashinfer's mma.sync prefill over an fp8 pool with raw cp.async tiles converted in
# shared memory (was: plain global loads converted in registers, ~6x slower than bf16).
#  1. builds the CLI and every GPU test (scripts/device/check.sh) and runs the flashinfer / fa3
#     suites and the NaN-key cases (CTEST_REGEX overrides) without the decode plan-knob suites;
#  2. `attnkit run --verify` of fp8 extends on flashinfer (d 64 / 128 / 256, a window, sinks);
#  3. ROUNDS rounds of scripts/device/fi_s57_fp8_extend.json on flashinfer, with its SM90 wgmma
#     prefill (bf16 pools there) and with ATTNKIT_FLASHINFER_SM90_PREFILL=0 (every pool on
#     mma.sync: the fp8 / bf16 ratio of the same kernel), then fa3 on fa3_s57_fp8_variants.json.
#   run(carry=[".deps"], command="bash scripts/device/s57_fi_fp8.sh")
# (The prepared one-QT-stage ring that PATCH=1 applied landed in session 58; the script now
# measures the tree as it is.)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
OUT="$OUT/check" STAGES="build test" CTEST_JOBS=12 \
  CTEST_REGEX="${CTEST_REGEX:-FlashInfer|Fa3|NanKeyCases}" \
  CTEST_EXCLUDE="FlashInferDecode(Balance|DefaultPlan|SplitLong)" \
  bash scripts/device/check.sh 2>&1 | tail -4
ak=build/device/tools/attnkit/attnkit
echo "== run --verify (flashinfer, fp8_e4m3 pool)"
for c in '{"mode":"extend","prefix_lens":[300,0],"new_lens":[700,1024],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3"}' \
         '{"mode":"extend","prefix_lens":[0,100],"new_lens":[900,500],"num_q_heads":64,"num_kv_heads":8,"head_dim":64,"page_size":1,"kv_dtype":"fp8_e4m3","sliding_window":127,"sinks":true}' \
         '{"mode":"extend","prefix_lens":[2000],"new_lens":[700],"num_q_heads":16,"num_kv_heads":8,"head_dim":256,"page_size":64,"kv_dtype":"fp8_e4m3","logit_cap":50.0}'; do
  echo "$(timeout 120 "$ak" run --backend flashinfer --device cuda --case "$c" --verify 2>&1 | grep -E '^verify|error')"
done | tee "$OUT/verify.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r flashinfer"
  timeout 200 "$ak" bench --backend flashinfer --device cuda --cases scripts/device/fi_s57_fp8_extend.json \
    --json "$OUT/fi_r$r.json" 2>/dev/null | grep -E "^flashinfer "
  echo "== round $r flashinfer, ATTNKIT_FLASHINFER_SM90_PREFILL=0"
  ATTNKIT_FLASHINFER_SM90_PREFILL=0 timeout 200 "$ak" bench --backend flashinfer --device cuda \
    --cases scripts/device/fi_s57_fp8_extend.json --json "$OUT/fi_mma_r$r.json" 2>/dev/null | grep -E "^flashinfer "
done | tee "$OUT/bench.txt"
echo "== fa3, FP8 window / sinks (and ATTNKIT_FA3_FP8=0: the mma.sync path)" | tee -a "$OUT/bench.txt"
timeout 200 "$ak" bench --backend fa3 --device cuda --cases scripts/device/fa3_s57_fp8_variants.json \
  --json "$OUT/fa3.json" 2>/dev/null | grep -E "^fa3 " | tee -a "$OUT/bench.txt"
ATTNKIT_FA3_FP8=0 timeout 200 "$ak" bench --backend fa3 --device cuda --cases scripts/device/fa3_s57_fp8_variants.json \
  --json "$OUT/fa3_mma.json" 2>/dev/null | grep -E "^fa3 " | tee -a "$OUT/bench.txt"
