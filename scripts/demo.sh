#!/usr/bin/env bash
# Builds attnkit and runs the demo: the auto-selected backend on whatever device is present runs a
# mixed extend + decode batch over a paged KV cache and is verified against the fp64 reference.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
build=${ATTNKIT_BUILD_DIR:-build/demo}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_BUILD_TESTS=OFF \
  -DATTNKIT_CUDA="${ATTNKIT_CUDA:-AUTO}"
cmake --build "$build" -j "$(nproc)" --target attnkit_cli
"$build/tools/attnkit/attnkit" demo "$@"
