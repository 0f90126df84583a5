#!/usr/bin/env bash
# fa3 d 64 A/B (sessions 7, 9): build, the fa3 GPU tests (ctest under TEST_ENV, then test_fa3_cases
# again under each of EXTRA_TEST_ENVS), the d 64 case file with the VARIANTS alternated ROUNDS
# times, cuDNN / FA2 peers at the same shapes; one device call:
#   run(carry=[".deps"], command="bash scripts/device/fa3_d64_ab.sh")
# Knobs (defaults: the session-7 key-block A/B): VARIANTS="ATTNKIT_FA3_BLOCK_N=128
#   ATTNKIT_FA3_BLOCK_N=192" ("default" = no env; "A=1,B=0" sets several), ROUNDS=2,
#   TEST_ENV="ATTNKIT_FA3_BLOCK_N=192", EXTRA_TEST_ENVS="" (space-separated, commas inside one),
#   BUILD_TARGETS="attnkit_cli test_fa3_cases", PEERS=1 (0: no torch peers).
. scripts/device/lib.sh; B=build/device; W=/tmp/w; mkdir -p $W
OUT=${OUT:-$W}
VARIANTS=${VARIANTS:-ATTNKIT_FA3_BLOCK_N=128 ATTNKIT_FA3_BLOCK_N=192}
attnkit_configure $B 90a-real > $W/build.log 2>&1 && ninja -C $B -j16 ${BUILD_TARGETS:-attnkit_cli test_fa3_cases} >> $W/build.log 2>&1; echo build=$?
grep -E "error|FAILED" $W/build.log | head -20
env ${TEST_ENV-ATTNKIT_FA3_BLOCK_N=192} ctest --test-dir $B -L gpu -R 'Fa3|FA3|fa3' -j8 --timeout 100 --output-on-failure > $W/ctest.log 2>&1; echo "ctest (${TEST_ENV-ATTNKIT_FA3_BLOCK_N=192})=$?"; grep -E "tests passed|tests failed" $W/ctest.log; grep -E "\*\*\*Failed" $W/ctest.log | head -5
for e in ${EXTRA_TEST_ENVS:-}; do
  env ${e//,/ } timeout 90 $B/tests/test_fa3_cases --gtest_brief=1 > $W/test_$e.log 2>&1
  echo "test_fa3_cases ($e)=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_$e.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|rel_l2" $W/test_$e.log | head -8
done
C=$B/tools/attnkit/attnkit
for r in $(seq 1 ${ROUNDS:-2}); do for v in $VARIANTS; do
 if [ "$v" = default ]; then envs=(); else IFS=, read -r -a envs <<< "$v"; fi
 n=${v//[^A-Za-z0-9_=]/_}
 env "${envs[@]}" $C bench --backend fa3 --cases scripts/device/fa3_d64.json --device cuda --warmup 3 --iters 20 --json $W/d64_${n}_$r.json > $W/d64_${n}_$r.txt 2>&1
 echo "== $v r=$r"; grep -E "^fa3" $W/d64_${n}_$r.txt | awk '{print $2, $3, $6, $NF}'
done; done
[ "${PEERS:-1}" = 1 ] && FA3_PEERS_EXTRA="4,4096,64,1;1,16384,64,1;2,8192,64,0" OUT=$W timeout 150 python3 scripts/device/fa3_peers.py 2>&1 | grep -E "gemm|d=64"
tar -czf $OUT/d64.tar.gz -C $W .
