// Parameters of the triton backend's attention kernels: one POD passed by value as
// `const __grid_constant__`, shared by the host planner (plain C++) and the kernels. Strides are
// in elements; every pointer states its shape.
//
// Key index space of request b: [0, num_prefix_b) are pool keys reached through the flattened
// token indices (kv_indices[kv_indptr[b] + j]); [num_prefix_b, num_prefix_b + num_new_b) are the
// request's new tokens, read from the contiguous k/v inputs (k_new != nullptr) or from the pool
// at slot new_slots[q_start_b + j - num_prefix_b]. Query i of request b has position q_pos =
// num_prefix_b + i (decode: num_prefix_b - 1, the new token being the last pool key); key j has
// position j.
#pragma once

#include <cstdint>

namespace attnkit::triton {

// The most tokens one launch's grid covers (gridDim.z's limit); longer batches are launched in
// slices (AttentionParams::token_base).
inline constexpr int kMaxGridTokens = 65535;

struct AttentionParams {
  // Queries and outputs (activation dtype).
  const void* q = nullptr;  // [T, Hq, Dqk]
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;  // [T, Hq, Dv]
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;  // [T, Hq] natural-log LSE, optional
  int64_t lse_stride_token = 0;

  // KV pool of this layer (pool dtype). MLA: v_pool == k_pool with the K row strides.
  const void* k_pool = nullptr;  // [rows, Hkv, Dqk]
  const void* v_pool = nullptr;  // [rows, Hkv, Dv]
  int64_t k_stride_row = 0, k_stride_head = 0;
  int64_t v_stride_row = 0, v_stride_head = 0;
  const uint8_t* k_scales = nullptr;  // fp4 only: fp8_e4m3 [rows, Hkv, Dqk / 16]
  const uint8_t* v_scales = nullptr;  // fp4 only: fp8_e4m3 [rows, Hkv, Dv / 16]
  int64_t ks_stride_row = 0, ks_stride_head = 0;
  int64_t vs_stride_row = 0, vs_stride_head = 0;

  // Pool keys (the cached prefix; decode: the whole sequence).
  const int32_t* kv_indptr = nullptr;   // [bs + 1]
  const int32_t* kv_indices = nullptr;  // [kv_indptr[bs]] pool slots

  // New keys (extend only; decode and cross-attention have none).
  const void* k_new = nullptr;  // [T, Hkv, Dqk] activation dtype, or nullptr: read the pool
  const void* v_new = nullptr;  // [T, Hkv, Dv]
  int64_t kn_stride_token = 0, kn_stride_head = 0;
  int64_t vn_stride_token = 0, vn_stride_head = 0;
  // [T] the new tokens' pool slots in token order, used when k_new == nullptr: read from
  // req_to_token at plan time (cuda::build_token_indices over each request's columns after its
  // prefix), whose entries the host checks against the pool (kv/table_slots.h), not from
  // out_cache_loc, which nothing checks before a kernel reads it (set_kv only skips a bad write).
  const int32_t* new_slots = nullptr;

  // Query layout per request. Decode: q_start / q_len are nullptr (request b owns token b).
  const int32_t* q_start = nullptr;  // [bs] extend_start_loc
  const int32_t* q_len = nullptr;    // [bs] extend_seq_lens
  int has_new_keys = 0;              // 1: the new tokens are keys too (self-attention extend)

  // Verify tree mask: request b's block is row-major [num_new, num_prefix + num_new] bytes at
  // custom_mask + mask_indptr[b].
  const uint8_t* custom_mask = nullptr;
  const int64_t* mask_indptr = nullptr;  // [bs + 1]

  const float* sinks = nullptr;  // [Hq] natural-log sink logits, optional

  int bs = 0;
  int num_tokens = 0;  // T
  // The first token of this launch: grids are launched in slices of at most kMaxGridTokens
  // tokens (blockIdx.z, whose limit is 65535), token = token_base + blockIdx.z.
  int token_base = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int group_size = 0;  // Hq / Hkv
  int group_tiles =
      1;  // ceil(group_size / the kernel's q-head tile): blockIdx.y = kv_head * group_tiles + tile
  int causal = 1;  // 0: bidirectional (encoder-only, cross-attention)
  int is_decode = 0;
  int sliding_window = -1;  // -1 = off
  float sm_scale = 0.f;     // scaling * k_scale (natural-log units)
  float logit_cap = 0.f;    // 0 = off
  float v_scale = 1.f;      // applied to the output

  // Split-KV (decode). Request b's keys are cut into splits_b = ceil(n / chunk_b) chunks of
  // chunk_b keys, where splits_b <= max_splits (see split_plan.h). With max_splits == 1 the
  // attention kernel writes `out` directly.
  int max_splits = 1;
  int min_chunk = 0;
  // CUDA graphs: the replayed forward's min_chunk in device memory (nullptr: use min_chunk).
  const int* min_chunk_word = nullptr;
  float* partial_out = nullptr;  // [max_splits, T, Hq, Dv] f32, normalised per split
  float* partial_lse = nullptr;  // [max_splits, T, Hq] f32, log2 domain
  // 1: a request with a single split writes that split's partial (split 0; no sink, no v_scale)
  // instead of out/lse, for a caller that merges partial results (the MLA chunked prefix cache).
  int partial_single = 0;
  // Tensor-core decode only: split CTAs finished per (token, head block), [T, gridDim.x] int32,
  // zero between launches (the last split CTA merges in place and resets it).
  int* split_counters = nullptr;
  // Tensor-core decode: how a split CTA counts itself (experiment knob
  // ATTNKIT_TRITON_SPLIT_SYNC=fence_all: 0 = one acq_rel atomic by thread 0 after a CTA barrier, 1
  // = every thread fences, then the atomic, then a fence: ring::last_split_cta).
  int split_sync_fence_all = 0;
};

#if defined(__CUDACC__)
// The forward's split chunk floor: the graph's device word when set, else the launch value.
__device__ __forceinline__ int forward_min_chunk(const AttentionParams& p) {
  return p.min_chunk_word != nullptr ? *p.min_chunk_word : p.min_chunk;
}
#endif

}  // namespace attnkit::triton
