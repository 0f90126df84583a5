#!/usr/bin/env bash
# Session 66: where issues #6 / #5's targets stand after the FP8 variant kernels landed (one call,
# the peers in the same command): build the CLI (build/device, every head dim); fa3 over
# bench/cases/fa3_prefill.json with scripts/device/fa3_peers.py (GEMM ceiling, SDPA cuDNN / FA2);
# then flashinfer's decode targets (scripts/device/decode_targets.json) as CUDA graphs of 32
# forwards, when time is left. snapshot_s61.sh without the decode peers and the verify A/B.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/snapshot_s66.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
ak=build/device/tools/attnkit/attnkit
OUT="$OUT/check" STAGES=build TARGETS=attnkit_cli bash scripts/device/check.sh > /dev/null 2>&1
note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
OUT="$OUT/fa3" STAGES="bench peers" DIAG_VARIANTS=" " BENCH_OTHERS="" BENCH_VARIANTS="default" \
  BENCH_TIMEOUT=90 bash scripts/device/fa3_check.sh > "$OUT/fa3.log" 2>&1
note "fa3 bench + peers at $(elapsed) s"
grep -hE "^fa3 |ceiling|rror" "$OUT/fa3/bench.log" 2>/dev/null | head -30 >> "$summary"
grep -vE "^\s*$" "$OUT/fa3/peers.log" 2>/dev/null | head -30 >> "$summary"
if [ "$(elapsed)" -lt "${DECODE_BEFORE_S:-300}" ]; then
  timeout 90 "$ak" bench --backend flashinfer --device cuda --cases scripts/device/decode_targets.json \
    --graph --launches 32 --json "$OUT/decode_graph.json" > "$OUT/decode.log" 2>&1
  grep -E "^flashinfer |ceiling" "$OUT/decode.log" | head -20 >> "$summary"
  note "decode at $(elapsed) s"
fi
