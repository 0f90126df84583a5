#!/usr/bin/env bash
# Builds everything (CUDA code too when nvcc is present, even without a GPU) and runs the CPU tests;
# runs the GPU tests as well when a GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
build=${ATTNKIT_BUILD_DIR:-build/test}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA="${ATTNKIT_CUDA:-AUTO}"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" -L cpu --output-on-failure -j "$(nproc)"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ctest --test-dir "$build" -L gpu --output-on-failure
fi
