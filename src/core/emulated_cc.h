// ATTNKIT_EMULATE_CC: run the code paths of an older CUDA architecture on a newer GPU.
//
// With ATTNKIT_EMULATE_CC=75 (or 80, 86, 89, 90) every compute-capability query of the library
// (device detection for backend selection, and the attributes each backend sizes its kernels by)
// reports at most that compute capability and that generation's opt-in shared memory per block.
// Host dispatch then takes the older architecture's paths (SM75: the SIMT kernels; SM80: mma.sync
// without wgmma or TMA). Built with the older architecture's PTX only (e.g.
// -DCMAKE_CUDA_ARCHITECTURES="75-virtual;80-virtual"), the driver JIT-compiles that PTX for the
// GPU and the device code is the older architecture's too (__CUDA_ARCH__ of the PTX). This is how
// the SM75 and SM80 paths are exercised on the H100/H200 device machine
// (scripts/device/check.sh EMULATE_CC). Unset (the default): the real device.
#pragma once

#include "attnkit/status.h"

namespace attnkit::detail {

// Caps *compute_capability (major * 10 + minor) and *max_smem_per_block_optin (bytes) by the
// architecture named in ATTNKIT_EMULATE_CC; leaves them unchanged when the variable is unset or
// names an architecture at or above the real one. An unknown value is an invalid_argument error
// naming the variable, the value and the accepted ones.
Status apply_emulated_compute_capability(int* compute_capability, int* max_smem_per_block_optin);

}  // namespace attnkit::detail
