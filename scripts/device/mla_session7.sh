#!/usr/bin/env bash
# Session 7 device run for the MLA wgmma kernel (one command, fits timeout_s 360): build the MLA
# targets, torch ceilings, an A/B of the 128-head bf16 cases (mla_decode_128h.json, eager,
# --warmup 5 --iters 30) alternating the wgmma kernel's variants (ATTNKIT_MLA_WGMMA_BLOCKS 0 / 1 /
# 2), the timing-only diagnostic ATTNKIT_MLA_WGMMA_DIAG=noload (no K loads after the first two
# tiles: compute + sync bound), then every MLA GPU test with the default and again with
# ATTNKIT_MLA_WGMMA_BLOCKS=$BLOCKS2 (0). Everything comes back in one tar.gz.
# Run from the repository root with .deps carried. Knobs: B (build dir, build-dev), RUN (1: the
# first run's A/B), BLOCKS2, SKIP_TESTS2, SKIP_TESTS1 (no ctest with the default env), TARGETS
# (ninja targets), AB (session 9: "name:VAR=v,VAR=v name2:..." benched in two alternated rounds
# a / b instead of the session-7 list, the names in NOLOAD (default all) also once with
# ATTNKIT_MLA_WGMMA_DIAG=noload; a smoke bench (20 s) of each entry first: a failing one is
# dropped and the BLOCKS2 ctest skipped), LIMIT1 / LIMIT (s, 300 / 345: the first / second ctest
# ends by then), CEIL (0: no torch ceilings), ENV2 ("VAR=v ...": more env for the BLOCKS2 ctest),
# SMOKE (names smoked, default all), TTIMEOUT (ctest per-test limit, 45 s).
set -uo pipefail
FINAL="${OUT:-$PWD/out}"; OUT=${MLA_WORK:-/tmp/mla_s7}; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
B=${B:-build-dev}; T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
. scripts/device/lib.sh
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) date: $(date -u +%FT%TZ)"
attnkit_configure "$B" > "$OUT/build.log" 2>&1
# shellcheck disable=SC2086
ninja -C "$B" -j16 ${TARGETS:-attnkit_cli test_flashmla_cases test_cutlass_mla_cases \
  test_flashinfer_cases test_mla_prefix_cache test_fa3_cases test_triton_cases} >> "$OUT/build.log" 2>&1
echo "build rc=$? $(el)"; grep -m5 -E "error|C75[0-9][0-9]" "$OUT/build.log"
if [ "${CEIL:-1}" = 1 ]; then
  timeout 30 python3 scripts/device/mla_ceilings.py > "$OUT/ceilings.log" 2>&1; tail -2 "$OUT/ceilings.log"
fi
CASES=${CASES:-scripts/device/mla_decode_128h.json}
bench() {  # name, env...
  local name=$1; shift
  env "$@" timeout 40 "$B/tools/attnkit/attnkit" bench --backend flashmla --cases "$CASES" \
    --device cuda --warmup 5 --iters 30 --json "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$? $(el)"
}
SMOKE_OK=1
if [ -n "${AB:-}" ]; then
  ok_ab=""
  for e in $AB; do  # smoke each entry (20 s); a failing one is dropped and the BLOCKS2 ctest skipped
    case " ${SMOKE:-${e%%:*}} " in *" ${e%%:*} "*) ;; *) ok_ab="$ok_ab $e"; continue ;; esac
    rc=0
    # shellcheck disable=SC2046
    env $(echo "${e#*:}" | tr ',' ' ') timeout 20 "$B/tools/attnkit/attnkit" bench \
      --backend flashmla --cases "$CASES" --device cuda --warmup 1 --iters 2 \
      > "$OUT/smoke_${e%%:*}.log" 2>&1 || rc=$?
    if [ "$rc" = 0 ]; then ok_ab="$ok_ab $e"; else SMOKE_OK=0; fi
    echo "smoke ${e%%:*} rc=$rc $(el)"; grep -i -m2 'cluster\|error' "$OUT/smoke_${e%%:*}.log"
  done
  for r in a b; do
    for e in $ok_ab; do
      # shellcheck disable=SC2046
      bench "${e%%:*}$r" $(echo "${e#*:}" | tr ',' ' ')
    done
  done
  for e in $ok_ab; do
    case " ${NOLOAD:-${e%%:*}} " in *" ${e%%:*} "*) ;; *) continue ;; esac
    # shellcheck disable=SC2046
    bench "noload_${e%%:*}" $(echo "${e#*:}" | tr ',' ' ') ATTNKIT_MLA_WGMMA_DIAG=noload
  done
elif [ "${RUN:-2}" = 1 ]; then  # run 1 (00:57Z): before block barriers became the default
  bench base1 ATTNKIT_MLA_WGMMA_BLOCKS=0; bench blocks1 ATTNKIT_MLA_WGMMA_BLOCKS=1
  bench base2 ATTNKIT_MLA_WGMMA_BLOCKS=0; bench blocks2 ATTNKIT_MLA_WGMMA_BLOCKS=1
  bench noload_base ATTNKIT_MLA_WGMMA_BLOCKS=0 ATTNKIT_MLA_WGMMA_DIAG=noload
  bench noload_blocks ATTNKIT_MLA_WGMMA_BLOCKS=1 ATTNKIT_MLA_WGMMA_DIAG=noload
else  # variants 0 (tile barriers), 1 (block barriers), 2 (+ split release; unset = 2 since
  # 6281669 — in run 2 (01:03Z) the default was 1 and v2 ran with ATTNKIT_MLA_WGMMA_BLOCKS=2)
  bench v0a ATTNKIT_MLA_WGMMA_BLOCKS=0; bench v1a ATTNKIT_MLA_WGMMA_BLOCKS=1; bench v2a
  bench v0b ATTNKIT_MLA_WGMMA_BLOCKS=0; bench v1b ATTNKIT_MLA_WGMMA_BLOCKS=1; bench v2b
  bench noload_v2 ATTNKIT_MLA_WGMMA_DIAG=noload
  timeout 40 "$B/tools/attnkit/attnkit" bench --backend flashmla --graph --cases "$CASES" \
    --device cuda --warmup 5 --iters 30 --json "$OUT/bench_v2graph.json" > "$OUT/bench_v2graph.log" 2>&1
  echo "bench v2 (default) --graph rc=$? $(el)"
fi
python3 - "$OUT" <<'PY'
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    name = os.path.basename(f)[6:-5]
    for r in json.load(open(f)).get("results", []):
        if r.get("status") == "ok" and r.get("backend") == "flashmla":
            rows.setdefault(r["case"], {})[name] = (r["ms_median"], r.get("tflops") or 0)
for case, v in rows.items():
    print(case.replace("mla_decode_", "")[:40], " ".join(
        f"{k}={ms:.4f}ms/{tf:.1f}TF" for k, (ms, tf) in v.items()))
PY
REGEX='Mla|MLA|mla|FlashMla|CutlassMla|FlashInfer.*[Mm]la'
[ "$SMOKE_OK" = 1 ] || SKIP_TESTS2=1
[ -n "${SKIP_TESTS1:-}" ] || (cd "$B" && timeout $(( ${LIMIT1:-300} - ($(date +%s) - T0) )) ctest -L gpu -R "$REGEX" -j 8 --timeout ${TTIMEOUT:-45} \
  --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest.log" | head -12
if [ -z "${SKIP_TESTS2:-}" ]; then
  # shellcheck disable=SC2086
  (cd "$B" && env ${ENV2:-} ATTNKIT_MLA_WGMMA_BLOCKS=${BLOCKS2:-0} timeout $(( ${LIMIT:-345} - ($(date +%s) - T0) )) ctest -L gpu \
    -R "$REGEX" -j 8 --timeout ${TTIMEOUT:-45} --output-on-failure > "$OUT/ctest_blocks.log" 2>&1)
  echo "ctest ${ENV2:-} BLOCKS=${BLOCKS2:-0} rc=$? $(el): $(grep -E 'tests passed|tests failed' "$OUT/ctest_blocks.log")"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)" "$OUT/ctest_blocks.log" | head -12
fi
tar czf "$FINAL/mla_s7.tar.gz" -C "$OUT" . 2>/dev/null
echo "done $(el)"
