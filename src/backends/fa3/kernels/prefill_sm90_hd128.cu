// SM90 wgmma prefill kernel, head dim 128, bf16 and f16 (empty unless 128 is in ATTNKIT_HEAD_DIMS).
#include "backends/fa3/kernels/prefill_sm90_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_128
ATTNKIT_FA3_PREFILL_SM90(128)
#endif
