#!/usr/bin/env bash
# Session 25 (issue 7): per-phase timeline of the MLA wgmma decode (128 heads). On the device
# machine, from the repository root with .deps carried:
#   run(carry=[".deps"], command="OUT=\$OUT timeout 580 bash scripts/device/mla_timeline.sh")
# Builds the CLI with -DATTNKIT_MLA_TIMELINE=ON (build-tl; the stamps of mla_decode_wgmma.cuh), then
# for each entry of RUNS ("name:filter:VAR=v,VAR=v"; X=1 = nothing set) runs `attnkit bench
# --backend flashmla --cases $CASES --filter <filter> --iters 3` with ATTNKIT_MLA_TIMELINE_OUT set
# (the last launch's timeline is kept) and summarises it with scripts/device/mla_timeline.py.
# The bench's times in this build are not figures (the dump syncs after each launch).
# Writes $OUT/timeline.txt (the summaries) and $OUT/<name>.bin.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
CASES="${CASES:-scripts/device/mla_decode_128h_s24.json}"
RUNS="${RUNS:-v6_kv4k:kv4096_p64_h128_d576v512_kvbf16:X=1}"
mkdir -p "$OUT"
t0=$(date +%s)
{ attnkit_configure build-tl 90a-real "" -DATTNKIT_MLA_TIMELINE=ON -DATTNKIT_BUILD_TESTS=OFF &&
  ninja -C build-tl -j16 attnkit_cli; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build $(($(date +%s) - t0)) s" > "$OUT/timeline.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> "$OUT/timeline.txt"
for r in $RUNS; do
  name=${r%%:*}
  rest=${r#*:}
  filt=${rest%%:*}
  e=${rest#*:}
  echo "== $name filter $filt env $e" >> "$OUT/timeline.txt"
  env ${e//,/ } ATTNKIT_MLA_TIMELINE_OUT="$OUT/$name.bin" timeout 60 build-tl/tools/attnkit/attnkit \
    bench --backend flashmla --cases "$CASES" --filter "$filt" --device cuda --warmup 2 --iters 3 \
    2>&1 | awk '$1 == "flashmla" {print $2, $3, $6} /rror/' >> "$OUT/timeline.txt"
  python3 scripts/device/mla_timeline.py "$OUT/$name.bin" >> "$OUT/timeline.txt" 2>&1
done
echo "total $(($(date +%s) - t0)) s" >> "$OUT/timeline.txt"
cat "$OUT/timeline.txt"
