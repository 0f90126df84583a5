#!/usr/bin/env bash
# Small extends (backend/small_extend.h) on the device: builds the CLI and the two case binaries,
# runs their small-extend tests and shared tables (with the rule on, and off:
# ATTNKIT_EXTEND_DECODE_ROWS=0 ATTNKIT_FA3_MIN_Q_LEN=0), then times
# bench/cases/small_extend.json on each of VARIANTS (default: fa3 with the rule on, verified
# against the reference, and off).
#   STAGES="build test bench" VARIANTS CASES
#   run(carry=[".deps"], command="bash scripts/device/small_q_extend_check.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start
note_device
STAGES="${STAGES:-build test bench}"
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_flashinfer_cases"
fi
if has_stage test; then
  attnkit_run_gtest fi_small 120 test_flashinfer_cases \
    'FlashInferExtendDecodeTilesTest.*:SharedTable/*'
  attnkit_run_gtest fa3_small 120 test_fa3_cases 'Fa3SmallExtendTest.*:SharedTable/*'
  export ATTNKIT_EXTEND_DECODE_ROWS=0 ATTNKIT_FA3_MIN_Q_LEN=0
  attnkit_run_gtest fi_small_off 60 test_flashinfer_cases 'FlashInferExtendDecodeTilesTest.*'
  attnkit_run_gtest fa3_small_off 60 test_fa3_cases 'Fa3SmallExtendTest.*'
  unset ATTNKIT_EXTEND_DECODE_ROWS ATTNKIT_FA3_MIN_Q_LEN
fi
if has_stage bench; then
  # VARIANTS: space-separated BACKEND[:ENV=V,ENV=V]; the first one runs with --verify. Session 71's
  # first probe (14:41Z, before the rule) was VARIANTS="fa3 flashinfer
  # flashinfer:ATTNKIT_FLASHINFER_SM90_PREFILL=0" over the b64 new 1 / 4 / 16, b16 new 64 / 256 and
  # b1 new 2048 shapes.
  ak=build/device/tools/attnkit/attnkit
  i=0
  for v in ${VARIANTS:-fa3 fa3:ATTNKIT_EXTEND_DECODE_ROWS=0,ATTNKIT_FA3_MIN_Q_LEN=0}; do
    b=${v%%:*}
    e=""
    [[ "$v" == *:* ]] && e=${v#*:}
    i=$((i + 1))
    verify=""
    [ "$i" = 1 ] && verify="--verify"
    echo "== $v"
    env ${e//,/ } timeout 150 "$ak" bench --backend "$b" --device cuda \
      --cases "${CASES:-bench/cases/small_extend.json}" $verify --json "$OUT/bench_v$i.json" \
      2>>"$OUT/bench.err" | grep -E "^$b |ceiling"
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
fi
note "done at $(elapsed) s"
