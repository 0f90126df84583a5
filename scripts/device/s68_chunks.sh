#!/usr/bin/env bash
# Session 68: what a chunk of the MLA chunked prefix cache costs on fa3's wgmma passes
# (scripts/device/s68_mla_chunks.json: the same prefixes in chunks of different sizes, ROUNDS
# alternated rounds), and the passes on the portable SIMT kernel (ATTNKIT_FA3_MLA_PREFIX=0) for
# bench/cases/mla_prefill_prefix.json's first case. The CLI built for HEAD_DIMS (default 64; the
# MLA kernel is built whatever the list).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s68_chunks.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
ak=build/device/tools/attnkit/attnkit
HEAD_DIMS="${HEAD_DIMS:-64}" attnkit_build_targets attnkit_cli
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r"
  timeout 90 "$ak" bench --backend fa3 --device cuda --cases scripts/device/s68_mla_chunks.json \
    --json "$OUT/chunks_r$r.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
done > "$OUT/bench.txt"
echo "== ATTNKIT_FA3_MLA_PREFIX=0" >> "$OUT/bench.txt"
ATTNKIT_FA3_MLA_PREFIX=0 timeout 120 "$ak" bench --backend fa3 --device cuda \
  --cases bench/cases/mla_prefill_prefix.json --filter b1_pre8192 --warmup 1 --iters 3 \
  2>>"$OUT/bench.err" | grep -E "^fa3 " >> "$OUT/bench.txt"
sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
note "done at $(elapsed) s"
