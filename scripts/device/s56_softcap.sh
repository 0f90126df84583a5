#!/usr/bin/env bash
# Session 56: fa3's soft-cap by tanh.approx.f32 (sm90::tanh_approx). The A/B against session 55's
# exp2 + reciprocal formula ran first with scripts/device/patches/fa3_s55_softcap_tanh_approx.patch
# applied (knob ATTNKIT_FA3_SOFTCAP_TANH, 14:17Z); this script is the check of the adopted code:
#  1. builds the CLI and every GPU test (scripts/device/check.sh) and runs the fa3 / flashinfer
#     ones and their NaN-key cases (`ctest -R`) without the decode plan-knob suites;
#  2. `attnkit run --verify` of soft-cap cases (errors against the fp64 reference);
#  3. ROUNDS bench rounds of scripts/device/fa3_s55_variants.json's d 128 / d 256 cases (the plain
#     ones beside the soft-capped ones).
#   run(carry=[".deps"], command="bash scripts/device/s56_softcap.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
OUT="$OUT/check" STAGES="build test" CTEST_JOBS=12 \
  CTEST_REGEX="Fa3|FlashInfer|NanKeyCases.*(fa3|flashinfer)" CTEST_EXCLUDE="FlashInferDecode(Balance|DefaultPlan|SplitLong)" \
  bash scripts/device/check.sh 2>&1 | tail -4
ak=build/device/tools/attnkit/attnkit
echo "== run --verify"
for c in '{"mode":"extend","prefix_lens":[300,0],"new_lens":[700,1024],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"logit_cap":50.0}' \
         '{"mode":"extend","prefix_lens":[300,0],"new_lens":[700,1024],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"logit_cap":2.0}' \
         '{"mode":"extend","prefix_lens":[0],"new_lens":[1500],"num_q_heads":16,"num_kv_heads":8,"head_dim":256,"page_size":16,"logit_cap":50.0,"sliding_window":600}' \
         '{"mode":"extend","prefix_lens":[0,100],"new_lens":[900,500],"num_q_heads":64,"num_kv_heads":8,"head_dim":64,"page_size":16,"logit_cap":5.0,"sinks":true}'; do
  echo "$(timeout 120 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^verify')"
done | tee "$OUT/verify.txt"
cases=scripts/device/fa3_s55_variants.json
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo "== round $r"
  timeout 200 "$ak" bench --backend fa3 --device cuda --cases "$cases" --filter new8192 \
    --json "$OUT/fa3_r$r.json" 2>/dev/null | grep -E "^fa3 "
done | tee "$OUT/softcap_bench.txt"
