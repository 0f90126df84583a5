#!/usr/bin/env bash
# Session 15 A/B of the fa3 K / V release split (device, repository root, carry .deps .peers and
# .wt/base = `git archive` of the tree before the change): this tree's fa3 GPU tests, then
# scripts/device/fa3_kv_release.json timed with both trees' CLIs, alternated, two rounds.
CTEST_REGEX="Fa3|FA3|fa3" NAME=fa3_kv_release_ab \
  BENCH_ARGS="--backend fa3 --cases scripts/device/fa3_kv_release.json --warmup 3 --iters 10" \
  VARIANTS="base:X=1 base:ATTNKIT_FA3_OVERLAP=1 new:X=1 new:ATTNKIT_FA3_OVERLAP=1 new:ATTNKIT_FA3_OVERLAP=1,ATTNKIT_FA3_PINGPONG=0" \
  exec bash "$(dirname "$0")/ab_two_trees.sh"
