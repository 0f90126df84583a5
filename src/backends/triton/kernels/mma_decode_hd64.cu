// Tensor-core decode instantiation for head dim 64 (empty unless 64 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_decode.cuh"

#ifdef ATTNKIT_HEAD_DIM_64
namespace attnkit::triton {
template Status run_mma_decode<64>(AttentionParams, DType, DType, int, MmaDecodeRing, StreamHandle);
}  // namespace attnkit::triton
#endif
