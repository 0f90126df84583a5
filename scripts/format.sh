#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i
