#!/usr/bin/env bash
# Runs ON a device machine with two or more GPUs (kind nvidia-h100-x2 / nvidia-h200-x2), from the
# repository root with .deps / .peers carried:
#   run(kind="nvidia-h100-x2", carry=[".deps", ".peers"], command="bash scripts/device/multi_gpu_check.sh")
# 1. Builds the multi-GPU tests and the tests they share helpers with, runs them (ctest -L gpu).
# 2. The negative check of cuda::PerDeviceOnce: with its record made once per process (the device
#    ignored, as before f8d63e3), RunsOnBothDevicesInOneProcess must fail (the second device
#    launches without its shared-memory opt-in). The header is restored afterwards.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT/mg"
TARGETS="test_multi_gpu test_cuda_kv_metadata test_verify_graphs test_kv_guard" OUT="$OUT/mg" STAGES="build test" \
  CTEST_JOBS=4 CTEST_REGEX="${CTEST_REGEX:-OtherDevice|DeviceScopeRestore|WrapOnTwoDevices|PerDeviceValue|CudaWrapTest|CudaSetKv|VerifyGraphs|KVGuard}" \
  bash scripts/device/check.sh 2>&1 | tail -8

[ "${NEGATIVE:-1}" = 1 ] || exit 0
header=src/cuda/common/per_device_once.h
cp "$header" /tmp/per_device_once.h.orig
trap 'cp /tmp/per_device_once.h.orig "$header"' EXIT
sed -i 's/const uint64_t bit = uint64_t{1} << device;/const uint64_t bit = 1;/' "$header"
if ! grep -q "const uint64_t bit = 1;" "$header"; then echo "negative check: patch did not apply"; exit 1; fi
t0=$(date +%s)
ninja -C build/device -j16 test_multi_gpu > "$OUT/neg_build.log" 2>&1
echo "negative check build: rc=$? in $(( $(date +%s) - t0 )) s"
build/device/tests/test_multi_gpu --gtest_filter='*RunsOnBothDevicesInOneProcess*' > "$OUT/neg_run.log" 2>&1
echo "negative check run: rc=$? (expected non-zero: once-per-process attributes)"
grep -E "^\[  (PASSED|FAILED) |tests? ran" "$OUT/neg_run.log" | head -30
