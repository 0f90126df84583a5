// Tensor-core decode instantiation for head dim 256 (empty unless 256 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_decode.cuh"

#ifdef ATTNKIT_HEAD_DIM_256
namespace attnkit::triton {
template Status run_mma_decode<256>(AttentionParams, DType, DType, int, MmaDecodeRing,
                                    StreamHandle);
}  // namespace attnkit::triton
#endif
