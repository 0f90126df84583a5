// SIMT attention instantiation for head dim 128 (empty unless 128 is in ATTNKIT_HEAD_DIMS).
#include "backends/triton/kernels/simt_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_128
namespace attnkit::triton {
template Status run_simt<128, 128>(AttentionParams, DType, DType, bool, int, StreamHandle);
}  // namespace attnkit::triton
#endif
