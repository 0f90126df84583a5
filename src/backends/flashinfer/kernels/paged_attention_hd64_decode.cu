// Paged attention instantiation: head dim 64, decode tiles (empty unless 64 is in
// ATTNKIT_HEAD_DIMS).
#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "backends/flashinfer/kernels/paged_attention_sm80.cuh"

#ifdef ATTNKIT_HEAD_DIM_64
namespace attnkit::flashinfer {
template <>
Status run_paged<64, TileShape::kDecode>(const PagedParams& p, DType q_dtype, DType kv_dtype,
                                         int grid_items, StreamHandle stream) {
  return run_paged_impl<64, TileShape::kDecode>(p, q_dtype, kv_dtype, grid_items, stream);
}
}  // namespace attnkit::flashinfer
#endif
