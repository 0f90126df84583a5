// Tensor-core extend instantiation for head dim 128 (empty unless 128 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_extend_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_128
namespace attnkit::triton {
template Status run_mma_extend<128>(AttentionParams, DType, DType, int, StreamHandle);
}  // namespace attnkit::triton
#endif
