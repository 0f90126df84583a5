# fa3 d 64 key-block A/B (session 7): build, the fa3 GPU tests with ATTNKIT_FA3_BLOCK_N=192, the d 64 case
# file with 128 / 192 alternated twice, cuDNN / FA2 peers at the same shapes; one device call:
#   run(carry=[".deps"], command="bash scripts/device/fa3_d64_ab.sh")
. scripts/device/lib.sh; B=build/device; W=/tmp/w; mkdir -p $W
attnkit_configure $B 90a-real > $W/build.log 2>&1 && ninja -C $B -j16 attnkit_cli test_fa3_cases > $W/build.log 2>&1; echo build=$?
ATTNKIT_FA3_BLOCK_N=192 ctest --test-dir $B -L gpu -R 'Fa3|FA3|fa3' -j8 --timeout 100 --output-on-failure > $W/ctest192.log 2>&1; echo ctest192=$?; grep -E "tests passed|tests failed" $W/ctest192.log; grep -E "\*\*\*Failed" $W/ctest192.log | head -5
C=$B/tools/attnkit/attnkit
for r in 1 2; do for n in 128 192; do
 ATTNKIT_FA3_BLOCK_N=$n $C bench --backend fa3 --cases scripts/device/fa3_d64.json --device cuda --warmup 3 --iters 20 --json $W/d64_${n}_$r.json > $W/d64_${n}_$r.txt 2>&1
 echo "== N=$n r=$r"; grep -E "^fa3" $W/d64_${n}_$r.txt | awk '{print $2, $3, $6, $NF}'
done; done
FA3_PEERS_EXTRA="4,4096,64,1;1,16384,64,1;2,8192,64,0" OUT=$W timeout 150 python3 scripts/device/fa3_peers.py 2>&1 | grep -E "gemm|d=64"
tar -czf $OUT/d64.tar.gz -C $W .
