#!/usr/bin/env bash
# Session 78 (runs ON the device, carry .deps): a snapshot of #5's decode targets (flashinfer,
# graph of 32, scripts/device/decode_targets.json) and #6's FP8-over-bf16 prefill ratio
# (bench/cases/fa3_prefill.json's d 128 cases), on a CLI built for head dim 128 only.
#   run(carry=[".deps"], command="bash scripts/device/s78_snapshot.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
. scripts/device/lib.sh
attnkit_script_start
note_device
HEAD_DIMS=128 attnkit_build_targets attnkit_cli
ak=build/device/tools/attnkit/attnkit
timeout 100 "$ak" bench --backend flashinfer --device cuda --graph --launches 32 \
  --cases scripts/device/decode_targets.json --json "$OUT/decode_targets.json" \
  > "$OUT/decode_targets.txt" 2>&1
note "decode targets rc=$? at $(elapsed) s"
timeout 150 "$ak" bench --backend fa3 --device cuda --filter d128 \
  --cases bench/cases/fa3_prefill.json --json "$OUT/fa3_prefill.json" \
  > "$OUT/fa3_prefill.txt" 2>&1
note "fa3 prefill rc=$? at $(elapsed) s"
grep -E "^(flashinfer|fa3) |ceiling" "$OUT/decode_targets.txt" "$OUT/fa3_prefill.txt"
