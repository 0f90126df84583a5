"""Peers for the fa3 targets (issue 6), a trimmed .peers/torch_peers.py: the bf16 GEMM ceiling and
PyTorch SDPA (cuDNN, FA2) prefill at the shapes of bench/cases/fa3_prefill.json (GQA 32/8, B x S =
16k tokens), causal and bidirectional, and the MLA prefill shapes of bench/cases/mla_prefill.json
(q / k 192, v 128), timed the same way (median of 20 CUDA-event-timed calls
after 5 warm-ups). No FlexAttention / decode (their torch.compile time does not fit one device
call next to the build). Writes $OUT/fa3_peers.json; one line per case.
"""
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import bench  # same directory

dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
print(f"# {props.name} SMs={props.multi_processor_count} torch={torch.__version__} "
      f"cudnn={torch.backends.cudnn.version()}", flush=True)
results = []


def rec(name, shape, ms, tflops):
    results.append(dict(name=name, shape=shape, ms=ms, tflops=tflops))
    print(f"{name:12s} {shape:44s} {ms:8.3f} ms {tflops:7.1f} TFLOP/s", flush=True)


a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn_like(a)
ms = bench(lambda: a @ b, iters=10)
rec("gemm_bf16", "8192^3", ms, 2 * 8192**3 / ms / 1e9)
# FP8 (e4m3) GEMM ceiling for the FP8 kernel's utilisation (torch._scaled_mm, per-tensor scales).
try:
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)
    ms = bench(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16), iters=10)
    rec("gemm_e4m3", "8192^3", ms, 2 * 8192**3 / ms / 1e9)
    del a8, b8
except Exception as ex:  # noqa: BLE001
    print(f"gemm_e4m3    unsupported: {str(ex)[:80]}", flush=True)
del a, b

def time_sdpa(q, k, v, causal, flops, shape):
    """Records SDPA's cuDNN and FA2 backends on (q, k, v), or says a backend has no kernel."""
    for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            rec(name, shape, ms, flops / ms / 1e9)
        except Exception as ex:  # noqa: BLE001
            print(f"{name:12s} {shape:44s} unsupported: {str(ex)[:80]}", flush=True)


cases = [(4, 4096, 128, True), (2, 8192, 128, True), (1, 16384, 128, True),
         (4, 4096, 128, False), (2, 8192, 128, False), (1, 16384, 128, False),
         (2, 8192, 64, True), (2, 8192, 256, True)]
# FA3_PEERS_EXTRA="B,S,d,causal;..." adds shapes (causal 1/0), e.g. "4,4096,64,1;2,8192,64,0".
for item in filter(None, os.environ.get("FA3_PEERS_EXTRA", "").split(";")):
    B, S, d, c = (int(x) for x in item.split(","))
    cases.append((B, S, d, c != 0))
for B, S, d, causal in cases:
    Hq, Hk = 32, 8
    q = torch.randn(B, Hq, S, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hk, S, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hk, S, d, device=dev, dtype=torch.bfloat16)
    kr = k.repeat_interleave(Hq // Hk, dim=1)
    vr = v.repeat_interleave(Hq // Hk, dim=1)
    # Visible (query, key) pairs, as attnkit bench counts them: S (S + 1) / 2 causal, S^2 bidirectional.
    flops = 4 * B * Hq * d * (S * (S + 1) // 2 if causal else S * S)
    time_sdpa(q, kr, vr, causal, flops, f"B={B} S={S} d={d} {'causal' if causal else 'bidir'}")
    del q, k, v, kr, vr
    torch.cuda.empty_cache()

# MLA prefill (bench/cases/mla_prefill.json): q / k 192, v 128, kv heads = q heads, causal.
# FA3_PEERS_MLA="B,S,H;..." replaces the default list ("" or "0": none).
mla_env = os.environ.get("FA3_PEERS_MLA", "4,4096,16;2,8192,16;1,16384,16;1,4096,128")
mla_cases = [] if mla_env in ("", "0") else [
    tuple(int(x) for x in item.split(",")) for item in filter(None, mla_env.split(";"))]
for B, S, H in mla_cases:
    q = torch.randn(B, H, S, 192, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, H, S, 192, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, H, S, 128, device=dev, dtype=torch.bfloat16)
    flops = 2 * (192 + 128) * B * H * (S * (S + 1) // 2)
    time_sdpa(q, k, v, True, flops, f"MLA B={B} S={S} H={H} d=192/128 causal")
    del q, k, v
    torch.cuda.empty_cache()

with open(os.path.join(os.environ.get("OUT", "."), "fa3_peers.json"), "w") as f:
    json.dump(results, f, indent=1)
