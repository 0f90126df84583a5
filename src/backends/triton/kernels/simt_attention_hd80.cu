// SIMT attention instantiation for head dim 80 (empty unless 80 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/simt_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_80
namespace attnkit::triton {
template Status run_simt<80, 80>(AttentionParams, DType, DType, bool, int, StreamHandle);
}  // namespace attnkit::triton
#endif
