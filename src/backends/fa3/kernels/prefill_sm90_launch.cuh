// Launch glue of the SM90 prefill kernel (included by the per-head-dim translation units).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backends/fa3/kernels/fa3_kernels.h"
#include "backends/fa3/kernels/prefill_sm90.cuh"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/per_device_once.h"

namespace attnkit::fa3 {

// The persistent grid of the prefill kernels (bf16 / f16 and FP8) for p: min(scheduled units,
// SMs), the tail split's pieces included; kInternal for a split the kernel cannot run (a piece
// count < 2, more split units than units, no workspace).
inline Result<int> persistent_grid(const Fa3Params& p, int sm_count) {
  const int64_t units = static_cast<int64_t>(p.num_tiles) * p.num_q_heads;
  if (p.section_heads <= 0 || p.num_q_heads % p.section_heads != 0) {
    return Status::internal("fa3: section_heads " + std::to_string(p.section_heads) +
                            " does not divide num_q_heads " + std::to_string(p.num_q_heads));
  }
  if (p.split_units < 0 || p.split_units > units || p.num_splits < 1 ||
      (p.split_units > 0 && (p.num_splits < 2 || p.split_o == nullptr || p.split_lse == nullptr))) {
    return Status::internal("fa3: tail split of " + std::to_string(p.split_units) + " units x " +
                            std::to_string(p.num_splits) + " pieces (units " +
                            std::to_string(units) + ", workspace " +
                            (p.split_o != nullptr ? "set" : "missing") + ")");
  }
  return static_cast<int>(
      std::min<int64_t>(virtual_units(units, p.split_units, p.num_splits), sm_count));
}

// After a prefill kernel with a tail split (p.split_units > 0): merge_tail_splits_kernel.
template <int kD, bool kBf16>
Status launch_tail_merge(const Fa3Params& p, StreamHandle stream) {
  if (p.split_units == 0) return Status::ok();
  constexpr int kMergeWarps = 4;
  const int64_t warps = static_cast<int64_t>(p.split_units) * p.block_m;
  merge_tail_splits_kernel<kD, kBf16>
      <<<static_cast<unsigned>((warps + kMergeWarps - 1) / kMergeWarps), 32 * kMergeWarps, 0,
         cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// The launch of a bf16 / f16 prefill kernel with traits Tr on the persistent grid (its shared
// memory opted into), then the tail split's merge at the V head dim.
template <typename Tr, bool kBf16>
Status launch_persistent(void (*kernel)(Fa3Params), const Fa3Params& p, int sm_count,
                         StreamHandle stream) {
  ATTNKIT_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  if (static_cast<int64_t>(p.num_tiles) * p.num_q_heads == 0) return Status::ok();
  ATTNKIT_ASSIGN_OR_RETURN(const int grid, persistent_grid(p, sm_count));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return launch_tail_merge<Tr::kHeadDimV, kBf16>(p, stream);
}

template <int kD, int kN, bool kBf16, int kWG = 2, int kVariant = kPlain>
Status launch_prefill_sm90(const Fa3Params& p, int sm_count, StreamHandle stream) {
  using Tr = PrefillTraits<kD, kN, kBf16, kWG, kVariant>;
  if constexpr (kVariant == kPlain) {
    // A soft-cap, or a sliding window / sinks: a variant instantiation (uniform warpgroups only).
    if (uses_variant_features(p)) {
      return p.logit_cap > 0.f
                 ? launch_prefill_sm90<kD, kN, kBf16, kWG, kSoftcap>(p, sm_count, stream)
                 : launch_prefill_sm90<kD, kN, kBf16, kWG, kWindowSinks>(p, sm_count, stream);
    }
  } else if (p.split_units > 0) {
    return Status::internal("fa3: a tail split of a window / soft-cap / sinks layer");
  }
  if constexpr (kWG == 2 && (kD == 64 || kD == 128) && kN == 128) {
    // Three consumer warpgroups (192-row tiles: the plan was built for them; uniform only).
    if (p.block_m == 3 * 64) {
      return launch_prefill_sm90<kD, kN, kBf16, 3, kVariant>(p, sm_count, stream);
    }
  }
  if (p.block_m != Tr::kBlockM) return Status::invalid_argument("fa3: plan rows per tile");
  auto kernel = prefill_sm90_kernel<kD, kN, kBf16, true, kWG, kVariant>;
  if constexpr (kWG == 2 && kVariant == kPlain) {
    if (p.uniform_wg == 0) kernel = prefill_sm90_kernel<kD, kN, kBf16, false>;
  }
  return launch_persistent<Tr, kBf16>(kernel, p, sm_count, stream);
}

// Key blocks instantiated per head dim (block_n_supported in fa3_params.h says the same).
template <int kD>
using BlockNs =
    std::conditional_t<kD == 256, ValueList<80, 64>,
                       std::conditional_t<kD == 64, ValueList<128, 192>, ValueList<128>>>;

template <int kD>
Status launch_prefill_sm90_n(const Fa3Params& p, DType q_dtype, int block_n, int sm_count,
                             StreamHandle stream) {
  return dispatch_value<BlockNs<kD>>(block_n, "fa3: wgmma key block", [&]<int kN>() -> Status {
    static_assert(block_n_supported(kD, kN));
    if (q_dtype == DType::kBF16) return launch_prefill_sm90<kD, kN, true>(p, sm_count, stream);
    if (q_dtype == DType::kF16) return launch_prefill_sm90<kD, kN, false>(p, sm_count, stream);
    return Status::unsupported(std::string("fa3: wgmma prefill q dtype ") + dtype_name(q_dtype) +
                               " (needs bf16 or f16)");
  });
}

}  // namespace attnkit::fa3

// Explicit instantiations of the host entry points for one head dim.
#define ATTNKIT_FA3_PREFILL_SM90(kD)                                                        \
  namespace attnkit::fa3 {                                                                  \
  template <>                                                                               \
  bool prefill_sm90_available<kD>() {                                                       \
    static cuda::PerDeviceValue ok; /* per device: a process may mix GPU generations */     \
    return ok.get([] {                                                                      \
      return cuda::loads_as_sm90(prefill_sm90_kernel<kD, default_block_n(kD), true>);       \
    }) > 0;                                                                                 \
  }                                                                                         \
  template <>                                                                               \
  Status run_prefill_sm90<kD>(const Fa3Params& p, DType q_dtype, int block_n, int sm_count, \
                              StreamHandle stream) {                                        \
    return launch_prefill_sm90_n<kD>(p, q_dtype, block_n, sm_count, stream);                \
  }                                                                                         \
  }
