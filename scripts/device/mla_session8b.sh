#!/usr/bin/env bash
# MLA 16-head page-64 A/B (session 8 second wave, engineer mla2; session 9, mla16): one device
# command (fits timeout_s 300). Order: build the MLA targets, A/B round a, every MLA GPU test
# (CTEST_ENV="VAR=value ..." forces knobs; FlashMlaKernels.Heads16CombineSkip covers the
# knobs on split / unsplit batches), rounds b and c, the torch ceilings. Alternates on
# mla_decode_16h.json (eager, --warmup 5 --iters 20):
#   def     the default (session 9: combine launch skipped when the host schedule splits nothing)
#   noskip  ATTNKIT_MLA_COMBINE_SKIP=0 (the combine always launched: the session-8 default)
#   pdlns   ATTNKIT_MLA_COMBINE_SKIP=0 ATTNKIT_MLA_COMBINE_PDL=1 (combine as a PDL dependent)
#   chain   ATTNKIT_MLA_CHAIN_PREFETCH=1 (first request's loads issued together, page table
#           prefetched)
# pdlns and chain run only with PATCHED=1: their knobs exist only with
# scripts/device/patches/mla_s9_combine_pdl_chain_prefetch.patch applied (on main they would bench
# the default under another label).
# Session 9's first run (10:02Z) used this script with the fp8 register-V / schedule-overhead
# variants of mla2's patch (dropped since; docs/perf/mla_notes.md). Run from the repository root
# with .deps carried. Knobs: B (build dir), ROUNDS, GUARD (no bench or ceiling starts after GUARD
# s), BENCH_EXTRA, CTEST_ENV, TREE (printed), PATCHED (1: the patch is applied). Each bench's
# lines go to stdout as it ends.
set -uo pipefail
FINAL="${OUT:-$PWD/out}"; OUT=${MLA_WORK:-/tmp/mla_s8b}; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
B=${B:-build-dev}; T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
. scripts/device/lib.sh
echo "tree: ${TREE:-?} device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
attnkit_configure "$B" > "$OUT/build.log" 2>&1
ninja -C "$B" -j16 attnkit_cli test_flashmla_cases test_cutlass_mla_cases test_flashinfer_cases \
  test_mla_prefix_cache >> "$OUT/build.log" 2>&1
echo "build rc=$? $(el)"; grep -m5 -E "error|C75[0-9][0-9]" "$OUT/build.log"
CASES=${CASES:-scripts/device/mla_decode_16h.json}
bench() {  # name, filter ("" = all), env...
  local name=$1 filter=$2; shift 2
  [ $(( $(date +%s) - T0 )) -gt ${GUARD:-270} ] && { echo "bench $name skipped (time)"; return; }
  env "$@" timeout 30 "$B/tools/attnkit/attnkit" bench --backend flashmla --cases "$CASES" \
    ${filter:+--filter "$filter"} --device cuda --warmup 5 --iters 20 ${BENCH_EXTRA:-} \
    --json "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$? $(el) $(grep -m1 'ceiling' "$OUT/bench_$name.log" | grep -oE '[0-9.]+ GB/s')"
  awk '/^flashmla /{sub("mla_decode_b128_", "", $2); print "   ", $2, $3, $4, $5}' "$OUT/bench_$name.log"
}
round() {  # session 9 (second run): the new defaults against the old (and the patch's two knobs)
  local r=$1
  bench def_$r ""; bench noskip_$r "" ATTNKIT_MLA_COMBINE_SKIP=0
  [ "${PATCHED:-0}" = 1 ] || return 0
  bench pdlns_$r "" ATTNKIT_MLA_COMBINE_SKIP=0 ATTNKIT_MLA_COMBINE_PDL=1
  bench chain_$r "" ATTNKIT_MLA_CHAIN_PREFETCH=1
}
round a
REGEX='Mla|MLA|mla|FlashMla|CutlassMla|FlashInfer.*[Mm]la'
(cd "$B" && env ${CTEST_ENV:-} timeout 80 ctest -L gpu -R "$REGEX" \
  -j 12 --timeout 60 --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest (${CTEST_ENV:-defaults}) rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest.log" | head -12
grep -E "Heads16CombineSkip|Heads16PrefetchAndFp8" "$OUT/ctest.log" | head -4
for r in ${ROUNDS:-b c}; do round $r; done
[ $(( $(date +%s) - T0 )) -lt ${GUARD:-270} ] && { timeout 25 python3 scripts/device/mla_ceilings.py \
  > "$OUT/ceilings.log" 2>&1; tail -2 "$OUT/ceilings.log"; }
python3 scripts/device/mla_bench_table.py "$OUT"
tar czf "$FINAL/mla_s8b.tar.gz" -C "$OUT" . 2>/dev/null
echo "done $(el)"
