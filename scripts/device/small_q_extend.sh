#!/usr/bin/env bash
# Extends with few new tokens per request over long prefixes (scripts/device/small_q_extend.json)
# on each VARIANT (BACKEND[:ENV=V,ENV=V]), alternated ROUNDS rounds, beside the decode of the same
# requests (bench/cases/decode.json is not used: the decode rows here are the extend's b64 / kv
# 4096 new 1). Builds the d-128 CLI in build/d128.
#   VARIANTS="fa3 flashinfer flashinfer:ATTNKIT_FLASHINFER_SM90_PREFILL=0"  ROUNDS=2
#   run(carry=[".deps"], command="bash scripts/device/small_q_extend.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start
note_device
note "$(attnkit_build_cli_d128 "$OUT")"
ak=build/d128/tools/attnkit/attnkit
cases=${CASES:-scripts/device/small_q_extend.json}
for r in $(seq 1 "${ROUNDS:-2}"); do
  i=0
  for v in ${VARIANTS:-fa3 flashinfer flashinfer:ATTNKIT_FLASHINFER_SM90_PREFILL=0}; do
    b=${v%%:*}
    e=""
    [[ "$v" == *:* ]] && e=${v#*:}
    i=$((i + 1))
    verify=""
    [ "$r" = 1 ] && verify="--verify"
    echo "== round $r $v"
    env ${e//,/ } timeout 150 "$ak" bench --backend "$b" --device cuda --cases "$cases" $verify \
      --json "$OUT/r${r}_v$i.json" 2>>"$OUT/bench.err" | grep -E "^$b |ceiling|verify|rel"
  done
done > "$OUT/bench.txt"
sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
note "done at $(elapsed) s"
