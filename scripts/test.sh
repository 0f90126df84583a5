#!/usr/bin/env bash
# Builds everything (CUDA code too when nvcc is present, even without a GPU; the Python package when
# nanobind can be had from PyPI) and runs the CPU tests and the Python tests; runs the GPU tests as
# well when a GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
build=${ATTNKIT_BUILD_DIR:-build/test}
python=${PYTHON:-python3}

# Python package: nanobind, numpy and pytest from PyPI when missing.
with_python=OFF
if command -v "$python" >/dev/null 2>&1; then
  missing=()
  for m in nanobind numpy pytest; do "$python" -c "import $m" 2>/dev/null || missing+=("$m"); done
  if ((${#missing[@]})); then
    "$python" -m pip install --quiet "${missing[@]}" || true
  fi
  "$python" -c "import nanobind, numpy, pytest" 2>/dev/null && with_python=ON
fi
[ "$with_python" = ON ] || echo "attnkit: Python tests SKIPPED (nanobind/numpy/pytest unavailable)" >&2

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA="${ATTNKIT_CUDA:-AUTO}" \
  -DATTNKIT_BUILD_PYTHON="$with_python" -DPython_EXECUTABLE="$(command -v "$python" || echo python3)"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" -L cpu --output-on-failure -j "$(nproc)"
if [ "$with_python" = ON ]; then
  PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -q tests/python
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ctest --test-dir "$build" -L gpu --output-on-failure
fi
