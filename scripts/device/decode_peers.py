"""Decode peers for the decode target shapes, small enough for a short device run: the copy
ceiling (as .peers/torch_peers.py measures it) and PyTorch SDPA (cuDNN, FlashAttention-2) decode
on contiguous KV, GQA 32/8 d 128 bf16. Prints one line per case; writes $OUT/decode_peers.json."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import bench  # same directory

dev = torch.device("cuda")
results = []


def rec(kind, name, shape, ms, gbs):
    results.append(dict(kind=kind, name=name, shape=shape, ms=ms, gbs=gbs))
    print(f"{kind:8s} {name:12s} {shape:32s} {ms:8.4f} ms {gbs:7.0f} GB/s", flush=True)


x = torch.randn(1 << 30, device=dev, dtype=torch.bfloat16)
y = torch.empty_like(x)
ms = bench(lambda: y.copy_(x), iters=10)
rec("ceiling", "d2d_copy", "2GiB", ms, 2 * x.numel() * 2 / ms / 1e6)
del x, y
torch.cuda.empty_cache()

for B, L in [(16, 4096), (64, 4096), (1, 16384), (1, 32768)]:
    Hq, Hk, d = 32, 8, 128
    q = torch.randn(B, Hq, 1, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hk, L, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hk, L, d, device=dev, dtype=torch.bfloat16)
    kv_bytes = 2 * B * Hk * L * d * 2
    shape = f"B={B} L={L}"
    for name, be in [("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("sdpa_flash", SDPBackend.FLASH_ATTENTION)]:
        try:
            with sdpa_kernel([be]):
                ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            rec("decode", name, shape, ms, kv_bytes / ms / 1e6)
        except Exception as ex:
            print(f"decode   {name:12s} {shape:32s} unsupported: {str(ex)[:80]}")
    del q, k, v
    torch.cuda.empty_cache()

with open(os.path.join(os.environ.get("OUT", "."), "decode_peers.json"), "w") as f:
    json.dump(results, f, indent=1)
