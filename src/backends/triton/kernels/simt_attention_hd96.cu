// SIMT attention instantiation for head dim 96 (empty unless 96 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/simt_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_96
namespace attnkit::triton {
template Status run_simt<96, 96>(AttentionParams, DType, DType, bool, int, StreamHandle);
}  // namespace attnkit::triton
#endif
