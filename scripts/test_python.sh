#!/usr/bin/env bash
# Builds the attnkit Python package from CMake (CPU backends unless ATTNKIT_CUDA says otherwise)
# and runs its pytest suite (tests/python): extend + decode on torch_native / intel_amx checked
# against an fp64 NumPy oracle, zero-copy pools, errors, selection and the support matrix.
#
#   scripts/test_python.sh [pytest args]
#   PYTHON=python3.12 ATTNKIT_PY_BUILD_DIR=build/py312 scripts/test_python.sh -k decode
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [[ -x scripts/install_deps.sh ]]; then
  scripts/install_deps.sh
fi
# Build and test requirements from PyPI, only when missing.
missing=()
for pair in nanobind:nanobind numpy:numpy pytest:pytest; do
  "$python" -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  "$python" -m pip install --quiet "${missing[@]}"
fi

build=${ATTNKIT_PY_BUILD_DIR:-build/python}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DATTNKIT_CUDA="${ATTNKIT_CUDA:-OFF}" -DATTNKIT_BUILD_PYTHON=ON \
  -DATTNKIT_BUILD_TESTS=OFF -DATTNKIT_BUILD_CLI=OFF -DATTNKIT_INSTALL=OFF \
  -DPython_EXECUTABLE="$(command -v "$python")"
cmake --build "$build" --target _attnkit -j "${ATTNKIT_JOBS:-$(nproc)}"
PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -q tests/python "$@"
