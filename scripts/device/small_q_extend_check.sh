#!/usr/bin/env bash
# Small extends (backend/small_extend.h) on the device: builds the CLI and the two case binaries,
# runs their small-extend tests and shared tables (with the rule on, and off:
# ATTNKIT_EXTEND_DECODE_ROWS=0 ATTNKIT_FA3_MIN_Q_LEN=0), then times scripts/device/small_q_extend.json
# with the rule on and off (fa3; the first variant verified against the reference).
#   STAGES="build test bench"  run(carry=[".deps"], command="bash scripts/device/small_q_extend_check.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start
note_device
STAGES="${STAGES:-build test bench}"
off="ATTNKIT_EXTEND_DECODE_ROWS=0 ATTNKIT_FA3_MIN_Q_LEN=0"
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_flashinfer_cases"
fi
if has_stage test; then
  attnkit_run_gtest fi_small 120 test_flashinfer_cases 'FlashInferExtendDecodeTilesTest.*:SharedTable/*'
  attnkit_run_gtest fa3_small 120 test_fa3_cases 'Fa3SmallExtendTest.*:SharedTable/*'
  export ATTNKIT_EXTEND_DECODE_ROWS=0 ATTNKIT_FA3_MIN_Q_LEN=0
  attnkit_run_gtest fi_small_off 60 test_flashinfer_cases 'FlashInferExtendDecodeTilesTest.*'
  attnkit_run_gtest fa3_small_off 60 test_fa3_cases 'Fa3SmallExtendTest.*'
  unset ATTNKIT_EXTEND_DECODE_ROWS ATTNKIT_FA3_MIN_Q_LEN
fi
if has_stage bench; then
  ak=build/device/tools/attnkit/attnkit
  for v in "on" "off"; do
    e=""
    verify="--verify"
    [ "$v" = off ] && e="$off" && verify=""
    echo "== fa3 rule $v"
    env $e timeout 150 "$ak" bench --backend fa3 --device cuda --cases scripts/device/small_q_extend.json \
      $verify --json "$OUT/bench_$v.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
fi
note "done at $(elapsed) s"
