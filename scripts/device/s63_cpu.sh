#!/usr/bin/env bash
# Session 63: the CPU test suite (`ctest -L cpu`, what CI runs) on the device machine's host CPU, a
# Xeon with AMX-BF16, AVX512-BF16 / FP16 / VBMI: the ISA paths that CI's AVX2-only VM skips (the
# AMX tiles, the AVX-512 traits, the byte-table fp8 decode) then run on their own hardware.
# Runs ON the device machine from the repository root, carrying .deps:
#   run(carry=[".deps"], command="bash scripts/device/s63_cpu.sh")
#   STAGES="build test"  LIMIT_S=560 (the whole call's budget; ctest gets what the build left)
#   CTEST_ARGS=""        extra ctest arguments (e.g. "--rerun-failed" or "-R IntelAmx")
# Files back from $OUT: summary.txt build.log ctest.log fp8_widening.log.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
build="${BUILD_DIR:-$root/build/cpu-device}"
STAGES="${STAGES:-build test}"
limit="${LIMIT_S:-560}"

note "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  $(lscpu | grep -m1 'Model name' | sed -E 's/  +/ /g')  nproc $(nproc)"
note "flags: $(grep -m1 -o -w -E 'amx_bf16|amx_tile|avx512f|avx512_bf16|avx512_fp16|avx512vbmi' /proc/cpuinfo | sort -u | tr '\n' ' ')"

if has_stage build; then
  attnkit_configure_cpu "$build" > "$OUT/build.log" 2>&1 || {
    tail -20 "$OUT/build.log"
    note "configure FAILED"
    exit 1
  }
  timeout 300 ninja -C "$build" -j16 -k 0 >> "$OUT/build.log" 2>&1
  note "build: rc=$? at $(elapsed) s"
fi

if has_stage test; then
  timeout 30 "$build/tests/test_cpu_fp8_widening" > "$OUT/fp8_widening.log" 2>&1
  note "test_cpu_fp8_widening: rc=$? $(grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$OUT/fp8_widening.log" | tr '\n' ' ')"
  left=$((limit - $(elapsed) - 10))
  read -r -a extra <<< "${CTEST_ARGS:-}"
  timeout "$left" ctest --test-dir "$build" -L cpu -j16 --timeout 200 --output-on-failure \
    "${extra[@]}" > "$OUT/ctest.log" 2>&1
  note "ctest -L cpu: rc=$? at $(elapsed) s: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Not Run|Exception)' "$OUT/ctest.log" | head -20 |
    tee -a "$OUT/summary.txt"
  true
fi
