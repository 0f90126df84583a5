#!/usr/bin/env bash
# CPU A/B of this tree against an older one on the device machine's host CPU (the Xeon with AMX),
# in one device command from the repository root: builds the CLI of both trees without CUDA, then
# alternates `attnkit bench --device cpu $BENCH_ARGS` between them for ROUNDS rounds with
# OMP_NUM_THREADS=$THREADS pinned threads, printing the result lines and the copy / read ceilings
# into $OUT/ab.txt. Prepare the base tree here first (carry it with .deps):
#   rm -rf .wt && mkdir -p .wt/base && git archive <rev> -- CMakeLists.txt CMakePresets.json cmake \
#     include src tools bench tests python scripts pyproject.toml | tar -x -C .wt/base
#   run(carry=[".deps", ".wt"], command="BENCH_ARGS='--backend intel_amx --cases ...' \
#     bash scripts/device/cpu_ab_two_trees.sh")
#   BASE=.wt/base  ROUNDS=2  THREADS=2
set -u
root="$(pwd)"
OUT="${OUT:-$root/out}"
BASE="${BASE:-.wt/base}"
. scripts/device/lib.sh
attnkit_configure_cpu "$root/build/cpu-ab-new" > "$OUT/new_cfg.log" 2>&1 &&
  ninja -C "$root/build/cpu-ab-new" -j16 attnkit_cli > "$OUT/new_build.log" 2>&1
echo "new build rc $?"
(cd "$BASE" && ln -sfn "$root/.deps" .deps && . scripts/device/lib.sh &&
  attnkit_configure_cpu "$root/build/cpu-ab-base" > "$OUT/base_cfg.log" 2>&1 &&
  ninja -C "$root/build/cpu-ab-base" -j16 attnkit_cli > "$OUT/base_build.log" 2>&1
  echo "base build rc $?")
export OMP_PROC_BIND=spread OMP_PLACES=cores OMP_NUM_THREADS="${THREADS:-2}"
read -r -a args <<< "${BENCH_ARGS:---backend intel_amx --cases bench/cases/cpu_decode.json --filter b8_kv4096}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in base new; do
    echo "== round $r $v"
    "$root/build/cpu-ab-$v/tools/attnkit/attnkit" bench --device cpu "${args[@]}" 2>&1 |
      grep -E "^intel_amx|ceiling cpu_(copy|read)" | sed -E 's/  +/ /g' | cut -c1-220
  done
done 2>&1 | tee "$OUT/ab.txt"
