// Device helpers shared by the two MLA decode kernels (mla_decode_mma.cuh: mma.sync, 16/32/64-row
// tiles, bf16 and fp8 cache; mla_decode_wgmma.cuh: sm_90a wgmma, 64-row tiles, bf16 and fp8
// cache): the walk over a CTA's request segments of the plan, the source of one 16-byte chunk of
// a query row, the pool slot of a key through the page table, the e4m3 -> bf16 / f16 conversions
// and the scaled bf16 -> f16 conversion of Q for the f16 tensor-core paths.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/mla/kernels/mla_decode_params.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/mma_sm80.cuh"

namespace attnkit::mla {

// Four e4m3 values (one 32-bit word, lowest byte first) -> two bf16x2 words (exact: every e4m3
// value is a bf16 value). The mma.sync kernel's fp8 tiles and the wgmma kernel's fp8 consumers.
__device__ __forceinline__ void fp8x4_to_bf16x4(uint32_t word, uint32_t& lo, uint32_t& hi) {
  uint32_t out[2];
#pragma unroll
  for (int hlf = 0; hlf < 2; ++hlf) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>((word >> (16 * hlf)) & 0xffffu);
    const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
    out[hlf] = cuda::pack2<__nv_bfloat16>(f.x, f.y);
  }
  lo = out[0];
  hi = out[1];
}

// Four e4m3 values -> two f16x2 words (exact; one cvt per pair): the f16 tensor-core inputs of
// both kernels' fp8 paths (the mma.sync kernel's 16-row tiles, the wgmma kernel's consumers).
__device__ __forceinline__ void fp8x4_to_f16x4(uint32_t word, uint32_t& lo, uint32_t& hi) {
  cuda::fp8x4_to_f16x2x2<DType::kFP8E4M3, /*kPaired=*/false>(word, lo, hi);
}
// bf16x2 word -> f16x2 word of the values times 2^-kQShiftF16.
__device__ __forceinline__ uint32_t bf16x2_to_scaled_f16x2(uint32_t w) {
  constexpr float kMul = 1.f / (1 << kQShiftF16);
  const float x = __uint_as_float(w << 16) * kMul, y = __uint_as_float(w & 0xffff0000u) * kMul;
  return cuda::pack2<__half>(x, y);
}
// The scale of S = Q K^T into the log2 domain, with Q in f16 (q_f16: scaled by 2^-kQShiftF16)
// or as given.
__device__ __forceinline__ float qk_scale_log2(const MlaDecodeParams& p, bool q_f16) {
  return q_f16 ? p.scale_log2 * static_cast<float>(1 << kQShiftF16) : p.scale_log2;
}

// The CTA's plan part and query-row tile (MlaDecodeParams::grid_rows_fastest: which grid axis
// holds which).
__device__ __forceinline__ int mla_part(const MlaDecodeParams& p) {
  return p.grid_rows_fastest != 0 ? static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.x);
}
__device__ __forceinline__ int mla_row_tile(const MlaDecodeParams& p) {
  return p.grid_rows_fastest != 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.y);
}

// Calls f(b, kv_len, t0, t1, whole, partial) for every request segment of the plan part
// mla_part(p) (mla_tile_scheduler.h): tiles [t0, t1) of request b, `whole` when that is all of
// it, `partial` the split index of the segment.
template <typename F>
__device__ __forceinline__ void for_each_segment(const MlaDecodeParams& p, F&& f) {
  const int32_t* s = p.sched + static_cast<int64_t>(mla_part(p)) * kSchedWords;
  const int last = s[2] < p.bs ? s[2] : p.bs - 1;
  for (int b = s[0]; b <= last; ++b) {
    const int kv_len = p.seq_lens[b] + p.kv_len_extra;
    int t0, t1, partial;
    if (!segment_of(s, p.split_indptr, b, kv_len, &t0, &t1, &partial)) continue;
    f(b, kv_len, t0, t1, t0 == 0 && t1 == num_tiles(kv_len), partial);
  }
}

// 16-byte chunk c of query row m (token m / num_heads, head m % num_heads) of request b, or
// nullptr for a padding row (m >= rows_per_req), which the caller zero-fills.
__device__ __forceinline__ const uint8_t* q_chunk_src(const MlaDecodeParams& p, int b, int m,
                                                      int c) {
  if (m >= p.rows_per_req) return nullptr;
  const int token = b * p.s_q + m / p.num_heads;
  const int h = m % p.num_heads;
  return static_cast<const uint8_t*>(p.q) + (token * p.q_stride_token + h * p.q_stride_head) * 2 +
         static_cast<int64_t>(c) * 16;
}

// Pool slot of key j of the request whose req_to_token row is tok (j < kv_len). A tile of
// kBlockN keys lies inside one page (kPage 1 or a multiple of kBlockN): page start + offset.
template <int kPage>
__device__ __forceinline__ int64_t kv_slot(const int32_t* tok, int j) {
  static_assert(kPage == 1 || kPage % kBlockN == 0, "a tile never straddles a page boundary");
  if constexpr (kPage == 1) {
    return tok[j];
  } else {
    return static_cast<int64_t>(tok[j - j % kPage]) + j % kPage;
  }
}

}  // namespace attnkit::mla
