// The two small kernels around the MLA decode kernel: the device-side tile schedule (once per
// forward) and the LSE combine of split requests (once per layer). Included only by mla_decode.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/mla/kernels/mla_decode_params.h"
#include "backends/mla/kernels/mla_tile_scheduler.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::mla {

// grid: (1) block: (32); lane 0 writes the schedule (a few microseconds for hundreds of requests).
__global__ void mla_schedule_kernel(const int32_t* seq_lens, int kv_len_extra, int bs,
                                    int num_parts, int min_parts, int32_t* sched,
                                    int32_t* split_indptr) {
  if (threadIdx.x != 0) return;
  build_schedule(
      bs, num_parts, min_parts, [&](int b) { return seq_lens[b] + kv_len_extra; }, sched,
      split_indptr);
}

inline constexpr int kCombineWarps = 8;

// Merges the segments of split requests (natural-log LSE out, v_scale applied); requests with one
// segment were finished by mla_decode_kernel.
// grid: (ceil(bs * rows_per_req / kCombineWarps)) block: (32 * kCombineWarps); one warp per row,
// 16 output columns per lane.
__global__ void __launch_bounds__(32 * kCombineWarps)
    mla_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t gr = static_cast<int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
  if (gr >= static_cast<int64_t>(p.bs) * p.rows_per_req) return;
  const int b = static_cast<int>(gr / p.rows_per_req);
  const int m = static_cast<int>(gr % p.rows_per_req);
  const int first = p.split_indptr[b];
  const int n = p.split_indptr[b + 1] - first;
  if (n <= 1) return;
  float mx = -INFINITY;
  bool nan = false;  // a partial with a NaN lse (a NaN score): the row is NaN, as in the reference
  for (int s = lane; s < n; s += 32) {
    const float lse = p.partial_lse[static_cast<int64_t>(first + s) * p.rows_per_req + m];
    mx = fmaxf(mx, lse);
    nan |= lse != lse;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  nan = __any_sync(0xffffffffu, nan);
  float sum = 0.f;
  if (mx != -INFINITY) {
    for (int s = lane; s < n; s += 32) {
      sum += exp2f(p.partial_lse[static_cast<int64_t>(first + s) * p.rows_per_req + m] - mx);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (nan) sum = __int_as_float(0x7fffffff);  // every weight below is then NaN, so is the row
  const bool any = cuda::row_has_keys(sum);
  const float lse2 = any ? mx + log2f(sum) : -INFINITY;
  constexpr int kPerLane = kLatentDim / 32;
  float acc[kPerLane] = {};
  if (any) {
    for (int s = 0; s < n; ++s) {
      const int64_t prow = static_cast<int64_t>(first + s) * p.rows_per_req + m;
      const float w = exp2f(p.partial_lse[prow] - lse2);
      if (w == 0.f) continue;
      const float4* src =
          reinterpret_cast<const float4*>(p.partial_out + prow * kLatentDim + lane * kPerLane);
#pragma unroll
      for (int v = 0; v < kPerLane / 4; ++v) {
        const float4 x = src[v];
        acc[4 * v] += w * x.x;
        acc[4 * v + 1] += w * x.y;
        acc[4 * v + 2] += w * x.z;
        acc[4 * v + 3] += w * x.w;
      }
    }
  }
  const int token = b * p.s_q + m / p.num_heads;
  const int h = m % p.num_heads;
  auto* dst = static_cast<__nv_bfloat16*>(p.out) + token * p.o_stride_token + h * p.o_stride_head +
              lane * kPerLane;
  uint32_t words[kPerLane / 2];
#pragma unroll
  for (int v = 0; v < kPerLane / 2; ++v) {
    words[v] = cuda::pack2<__nv_bfloat16>(acc[2 * v] * p.v_scale, acc[2 * v + 1] * p.v_scale);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(words[0], words[1], words[2], words[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(words[4], words[5], words[6], words[7]);
  if (lane == 0 && p.lse != nullptr) {
    p.lse[token * p.lse_stride_token + h] = any ? lse2 * cuda::kLn2 : -INFINITY;
  }
}

}  // namespace attnkit::mla
