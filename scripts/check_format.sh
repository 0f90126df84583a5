#!/usr/bin/env bash
# Fails when any C++/CUDA source differs from .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
[ -z "$files" ] && exit 0
if ! clang-format --dry-run --Werror $files; then
  echo "formatting differs: run scripts/format.sh" >&2
  exit 1
fi
