#!/usr/bin/env bash
# Session 20 (issue 5): early K/V reads of the balanced decode (PagedParams::decode_early_kv) on the
# device: builds the CLI and the flashinfer GPU tests, runs `ctest -L gpu -R FlashInfer`, then
# times b16 kv 4k (shuffled / in-order pages) and b1 kv 16k / 32k with ATTNKIT_FLASHINFER_EARLY_KV=1
# (the default) and =0 alternated, ROUNDS rounds, graph32. Carry .deps and .peers. Writes
# $OUT/check/ (tests) and $OUT/early_kv.txt.
set -uo pipefail
OUT=$OUT/check STAGES="build test" TARGETS="attnkit_cli test_flashinfer_cases" \
  CTEST_REGEX="FlashInfer" CTEST_JOBS=${CTEST_JOBS:-10} bash scripts/device/check.sh > "$OUT/check.log" 2>&1
tail -4 "$OUT/check.log"
grep -E "Failed|FAILED" "$OUT/check/ctest.log" | head
A=build/device/tools/attnkit/attnkit
for r in $(seq 1 "${ROUNDS:-3}"); do
  for e in 1 0; do
    for f in scripts/device/decode_s20_layout.json scripts/device/decode_s20_merge.json; do
      echo "== round $r EARLY_KV=$e $(basename $f)"
      ATTNKIT_FLASHINFER_EARLY_KV=$e $A bench --backend flashinfer --cases $f --device cuda \
        --graph --launches 32 2>/dev/null | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $4, $5}'
    done
  done
done 2>&1 | tee "$OUT/early_kv.txt"
