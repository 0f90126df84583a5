// Input validation for a computation that writes no `out` view (the fp64 reference, which returns
// its result in host vectors): validate_forward_inputs without the checks of out.
#pragma once

#include "attnkit/backend.h"

namespace attnkit {

Status validate_reference_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 Device device);

}  // namespace attnkit
