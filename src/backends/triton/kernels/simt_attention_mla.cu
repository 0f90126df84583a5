// SIMT attention instantiations for MLA: absorbed 576/512 and non-absorbed prefill 192/128.
#include "backends/triton/kernels/simt_launch.cuh"

namespace attnkit::triton {
template Status run_simt<kMlaHeadDimQK, kMlaHeadDimV>(AttentionParams, DType, DType, bool, int,
                                                      StreamHandle);
template Status run_simt<kMlaPrefillHeadDimQK, kMlaPrefillHeadDimV>(AttentionParams, DType, DType,
                                                                    bool, int, StreamHandle);
}  // namespace attnkit::triton
