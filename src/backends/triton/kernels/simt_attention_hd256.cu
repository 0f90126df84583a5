// SIMT attention instantiation for head dim 256 (empty unless 256 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/simt_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_256
namespace attnkit::triton {
template Status run_simt<256, 256>(AttentionParams, DType, DType, bool, int, StreamHandle);
}  // namespace attnkit::triton
#endif
