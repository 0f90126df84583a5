#!/usr/bin/env bash
# A/B of several prepared fa3 patch sets against the unpatched tree in one device call (issue 6),
# head dim 128 by default: each variant is its own tree and CLI, the benches alternate per round.
# Runs ON the device machine from the repository root with .deps carried:
#   run(carry=[".deps", ".peers"], command="VARIANTS='base a=x.patch ab=x.patch+y.patch' \
#       CASES=scripts/device/fa3_fp8_ab.json FILTER=kvfp8 bash scripts/device/fa3_variants_ab.sh")
# VARIANTS: "name=patch+patch" (patches under scripts/device/patches, applied in order); "base" is
#   the tree as it is. Knobs: CASES (default bench/cases/fa3_prefill.json), FILTER (default
#   d128_kvbf16), ROUNDS=3, JOBS=16 (ninja -j, split between the parallel builds), HEAD_DIMS=128
#   (-DATTNKIT_HEAD_DIMS of every tree, e.g. "64" for a d 64 A/B).
# Correctness is not checked here: a variant that is kept runs `ctest -L gpu` once committed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
t_start=$(date +%s)
log() { echo "$*" | tee -a "$OUT/ab_summary.txt"; }
read -r -a variants <<< "${VARIANTS:-base}"
jobs=$(( ${JOBS:-16} / ${#variants[@]} + 1 ))
names=()
for v in "${variants[@]}"; do
  name=${v%%=*}
  names+=("$name")
  tree=.wt/v_$name
  rm -rf "$tree" && mkdir -p "$tree"
  tar --exclude=./.wt --exclude=./build --exclude=./out --exclude=./.deps --exclude=./.peers \
    -cf - . | tar -xf - -C "$tree"
  ln -sfn "$root/.deps" "$tree/.deps"
  if [[ $v == *=* ]]; then
    IFS=+ read -r -a patches <<< "${v#*=}"
    for p in "${patches[@]}"; do
      (cd "$tree" && git apply "$root/scripts/device/patches/$p" 2>/dev/null ||
        patch -p1 --forward < "$root/scripts/device/patches/$p" > /dev/null) ||
        { log "$name: patch $p does not apply"; exit 1; }
    done
    log "$name: applied ${v#*=}"
  fi
  (cd "$tree" && attnkit_configure build 90a-real "${HEAD_DIMS:-128}" > "$OUT/build_$name.log" 2>&1 &&
    ninja -C build -j"$jobs" attnkit_cli >> "$OUT/build_$name.log" 2>&1
    echo "$name build rc $?" >> "$OUT/ab_summary.txt") &
done
wait
log "builds done at $(( $(date +%s) - t_start )) s"
args=(bench --backend fa3 --cases "${CASES:-bench/cases/fa3_prefill.json}" --device cuda --warmup 3
  --iters 10 --filter "${FILTER:-d128_kvbf16}")
for r in $(seq 1 "${ROUNDS:-3}"); do
  for name in "${names[@]}"; do
    echo "== round $r $name"
    timeout 60 ".wt/v_$name/build/tools/attnkit/attnkit" "${args[@]}" 2>&1 |
      awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $6}'
  done
done > "$OUT/ab_bench.txt" 2>&1
log "bench done at $(( $(date +%s) - t_start )) s"
python3 scripts/device/ab_table.py "$OUT/ab_bench.txt" | tee -a "$OUT/ab_summary.txt"
log "total $(( $(date +%s) - t_start )) s"
