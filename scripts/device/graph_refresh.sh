#!/usr/bin/env bash
# DESIGN.md section 9, "CUDA-graph replay of a 32-layer decode step: metadata refresh < 20 us host
# time": builds the CLI and test_bench_graph (head dim 128), runs the test, then `attnkit bench
# --graph --launches 32` (the captured graph holds 32 forwards = one 32-layer step, refreshed once
# per replay) over scripts/device/graph_refresh.json and the decode / MLA target files, for every
# backend with CUDA-graph support here. The bench line's "replay metadata refresh: host median X us"
# is the figure. Runs ON the device machine from the repository root with .deps beside it:
#   run(carry=[".deps"], command="bash scripts/device/graph_refresh.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="$root/build/device-graph"
t0=$(date +%s)
attnkit_configure "$build" 90a-real "128" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
ninja -C "$build" -j16 attnkit_cli test_bench_graph >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
timeout 300 "$build/tests/test_bench_graph" --gtest_brief=1 2>&1 | tail -5
cli="$build/tools/attnkit/attnkit"
run() {  # backends case-file
  timeout 200 "$cli" bench --device cuda --graph --launches 32 --warmup 3 --iters 10 --backend "$1" \
    --cases "$2" --json "$OUT/$(basename "$2" .json)_${1//,/_}.json" 2>&1 | grep -vE "^\[" |
    sed -E 's/ +/ /g' | tee -a "$OUT/graph_refresh.log"
}
run triton,flashinfer,fa3 scripts/device/graph_refresh.json
run flashinfer scripts/device/decode_targets.json
run flashmla,flashinfer scripts/device/mla_decode_quick.json
echo "total: $(( $(date +%s) - t0 )) s"
