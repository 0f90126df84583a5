#!/usr/bin/env bash
# Session 86: a snapshot of issues #5 / #6's targets with their peers on today's machine, and the
# GPU test groups session 85 did not reach. Calls (carry .deps and .peers):
#   bash scripts/device/s86_check.sh
#       build (CLI + every GPU test), the snapshot (s68_snapshot.sh's stage: fa3 prefill + SDPA
#       peers, flashinfer decode targets as graphs), then the SM80 / SM86 emulation groups,
#       FlashInferVerifyMemcheck and GpuSynccheck_flashmla
#   STAGES="build long" bash scripts/device/s86_check.sh
#       FlashInferDecode(Balance|DefaultPlan|SplitLong) (~390 s each, run side by side)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build snapshot rest}"
# run_group NAME JOBS REGEX: check.sh's test stage over REGEX into $OUT/ctest_NAME.
run_group() {
  OUT="$OUT/ctest_$1" STAGES=test CTEST_JOBS="$2" CTEST_REGEX="$3" \
    bash scripts/device/check.sh > /dev/null 2>&1
  cat "$OUT/ctest_$1/summary.txt" >> "$summary"
  note "$1 at $(elapsed) s"
}
if has_stage build; then
  attnkit_build_targets ""
fi
if has_stage snapshot; then
  OUT="$OUT/snapshot" STAGES=snapshot bash scripts/device/s68_snapshot.sh > /dev/null 2>&1
  cat "$OUT/snapshot/summary.txt" >> "$summary"
fi
if has_stage rest; then
  run_group rest 12 'Sm(80|86)Emulated|FlashInferVerifyMemcheck|GpuSynccheck_flashmla'
fi
if has_stage long; then
  run_group long 3 'FlashInferDecode(Balance|DefaultPlan|SplitLong)'
fi
note "done at $(elapsed) s"
