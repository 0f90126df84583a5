#!/usr/bin/env bash
# Session 66, first full-suite call: the GPU tests on this session's code (the FP8 two-warpgroup
# variants, the e4m3-q variant cases the bench and `run` no longer skip), then those cases.
#  1. check.sh: build everything (build/device) and `ctest -L gpu` less the long MLA / emulated /
#     decode-balance suites (call 1 of the standard split, docs/gpu_tests.md "Session 61");
#  2. `attnkit run --verify` of e4m3-q layers with a window / sinks / soft-cap on both FP8 plans
#     (fa3; the case JSON's new "fp8_q");
#  3. one bench round of scripts/device/fa3_s66_fp8q_variants.json (e4m3 q beside bf16 q).
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s66_check.sh")
# Knobs: STAGES (default "check verify bench"; "build verify bench" builds only the CLI; the 22:03Z
# call's stage "rest", a `ctest -I` list of the tests 21:52Z left, selected one test: removed),
# ROUNDS (bench rounds, default 1), CTEST_JOBS (12).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
# ctest -R / -E take a CMake regex: '|' alternates ('\|' in docs/gpu_tests.md is the markdown
# table's escape; the 21:52Z call passed it as written and so excluded nothing).
call2='FlashMla|CutlassMla|Mla/|VerifyGraphs|TritonCudaGraphSplits|FlashInferDecode(Balance|DefaultPlan|SplitLong)|Sm(80|86)Emulated|FlashInferVerifyMemcheck'
STAGES="${STAGES:-check verify bench}"
ak=build/device/tools/attnkit/attnkit
if has_stage check; then
  OUT="$OUT/check" STAGES="build test" CTEST_JOBS="${CTEST_JOBS:-12}" CTEST_EXCLUDE="$call2" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "check.sh: $(tr '\n' ' ' < "$OUT/check/summary.txt" | cut -c1-600) at $(elapsed) s"
elif has_stage build; then  # the CLI only
  OUT="$OUT/check" STAGES=build TARGETS=attnkit_cli bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
fi
base='"mode":"extend","num_q_heads":32,"num_kv_heads":8,"head_dim":128,"page_size":16,"kv_dtype":"fp8_e4m3","fp8_q":true'
if has_stage verify; then
  for c in "{$base,\"prefix_lens\":[300,0],\"new_lens\":[700,1024],\"logit_cap\":20}" \
           "{$base,\"prefix_lens\":[0,100],\"new_lens\":[900,500],\"sliding_window\":127,\"sinks\":true,\"logit_cap\":10}" \
           "{$base,\"prefix_lens\":[3000],\"new_lens\":[200],\"sliding_window\":1000,\"sinks\":true,\"logit_cap\":30}" \
           "{$base,\"prefix_lens\":[1500,700],\"new_lens\":[100,40],\"logit_cap\":5}"; do
    echo "$c" | cut -c117-  # past {$base,
    echo "  fa3: $(timeout 60 "$ak" run --backend fa3 --device cuda --case "$c" --verify 2>&1 | grep -E '^(verify|attnkit:)')"
  done > "$OUT/verify.txt"
  cat "$OUT/verify.txt" >> "$summary"
  note "verify at $(elapsed) s"
fi
if has_stage bench && [ "$(elapsed)" -lt $((590 - 60 * ${ROUNDS:-1})) ]; then
  for r in $(seq 1 "${ROUNDS:-1}"); do
    echo "== round $r"
    timeout 60 "$ak" bench --backend fa3 --device cuda --cases scripts/device/fa3_s66_fp8q_variants.json \
      --json "$OUT/fa3_fp8q_variants_r$r.json" 2>>"$OUT/bench.err" | grep -E "^fa3 "
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
fi
note "done at $(elapsed) s"
