#!/usr/bin/env bash
# Session 8 (fa3 engineer): fa3_check.sh (build, fa3 ctest, bench variants, peers) plus the FP8
# time decomposition (ATTNKIT_FA3_DIAG bit sets x producer variants) and extra FP8 test subsets.
# Runs ON the device from the tree root:  bash scripts/device/fa3_s8.sh
# Knobs: everything fa3_check.sh reads; FP8_DIAGS ("1 2 4 5 6 7"), FP8_DIAG_ENVS (env settings the
#   decomposition is repeated under, "default" = none), FP8_TEST_ENVS (env settings under which the
#   FP8 / long test subset runs again). An env setting may join several with commas:
#   "ATTNKIT_FA3_FP8_SPEC=1,ATTNKIT_FA3_LAZY_RESCALE=0".
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
export OUT
bash scripts/device/fa3_check.sh
tests=build/device/tests/test_fa3_cases
cli=build/device/tools/attnkit/attnkit
for e in ${FP8_TEST_ENVS:-}; do
  # shellcheck disable=SC2086
  env ${e//,/ } timeout 60 "$tests" --gtest_brief=1 --gtest_filter='*Fp8*:*fp8*:*Long*' > "$OUT/test_env.log" 2>&1
  echo "test ($e, *Fp8*:*fp8*:*Long*): rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_env.log" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  grep -E "^\[  FAILED  \]|rel_l2" "$OUT/test_env.log" | head -8 | tee -a "$OUT/summary.txt"
done
args=(bench --cases bench/cases/fa3_prefill.json --device cuda --warmup 3 --iters 10 --backend fa3)
for e in ${FP8_DIAG_ENVS:-default}; do
  for d in ${FP8_DIAGS:-1 2 4 5 6 7}; do
    if [ "$e" = default ]; then envs=(); else IFS=, read -r -a envs <<< "$e"; fi
    r=$(env "${envs[@]}" ATTNKIT_FA3_DIAG=$d timeout 30 "$cli" "${args[@]}" \
      --filter new8192_p16_h32x8_d128_kvfp8 2>&1 | grep -E "^fa3 " | awk '{print $2, $3, $6}' | tr '\n' ' ')
    echo "fp8 diag $d ($e): $r" | tee -a "$OUT/diag.txt"
  done
done
