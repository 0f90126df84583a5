#!/usr/bin/env bash
# Session 63: compute-sanitizer's racecheck (shared-memory hazards between threads of a block) and
# synccheck (barriers in divergent code, bad mbarrier / named-barrier use) over the GPU case
# binaries' shared case tables, which no run had done (memcheck runs in ctest as
# FlashInferVerifyMemcheck). Runs ON the device machine from the repository root, carrying .deps:
#   run(carry=[".deps"], command="bash scripts/device/s63_sanitize.sh")
#   STAGES="build sanitize"   BUILD_TARGETS (the case binaries to build)
#   RUNS="synccheck:flashinfer racecheck:fa3 ..." (tool:binary pairs, binary = test_<binary>_cases,
#   or a whole test binary name such as test_flashinfer_cascade)
#   FILTER (gtest filter, default SharedTable/*; the flashmla and triton binaries name their
#   suites otherwise: FILTER="*")   LIMIT_S (seconds per run)
# Files back from $OUT: summary.txt build.log logs.tar.gz (one log per run).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
mkdir -p "$OUT/logs"
build="${BUILD_DIR:-$root/build/device}"
STAGES="${STAGES:-build sanitize}"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)"

if has_stage build; then
  attnkit_configure "$build" 90a-real > "$OUT/build.log" 2>&1 || {
    tail -20 "$OUT/build.log"
    note "configure FAILED"
    exit 1
  }
  timeout 400 ninja -C "$build" -j16 ${BUILD_TARGETS:-test_flashinfer_cases test_fa3_cases test_triton_cases} \
    >> "$OUT/build.log" 2>&1
  note "build: rc=$? at $(elapsed) s"
fi

if has_stage sanitize; then
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  [ -n "$cs" ] || { note "no compute-sanitizer"; exit 1; }
  note "compute-sanitizer: $cs ($("$cs" --version | tail -1))"
  runs="${RUNS:-synccheck:flashinfer synccheck:fa3 racecheck:flashinfer racecheck:fa3}"
  for r in $runs; do
    tool="${r%%:*}"
    name="${r#*:}"
    case "$name" in  # a case binary's short name, or a whole test binary name (test_...)
      test_*) bin="$build/tests/$name" ;;
      *) bin="$build/tests/test_${name}_cases" ;;
    esac
    log="$OUT/logs/${tool}_${name}.log"
    timeout "${LIMIT_S:-100}" "$cs" --tool "$tool" --error-exitcode 99 "$bin" \
      --gtest_filter="${FILTER:-SharedTable/*}" > "$log" 2>&1
    rc=$?
    note "$tool $name: rc=$rc at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED) |SUMMARY' "$log" | tr '\n' ' ' | cut -c1-300)"
    tar -czf "$OUT/logs.tar.gz" -C "$OUT/logs" .  # after every run: a call cut short keeps what ran
  done
  rm -rf "$OUT/logs"
fi
