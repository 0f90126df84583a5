#!/usr/bin/env bash
# Session 61: one device call that measures where issues #5 / #6's targets stand on the tree that
# passed the whole `ctest -L gpu` (docs/gpu_tests.md "Session 61"), with the peers in the same
# command, plus the 32-row verify tiles at two CTAs per SM (session 60's untested A/B).
#  1. builds the CLI (sm_90a, head dims 64 / 128 / 256);
#  2. flashinfer decode targets (scripts/device/decode_targets.json) as CUDA graphs of 32 forwards;
#  3. scripts/device/decode_peers.py: the copy ceiling, SDPA cuDNN / FA2 on contiguous KV;
#  4. scripts/device/fa3_check.sh STAGES="bench peers": fa3 over bench/cases/fa3_prefill.json
#     (bf16, fp8_e4m3 KV, e4m3 q), then scripts/device/fa3_peers.py (GEMM ceiling, SDPA cuDNN /
#     FA2 prefill);
#  5. target verify (scripts/device/verify_s60.json, --launches 10): the default CTAs per SM and
#     ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM=2, alternated twice.
# Everything lands in $OUT/snapshot.tar.gz (the device returns a few files only) and the summary
# on stdout.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/snapshot_s61.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
final_out="${OUT:-$root/out}"
work=/tmp/snapshot
rm -rf "$work"
mkdir -p "$work/decode" "$work/fa3" "$final_out"
ak=build/device/tools/attnkit/attnkit

OUT="$work/decode" STAGES="build bench" TARGETS="attnkit_cli" HEAD_DIMS="64;128;256" BENCH_KINDS="" \
  BENCH_TIMEOUT=100 BENCH_RUNS="decode_graph=flashinfer=scripts/device/decode_targets.json=--graph,--launches,32" \
  bash scripts/device/check.sh > "$work/decode.log" 2>&1
OUT="$work/decode" PYTHONUNBUFFERED=1 timeout 120 python3 scripts/device/decode_peers.py \
  > "$work/decode/decode_peers.log" 2>&1
OUT="$work/fa3" STAGES="bench peers" DIAG_VARIANTS=" " BENCH_OTHERS="" BENCH_VARIANTS="default" \
  BENCH_TIMEOUT=90 bash scripts/device/fa3_check.sh > "$work/fa3.log" 2>&1
{
  for round in 1 2; do
    for ab in - ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM=2; do
      echo "== round $round, --launches 10, $ab"
      envs=()
      [ "$ab" != "-" ] && envs=("$ab")
      env "${envs[@]}" timeout 60 "$ak" bench --backend flashinfer --device cuda \
        --cases scripts/device/verify_s60.json --launches 10 2>&1 | grep -E "^flashinfer |ceiling"
    done
  done
} > "$work/verify_ab.txt" 2>&1
tar -czf "$final_out/snapshot.tar.gz" -C "$work" .
echo "=== decode"; cat "$work/decode/summary.txt"
grep -hE "^flashinfer |ceiling" "$work/decode/bench.log" | head -20
echo "=== decode peers"; tail -8 "$work/decode/decode_peers.log"
echo "=== fa3"; cat "$work/fa3/summary.txt"; grep -E "^fa3 |ceiling|rror" "$work/fa3/bench.log" | head -24
grep -vE "^\s*$" "$work/fa3/peers.log" | head -24
echo "=== verify A/B"; cat "$work/verify_ab.txt"
