// SM90 wgmma prefill kernel, head dim 64, bf16 and f16 (empty unless 64 is in ATTNKIT_HEAD_DIMS).
#include "backends/fa3/kernels/prefill_sm90_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_64
ATTNKIT_FA3_PREFILL_SM90(64)
#endif
