#!/usr/bin/env bash
# Session 8, second wave (engineer mla2): one device command (fits timeout_s 300). Order: build,
# A/B round a, ctest, rounds b and c, the torch ceilings (GUARD cuts what does not fit). Builds the MLA
# targets, runs every MLA GPU test with the two new knobs forced (ATTNKIT_MLA_FP8_REGV=6,
# ATTNKIT_MLA_COMBINE_SKIP=1, ATTNKIT_MLA_COMBINE_PDL=1; FlashMlaKernels.Heads16RegisterVAndCombineSkip covers REGV 4 / 6
# and the skip on split / unsplit batches), the torch copy ceiling, then alternates on
# mla_decode_16h.json (eager, --warmup 5 --iters 20):
#   def    the current default (baseline)
#   skip   ATTNKIT_MLA_COMBINE_SKIP=1 (no combine launch when the host schedule splits nothing)
#   regv6  ATTNKIT_MLA_FP8_REGV=6 (fp8 cases: V converted at the P V load, 6 stages)
#   regv4  ATTNKIT_MLA_FP8_REGV=4 (fp8 cases: the same with 4 stages)
#   regv6s ATTNKIT_MLA_FP8_REGV=6s (fp8 cases: 6 stages, swizzled fp8 stage, conflict-free V loads)
#   ovh0   ATTNKIT_MLA_SCHED_OVERHEAD=0 (bf16 cases: every request split evenly over 132 parts)
#   pdl    ATTNKIT_MLA_COMBINE_PDL=1 (session 9: the combine as a programmatic dependent launch)
#   def_g / pdl_g  bf16 kv 4k with --graph (after round a; the combine is always launched there)
#   def_l8 / skip_l8  bf16 kv 4k with --launches 8 (after round a; diagnostic)
# Run from the repository root with .deps carried. Knobs: B (build dir), ROUNDS, GUARD (no bench
# or ceiling starts after GUARD s). Each bench's lines go to stdout as it ends.
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
round() {
  local r=$1
  bench def_$r ""; bench regv6_$r kvfp8 ATTNKIT_MLA_FP8_REGV=6
  bench skip_$r "" ATTNKIT_MLA_COMBINE_SKIP=1; bench regv6s_$r kvfp8 ATTNKIT_MLA_FP8_REGV=6s
  bench regv4_$r kvfp8 ATTNKIT_MLA_FP8_REGV=4
  bench ovh0_$r kvbf16 ATTNKIT_MLA_SCHED_OVERHEAD=0
  bench pdl_$r "" ATTNKIT_MLA_COMBINE_PDL=1
}
round a
# diagnostic: 8 back-to-back forwards per event pair (per-sample launch / event cost at kv 4k)
BENCH_EXTRA="--launches 8" bench def_l8 kv4096_p64_h16_d576v512_kvbf16
BENCH_EXTRA="--launches 8" bench skip_l8 kv4096_p64_h16_d576v512_kvbf16 ATTNKIT_MLA_COMBINE_SKIP=1
BENCH_EXTRA="--graph" bench def_g kv4096_p64_h16_d576v512_kvbf16
BENCH_EXTRA="--graph" bench pdl_g kv4096_p64_h16_d576v512_kvbf16 ATTNKIT_MLA_COMBINE_PDL=1
REGEX='Mla|MLA|mla|FlashMla|CutlassMla|FlashInfer.*[Mm]la'
(cd "$B" && ATTNKIT_MLA_FP8_REGV=${CTEST_REGV:-6} ATTNKIT_MLA_COMBINE_SKIP=1 ATTNKIT_MLA_COMBINE_PDL=1 timeout 80 ctest -L gpu -R "$REGEX" \
  -j 12 --timeout 60 --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest (REGV=${CTEST_REGV:-6} SKIP=1 PDL=1) rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest.log" | head -12
grep -E "Heads16RegisterVAndCombineSkip|Heads16PrefetchAndFp8" "$OUT/ctest.log" | head -4
for r in ${ROUNDS:-b}; do round $r; done
[ $(( $(date +%s) - T0 )) -lt ${GUARD:-270} ] && { timeout 25 python3 scripts/device/mla_ceilings.py \
  > "$OUT/ceilings.log" 2>&1; tail -2 "$OUT/ceilings.log"; }
python3 - "$OUT" <<'PY'
import json, sys, glob, os
rows, ceil = {}, {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    name = os.path.basename(f)[6:-5]
    d = json.load(open(f))
    ceil[name] = d.get("ceilings", [{}])[0].get("gbs", 0)
    for r in d.get("results", []):
        if r.get("status") == "ok" and r.get("backend") == "flashmla":
            rows.setdefault(r["case"], {})[name] = (r["ms_median"], r.get("ceiling_ratio") or 0)
print("copy ceilings GB/s:", " ".join(f"{k}={v:.0f}" for k, v in ceil.items()))
for case, v in rows.items():
    print(case.replace("mla_decode_", "")[:44])
    print("   ", " ".join(f"{k}={ms:.4f}ms/{100*cr:.1f}%" for k, (ms, cr) in sorted(v.items())))
PY
tar czf "$FINAL/mla_s8b.tar.gz" -C "$OUT" . 2>/dev/null
echo "done $(el)"
