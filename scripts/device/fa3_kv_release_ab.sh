#!/usr/bin/env bash
# Session 15 A/B of the fa3 K / V release split (device, repository root, carry .deps .peers and
# .wt/base = `git archive` of the tree before the change): builds this tree (fa3 GPU tests) and the
# base tree's CLI, then times scripts/device/fa3_kv_release.json with both, alternated, two rounds.
set -u
OUT=$OUT/check STAGES="build test" CTEST_JOBS=8 CTEST_REGEX="Fa3|FA3|fa3" bash scripts/device/check.sh > $OUT/check.log 2>&1; tail -3 $OUT/check.log
grep -E "Failed|FAILED" $OUT/check/ctest.log | head
(cd .wt/base && ln -sfn ../../.deps .deps && . scripts/device/lib.sh && attnkit_configure build 90a-real > $OUT/base_cfg.log 2>&1 && ninja -C build -j16 attnkit_cli > $OUT/base_build.log 2>&1; echo "base build rc $?")
N=build/device/tools/attnkit/attnkit; B=.wt/base/build/tools/attnkit/attnkit
for r in 1 2; do for v in "base:X=1" "base:ATTNKIT_FA3_OVERLAP=1" "new:X=1" "new:ATTNKIT_FA3_OVERLAP=1" "new:ATTNKIT_FA3_OVERLAP=1 ATTNKIT_FA3_PINGPONG=0"; do bin=${v%%:*}; e=${v#*:}; [ $bin = base ] && C=$B || C=$N; echo "== round $r $bin $e"; env $e $C bench --backend fa3 --cases scripts/device/fa3_kv_release.json --device cuda --warmup 3 --iters 10 2>&1 | grep -E "^fa3 " | awk '{print $2, $3, $6}'; done; done 2>&1 | tee $OUT/fa3_kv_release_ab.txt
