#!/usr/bin/env bash
# Runs ON the device machine from the repository root (carry .deps and .peers, made here by
# scripts/device/prepare_deps.sh):
#   run(carry=[".deps", ".peers"], command="bash scripts/device/check.sh")
# Configures and builds with Ninja into build/device, runs `ctest -L gpu`, then the benchmark
# (`attnkit bench`, when built) and the torch peers, writing logs and JSON under $OUT, and prints a
# short table last.
#
# Environment knobs:
#   ARCHS="90a-real"        CUDA architectures (add 80-real for the sm_80 path)
#   BUILD_DIR=build/device  the build tree (a second one for other ARCHS keeps both incremental)
#   ATTNKIT_EMULATE_CC=75|80 (environment, read by the library): host dispatch as on SM75 / SM80;
#                           with ARCHS="75-virtual;80-virtual" the driver JIT-compiles that PTX, so
#                           the older architecture's device code runs on this GPU (core/emulated_cc.h)
#   STAGES="build test bench peers"   which stages to run
#   BENCH_FILTER=""         passed to attnkit bench --filter
#   CTEST_REGEX=""          passed to ctest -R
#   CTEST_EXCLUDE=""        passed to ctest -E
#   CTEST_JOBS=4            ctest -j
#   BENCH_VERIFY=0          1: attnkit bench --verify (fp64 reference per case; slow for big cases)
#   BENCH_TIMEOUT=240       seconds per case file
#   BENCH_QUICK=0           1: scripts/device/triton_{decode,extend}_quick.json
#   BENCH_BACKENDS="triton,flashinfer"   backends timed by attnkit bench
#   BENCH_KINDS="decode extend"          which case files the bench stage runs (set empty: none)
#   BENCH_RUNS=""           extra bench runs "label=backends=casefile[=flag,flag..] ..." (own
#                           backends per file; the optional flags are comma-separated)
#   EXTEND_CASES=""         case file for the extend bench instead of the default / quick one
#   TARGETS="" (or BUILD_TARGETS)  ninja targets to build instead of the CLI + every GPU test
#   PEERS_SCRIPT=".peers/torch_peers.py"   peers stage script (e.g. scripts/device/prefill_peers.py)
#   HEAD_DIMS=""            -DATTNKIT_HEAD_DIMS (e.g. "64;128;256"); empty = the CMake default
#   stage "python": builds the Python extension in the same tree and runs
#                   scripts/device/python_gpu_check.py (torch SDPA as the oracle)
#   stage "pip":    `pip install --no-build-isolation --no-index .` (offline, as docs/python.md
#                   says; wheels carried in .whl are installed first when present) into /tmp/ak,
#                   then the same GPU check against the installed package
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start  # OUT, summary, note, has_stage
ARCHS="${ARCHS:-90a-real}"
STAGES="${STAGES:-build test bench peers}"
build="${BUILD_DIR:-$root/build/device}"

# At most 8 files come back from $OUT: summary.txt build.log ctest.log bench.log bench_decode.json
# bench_extend.json peers.log torch_peers.json.
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ)  .git HEAD: $(git rev-parse --short HEAD 2>/dev/null) (the device copies the working tree; its .git can be older)"

if has_stage build; then
  t0=$(date +%s)
  attnkit_configure "$build" "$ARCHS" "${HEAD_DIMS:-}" > "$OUT/build.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then tail -30 "$OUT/build.log"; note "configure: FAILED"; exit 1; fi
  # The library, the CLI (bench) and every GPU test; the CPU unit tests run in CI, not here.
  targets=(attnkit_cli)
  for f in tests/gpu/test_*.cpp tests/gpu/test_*.cu; do
    [ -f "$f" ] && targets+=("$(basename "${f%.*}")")
  done
  TARGETS="${TARGETS:-${BUILD_TARGETS:-}}"
  [ -n "${TARGETS:-}" ] && read -r -a targets <<< "$TARGETS"
  ninja -C "$build" -j16 -k 0 "${targets[@]}" >> "$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(( $(date +%s) - t0 )) s"
  # -k 0 keeps going: a target that fails to build (another backend mid-edit) is reported and the
  # rest still run.
  if [ $rc -ne 0 ]; then grep -E "error|FAILED" "$OUT/build.log" | head -30 | tee -a "$summary"; fi
  # ptxas serialised a kernel's wgmma (C7511): a silent slowdown (scripts/test.sh fails on it).
  if grep -q "C7511" "$OUT/build.log"; then
    note "WARNING: ptxas serialised wgmma (C7511) in $(grep "C7511" "$OUT/build.log" |
      sed -E "s/.*function '([^']+)'.*/\1/" | sort -u | tr '\n' ' ')"
  fi
fi

if has_stage test; then
  t0=$(date +%s)
  args=(-L gpu --output-on-failure --timeout 300 -j"${CTEST_JOBS:-4}")
  [ -n "${CTEST_REGEX:-}" ] && args+=(-R "$CTEST_REGEX")
  [ -n "${CTEST_EXCLUDE:-}" ] && args+=(-E "$CTEST_EXCLUDE")
  ctest --test-dir "$build" "${args[@]}" > "$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|Total Test time" "$OUT/ctest.log" | tee -a "$summary"
  grep -E "^\s*[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception)" "$OUT/ctest.log" | head -40 | tee -a "$summary"
  skipped=$(grep -c "\*\*\*Skipped" "$OUT/ctest.log")
  note "ctest: rc=$rc skipped=$skipped in $(( $(date +%s) - t0 )) s"
fi

# The torch peers first, so that the bench can report its ratio to their GEMM ceiling.
peers_script="${PEERS_SCRIPT:-.peers/torch_peers.py}"
if has_stage peers && [ -f "$peers_script" ]; then
  PYTHONUNBUFFERED=1 OUT="$OUT" timeout "${PEERS_TIMEOUT:-300}" python3 "$peers_script" > "$OUT/peers.log" 2>&1
  note "peers: rc=$?"
fi
gemm_tflops=""
if [ -f "$OUT/torch_peers.json" ]; then
  gemm_tflops=$(python3 -c 'import json,sys; print(next((r["tflops"] for r in json.load(open(sys.argv[1])) if r.get("name") == "gemm_bf16"), ""))' "$OUT/torch_peers.json" 2>/dev/null)
fi

cli="$build/tools/attnkit/attnkit"
# One bench run: run_bench LABEL BACKENDS CASES [extra bench args...] -> $OUT/bench_LABEL.json.
run_bench() {
  local label=$1 backends=$2 cases=$3
  shift 3
  local args=(bench --backend "$backends" --cases "$cases" --device cuda
              --json "$OUT/bench_$label.json" "$@")
  [ -n "$gemm_tflops" ] && args+=(--gemm-tflops "$gemm_tflops")
  echo "=== bench $label: ${args[*]}" >> "$OUT/bench.log"
  timeout "${BENCH_TIMEOUT:-240}" "$cli" "${args[@]}" >> "$OUT/bench.log" 2>&1
  note "bench $label: rc=$?"
}
if has_stage bench && [ -x "$cli" ]; then
  # BENCH_QUICK=1: the small case files next to this script instead of bench/cases/*.json.
  for f in ${BENCH_KINDS-decode extend}; do
    cases="bench/cases/$f.json"
    [ "${BENCH_QUICK:-0}" = 1 ] && cases="scripts/device/triton_${f}_quick.json"
    [ "$f" = extend ] && [ -n "${EXTEND_CASES:-}" ] && cases="$EXTEND_CASES"
    [ -f "$cases" ] || continue
    extra=()
    [ "${BENCH_VERIFY:-0}" = 1 ] && extra+=(--verify)
    [ -n "${BENCH_FILTER:-}" ] && extra+=(--filter "$BENCH_FILTER")
    run_bench "$f" "${BENCH_BACKENDS:-triton,flashinfer}" "$cases" "${extra[@]}"
  done
  # BENCH_RUNS="label=backends=casefile ...": extra bench runs, each with its own backends and
  # case file (e.g. "mla=flashmla,triton=scripts/device/mla_decode_quick.json").
  # An optional fourth field holds extra bench flags, comma-separated
  # ("decode_graph=triton,flashinfer=scripts/device/decode_targets.json=--graph,--launches,32").
  for spec in ${BENCH_RUNS:-}; do
    IFS='=' read -r label backends cases flags <<< "$spec"
    extra=()
    [ -n "$flags" ] && IFS=',' read -r -a extra <<< "$flags"
    run_bench "$label" "$backends" "$cases" "${extra[@]}"
  done
fi

if has_stage python; then
  t0=$(date +%s)
  { cmake -S . -B "$build" -DATTNKIT_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" &&
    ninja -C "$build" -j16 _attnkit; } >> "$OUT/ctest.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    PYTHONUNBUFFERED=1 PYTHONPATH="$build/python" timeout 240 python3 -X faulthandler \
      scripts/device/python_gpu_check.py >> "$OUT/ctest.log" 2>&1
    rc=$?
  fi
  note "python gpu check: rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E 'passed|failed' "$OUT/ctest.log" | tail -1)"
  # The README's Python example exactly as printed (tests/python/test_readme_example.py does the
  # same under pytest where torch is installed; the CI machine has no torch).
  if [ $rc -eq 0 ]; then
    PYTHONUNBUFFERED=1 PYTHONPATH="$build/python" timeout 120 python3 - > "$OUT/readme_example.log" 2>&1 <<'PY'
import pathlib, re
text = pathlib.Path("README.md").read_text()
code = re.findall(r"```python\n(.*?)```", text[text.index("## Python"):], flags=re.S)[0]
exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
PY
    rc=$?
    cat "$OUT/readme_example.log" >> "$OUT/ctest.log"
    note "README python example: rc=$rc; $(grep -E 'max' "$OUT/readme_example.log" | tr '\n' ' ')"
  fi
fi

if has_stage pip; then
  t0=$(date +%s)
  site=/tmp/ak-site
  rm -rf "$site" /tmp/ak && mkdir -p "$site"
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl >> "$OUT/ctest.log" 2>&1
  fi
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" CMAKE_BUILD_PARALLEL_LEVEL=16 \
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCHS ${HEAD_DIMS:+-DATTNKIT_HEAD_DIMS=$HEAD_DIMS} \
-DCMAKE_PREFIX_PATH=$root/.deps -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
-DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20" \
    timeout 420 python3 -m pip install --no-build-isolation --no-index --no-deps --target /tmp/ak . \
    > "$OUT/pip.log" 2>&1
  rc=$?
  note "pip install (offline): rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && tail -20 "$OUT/pip.log" | tee -a "$summary"
  if [ $rc -eq 0 ]; then
    t0=$(date +%s)
    (cd /tmp && PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/ak:$site" timeout 240 python3 -X faulthandler \
      "$root/scripts/device/python_gpu_check.py") >> "$OUT/ctest.log" 2>&1
    rc=$?
    note "python gpu check (pip-installed package): rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E 'passed|failed' "$OUT/ctest.log" | tail -1)"
  fi
fi

echo "==================== summary ===================="
cat "$summary"
[ -f "$OUT/bench.log" ] && { echo "--- bench (tail) ---"; tail -40 "$OUT/bench.log"; }
[ -f "$OUT/peers.log" ] && { echo "--- peers (ceilings + decode + prefill peers) ---"; grep -E "ceiling|decode|^peer" "$OUT/peers.log" | head -30; }
exit 0
