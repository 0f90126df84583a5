#!/usr/bin/env bash
# Session 5 device run for the MLA backends (one command): build, the MLA ctest subset, ceilings,
# bench flashmla + cutlass_mla (page 128 on the wgmma kernel via ATTNKIT_MLA_WGMMA=all), then the
# with PATCH=<file> a variant: apply, rebuild, its tests, its bench, revert; last the fa3/triton
# MLA case tests. (Session 5 measured scripts/device/patches/mla_wgmma_early_release.patch this way;
# it is now in the kernel.)
# Run from the repository root with .deps carried. Knobs: B (build dir, build-dev), T_END (seconds
# after start by which the optional last stage must not begin, 230).
set -uo pipefail
FINAL="${OUT:-$PWD/out}"; OUT=${MLA_WORK:-/tmp/mla_s5}; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
# Few files come back from a device run: everything is written to $OUT=/tmp/..., the bench JSON and
# one concatenated log are copied to the real $OUT at the end.
B=${B:-build-dev}; T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
. scripts/device/lib.sh
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
attnkit_configure "$B" > "$OUT/build.log" 2>&1
CORE="attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases test_mla_prefix_cache"
ninja -C "$B" -j16 $CORE >> "$OUT/build.log" 2>&1; echo "build rc=$? $(el)"
grep -m5 -E "error|C75[0-9][0-9]|spill" "$OUT/build.log"
ctest_mla() {  # $1 log name, $2 regex, $3 timeout
  (cd "$B" && timeout "$3" ctest -L gpu -R "$2" -j 8 --timeout 45 --output-on-failure > "$OUT/$1" 2>&1)
  echo "ctest[$1] rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/$1")"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/$1" | head -12
}
ctest_mla ctest_core.log 'FlashMla|CutlassMla|MlaPrefix|FlashInfer.*[Mm]la' 100
(cd "$B" && ctest -N -R 'Heads128Bf16BothKernels' | grep -c Test)
grep -E "Heads128Bf16BothKernels" "$OUT/ctest_core.log" | head -3
timeout 40 python3 scripts/device/mla_ceilings.py 2>&1 | tail -2
bench() {  # $1 name, $2 backend, $3 cases, env...
  local n=$1 be=$2 cs=$3; shift 3
  env "$@" timeout 60 "$B/tools/attnkit/attnkit" bench --backend "$be" --cases "$cs" --device cuda \
    --warmup 3 --iters 10 --json "$OUT/bench_$n.json" > "$OUT/bench_$n.log" 2>&1
  echo "bench[$n] rc=$? $(el)"
}
Q=scripts/device/mla_decode_quick.json
bench base_flashmla flashmla $Q
# cutlass_mla's descriptor needs SM100 (bench skips it on an H200); its page-128 kernels are
# covered by test_cutlass_mla_cases above.
if [ -z "${PATCH:-}" ]; then :
elif git apply "$PATCH" 2>"$OUT/patch.log" || patch -p1 < "$PATCH" >> "$OUT/patch.log" 2>&1; then
  ninja -C "$B" -j16 attnkit_cli test_flashmla_cases test_cutlass_mla_cases >> "$OUT/build_patch.log" 2>&1
  echo "patch build rc=$? $(el)"; grep -m5 -E "error|C75[0-9][0-9]" "$OUT/build_patch.log"
  ctest_mla ctest_patch.log 'FlashMla|CutlassMla' 60
  if ! grep -q Timeout "$OUT/ctest_patch.log"; then
    bench patch_flashmla flashmla $Q
  fi
  git apply -R "$PATCH" 2>/dev/null || patch -R -p1 < "$PATCH"
else echo "patch failed"; fi
if [ $(( $(date +%s) - T0 )) -lt "${T_END:-200}" ]; then
  ninja -C "$B" -j16 test_fa3_cases test_triton_cases >> "$OUT/build_peers.log" 2>&1
  echo "fa3/triton build rc=$? $(el)"
  ctest_mla ctest_fa3_triton.log '(Fa3|FA3|Triton).*[Mm]la' $(( 285 - ($(date +%s) - T0) ))
fi
echo "== summary $(el)"
for f in "$OUT"/bench_*.log; do
  echo "-- $(basename "$f") $(grep -o 'cuda_d2d_copy: [0-9.]* GB/s' "$f")"
  grep -E " ok$| skipped| failed|error" "$f" | awk '{print $2, $3, $4, $5, $6}'
done
cp "$OUT"/bench_*.json "$FINAL"/ 2>/dev/null
for f in "$OUT"/*.log; do echo "=== $f"; cat "$f"; done > "$FINAL/all_logs.txt"
