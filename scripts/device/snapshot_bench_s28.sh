#!/usr/bin/env bash
# Session 28 (device, repository root, carry .deps and .peers): the bench half of
# scripts/device/integration.sh in one call with only the CLI built (TARGETS=attnkit_cli): torch
# peers, the decode targets in the three timing modes (eager, --launches 10, --graph), extend
# (triton, flashinfer, fa3), MLA (flashmla), then the SDPA decode peers. Files under $OUT/bench.
set -uo pipefail
mkdir -p "$OUT/bench"
OUT="$OUT/bench" TARGETS=attnkit_cli BENCH_TIMEOUT="${BENCH_TIMEOUT:-70}" \
  PEERS_TIMEOUT="${PEERS_TIMEOUT:-110}" STAGES="build peers bench" BENCH_KINDS="" BENCH_RUNS="\
decode=triton,flashinfer=scripts/device/decode_targets.json \
decode_b2b=triton,flashinfer=scripts/device/decode_targets.json=--launches,10 \
decode_graph=triton,flashinfer=scripts/device/decode_targets.json=--graph,--launches,32 \
extend=triton,flashinfer,fa3=scripts/device/extend_prefill_quick.json \
mla=flashmla=scripts/device/mla_decode_quick.json \
mla_b2b=flashmla=scripts/device/mla_decode_quick.json=--launches,8" \
  bash scripts/device/check.sh > "$OUT/bench.log" 2>&1
OUT="$OUT/bench" PYTHONUNBUFFERED=1 timeout 120 python3 scripts/device/decode_peers.py \
  > "$OUT/bench/decode_peers.log" 2>&1
grep -E "rc=" "$OUT/bench/summary.txt"
tail -8 "$OUT/bench/decode_peers.log"
