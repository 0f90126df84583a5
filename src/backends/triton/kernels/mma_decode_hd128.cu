// Tensor-core decode instantiation for head dim 128 (empty unless 128 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_decode.cuh"

#ifdef ATTNKIT_HEAD_DIM_128
namespace attnkit::triton {
template Status run_mma_decode<128>(AttentionParams, DType, DType, int, MmaDecodeRing,
                                    StreamHandle);
}  // namespace attnkit::triton
#endif
