// SIMT attention instantiation for head dim 64 (empty unless 64 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/simt_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_64
namespace attnkit::triton {
template Status run_simt<64, 64>(AttentionParams, DType, DType, bool, int, StreamHandle);
}  // namespace attnkit::triton
#endif
