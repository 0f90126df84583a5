#!/usr/bin/env bash
# Session 20 (issue 5): the flashinfer decode with its math compiled out of ring::attend's main
# loop (loads, waits, __syncwarp and the epilogue stay; one word of each stage is consumed), beside
# the unchanged kernel, alternated, b16 kv 4k shuffled / in-order pages (decode_s20_layout.json),
# graph32 (or TIMING / ENVS / FILTER / ROUNDS, below). Device machine, repository root, carry
# .deps; the edit is made to the device's copy of the tree only. Writes $OUT/nomath.txt.
set -uo pipefail
. scripts/device/lib.sh
attnkit_configure build/device 90a-real > "$OUT/build.log" 2>&1 &&
  ninja -C build/device -j16 attnkit_cli >> "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
cp build/device/tools/attnkit/attnkit /tmp/attnkit_base
f=src/cuda/common/ring_decode.cuh
grep -q 'const int key0 = tile_key0(i);  // the step' $f || { echo "anchor missing"; exit 1; }
sed -i 's|^\(\s*\)const int key0 = tile_key0(i);  // the step.*$|&\n#ifdef ATTNKIT_RING_NOMATH\n    if (w.k_row_bytes != 0u) {\n      d[0] += __uint_as_float(reinterpret_cast<const uint32_t*>(ring + (i % kS) * Tr::kStageBytes)[lane] \& 0x3f800000u) * 1e-30f;\n      __syncwarp();\n      continue;\n    }\n#endif|' $f
sed -i '0,/^#pragma once/s//#pragma once\n#define ATTNKIT_RING_NOMATH 1/' $f
grep -n -A5 'ifdef ATTNKIT_RING_NOMATH' $f | head -8
t0=$(date +%s)
ninja -C build/device -j16 attnkit_cli >> "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "nomath rebuild $(( $(date +%s) - t0 )) s"
cp build/device/tools/attnkit/attnkit /tmp/attnkit_nomath
# ENVS: settings each binary runs under ("X=1": none; "A=1,B=0": several); TIMING: bench timing
# flags, "_" for spaces (graph32 = "--graph_--launches_32"); FILTER: the case filter.
ENVS=${ENVS:-X=1}
TIMING=${TIMING:---graph_--launches_32}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for t in $TIMING; do
    for e in $ENVS; do
      for v in base nomath; do
        echo "== round $r $v $e ${t//_/ }"
        env ${e//,/ } /tmp/attnkit_$v bench --backend flashinfer --cases \
          ${CASES:-scripts/device/decode_s20_layout.json} --device cuda ${t//_/ } ${FILTER:+--filter $FILTER} \
          2>/dev/null | awk '$1 !~ /^\[/ && $3 ~ /^[0-9.]+$/ {print $2, $3, $4, $5}'
      done
    done
  done
done 2>&1 | tee "$OUT/nomath.txt"
