#!/usr/bin/env bash
# A/B of the CUDA-graph replay refresh (host time of init_forward_metadata_replay_cuda_graph, the
# bench's "replay metadata refresh" figure) between this tree and an older one, in one device
# command (repository root; carry .deps and the base tree, made on the development machine with
# `rm -rf .wt/base && mkdir -p .wt/base && git archive <rev> | tar -x -C .wt/base`):
#   run(carry=[".deps", ".wt"], command="bash scripts/device/refresh_ab.sh")
# Builds and tests this tree (check.sh: CLI + the flashinfer case / cascade tests + test_bench_graph,
# ctest FlashInfer|BenchGraph), builds the base tree's CLI, then alternates the two CLIs ROUNDS
# times over CASES (`attnkit bench --graph --launches 32`, BACKENDS), printing one line per case:
# the per-forward time and the refresh's median / p90 (one replay ahead) and idle median.
#   BASE=.wt/base ROUNDS=3 BACKENDS=flashinfer CASES=scripts/device/graph_refresh.json
set -u
BASE=${BASE:-.wt/base}
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$OUT/check STAGES="build test" TARGETS="attnkit_cli test_flashinfer_cases test_flashinfer_cascade test_bench_graph" \
  CTEST_REGEX="${CTEST_REGEX:-FlashInfer|BenchGraph}" CTEST_EXCLUDE="${CTEST_EXCLUDE:-FlashInferDecode(Balance|DefaultPlan|SplitLong)}" \
  CTEST_JOBS=8 bash scripts/device/check.sh > "$OUT/check.log" 2>&1
tail -4 "$OUT/check.log"
grep -E "Failed|FAILED" "$OUT/check/ctest.log" | head
(cd "$BASE" && ln -sfn "$OLDPWD/.deps" .deps && . scripts/device/lib.sh &&
  attnkit_configure build 90a-real > "$OUT/base_cfg.log" 2>&1 &&
  ninja -C build -j16 attnkit_cli > "$OUT/base_build.log" 2>&1
  echo "base build rc $?")
N=build/device/tools/attnkit/attnkit
B=$BASE/build/tools/attnkit/attnkit
for r in $(seq 1 "${ROUNDS:-3}"); do
  for bin in base new; do
    [ "$bin" = base ] && C=$B || C=$N
    timeout 200 "$C" bench --device cuda --graph --launches 32 --warmup 3 --iters 10 \
      --backend "${BACKENDS:-flashinfer}" --cases "${CASES:-scripts/device/graph_refresh.json}" 2>&1 |
      grep -E " ok " | sed -E 's/ +/ /g' |
      sed -E 's/^([a-z0-9]+) ([^ ]+) ([0-9.]+) .*host: median ([0-9.]+) us, p90 ([0-9.]+) us.*median ([0-9.]+) us idle.*/\1 \2 ms \3 refresh median \4 p90 \5 idle \6/' |
      sed "s/^/round $r $bin /" | tee -a "$OUT/refresh_ab.txt"
  done
done
