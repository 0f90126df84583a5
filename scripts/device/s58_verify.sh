#!/usr/bin/env bash
# Session 58: speculative verify steps (decode case files with s_q drafts and topk) on flashinfer,
# fa3 (which hands verify to flashinfer's kernels) and triton, against the copy ceiling the bench
# measures in the same run. Builds the CLI only, then
#  1. `attnkit bench --verify` once (fp64 reference per case; eager, one forward per sample);
#  2. ROUNDS rounds of eager `--launches 10` (kernel time) and `--graph` (CUDA-graph replays, as a
#     serving engine runs verify).
#   run(carry=[".deps"], command="bash scripts/device/s58_verify.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
build="$root/build/device"
cases="${CASES:-scripts/device/verify_s58.json}"
backends="${BACKENDS:-flashinfer,fa3,triton}"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) date: $(date -u +%FT%RZ)" | tee "$OUT/summary.txt"
t0=$(date +%s)
attnkit_configure "$build" "${ARCHS:-90a-real}" > "$OUT/build.log" 2>&1 &&
  ninja -C "$build" -j16 attnkit_cli >> "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
ak="$build/tools/attnkit/attnkit"
row='^(flashinfer|fa3|triton) |ceiling|copy'
echo "== --verify" | tee -a "$OUT/summary.txt"
timeout 260 "$ak" bench --backend "$backends" --device cuda --cases "$cases" --verify \
  --json "$OUT/verify.json" 2>&1 | grep -E "$row|mismatch|failed" | tee -a "$OUT/summary.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r --launches 10" | tee -a "$OUT/summary.txt"
  timeout 120 "$ak" bench --backend "$backends" --device cuda --cases "$cases" --launches 10 \
    --json "$OUT/b2b_r$r.json" 2>&1 | grep -E "$row" | tee -a "$OUT/summary.txt"
  echo "== round $r --graph" | tee -a "$OUT/summary.txt"
  timeout 120 "$ak" bench --backend "$backends" --device cuda --cases "$cases" --graph \
    --json "$OUT/graph_r$r.json" 2>&1 | grep -E "$row" | tee -a "$OUT/summary.txt"
done
