# Shared by the scripts in scripts/device (they run ON the device machine from the repository root
# with .deps beside it, made by scripts/device/prepare_deps.sh). Source it:
#   . "$(dirname "$0")/lib.sh"
#
# attnkit_configure BUILD_DIR [ARCHS [HEAD_DIMS [extra cmake args...]]]
#   Configures the CUDA Release build with Ninja against .deps (GoogleTest from source, nvcc told
#   -std=c++20 directly). ARCHS defaults to 90a-real; HEAD_DIMS empty = the CMake default
#   (-DATTNKIT_HEAD_DIMS otherwise). Output goes where the caller sends it; returns cmake's status.
# attnkit_configure_cpu BUILD_DIR [extra cmake args...]
#   The same Release / Ninja / .deps configure without CUDA (-DATTNKIT_CUDA=OFF).
# attnkit_build_base_cli BASE LOG_DIR
#   Builds the attnkit CLI of an older tree unpacked at BASE (its own lib.sh, this .deps linked in)
#   into BASE/build, logs in LOG_DIR/base_{cfg,build}.log; prints "base build rc N".
# attnkit_build_cli_d128 LOG_DIR
#   Configures (first time only) and builds the CLI for head dim 128 alone in build/d128
#   (incremental on a warm machine), logs in LOG_DIR/{cfg,build}.log; prints the build time, or
#   the build log's tail and returns 1 when the build fails.
# attnkit_script_start
#   The common start of a device script, run from the repository root after sourcing this file:
#   OUT (default ./out) created, summary=$OUT/summary.txt emptied, t_start now. With it come
#   note TEXT (echo, appended to the summary), has_stage NAME (whether STAGES lists it) and elapsed
#   (seconds since attnkit_script_start).
# attnkit_build_targets "TARGETS"
#   After attnkit_script_start: builds the space-separated TARGETS in build/device through check.sh's
#   build stage (HEAD_DIMS from the environment, empty = every head dim; logs in $OUT/check) and
#   notes check.sh's build line and the build log's error / FAILED lines in the summary.
# attnkit_run_gtest NAME LIMIT BINARY [FILTER]
#   After attnkit_script_start: runs build/device/tests/BINARY with --gtest_filter=FILTER (default
#   *) under a LIMIT-second timeout into $OUT/NAME.log and notes its exit status, the time and the
#   PASSED / FAILED lines, then its failure lines, in the summary.
# attnkit_ncu_bin
#   Prints the path of Nsight Compute's ncu (PATH first, else the newest under
#   /opt/nvidia/nsight-compute, else the CUDA toolkit's); nothing when there is none.

# _attnkit_cmake BUILD_DIR ON|OFF [cmake args...]: the part both configures share.
_attnkit_cmake() {
  local build=$1 cuda=$2
  shift 2
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA="$cuda" \
    -DCMAKE_PREFIX_PATH="$root/.deps" -DATTNKIT_GTEST_SOURCE_DIR="$root/.deps/googletest" "$@"
}

attnkit_configure() {
  local build=$1 archs=${2:-90a-real} head_dims=${3:-}
  shift $(($# < 3 ? $# : 3))
  _attnkit_cmake "$build" ON -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
    -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 \
    ${head_dims:+"-DATTNKIT_HEAD_DIMS=$head_dims"} "$@"
}

attnkit_configure_cpu() {
  local build=$1
  shift
  _attnkit_cmake "$build" OFF "$@"
}

attnkit_build_cli_d128() {
  local logs=$1 build=build/d128 t0
  [ -f "$build/build.ninja" ] || attnkit_configure "$build" 90a-real 128 > "$logs/cfg.log" 2>&1
  t0=$(date +%s)
  ninja -C "$build" -j16 attnkit_cli > "$logs/build.log" 2>&1 || {
    tail -20 "$logs/build.log"
    return 1
  }
  echo "build: $(($(date +%s) - t0)) s"
}

attnkit_ncu_bin() {
  command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1
}

attnkit_build_base_cli() {
  local base=$1 logs=$2 here
  here=$(pwd)
  (cd "$base" && ln -sfn "$here/.deps" .deps && . scripts/device/lib.sh &&
    attnkit_configure build 90a-real > "$logs/base_cfg.log" 2>&1 &&
    ninja -C build -j16 attnkit_cli > "$logs/base_build.log" 2>&1
    echo "base build rc $?")
}

attnkit_script_start() {
  OUT="${OUT:-$(pwd)/out}"
  mkdir -p "$OUT"
  summary="$OUT/summary.txt"
  : > "$summary"
  t_start=$(date +%s)
}
note() { echo "$*" | tee -a "$summary"; }
has_stage() { [[ " ${STAGES:-} " == *" $1 "* ]]; }
elapsed() { echo $(($(date +%s) - t_start)); }
# The summary's first line: GPU, driver, UTC time.
note_device() {
  note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)"
}
attnkit_build_targets() {
  OUT="$OUT/check" STAGES=build HEAD_DIMS="${HEAD_DIMS:-}" TARGETS="$1" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
  grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
}
attnkit_run_gtest() {
  local name=$1 limit=$2 bin=$3 filter=${4:-*}
  timeout "$limit" "build/device/tests/$bin" --gtest_filter="$filter" > "$OUT/$name.log" 2>&1
  note "$name ($bin $filter): rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-300)"
  grep -E "^\[  FAILED  \]|Failure$|rel_l2 .*tol" "$OUT/$name.log" | head -12 >> "$summary"
}
