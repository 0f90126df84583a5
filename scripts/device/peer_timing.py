"""The timing loop of the small peer scripts next to this file (decode_peers.py, fa3_peers.py,
prefill_peers.py): the same method as .peers/torch_peers.py, the median of `iters` CUDA-event-timed
calls after `warmup` untimed ones, in milliseconds."""
import torch


def bench(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]
