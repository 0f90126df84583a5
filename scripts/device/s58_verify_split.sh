#!/usr/bin/env bash
# Session 58: target verify split into key chunks on flashinfer's prefill tiles (eager and CUDA
# graphs), the tree mask read only over the drafts' keys, and the cascade merge of the partials.
#  1. builds the CLI and the flashinfer / fa3 / NaN-key GPU tests; runs the suites that reach the
#     prefill kernel and the verify plans (CTEST_REGEX overrides);
#  2. scripts/device/verify_s58.json on flashinfer with --verify (fp64 reference per case), then
#     --launches 10 and --graph (BACKENDS overrides; fa3 runs the same kernels).
#   run(carry=[".deps"], command="bash scripts/device/s58_verify_split.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
OUT="$OUT/check" STAGES="build test" CTEST_JOBS=12 \
  TARGETS="attnkit_cli test_flashinfer_cases test_flashinfer_cascade test_nan_key_cases test_fa3_cases" \
  CTEST_REGEX="${CTEST_REGEX:-FlashInferCase|FlashInferVerify|FlashInferSplitTest|FlashInferGraph|FlashInferPrefill|FlashInferPlanTest|NanKeyCases|Fa3CaseTest|Fa3GraphTest}" \
  bash scripts/device/check.sh 2>&1 | tail -4
grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/check/ctest.log" | head -20
ak=build/device/tools/attnkit/attnkit
backends="${BACKENDS:-flashinfer}"
row='^(flashinfer|fa3|triton) |ceiling'
echo "== --verify" | tee "$OUT/bench.txt"
timeout 150 "$ak" bench --backend "$backends" --device cuda --cases scripts/device/verify_s58.json \
  --verify --json "$OUT/verify.json" 2>&1 | grep -E "$row|mismatch|failed" | tee -a "$OUT/bench.txt"
for mode in "--launches 10" "--graph"; do
  echo "== $mode" | tee -a "$OUT/bench.txt"
  # shellcheck disable=SC2086
  timeout 90 "$ak" bench --backend "$backends" --device cuda --cases scripts/device/verify_s58.json \
    $mode --json "$OUT/bench_${mode##* }.json" 2>&1 | grep -E "$row" | tee -a "$OUT/bench.txt"
done
