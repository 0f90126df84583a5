#!/usr/bin/env bash
# Session 28 (device, repository root, carry .deps): builds the CLI and test_fa3_cases, runs the fa3
# GPU tests, then scripts/device/fa3_qprefetch.json with ATTNKIT_FA3_Q_PREFETCH=1 (default) and =0
# alternated, ROUNDS rounds, then the cuDNN / FA2 peers (d 256 shapes added) into $OUT. The knob
# belongs to the kernel change measured in session 28 (not kept):
# scripts/device/patches/fa3_s28_q_prefetch_l2.patch; apply it to this tree first.
set -u
. scripts/device/lib.sh
OUT=$OUT/check STAGES="build test" TARGETS="attnkit_cli test_fa3_cases test_mla_prefix_cache" \
  CTEST_REGEX="${CTEST_REGEX-Fa3}" CTEST_JOBS=8 bash scripts/device/check.sh > "$OUT/check.log" 2>&1
tail -3 "$OUT/check.log"
C=build/device/tools/attnkit/attnkit
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in ATTNKIT_FA3_Q_PREFETCH=1 ATTNKIT_FA3_Q_PREFETCH=0; do
    echo "== round $r $v"
    env "$v" "$C" bench --backend fa3 --cases scripts/device/fa3_qprefetch.json --device cuda \
      --warmup 3 --iters 10 2>&1 | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $6}'
  done
done 2>&1 | tee "$OUT/fa3_qprefetch_ab.txt"
FA3_PEERS_EXTRA="8,2048,256,1;4,4096,256,1;1,16384,256,1;2,8192,256,0" timeout 150 \
  python3 scripts/device/fa3_peers.py > "$OUT/fa3_peers.log" 2>&1
grep -E "gemm_bf16|cudnn.*d=256" "$OUT/fa3_peers.log"
