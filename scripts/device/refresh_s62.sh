#!/usr/bin/env bash
# Session 62: the CUDA-graph replay refresh (init_forward_metadata_replay_cuda_graph, host time)
# on ONE host in both graph sizes, to tell the host from the graph size apart (session 61 read
# 32-36 us at b16 with graphs of 32 forwards on one machine and 5.7 us with a graph of one on
# another). Builds the CLI (sm_90a, d 128), then alternates --launches 1 / --launches 32, and the
# default / ATTNKIT_FLASHINFER_DEVICE_PLAN=2 (the plan written on the GPU from the lengths: no host
# plan, no staging upload), over the decode target shapes; prints the refresh medians (overlapped
# and idle) per case, with the host's load.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/refresh_s62.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
final_out="${OUT:-$root/out}"
mkdir -p "$final_out"
work=/tmp/refresh
rm -rf "$work"; mkdir -p "$work"
OUT="$work/build" STAGES="build" TARGETS="attnkit_cli" HEAD_DIMS="128" bash scripts/device/check.sh \
  > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
ak=build/device/tools/attnkit/attnkit
echo "host: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for round in 1 2; do
  for launches in 1 32; do
    for variant in default ATTNKIT_FLASHINFER_DEVICE_PLAN=2; do
      envs=(); [ "$variant" != default ] && envs=("$variant")
      j="$work/r${round}_l${launches}_${variant%%=*}.json"
      echo "== round $round, --launches $launches, $variant, load $(cut -d' ' -f1-3 /proc/loadavg)"
      env "${envs[@]}" timeout 120 "$ak" bench --backend flashinfer --device cuda --graph \
        --launches "$launches" --warmup 3 --iters 10 --cases scripts/device/decode_targets.json \
        --json "$j" > "$j.log" 2>&1 || tail -3 "$j.log"
      python3 - "$j" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    rr = r.get("replay_refresh") or {}
    print(f'  {r["case"]:48s} ms {r.get("ms_median", 0):.4f}  refresh us median {rr.get("us_median", -1):6.1f}'
          f' p90 {rr.get("us_p90", -1):6.1f} idle {rr.get("idle_us_median", -1):6.1f}')
PY
    done
  done
done
tar -czf "$final_out/refresh.tar.gz" -C "$work" --exclude build .
