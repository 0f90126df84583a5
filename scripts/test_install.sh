#!/usr/bin/env bash
# Installs a built attnkit tree into a temporary prefix and builds + runs a consumer project that
# uses find_package(attnkit). Usage: scripts/test_install.sh BUILD_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cuda_args=()
if grep -q '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" 2>/dev/null; then
  cuda_args=(-DCMAKE_CUDA_COMPILER="$(grep '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)")
fi
# The dependencies the build found (dlpack from a .deps prefix on the device machine, say) are the
# consumer's too: its find_package(attnkit) looks them up through the same prefix path.
prefix="$tmp/prefix"
build_prefix=$(grep '^CMAKE_PREFIX_PATH:' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2- || true)
if [ -n "$build_prefix" ]; then prefix="$prefix;$build_prefix"; fi
# So are its compiler flags: a library built with -fsanitize=address,undefined (the debug-asan
# preset) links only into a consumer compiled and linked with them.
cxx_flags=$(grep '^CMAKE_CXX_FLAGS:' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2- || true)
cmake -S "$src/tests/consumer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_FLAGS="$cxx_flags" "${cuda_args[@]}" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
