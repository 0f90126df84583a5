#!/usr/bin/env bash
# Session 58, second GPU call (20:50Z, run with scripts/device/patches/fi_s57_fp8_raw_ring.patch
# applied first; the patch then landed as is, so the script now runs the tree as it is): flashinfer's
# mma.sync prefill over fp8 pools by raw cp.async tiles, one QT stage. Builds, runs
# the second half of `ctest -L gpu` (the MLA / graph suites, which the patch does not touch) and the
# suites that run the patched kernel, `attnkit run --verify` of fp8 extends, then one bench round of
# scripts/device/fi_s57_fp8_extend.json with every pool on mma.sync.
#   run(carry=[".deps"], command="bash scripts/device/s58_patch_check.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
OUT="$OUT/check" STAGES="build test" CTEST_JOBS=12 \
  CTEST_REGEX="FlashMla|CutlassMla|Mla/|VerifyGraphs|TritonCudaGraphSplits|FlashInferCase|FlashInferCascade|FlashInferPrefill|NanKeyCases|Fa3Variant" \
  bash scripts/device/check.sh 2>&1 | tail -4
grep -E "Failed|\*\*\*" "$OUT/check/ctest.log" | head -20
ak=build/device/tools/attnkit/attnkit
echo "== run --verify (flashinfer, fp8_e4m3 pool)"
for c in '{"mode":"extend","prefix_lens":[300,0],"new_lens":[700,1024],"num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3"}' \
         '{"mode":"extend","prefix_lens":[0,100],"new_lens":[900,500],"num_q_heads":64,"num_kv_heads":8,"head_dim":64,"page_size":1,"kv_dtype":"fp8_e4m3","sliding_window":127,"sinks":true}' \
         '{"mode":"extend","prefix_lens":[2000],"new_lens":[700],"num_q_heads":16,"num_kv_heads":8,"head_dim":256,"page_size":64,"kv_dtype":"fp8_e5m2","logit_cap":50.0}'; do
  echo "$(timeout 120 "$ak" run --backend flashinfer --device cuda --case "$c" --verify 2>&1 | grep -E '^verify|rror')"
done | tee "$OUT/verify.txt"
echo "== flashinfer, ATTNKIT_FLASHINFER_SM90_PREFILL=0"
ATTNKIT_FLASHINFER_SM90_PREFILL=0 timeout 150 "$ak" bench --backend flashinfer --device cuda \
  --cases scripts/device/fi_s57_fp8_extend.json --json "$OUT/fi_mma.json" 2>/dev/null | grep -E "^flashinfer " | tee "$OUT/bench.txt"
