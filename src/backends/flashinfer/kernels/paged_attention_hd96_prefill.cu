// Paged attention instantiation: head dim 96, prefill tiles (empty unless 96 is in
// ATTNKIT_HEAD_DIMS).
#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "backends/flashinfer/kernels/paged_attention_sm80.cuh"

#ifdef ATTNKIT_HEAD_DIM_96
namespace attnkit::flashinfer {
template <>
Status run_paged<96, TileShape::kPrefill>(const PagedParams& p, DType q_dtype, DType kv_dtype,
                                          int grid_items, StreamHandle stream) {
  return run_paged_impl<96, TileShape::kPrefill>(p, q_dtype, kv_dtype, grid_items, stream);
}
}  // namespace attnkit::flashinfer
#endif
