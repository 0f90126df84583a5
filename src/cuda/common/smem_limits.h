// Opt-in dynamic shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) of the
// smallest tensor-core generation attnkit runs, in plain C++ for the host fit rules
// (flashinfer_kernels.h, triton_kernels.h) and the launchers (smem_fit.h, ring_decode.cuh):
// sm_86 / sm_89 (A10, A40, L4, L40, L40S, RTX 30 / 40), 99 KB. A kernel shape at or below it runs
// on every tensor-core device; one above it keeps a compact shape for those devices.
#pragma once

namespace attnkit::cuda {

inline constexpr int kSmallestTensorCoreSmemOptin = 99 * 1024;

}  // namespace attnkit::cuda
