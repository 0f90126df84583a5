// Tensor-core extend instantiation for head dim 256 (empty unless 256 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/mma_extend_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_256
namespace attnkit::triton {
template Status run_mma_extend<256>(AttentionParams, DType, DType, int, StreamHandle);
}  // namespace attnkit::triton
#endif
