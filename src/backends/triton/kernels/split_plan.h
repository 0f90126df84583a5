// The split-KV heuristic of the triton backend's decode, shared by the host planner and the
// kernels (so eager runs and CUDA-graph replays cut every request identically).
//
// Goal: enough blocks to fill the SMs when a few long sequences are decoded, and no block holding
// much more work than another when lengths are uneven. A request's split count depends only on
// its own length and on constants of the backend (SM count, heads), never on the rest of the
// batch: a request gives bit-identical results whatever it is batched with, including the padded
// rows of a CUDA-graph batch.
//
//   max_splits = clamp(ceil(kTargetBlocksPerSm * num_sms / head_blocks), 1, kMaxSplits)
//                (head_blocks = kv_heads * ceil(group / tile): blocks of one request/split; tile =
//                16 q heads for the tensor-core decode, simt::gqa_tile for the SIMT kernel)
//   splits(n)  = clamp(ceil(n / kMinChunk), 1, max_splits)
//   chunk(n)   = round_up(ceil(n / splits(n)), kChunkAlign); the last split takes the remainder.
//
// kTargetBlocksPerSm is the tensor-core decode's residency (2 blocks of 110 KB shared memory per
// SM90 multiprocessor); kMinChunk = 512 keys gives each of its 4 warps >= 8 tiles of 16 keys, so
// the cp.async rings run mostly full rather than filling and draining.
//
// Worked example (H100/H200, 132 SMs; 32 q / 8 kv heads, d 128, so one 16-head tile covers the
// group of 4 and head_blocks = 8): max_splits = ceil(2 * 132 / 8) = 33.
//   * bs 1, kv 16384: splits = min(32, 33) = 32, chunk 512 -> 8 * 32 = 256 blocks, two per SM.
//   * bs 16, kv 4096: splits = 8, chunk 512 -> 8 * 8 * 16 = 1024 blocks of 512 keys.
//   * bs 4 with kv 16384, 1000, 300, 20: 32 / 2 / 1 / 1 splits of at most 512 / 512 / 300 / 20
//     keys: the long request no longer decides the step time alone.
#pragma once

#if defined(__CUDACC__)
#define ATTNKIT_HOST_DEVICE __host__ __device__
#else
#define ATTNKIT_HOST_DEVICE
#endif

namespace attnkit::triton {

inline constexpr int kTargetBlocksPerSm = 2;
inline constexpr int kMaxSplits = 64;
inline constexpr int kMinChunk = 512;  // keys (see above); the merge's traffic stays < 1%
inline constexpr int kChunkAlign = 16;

inline int plan_max_splits(int num_sms, int head_blocks) {
  const int target = kTargetBlocksPerSm * num_sms;
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

}  // namespace attnkit::triton
