#!/usr/bin/env bash
# One device run for the MLA backends (issue 7): build only their targets, run their GPU tests
# (MLA cases of flashmla, cutlass_mla and flashinfer) and the MLA decode benchmark with the copy
# ceiling measured in the same process. Run from the repository root with .deps carried:
#   MLA_BENCH_BACKENDS=flashmla,triton MLA_CASES=scripts/device/mla_decode_quick.json \
#     bash scripts/device/mla_run.sh
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
B=build/mla
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real -DCMAKE_PREFIX_PATH="$PWD/.deps" \
  -DATTNKIT_GTEST_SOURCE_DIR="$PWD/.deps/googletest" \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
  -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 > "$OUT/build.log" 2>&1
ninja -C $B -j16 attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases \
  >> "$OUT/build.log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s"
grep -m8 -E "error" "$OUT/build.log"
for t in flashmla_cases cutlass_mla_cases flashinfer_cases; do
  filter='*'
  [ "$t" = flashinfer_cases ] && filter='*mla*'
  timeout "${MLA_TEST_TIMEOUT:-60}" "$B/tests/test_$t" --gtest_filter="$filter" > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|tests ran' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] .*\." "$OUT/$t.log" | head -12
  grep -E "rel_l2|Failure|error" "$OUT/$t.log" | head -6
done
timeout "${MLA_BENCH_TIMEOUT:-100}" "$B/tools/attnkit/attnkit" bench \
  --backend "${MLA_BENCH_BACKENDS:-flashmla,triton}" \
  --cases "${MLA_CASES:-scripts/device/mla_decode_quick.json}" --device cuda --warmup 3 \
  --iters 10 --json "$OUT/mla_bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
tail -32 "$OUT/bench.log"
