#!/usr/bin/env bash
# Session 64: how fast would the flashinfer fp8 KV decode be without its fp8 -> f16 conversions?
# Builds the CLI (head dim 128) of this tree in build/d128 and of a copy with
# scripts/device/patches/$PATCH applied (default decode_s64_fp8_nocvt_probe.patch: K and V
# fragments fed to the MMAs raw, values wrong, timing only) in /tmp/probe/build, then alternates
# ROUNDS rounds of `attnkit bench --backend flashinfer --graph --launches 32` over CASES.
#   run(carry=[".deps"], command="bash scripts/device/s64_fp8_probe.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
attnkit_script_start
PATCH="${PATCH:-decode_s64_fp8_nocvt_probe.patch}"
CASES="${CASES:-scripts/device/decode_s64_fp8.json}"
note "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)  date: $(date -u +%Y-%m-%dT%H:%MZ) patch: $PATCH"
rm -rf /tmp/probe && mkdir -p /tmp/probe
tar --exclude=./build --exclude=./.git --exclude=./out --exclude=./.wt -cf - . | tar -xf - -C /tmp/probe
(cd /tmp/probe && patch -p1 < "scripts/device/patches/$PATCH" > /dev/null) || { note "patch failed"; exit 1; }
mkdir -p "$OUT/base" "$OUT/probe"
(attnkit_build_cli_d128 "$OUT/base" > "$OUT/base/time.txt" 2>&1; echo "rc $?" >> "$OUT/base/time.txt") &
(cd /tmp/probe && attnkit_build_cli_d128 "$OUT/probe" > "$OUT/probe/time.txt" 2>&1; echo "rc $?" >> "$OUT/probe/time.txt") &
wait
note "base build: $(tr '\n' ' ' < "$OUT/base/time.txt")  probe build: $(tr '\n' ' ' < "$OUT/probe/time.txt") at $(elapsed) s"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in base probe; do
    [ "$v" = base ] && C=build/d128/tools/attnkit/attnkit || C=/tmp/probe/build/d128/tools/attnkit/attnkit
    echo "== round $r $v" >> "$OUT/bench.txt"
    timeout 60 "$C" bench --backend flashinfer --device cuda --cases "$CASES" --graph --launches 32 \
      >> "$OUT/bench.txt" 2>&1
  done
done
grep -E "^== |^flashinfer |ceiling cuda" "$OUT/bench.txt" | sed -E 's/ +/ /g' | cut -c1-160 | tee -a "$summary"
note "done at $(elapsed) s"
