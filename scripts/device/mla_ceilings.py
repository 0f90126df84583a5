"""Copy-bandwidth and bf16 GEMM ceilings for the MLA notes (torch, CUDA events, median of 10).

Writes $OUT/mla_ceilings.json and prints two lines."""
import json
import os

import torch


def bench(fn, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
y = torch.empty_like(x)
ms = bench(lambda: y.copy_(x))
copy_gbs = 2 * x.numel() * 2 / ms / 1e6
del x, y
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
ms_g = bench(lambda: a @ b)
gemm_tf = 2 * n**3 / ms_g / 1e9
res = dict(device=torch.cuda.get_device_name(0), copy_gbs=copy_gbs, copy_ms=ms,
           gemm_bf16_8192_tflops=gemm_tf, gemm_ms=ms_g)
print(f"torch copy 2GiB: {copy_gbs:.1f} GB/s ({ms:.3f} ms); bf16 GEMM 8192^3: {gemm_tf:.1f} TFLOP/s")
with open(os.path.join(os.environ.get("OUT", "."), "mla_ceilings.json"), "w") as f:
    json.dump(res, f, indent=1)
