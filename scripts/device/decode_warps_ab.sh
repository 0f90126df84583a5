#!/usr/bin/env bash
# Session 16 A/B of the flashinfer decode CTA shape (device, repository root; carry .deps .peers),
# on a tree with scripts/device/patches/decode_s16_8warp_cta.patch applied (the knob is not in main:
# 8 warps measured no faster, docs/perf/fidecode_notes.md session 16):
# builds the CLI and the flashinfer GPU test binaries, runs `ctest -L gpu -R FlashInfer` with
# ATTNKIT_FLASHINFER_DECODE_WARPS=8 forced (one 8-warp CTA per SM wherever a launch has at most
# one CTA per SM), then times scripts/device/decode_s9.json with =4 (the default) and =8 in b2b
# (--launches 10) and graph (--graph --launches 32) modes, alternated, ROUNDS rounds, each bench
# process with its own copy ceiling (column 8: % of copy).
set -u
OUT0=$OUT
OUT=$OUT0/check STAGES="build" TARGETS="attnkit_cli test_flashinfer_cases test_flashinfer_cascade test_flashinfer_balanced_plan test_flashinfer_perf" \
  bash scripts/device/check.sh > "$OUT0/check.log" 2>&1
tail -2 "$OUT0/check.log"
ATTNKIT_FLASHINFER_DECODE_WARPS=8 timeout "${CTEST_TIMEOUT:-200}" ctest --test-dir build/device -L gpu \
  -R FlashInfer -j8 --output-on-failure > "$OUT0/ctest_warps8.log" 2>&1
echo "ctest (DECODE_WARPS=8) rc $?"; grep -E "tests passed|Failed|FAILED" "$OUT0/ctest_warps8.log" | head
C=build/device/tools/attnkit/attnkit
for r in $(seq 1 "${ROUNDS:-2}"); do
  for mode in b2b graph; do
    [ "$mode" = b2b ] && M="--launches 10" || M="--graph --launches 32"
    for w in 4 8; do
      echo "== round $r $mode warps $w"
      ATTNKIT_FLASHINFER_DECODE_WARPS=$w $C bench --backend flashinfer --cases scripts/device/decode_s9.json \
        --device cuda --warmup 5 --iters 30 $M 2>&1 | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/'
    done
  done
done 2>&1 | tee "$OUT0/decode_warps_ab.txt"
