#!/usr/bin/env bash
# Session 28 A/B (device, repository root; carry .deps, .peers and .wt/base = `git archive` of the
# tree before the change): this tree's fa3 GPU tests (defaults, then test_fa3_cases again with
# ATTNKIT_FA3_BLOCK_N=176), the cuDNN / FA2 peers (scripts/device/fa3_peers.py, d 256
# bidirectional added), then scripts/device/fa3_bidir176.json timed with both trees' CLIs,
# alternated, ROUNDS rounds: base, new (two-stage kernels release K and V separately), new with
# 176-key blocks at d 128. The kernel change it measured (session 28, not kept) is
# scripts/device/patches/fa3_s28_bidir176_split_release.patch: apply it to this tree first.
set -u
CTEST_REGEX="${CTEST_REGEX-Fa3|FA3|fa3}" NAME=fa3_bidir176_ab ROUNDS=${ROUNDS:-2} \
  BENCH_ARGS="--backend fa3 --cases scripts/device/fa3_bidir176.json --warmup 3 --iters 10" \
  VARIANTS="${VARIANTS:-base:X=1 new:X=1 new:ATTNKIT_FA3_BLOCK_N=176}" \
  bash "$(dirname "$0")/ab_two_trees.sh"
t=$(find build/device -name test_fa3_cases -type f | head -1)
if [ -n "$t" ] && [ -n "${TEST176:-1}" ]; then
  ATTNKIT_FA3_BLOCK_N=176 timeout 200 "$t" > "$OUT/test_fa3_cases_176.log" 2>&1
  echo "test_fa3_cases with ATTNKIT_FA3_BLOCK_N=176: rc $?"
  tail -4 "$OUT/test_fa3_cases_176.log"
fi
FA3_PEERS_EXTRA="2,8192,256,0;4,4096,256,1" timeout 150 python3 scripts/device/fa3_peers.py \
  > "$OUT/fa3_peers.log" 2>&1
grep -E "gemm|cudnn" "$OUT/fa3_peers.log"
