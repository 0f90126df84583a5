// Tensor-core decode instantiation for head dim 96 (empty unless 96 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_decode.cuh"

#ifdef ATTNKIT_HEAD_DIM_96
namespace attnkit::triton {
template Status run_mma_decode<96>(AttentionParams, DType, DType, int, MmaDecodeRing, StreamHandle);
}  // namespace attnkit::triton
#endif
