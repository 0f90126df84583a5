#!/usr/bin/env bash
# The lead's end-of-session integration command, one device call (read docs/PERF.md "GPU results"):
#   1. scripts/device/check.sh STAGES="build test python": build (sm_90a, all head dims),
#      `ctest -L gpu`, the Python GPU check;
#   2. check.sh STAGES="build peers bench" (the build is a no-op after step 1 on a warm machine):
#      torch peers, then the decode targets in the three timing modes (eager, --launches 10,
#      --graph), extend (triton, flashinfer, fa3), MLA (flashmla);
#   3. scripts/device/decode_peers.py (SDPA cuDNN / FA2 decode on contiguous KV);
#   4. scripts/device/fa3_check.sh STAGES="bench peers" (fa3 case file + cuDNN peers).
# Everything is written under $WORK (default /tmp/integration) and packed into one file,
# $OUT/integration_<parts>.tar.gz, because the device returns only a few files from $OUT.
# PARTS (default "tests fa3 bench") picks steps 1 / 4 / 2-3, so the whole can be split over two
# device calls of less than 10 minutes each (the build of step 1 stays in build/device).
# Usage on the device, from the repository root with .deps and .peers beside it:
#   PARTS="tests fa3" bash scripts/device/integration.sh; PARTS=bench bash ...
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
final_out="${OUT:-$root/out}"
WORK="${WORK:-/tmp/integration}"
PARTS="${PARTS:-tests fa3 bench}"
part() { [[ " $PARTS " == *" $1 "* ]]; }
rm -rf "$WORK"
mkdir -p "$WORK/check" "$WORK/bench" "$WORK/fa3" "$final_out"
part tests && OUT="$WORK/check" CTEST_JOBS="${CTEST_JOBS:-8}" STAGES="build test python" \
  bash scripts/device/check.sh > "$WORK/check.log" 2>&1
part bench && OUT="$WORK/bench" BENCH_TIMEOUT="${BENCH_TIMEOUT:-70}" PEERS_TIMEOUT="${PEERS_TIMEOUT:-110}" \
  STAGES="build peers bench" BENCH_KINDS="" BENCH_RUNS="\
decode=triton,flashinfer=scripts/device/decode_targets.json \
decode_b2b=triton,flashinfer=scripts/device/decode_targets.json=--launches,10 \
decode_graph=triton,flashinfer=scripts/device/decode_targets.json=--graph,--launches,32 \
extend=triton,flashinfer,fa3=scripts/device/extend_prefill_quick.json \
mla=flashmla=scripts/device/mla_decode_quick.json \
mla_b2b=flashmla=scripts/device/mla_decode_quick.json=--launches,8" \
  bash scripts/device/check.sh > "$WORK/bench.log" 2>&1
part bench && OUT="$WORK/bench" PYTHONUNBUFFERED=1 timeout 120 python3 scripts/device/decode_peers.py \
  > "$WORK/bench/decode_peers.log" 2>&1
part fa3 && OUT="$WORK/fa3" STAGES="bench peers" DIAG_VARIANTS=" " BENCH_OTHERS="" BENCH_VARIANTS="default" \
  bash scripts/device/fa3_check.sh > "$WORK/fa3.log" 2>&1
tar -czf "$final_out/integration_${PARTS// /_}.tar.gz" -C "$WORK" .
echo "=== check"; grep -vE "^\s*$" "$WORK/check/summary.txt" 2>/dev/null | head -12
echo "=== bench"; grep -E "rc=" "$WORK/bench/summary.txt" 2>/dev/null
grep -hE "^(triton|flashinfer|fa3|flashmla) " "$WORK/bench/bench.log" | awk '{print $1, $2, $3, $4, $5}' | head -60
echo "=== decode peers"; tail -8 "$WORK/bench/decode_peers.log"
echo "=== fa3"; grep -E "^fa3 |sdpa_cudnn|gemm" "$WORK/fa3.log" | awk '{print $1, $2, $3, $4, $5, $6}' | head -30
