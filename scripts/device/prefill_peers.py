# Torch SDPA peers (FlashAttention-2 and cuDNN backends) for the prefill shapes of
# scripts/device/extend_prefill_quick.json: causal, GQA 32/8, bf16, no prefix. Writes
# $OUT/prefill_peers.json and prints one line per measurement. Same timing method as
# .peers/torch_peers.py (CUDA events, median after warm-up).
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import bench  # same directory


results = []
dev = "cuda"
shapes = [(4, 4096, 128), (2, 8192, 128), (1, 16384, 128), (4, 4096, 64), (2, 8192, 64),
          (1, 16384, 64), (4, 4096, 256), (2, 8192, 256), (1, 16384, 256)]
# PEERS_SHAPES="B,S,d B,S,d ...": only these shapes (default: all of the above).
if os.environ.get("PEERS_SHAPES"):
    shapes = [tuple(int(x) for x in t.split(",")) for t in os.environ["PEERS_SHAPES"].split()]
for B, S, d in shapes:
    Hq, Hk = 32, 8
    q = torch.randn(B, Hq, S, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hk, S, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hk, S, d, device=dev, dtype=torch.bfloat16)
    kr = k.repeat_interleave(Hq // Hk, dim=1)
    vr = v.repeat_interleave(Hq // Hk, dim=1)
    flops = 4 * B * Hq * d * (S * (S + 1) // 2)  # causal pairs, as attnkit bench counts them
    for name, be in [("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                     ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]:
        try:
            with sdpa_kernel([be]):
                ms = bench(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True))
            r = dict(name=name, B=B, S=S, d=d, ms=ms, tflops=flops / ms / 1e9)
            results.append(r)
            print(f"peer {name:11s} B={B} S={S} d={d}: {ms:8.3f} ms {r['tflops']:7.1f} TFLOP/s",
                  flush=True)
        except Exception as ex:  # a backend the build lacks
            print(f"peer {name:11s} B={B} S={S} d={d}: unsupported: {str(ex)[:80]}")
    del q, k, v, kr, vr
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "prefill_peers.json"), "w") as f:
    json.dump(results, f, indent=1)
