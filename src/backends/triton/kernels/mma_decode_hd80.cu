// Tensor-core decode instantiation for head dim 80 (empty unless 80 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_decode.cuh"

#ifdef ATTNKIT_HEAD_DIM_80
namespace attnkit::triton {
template Status run_mma_decode<80>(AttentionParams, DType, DType, int, MmaDecodeRing, StreamHandle);
}  // namespace attnkit::triton
#endif
