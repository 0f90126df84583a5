#!/usr/bin/env bash
# A/B of prepared fa3 patches against the unpatched tree, in one device call (issue 6).
# Runs ON the device machine from the repository root of a clean checkout with .deps and .peers
# carried: copies the tree to .wt/base (the "before"), applies PATCHES to the working copy, then
#   1. scripts/device/fa3_check.sh on the patched tree (STAGES, default "build test peers": the fa3
#      tests in HEAD_DIMS, TEST_SUBSETS, the torch peers),
#   2. the base tree's CLI (head dim 128 only),
#   3. `attnkit bench` alternated ROUNDS times: base, patched, and each of NEW_VARIANTS (env
#      settings of the patched CLI, "A=1,B=0"), on the cases whose name contains FILTER,
#   4. optionally (TIMELINE=1, when fewer than TIMELINE_AFTER_S seconds have passed) the patched
#      tree's timeline build (scripts/device/fa3_timeline.sh, CASE_INDICES).
#   run(carry=[".deps", ".peers"], command="PATCHES='a.patch b.patch' bash scripts/device/fa3_patch_ab.sh")
# Knobs: PATCHES (paths under scripts/device/patches, applied in order), HEAD_DIMS="64;128;256",
#   TEST_SUBSETS, NEW_VARIANTS="", FILTER="d128_kvbf16", ROUNDS=2, TIMELINE=0, CASE_INDICES="0 3",
#   CASES (the bench's case file, default bench/cases/fa3_prefill.json).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
t_start=$(date +%s)
log() { echo "$*" | tee -a "$OUT/ab_summary.txt"; }

rm -rf .wt/base && mkdir -p .wt/base
tar --exclude=./.wt --exclude=./build --exclude=./out -cf - . | tar -xf - -C .wt/base
for p in ${PATCHES:-}; do
  git apply "scripts/device/patches/$p" 2>/dev/null || patch -p1 --forward < "scripts/device/patches/$p" ||
    { log "patch $p does not apply"; exit 1; }
  log "applied $p"
done

OUT="$OUT" STAGES="${STAGES:-build test peers}" HEAD_DIMS="${HEAD_DIMS:-64;128;256}" \
  TEST_SUBSETS="${TEST_SUBSETS:-}" DIAG_VARIANTS="" BENCH_OTHERS="" \
  bash scripts/device/fa3_check.sh > "$OUT/check.log" 2>&1
grep -vE "^\s*$" "$OUT/summary.txt" | tee -a "$OUT/ab_summary.txt"

(cd .wt/base && attnkit_configure build 90a-real 128 > "$OUT/base_build.log" 2>&1 &&
  ninja -C build -j16 attnkit_cli >> "$OUT/base_build.log" 2>&1)
log "base build rc $? at $(( $(date +%s) - t_start )) s"

N=build/device/tools/attnkit/attnkit
B=.wt/base/build/tools/attnkit/attnkit
args=(bench --backend fa3 --cases "${CASES:-bench/cases/fa3_prefill.json}" --device cuda --warmup 3 --iters 10
  --filter "${FILTER:-d128_kvbf16}")
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in base new ${NEW_VARIANTS:-}; do
    case $v in
      base) C=$B envs=() ;;
      new) C=$N envs=() ;;
      *) C=$N; IFS=, read -r -a envs <<< "$v" ;;
    esac
    echo "== round $r $v"
    env "${envs[@]}" timeout 60 "$C" "${args[@]}" 2>&1 |
      awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $6}'
  done
done > "$OUT/ab_bench.txt" 2>&1
log "bench done at $(( $(date +%s) - t_start )) s"
python3 scripts/device/ab_table.py "$OUT/ab_bench.txt" | tee -a "$OUT/ab_summary.txt"

if [ "${TIMELINE:-0}" = 1 ] && [ $(( $(date +%s) - t_start )) -lt "${TIMELINE_AFTER_S:-420}" ]; then
  OUT="$OUT/timeline" CASE_INDICES="${CASE_INDICES:-0 3}" bash scripts/device/fa3_timeline.sh \
    > "$OUT/timeline.log" 2>&1
  grep -E "^==|store|next_q|first_|boundary|overhead  |q_issue|issue_gap" "$OUT/timeline/timeline.txt" |
    tee -a "$OUT/ab_summary.txt"
fi
log "total $(( $(date +%s) - t_start )) s"
