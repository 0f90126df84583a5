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
//                (head_blocks = kv_heads * ceil(group / gqa_tile): blocks of one request/split)
//   splits(n)  = clamp(ceil(n / kMinChunk), 1, max_splits)
//   chunk(n)   = round_up(ceil(n / splits(n)), kChunkAlign); the last split takes the remainder.
//
// Worked example (H100, 132 SMs; 32 q / 8 kv heads, d 128, so gqa_tile 8 covers the group of 4
// and head_blocks = 8): max_splits = ceil(2 * 132 / 8) = 33.
//   * bs 1, kv 16384: splits = min(64, 33) = 33, chunk = round_up(497, 16) = 512 -> 32 splits of
//     512 keys: 8 * 32 = 256 blocks, about two per SM.
//   * bs 16, kv 4096: splits = 16, chunk 256 -> 16 * 8 * 16 = 2048 blocks of 256 keys.
//   * bs 4 with kv 16384, 1000, 300, 20: 32 / 4 / 2 / 1 splits of at most 512 / 256 / 160 / 20
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
inline constexpr int kMinChunk = 256;  // keys: the merge's extra traffic stays ~1% of the KV read
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
