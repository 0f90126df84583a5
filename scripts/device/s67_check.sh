#!/usr/bin/env bash
# Session 67, the closing check of the MLA prefill kernel (and of the engine refactor it brought:
# the MHA run path now builds its parameters in base_params): build everything (build/device, every
# head dim), run test_fa3_cases whole, test_flashinfer_cases (flashinfer's SM90 prefill is the same
# engine) and the NaN-key cases of fa3 / flashinfer, then bench/cases/mla_prefill.json on fa3
# (ROUNDS rounds) with scripts/device/fa3_peers.py in the same command.
#   run(carry=[".deps", ".peers"], command="bash scripts/device/s67_check.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage, elapsed
note_device
STAGES="${STAGES:-build test bench peers}"
ak=build/device/tools/attnkit/attnkit
if has_stage build; then
  OUT="$OUT/check" STAGES=build TARGETS="attnkit_cli test_fa3_cases test_flashinfer_cases test_nan_key_cases" \
    bash scripts/device/check.sh > /dev/null 2>&1
  note "$(grep build "$OUT/check/summary.txt" | tail -1) at $(elapsed) s"
  grep -E "error|FAILED" "$OUT/check/build.log" 2>/dev/null | head -20 >> "$summary"
fi
if has_stage test; then
  for t in test_fa3_cases test_flashinfer_cases; do
    timeout 200 build/device/tests/$t > "$OUT/$t.log" 2>&1
    note "$t: rc=$? at $(elapsed) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$t.log" | tr '\n' ' ' | cut -c1-400)"
    grep -E "^\[  FAILED  \]" "$OUT/$t.log" | head -10 >> "$summary"
  done
  timeout 120 build/device/tests/test_nan_key_cases --gtest_filter='*fa3*:*flashinfer*' > "$OUT/nan.log" 2>&1
  note "NanKeyCases (fa3, flashinfer): rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/nan.log" | tr '\n' ' ')"
fi
if has_stage bench; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    echo "== round $r"
    timeout 60 "$ak" bench --backend fa3 --device cuda --cases bench/cases/mla_prefill.json \
      --json "$OUT/mla_prefill_r$r.json" 2>>"$OUT/bench.err" | grep -E "^fa3 |ceiling"
  done > "$OUT/bench.txt"
  sed -E 's/ +/ /g' "$OUT/bench.txt" >> "$summary"
fi
if has_stage peers; then
  PYTHONUNBUFFERED=1 OUT="$OUT" timeout 90 python3 scripts/device/fa3_peers.py > "$OUT/peers.log" 2>&1
  note "peers: rc=$? at $(elapsed) s"
  grep -E "gemm|sdpa_cudnn" "$OUT/peers.log" >> "$summary"
fi
note "done at $(elapsed) s"
