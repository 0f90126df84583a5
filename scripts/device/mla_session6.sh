#!/usr/bin/env bash
# Session 6 device run for the MLA backends (one command, fits timeout_s 240): build the MLA
# targets (+ fa3/triton case tests, which hold MLA cases), torch ceilings, the flashmla bench
# (eager and --graph, --warmup 3 --iters 10), then every MLA GPU test. Bench before tests so the figures come
# back even if the test stage runs out of time; tests still gate whether a change lands.
# Run from the repository root with .deps carried. Knobs: B (build dir, build-dev).
set -uo pipefail
FINAL="${OUT:-$PWD/out}"; OUT=${MLA_WORK:-/tmp/mla_s6}; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
B=${B:-build-dev}; T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
. scripts/device/lib.sh
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
attnkit_configure "$B" > "$OUT/build.log" 2>&1
ninja -C "$B" -j16 attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases \
  test_mla_prefix_cache test_fa3_cases test_triton_cases >> "$OUT/build.log" 2>&1
echo "build rc=$? $(el)"; grep -m5 -E "error|C75[0-9][0-9]" "$OUT/build.log"
[ -n "${PATCH:-}" ] || timeout 30 python3 scripts/device/mla_ceilings.py 2>&1 | tail -2
CASES=${CASES:-scripts/device/mla_decode_quick.json}
timeout 60 "$B/tools/attnkit/attnkit" bench --backend flashmla \
  --cases "$CASES" --device cuda --warmup 3 --iters 10 \
  --json "$OUT/bench_flashmla.json" > "$OUT/bench_flashmla.log" 2>&1
echo "bench rc=$? $(el)"
if [ -z "${PATCH:-}" ]; then
  timeout 40 "$B/tools/attnkit/attnkit" bench --backend flashmla --graph \
    --cases "$CASES" --device cuda --warmup 3 --iters 10 \
    --json "$OUT/bench_flashmla_graph.json" > "$OUT/bench_flashmla_graph.log" 2>&1
  echo "bench --graph rc=$? $(el)"
fi
(cd "$B" && timeout $(( 228 - ($(date +%s) - T0) )) ctest -L gpu \
  -R 'Mla|MLA|mla|FlashMla|CutlassMla|FlashInfer.*[Mm]la' -j 8 --timeout 45 \
  --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest.log" | head -12
# PATCH=<file>: a variant measured in the same run (16-head cases): apply, rebuild, its FlashMla
# tests, its bench, revert. CASES (default the quick file) narrows the base bench too.
if [ -n "${PATCH:-}" ] && git apply "$PATCH" 2> "$OUT/patch.log"; then
  ninja -C "$B" -j16 attnkit_cli test_flashmla_cases > "$OUT/build_patch.log" 2>&1
  echo "patch build rc=$? $(el)"; grep -m5 -E "error|C75[0-9][0-9]" "$OUT/build_patch.log"
  (cd "$B" && timeout $(( 215 - ($(date +%s) - T0) )) ctest -L gpu -R 'FlashMla' -j 8 \
    --timeout 45 --output-on-failure > "$OUT/ctest_patch.log" 2>&1)
  echo "patch ctest rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest_patch.log")"
  timeout $(( 235 - ($(date +%s) - T0) )) "$B/tools/attnkit/attnkit" bench --backend flashmla \
    --cases scripts/device/mla_decode_16h.json --device cuda --warmup 3 --iters 10 \
    --json "$OUT/bench_patch.json" > "$OUT/bench_patch.log" 2>&1
  echo "patch bench rc=$? $(el)"
  git apply -R "$PATCH"
elif [ -n "${PATCH:-}" ]; then echo "patch failed: $(cat "$OUT/patch.log")"; fi
cp "$OUT"/bench_*.json "$FINAL"/ 2>/dev/null
for f in "$OUT"/*.log; do echo "=== $f"; cat "$f"; done > "$FINAL/all_logs.txt"
for f in "$OUT"/bench_*.log; do
  echo "== $(basename "$f") $(grep -o 'cuda_d2d_copy: [0-9.]* GB/s' "$f")"
  grep -E " ok$| skipped| failed|error" "$f" | awk '{print $2, $3, $4, $5, $6}'
done
