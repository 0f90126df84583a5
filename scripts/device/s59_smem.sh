#!/usr/bin/env bash
# Session 59: shared memory per block against the device (cuda/common/smem_fit.h). Builds the CLI
# and the GPU tests, runs the emulated-device case tables (ctest Sm80Emulated_* / Sm86Emulated_*:
# ATTNKIT_EMULATE_CC caps the opt-in limit, every launcher checks against it), then times the
# default and the compact shapes on this H200 (`attnkit bench --launches 10`, flashinfer and
# triton, bf16 decode / extend at d 128 and 256) with the variable unset, =80 and =86.
#   run(carry=[".deps"], command="bash scripts/device/s59_smem.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="$root/build/device"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) date: $(date -u +%FT%RZ)" | tee "$OUT/summary.txt"
t0=$(date +%s)
if [ "${BUILD:-1}" = 1 ]; then
  attnkit_configure "$build" "${ARCHS:-90a-real}" > "$OUT/build.log" 2>&1 &&
    ninja -C "$build" -j16 attnkit_cli test_flashinfer_cases test_fa3_cases test_triton_cases \
      >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi
# CTEST_EXTRA: more ctest -R alternatives (e.g. the same binaries' native-device tests).
regex="Sm(80|86)Emulated${CTEST_EXTRA:+|$CTEST_EXTRA}"
(cd "$build" && ctest -R "$regex" -j12 --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest -R \"$regex\": rc=$?" | tee -a "$OUT/summary.txt"
grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest.log" | head -20 | tee -a "$OUT/summary.txt"
ak="$build/tools/attnkit/attnkit"
row='^(flashinfer|triton) |ceiling|copy'
for cc in none 80 86; do
  for kind in decode extend; do
    echo "== EMULATE_CC=$cc $kind --launches 10" | tee -a "$OUT/summary.txt"
    if [ "$cc" = none ]; then unset ATTNKIT_EMULATE_CC; else export ATTNKIT_EMULATE_CC=$cc; fi
    timeout 120 "$ak" bench --backend flashinfer,triton --device cuda \
      --cases "scripts/device/smem_s59_$kind.json" --launches 10 \
      --json "$OUT/${kind}_cc$cc.json" 2>&1 | grep -E "$row" | tee -a "$OUT/summary.txt"
  done
done
unset ATTNKIT_EMULATE_CC
