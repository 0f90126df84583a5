// Definition of run_simt<kDqk, kDv>: dtype dispatch and launch of the SIMT attention kernel and
// the split-KV merge. Included by one small translation unit per head-dim pair.
#pragma once

#include <algorithm>
#include <string>

#include "backends/triton/kernels/simt_attention.cuh"
#include "backends/triton/kernels/split_kv_merge.cuh"
#include "backends/triton/kernels/triton_kernels.h"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::triton {

template <int kDqk, int kDv, DType kQ, DType kKV>
Status launch_simt(AttentionParams p, bool extend, int grid_splits, StreamHandle stream) {
  using Traits = SimtTraits<kDqk, kDv, kQ, kKV>;
  p.group_tiles = (p.group_size + Traits::kGqaTile - 1) / Traits::kGqaTile;
  cudaStream_t s = cuda::to_stream(stream);
  for (int base = 0; base < p.num_tokens; base += kMaxGridTokens) {
    AttentionParams slice = p;
    slice.token_base = base;
    const dim3 grid(grid_splits, p.num_kv_heads * p.group_tiles,
                    std::min(kMaxGridTokens, p.num_tokens - base));
    if (extend) {
      simt_attention_kernel<Traits, true><<<grid, Traits::kThreads, 0, s>>>(slice);
    } else {
      simt_attention_kernel<Traits, false><<<grid, Traits::kThreads, 0, s>>>(slice);
    }
    ATTNKIT_CUDA_TRY(cudaGetLastError());
  }
  if (!extend && p.max_splits > 1) {
    launch_split_kv_merge<kDv, kQ>(p, s);
    ATTNKIT_CUDA_TRY(cudaGetLastError());
  }
  return Status::ok();
}

template <int kDqk, int kDv, DType kQ>
Status launch_simt_kv(AttentionParams p, DType kv_dtype, bool extend, int grid_splits,
                      StreamHandle stream) {
  constexpr bool kMla = kDqk == kMlaHeadDimQK || kDqk == kMlaPrefillHeadDimQK;
  ATTNKIT_RETURN_IF_ERROR(check_kv_dtype(kQ, kv_dtype, kMla));
  if (kv_dtype == kQ) return launch_simt<kDqk, kDv, kQ, kQ>(p, extend, grid_splits, stream);
  if constexpr (!kMla) {
    switch (kv_dtype) {
      case DType::kFP8E4M3:
        return launch_simt<kDqk, kDv, kQ, DType::kFP8E4M3>(p, extend, grid_splits, stream);
      case DType::kFP8E5M2:
        return launch_simt<kDqk, kDv, kQ, DType::kFP8E5M2>(p, extend, grid_splits, stream);
      case DType::kFP4E2M1:
        return launch_simt<kDqk, kDv, kQ, DType::kFP4E2M1>(p, extend, grid_splits, stream);
      default:
        break;
    }
  }
  return Status::internal(std::string("triton: kv cache dtype ") + dtype_name(kv_dtype) +
                          " passed check_kv_dtype but has no SIMT instantiation");
}

template <int kDqk, int kDv>
Status run_simt(AttentionParams p, DType q_dtype, DType kv_dtype, bool extend, int grid_splits,
                StreamHandle stream) {
  {
    switch (q_dtype) {
      case DType::kBF16:
        return launch_simt_kv<kDqk, kDv, DType::kBF16>(p, kv_dtype, extend, grid_splits, stream);
      case DType::kF16:
        return launch_simt_kv<kDqk, kDv, DType::kF16>(p, kv_dtype, extend, grid_splits, stream);
      case DType::kF32:
        return launch_simt_kv<kDqk, kDv, DType::kF32>(p, kv_dtype, extend, grid_splits, stream);
      default:
        return Status::unsupported(std::string("triton: q dtype ") + dtype_name(q_dtype) +
                                   " is not supported (accepted: bf16, f16, f32)");
    }
  }
}

}  // namespace attnkit::triton
