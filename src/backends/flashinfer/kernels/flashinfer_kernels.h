// Host-facing entry points of the flashinfer backend's kernels (no CUDA types). Each head dim is
// compiled in its own translation units (paged_attention_hd<d>_{decode,prefill}.cu), present only
// when <d> is in ATTNKIT_HEAD_DIMS (the instantiation budget).
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "cuda/common/dispatch.h"

namespace attnkit::flashinfer {

// Head dims the tensor-core kernels are written for (any multiple of 16 up to 256 works; these
// are the translation units that exist).
using NativeHeadDims = ValueList<64, 80, 96, 128, 256>;

// Whether head dim d is compiled into this binary (in NativeHeadDims and in the CMake list).
constexpr bool head_dim_compiled(int d) {
#ifdef ATTNKIT_HEAD_DIMS_LIST
  constexpr int kBuilt[] = {ATTNKIT_HEAD_DIMS_LIST};
  bool in_cmake = false;
  for (int b : kBuilt) in_cmake = in_cmake || b == d;
  return in_cmake && NativeHeadDims::contains(d);
#else
  (void)d;
  return false;
#endif
}

// The prefill kernels launch one block per (work item, kv head) in a one-dimensional grid: plans
// past 2^31 - 1 blocks are refused by name. The backend checks it before its cache write; the
// launch again.
inline Status check_prefill_grid(int64_t grid_items, int64_t num_kv_heads) {
  const int64_t blocks = grid_items * num_kv_heads;
  if (blocks <= 0x7fffffff) return Status::ok();
  return Status::invalid_argument("flashinfer: prefill grid of " + std::to_string(blocks) +
                                  " blocks (" + std::to_string(grid_items) + " work items x " +
                                  std::to_string(num_kv_heads) +
                                  " kv heads) exceeds 2^31 - 1; split the batch");
}

// Paged attention over the work items of p.plan (grid_items CTAs per kv head; a CUDA-graph grid
// may be larger than the plan: extra CTAs exit). Decode merges split requests in the kernel (the
// last split CTA; p.split_counters).
// q: bf16 / f16; KV: the q dtype, fp8_e4m3 or fp8_e5m2.
template <int kD, TileShape kShape>
Status run_paged(const PagedParams& p, DType q_dtype, DType kv_dtype, int grid_items,
                 StreamHandle stream);

}  // namespace attnkit::flashinfer
