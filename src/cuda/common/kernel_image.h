// Whether this binary has device code for a CUDA device (kernel_image.cu).
#pragma once

namespace attnkit::cuda {

// True when the kernels of this binary can run on CUDA device `ordinal` (its SASS or PTX matches
// the device's architecture); false when they cannot or the runtime cannot answer.
bool binary_has_kernel_image(int ordinal);

}  // namespace attnkit::cuda
