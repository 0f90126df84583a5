// The split-KV heuristic of the triton backend's decode, shared by the host planner and the
// kernels (so eager runs and CUDA-graph replays cut every request identically).
//
// Goal: enough blocks to fill the SMs when a few long sequences are decoded, one balanced wave
// (not several short ones) when many are, and no block holding much more work than another when
// lengths are uneven. Two levels:
//
//   max_splits   = clamp(ceil(kTargetBlocksPerSm * num_sms / head_blocks), 1, kMaxSplits)
//                  (head_blocks = kv_heads * ceil(group / tile): blocks of one request/split; tile
//                  = 16 q heads for the tensor-core decode, simt::gqa_tile for the SIMT kernel)
//   per forward:  min_chunk c = the smallest multiple of kChunkStep, >= kMinChunk, with
//                   head_blocks * sum_{r: n_r > kMinChunk} splits_c(n_r) <= kTargetBlocksPerSm *
//                   num_sms
//                 (or no split when even unsplit the long requests exceed that: c = the longest
//                 length). Requests of <= kMinChunk keys never split and do not enter the sum, so
//                 the padded rows of a CUDA-graph batch (length 1) leave c unchanged.
//   per request:  splits_c(n) = clamp(ceil(n / c), 1, max_splits)
//                 chunk_c(n)  = round_up(ceil(n / splits_c(n)), kChunkAlign); the last split takes
//                 the remainder.
//
// A request's split depends on its own length and on c, which the host computes once per forward
// from the host lengths (eager: init_forward_metadata; graphs: the replay writes c into a device
// word that the captured kernels read), so eager and replay cut every request identically.
// kTargetBlocksPerSm is the residency of the 2-CTA shape of the tensor-core decode (2 blocks of
// 110 KB shared memory per SM90 multiprocessor) and of the SIMT kernel: the grid is at most one
// wave. The backend passes 1 instead where it runs the one-CTA shape (one block of 8 warps and
// ~211 KB per SM: pools of the activation dtype, head dims <= 128, SM90; MmaDecodeRing in
// triton_kernels.h), so that its grid is one wave too: the same rule with half the blocks.
// kMinChunk = 512 keys gives each of its 4 warps >= 8 tiles of 16 keys, so the cp.async rings run
// mostly full rather than filling and draining. FlashInfer's decode planner and FlashDecoding's
// split rule size splits the same way (a batch-wide chunk that fills one wave); ours differs in
// ignoring short requests.
//
// Worked examples (H100/H200, 132 SMs; 32 q / 8 kv heads, d 128, so one 16-head tile covers the
// group of 4, head_blocks = 8, max_splits = ceil(2 * 132 / 8) = 33, per-head-block budget 33):
//   * bs 1, kv 16384: c = 512 (32 <= 33) -> 32 splits of 512 -> 256 blocks, one wave.
//   * bs 16, kv 4096: c = 512 would give 16 * 8 = 128 > 33; c = 2048 gives 16 * 2 = 32 -> 2
//     splits of 2048 keys, 256 blocks in one wave (the per-request rule gave 1024 blocks of 512
//     keys: four waves, each paying the ring's ramp and the merge).
//   * bs 64, kv 4096: 64 unsplit requests > 33 -> no split, 512 blocks.
//   * bs 4 with kv 16384, 1000, 300, 20: c = 576 -> 29 + 2 + 1 + 1 splits (the last two are short
//     and never split): the long request no longer decides the step time alone.
// With the one-CTA shape (blocks per SM 1: max_splits = ceil(132 / 8) = 17, budget 132 / 8 = 16):
//   * bs 1, kv 16384: c = 512 gives 17 > 16; c = 1024 -> 16 splits of 1024 -> 128 blocks.
//   * bs 16, kv 4096: only c = 4096 fits 16 -> no split, 128 blocks (no merge at all).
//   * bs 64, kv 4096: no split, 512 blocks (about 4 waves of one block per SM).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "core/host_device.h"

namespace attnkit::triton {

inline constexpr int kTargetBlocksPerSm = 2;
inline constexpr int kMaxSplits = 64;
inline constexpr int kMinChunk = 512;  // keys (see above); the merge's traffic stays < 1%
inline constexpr int kChunkAlign = 16;
inline constexpr int kChunkStep = 64;  // the per-forward chunk floor moves in whole CTA rounds

inline int plan_max_splits(int num_sms, int head_blocks, int blocks_per_sm = kTargetBlocksPerSm) {
  const int target = blocks_per_sm * num_sms;
  int s = (target + head_blocks - 1) / (head_blocks > 0 ? head_blocks : 1);
  if (s < 1) s = 1;
  if (s > kMaxSplits) s = kMaxSplits;
  return s;
}

// Keys per split for a request with n keys (n >= 0).
ATTNKIT_HOST_DEVICE inline int split_chunk(int n, int max_splits, int min_chunk) {
  int splits = (n + min_chunk - 1) / min_chunk;
  if (splits < 1) splits = 1;
  if (splits > max_splits) splits = max_splits;
  int chunk = (n + splits - 1) / splits;
  chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  return chunk > 0 ? chunk : kChunkAlign;
}
ATTNKIT_HOST_DEVICE inline int split_count(int n, int max_splits, int min_chunk) {
  const int chunk = split_chunk(n, max_splits, min_chunk);
  const int s = (n + chunk - 1) / chunk;
  return s > 0 ? s : 1;
}

// Per-forward chunk floor c (see above) for the requests' decode lengths; target_blocks = grid
// blocks of one wave (kTargetBlocksPerSm * num_sms).
inline int plan_forward_chunk(std::span<const int32_t> lens, int head_blocks, int target_blocks,
                              int max_splits) {
  const int64_t budget = std::max(1, target_blocks) / std::max(1, head_blocks);
  int max_len = 0;
  for (int32_t n : lens) max_len = std::max<int>(max_len, n);
  const auto blocks = [&](int c) {
    int64_t s = 0;
    for (int32_t n : lens) {
      if (n > kMinChunk) s += split_count(n, max_splits, c);
    }
    return s;
  };
  if (max_len <= kMinChunk || blocks(kMinChunk) <= budget) return kMinChunk;
  if (blocks(max_len) > budget) return max_len;  // the long requests alone fill the wave
  // Smallest step multiple c in (kMinChunk, max_len] within the budget (blocks(c) is
  // non-increasing in c).
  int lo = kMinChunk / kChunkStep + 1;
  int hi = (max_len + kChunkStep - 1) / kChunkStep;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (blocks(mid * kChunkStep) <= budget) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return std::min(max_len, lo * kChunkStep);
}

}  // namespace attnkit::triton
