#!/usr/bin/env bash
# Session 62: the split decode's merge in one L2 round trip (PagedParams::merge_one_chunk,
# ring::merge_partials4_row_warp) and the test fixes of the session's review, in one device call:
#  1. build the CLI and every GPU test (sm_90a);
#  2. ctest -R over the flashinfer decode / verify / split / graph / cascade suites, every backend's
#     VerifyGraphs, the NaN-key cases and the emulated sm_80 / sm_86 flashinfer tables (now with
#     Tiles/FlashInferVerifySplitTest);
#  3. A/B: flashinfer decode over scripts/device/decode_targets.json as CUDA graphs of 32
#     forwards, default vs ATTNKIT_FLASHINFER_MERGE_CHUNK=16 (the previous merge), three
#     alternated rounds, with --verify on the first round of each.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s62_merge.sh")
# The merge was measured level and not kept: apply scripts/device/patches/decode_s62_merge_one_trip.patch
# first to rerun the A/B (without it ATTNKIT_FLASHINFER_MERGE_CHUNK is not read and both variants are
# main's merge). Results: docs/perf/s62/h200_1026_merge_ab.txt.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
final_out="${OUT:-$root/out}"
mkdir -p "$final_out"
OUT="$final_out" STAGES="build test" CTEST_JOBS=12 \
  CTEST_REGEX="FlashInferVerify|FlashInferCase|VerifyGraphs|Sm(80|86)Emulated_flashinfer|FlashInferSplit|FlashInferGraph|FlashInferCascade|NanKey" \
  timeout 420 bash scripts/device/check.sh > "$final_out/check.log" 2>&1
tail -4 "$final_out/check.log"
grep -E "Failed|\*\*\*" "$final_out/ctest.log" | head -20
ak=build/device/tools/attnkit/attnkit
for round in 1 2 3; do
  for v in default ATTNKIT_FLASHINFER_MERGE_CHUNK=16; do
    envs=(); [ "$v" != default ] && envs=("$v")
    extra=(); [ "$round" = 1 ] && extra=(--verify)
    echo "== round $round $v"
    env "${envs[@]}" timeout 150 "$ak" bench --backend flashinfer --device cuda --graph --launches 32 \
      --cases scripts/device/decode_targets.json "${extra[@]}" 2>&1 |
      grep -E "^flashinfer " | sed "s/  */ /g" | cut -c1-220
  done
done
