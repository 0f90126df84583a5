#!/usr/bin/env bash
# Issue 7 peer: DeepSeek's public FlashMLA dense decode (sm90, bf16 latent cache, page 64) timed in
# the same device command as `attnkit bench --backend flashmla`, alternated rounds, same shapes.
# FlashMLA's sources and CUTLASS's headers are not in the repository: on the development machine
#   bash scripts/device/flashmla_peer.sh fetch   (after the `fetch` tool brought deepseek-ai/FlashMLA
#   and NVIDIA/cutlass into /work/.mirror) exports them into the git-ignored .peers/flashmla;
# then on the device:
#   run(carry=[".deps", ".peers"], command="bash scripts/device/flashmla_peer.sh")
# Environment: ROUNDS (3), CASES ("b:kv:heads:s_q" list), NCU=1 adds one ncu pass per kernel
# (DRAM / L2->SM bytes, tensor pipe activity, SM clock). Writes $OUT/summary.txt and logs.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
P=.peers/flashmla
if [ "${1:-}" = fetch ]; then
  M=/work/.mirror
  rm -rf "$P" && mkdir -p "$P/cutlass"
  (cd "$M/deepseek-ai+FlashMLA/repo" && git archive HEAD csrc) | tar -x -C "$P"
  sub=$(cd "$M/deepseek-ai+FlashMLA/repo" && git ls-tree HEAD csrc/cutlass | awk '{print $3}')
  (cd "$M/NVIDIA+cutlass/repo" && git archive "$sub" include) | tar -x -C "$P/cutlass"
  (cd "$M/deepseek-ai+FlashMLA/repo" && git rev-parse HEAD) > "$P/FLASHMLA_COMMIT"
  echo "$sub" > "$P/CUTLASS_COMMIT"
  du -sh "$P"
  exit 0
fi
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
ROUNDS="${ROUNDS:-3}"
CASES="${CASES:-128:4096:128:1 128:8192:128:1 128:4096:128:2}"
S="$OUT/summary.txt"
L="$OUT/logs"
BD=build-peer
mkdir -p "$L" "$BD"
t0=$(date +%s)
el() { echo "at $(($(date +%s) - t0)) s"; }
FL="-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES --expt-relaxed-constexpr --expt-extended-lambda
 --use_fast_math -gencode arch=compute_90a,code=sm_90a -I$P/csrc -I$P/csrc/kerutils/include
 -I$P/csrc/sm90 -I$P/cutlass/include -w"
srcs="$P/csrc/sm90/decode/dense/instantiations/bf16.cu $P/csrc/smxx/decode/combine/combine.cu
 $P/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
 scripts/device/peers/flashmla_decode_peer.cu"
{
  pids=""
  for s in $srcs; do
    nvcc $FL -c "$s" -o "$BD/$(basename "$s" .cu).o" > "$L/peer_$(basename "$s" .cu).log" 2>&1 &
    pids="$pids $!"
  done
  rc=0
  for pid in $pids; do wait "$pid" || rc=1; done
  [ $rc = 0 ] && nvcc -gencode arch=compute_90a,code=sm_90a "$BD"/*.o -o "$BD/flashmla_peer" -lcuda \
    > "$L/peer_link.log" 2>&1 || rc=1
  echo "peer build rc $rc"
} > "$L/peer_rc.txt" 2>&1 &
OUT=$OUT/check STAGES="build" TARGETS="attnkit_cli" bash scripts/device/check.sh > "$OUT/check.log" 2>&1
wait
{ tail -2 "$OUT/check.log"; cat "$L/peer_rc.txt"; cat "$P/FLASHMLA_COMMIT" 2>/dev/null; el; } > "$S"
CLI=build/device/tools/attnkit/attnkit
json="$BD/cases.json"
python3 - "$json" $CASES <<'PY'
import json, sys
cases = []
for c in sys.argv[2:]:
    b, kv, h, sq = map(int, c.split(":"))
    cases.append({"batch": b, "kv_len": kv, "q_heads": h, "s_q": sq, "kv_dtype": "bf16"})
json.dump({"kind": "mla_decode", "description": "flashmla peer shapes",
           "fixed": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "page_size": 64, "dtype": "bf16"},
           "cases": cases}, open(sys.argv[1], "w"), indent=1)
PY
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv >> "$S" 2>&1
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN="$(attnkit_ncu_bin)"
  M=dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,gpu__time_duration.sum
  SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy"
  c1=${CASES%% *}
  IFS=: read -r b kv h sq <<< "$c1"
  timeout 120 "$NCU_BIN" --clock-control none -k "regex:splitkv_mla" -c 1 $SEC --metrics "$M" \
    "$BD/flashmla_peer" "$b" "$kv" "$h" "$sq" 1 1 > "$L/ncu_peer.txt" 2>&1
  timeout 120 "$NCU_BIN" --clock-control none -k "regex:mla_decode_wgmma_kernel" -s 2 -c 1 $SEC --metrics "$M" \
    "$CLI" bench --backend flashmla --cases "$json" --filter "kv${kv}_" --device cuda --warmup 2 --iters 1 \
    > "$L/ncu_attnkit.txt" 2>&1
  for f in ncu_peer ncu_attnkit; do
    echo "== $f" >> "$S"
    grep -E "dram__|l1tex__|gpu__time|SM Frequency|Duration|Throughput|Issue|Busy|Registers|Stall|Warp Cycles|Executed Ipc|Theoretical|Achieved" "$L/$f.txt" | head -40 >> "$S"
  done
  el >> "$S"
fi
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  for c in $CASES; do
    IFS=: read -r b kv h sq <<< "$c"
    timeout 120 "$BD/flashmla_peer" "$b" "$kv" "$h" "$sq" 5 30 2>&1 | tail -2
  done
  timeout 120 "$CLI" bench --backend flashmla --cases "$json" --device cuda --warmup 5 --iters 30 2>&1 |
    awk '$1 == "flashmla" {print "attnkit", $2, $3, $6} /rror/'
done >> "$S" 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >> "$S" 2>&1
el >> "$S"
cat "$S"
