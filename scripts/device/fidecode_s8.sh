#!/usr/bin/env bash
# Session 8 fidecode device command: build the CLI + the flashinfer / triton GPU tests, run
# `ctest -L gpu -R 'FlashInfer|Triton'`, the full decode targets once (default / b2b / graph,
# both backends), then the A/B: each VARIANTS entry (env settings; "default" = none) timed on
# decode_s8.json (flashinfer) in the three modes (eager, --launches 10, --graph), ROUNDS rounds,
# the variant order reversed every other round; every bench process measures its own copy ceiling.
# (Session 8 ran it with VARIANTS of ATTNKIT_FLASHINFER_DECODE_S8, a knob now removed: see
# scripts/device/patches/decode_s8_rolled_split_lean.patch.)
# Second wave (fidecode2): MODES may name graph32 (--graph --launches 32), CASES another case file
# (default decode_s8.json), TEST_ENV env settings for the ctest run (e.g. a variant forced), and
# EXTRA_TESTS env settings (space-separated entries, commas inside an entry) under each of which
# test_flashinfer_cases runs again with the gtest filter EXTRA_FILTER.
# (The second wave ran it with VARIANTS of ATTNKIT_FLASHINFER_FP8_RING, a knob now removed: see
# scripts/device/patches/decode_s8_fp8_ring_swz_deep.patch.)
# Session 9 (fidec): CTEST_REGEX (default 'FlashInfer|Triton'); NCU_RUNS, entries
# "label|env|case name" separated by ';' (env: commas inside, "default" = none): after the A/B, one
# ncu (--clock-control none) reading of the decode kernel's DRAM / L2 read sectors and duration per
# entry, the case from CASES, into $OUT/summary.txt.
# (Session 9 fidec2 ran it with VARIANTS of ATTNKIT_FLASHINFER_PDL_EARLY_KV, a knob now removed: see
# scripts/device/patches/decode_s9_pdl_early_kv.patch, and ATTNKIT_FLASHINFER_PDL_SPLIT.)
# Session 10 (fidec): BENCH_TIMEOUT (default 40 s), the limit of each A/B bench process (larger case
# files, e.g. decode_s10.json's 11 cases).
# Writes $OUT/summary.txt (the A/B table) and $OUT/all.tgz (logs, JSONs).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"; mkdir -p "$OUT"
t0=$(date +%s); BUDGET_S="${BUDGET_S:-300}"
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
S="$OUT/summary.txt"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) date: $(date -u +%FT%RZ) tree: ${TREE_ID:-?}" | tee "$S"
build="$root/build/device"
. scripts/device/lib.sh
attnkit_configure "$build" "${ARCHS:-90a-real}" > "$OUT/build.log" 2>&1 &&
  ninja -C "$build" -j16 attnkit_cli test_flashinfer_cases test_flashinfer_cascade \
    test_triton_cases test_triton_cuda_graph >> "$OUT/build.log" 2>&1
rc=$?; echo "build: rc=$rc at $(( $(date +%s) - t0 )) s" | tee -a "$S"
[ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
cli="$build/tools/attnkit/attnkit"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "ctest env: ${TEST_ENV:-none}" | tee -a "$S"
  timeout "${CTEST_TIMEOUT:-110}" env ${TEST_ENV:-} ctest --test-dir "$build" -L gpu -R "${CTEST_REGEX:-FlashInfer|Triton}" \
    --output-on-failure --timeout 100 -j8 > "$OUT/ctest.log" 2>&1
  echo "ctest: rc=$? at $(( $(date +%s) - t0 )) s" | tee -a "$S"
  grep -E "tests passed|tests failed" "$OUT/ctest.log" | tee -a "$S"
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)|Total Test time" "$OUT/ctest.log" | head -20 | tee -a "$S"
  for v in ${EXTRA_TESTS:-}; do
    timeout 60 env ${v//,/ } "$build/tests/test_flashinfer_cases" --gtest_filter="${EXTRA_FILTER:-*}" \
      > "$OUT/extra_${v//[=,]/_}.log" 2>&1
    echo "extra tests $v: rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/extra_${v//[=,]/_}.log" | tr '\n' ' ') at $(( $(date +%s) - t0 )) s" | tee -a "$S"
  done
fi
mode_args() { case $1 in eager) echo "";; b2b) echo "--launches 10";; graph) echo "--graph";; graph32) echo "--graph --launches 32";; esac; }
if [ "${SKIP_TARGETS:-0}" != 1 ]; then
  for m in eager b2b graph; do
    timeout 60 "$cli" bench --device cuda --backend triton,flashinfer --cases scripts/device/decode_targets.json \
      $(mode_args $m) --json "$OUT/targets_$m.json" > "$OUT/targets_$m.log" 2>&1
    echo "targets $m: rc=$? at $(( $(date +%s) - t0 )) s" | tee -a "$S"
  done
fi
read -r -a vs <<< "${VARIANTS:-default}"
for ((round = 0; round < ${ROUNDS:-2}; round++)); do
  order=("${vs[@]}")
  if (( round % 2 == 1 )); then order=(); for ((k=${#vs[@]}-1; k>=0; k--)); do order+=("${vs[k]}"); done; fi
  for m in ${MODES:-eager b2b graph}; do
    for v in "${order[@]}"; do
      [ "$(left)" -lt 15 ] && { echo "ab $round $m $v: skipped (time)" | tee -a "$S"; continue; }
      envs=""; [ "$v" != default ] && envs=${v//,/ }
      timeout "${BENCH_TIMEOUT:-40}" env $envs "$cli" bench --device cuda --backend flashinfer --cases "${CASES:-scripts/device/decode_s8.json}" \
        $(mode_args $m) --json "$OUT/ab_${round}_${m}_${v//[=,]/_}.json" > "$OUT/ab.log" 2>&1 || echo "ab $round $m $v rc=$?" | tee -a "$S"
      python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], " ".join("%s %.1fus %.1f%%" % (r["case"].replace("decode_","").replace("_h32x8_d128",""), r.get("ms_median",0)*1e3, 100*r.get("ceiling_ratio",0)) for r in d["results"]))' \
        "$OUT/ab_${round}_${m}_${v//[=,]/_}.json" "ab $round $m $v:" >> "$S" 2>/dev/null
    done
  done
done
python3 scripts/device/fidecode_s8_table.py "$OUT" | tee -a "$S"
if [ -n "${NCU_RUNS:-}" ]; then
  NCU="$(attnkit_ncu_bin)"
  M=dram__sectors_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
  IFS=';' read -r -a runs <<< "$NCU_RUNS"
  for e in "${runs[@]}"; do
    IFS='|' read -r label venv ncase <<< "$e"
    [ "$(left)" -lt 25 ] && { echo "ncu $label: skipped (time)" | tee -a "$S"; continue; }
    envs=""; [ "$venv" != default ] && envs=${venv//,/ }
    timeout 40 env $envs "$NCU" --clock-control none --metrics "$M" -k regex:paged_decode_ring_kernel -s 2 -c 1 \
      "$cli" bench --device cuda --backend flashinfer --cases "${CASES:-scripts/device/decode_s8.json}" \
      --filter "$ncase" --warmup 2 --iters 1 > "$OUT/ncu_$label.log" 2>&1
    echo "ncu $label ($venv, $ncase): rc=$? $(grep -E 'dram__|lts__|gpu__time' "$OUT/ncu_$label.log" | awk '{print $1"="$NF}' | tr '\n' ' ')" | tee -a "$S"
  done
fi
cd "$OUT" && tar czf all.tgz *.json *.log 2>/dev/null && rm -f *.json ab.log targets_*.log
ls -la "$OUT"; echo "total $(( $(date +%s) - t0 )) s"
exit 0
