#!/usr/bin/env bash
# Session 68's first call: the snapshot first on a fresh machine (settles session 67's 16k question:
# fa3 causal d 128 read 3.53-3.58 ms at 16k on the 01:39Z machine against 3.07-3.14 ms before,
# the unchanged FP8 kernel 7-11% slower too), then the GPU tests session 67's last commits did not
# run: test_fa3_cases whole (f5be2e8's ATTNKIT_FA3_UNIT_SMEM=0 and encoder-only MLA cases among
# them), the NaN-key cases of fa3 / flashinfer, and the MLA prefill bench.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s68_snapshot.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build snapshot test mla}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  attnkit_build_targets "attnkit_cli test_fa3_cases test_nan_key_cases"
fi
if has_stage snapshot; then
  # snapshot_s66.sh's stages after its build (the CLI is built above).
  OUT="$OUT/fa3" STAGES="bench peers" DIAG_VARIANTS=" " BENCH_OTHERS="" BENCH_VARIANTS="default" \
    BENCH_TIMEOUT=90 bash scripts/device/fa3_check.sh > "$OUT/fa3.log" 2>&1
  note "fa3 bench + peers at $(elapsed) s"
  grep -hE "^fa3 |ceiling|rror" "$OUT/fa3/bench.log" 2>/dev/null | head -30 >> "$summary"
  grep -vE "^\s*$" "$OUT/fa3/peers.log" 2>/dev/null | head -30 >> "$summary"
  timeout 90 "$ak" bench --backend flashinfer --device cuda --cases scripts/device/decode_targets.json \
    --graph --launches 32 --json "$OUT/decode_graph.json" > "$OUT/decode.log" 2>&1
  grep -E "^flashinfer |ceiling" "$OUT/decode.log" | head -20 >> "$summary"
  note "decode at $(elapsed) s"
fi
if has_stage test; then
  attnkit_run_gtest test_fa3_cases 200 test_fa3_cases
  attnkit_run_gtest nan 120 test_nan_key_cases '*fa3*:*flashinfer*'
fi
if has_stage mla; then
  timeout 60 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill.json --verify \
    --json "$OUT/mla_prefill.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling|verify" > "$OUT/mla.txt"
  sed -E 's/ +/ /g' "$OUT/mla.txt" >> "$summary"
fi
note "done at $(elapsed) s"
