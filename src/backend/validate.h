// Input validation for a computation that writes no `out` view (the fp64 reference, which returns
// its result in host vectors): validate_forward_inputs without the checks of out.
#pragma once

#include "attnkit/backend.h"

namespace attnkit {

Status validate_reference_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 Device device);

// The values of host sinks (f32 [q_heads]): each finite, or -inf for no sink; kInvalidArgument
// naming the head otherwise (device sinks pass unread). validate_forward_inputs runs it on the
// layer's sinks; a backend that copies device sinks to the host anyway runs it on its copy before
// writing the cache.
Status check_sink_values(const TensorView& sinks);

// A sliding-window layer over requests of at most 2^30 - 2^16 keys each (seq_lens_host, plus the
// drafts of a verify batch): the kernels clip the window to 2^30 (detail::kernel_sliding_window)
// and compute key positions in int32. validate_forward_inputs runs it.
Status check_windowed_lengths(const AttentionLayer& layer, const ForwardBatch& batch);

}  // namespace attnkit
