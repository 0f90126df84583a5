// SM90 wgmma prefill kernel, head dim 256, bf16 and f16 (empty unless 256 is in ATTNKIT_HEAD_DIMS).
#include "backends/fa3/kernels/prefill_sm90_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_256
ATTNKIT_FA3_PREFILL_SM90(256)
#endif
