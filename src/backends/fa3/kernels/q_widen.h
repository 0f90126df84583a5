// The e4m3 q of the few-token requests of a partitioned FP8 forward, or of a forward whose requests
// all have few new tokens over an fp8_e4m3 pool, widened for flashinfer's decode / prefill tiles
// (fa3_backend.cpp): the FP8 wgmma kernel takes an e4m3 q (AttentionLayer::q_scale), those tiles a
// bf16 one, so the rows they read are widened first. Every e4m3 value is a bf16 value, so the
// widening is exact; q_scale is not applied (the caller folds it into the layer's scaling, as the
// FP8 kernel does).
#pragma once

#include <cstdint>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::fa3 {

// q: fp8_e4m3 [tokens, heads, d] on a CUDA device, innermost stride 1, d a multiple of 16, data
// and the token / head strides multiples of 16 bytes. ranges: device [num_ranges][2] (first
// token, tokens) of the rows to widen, one CTA each (its threads stride over the range's rows:
// short ranges keep the grid wide). out: bf16 [tokens, heads, d], contiguous; rows outside the
// ranges are not written. Asynchronous on stream.
Status widen_e4m3_q_rows(const TensorView& q, const int32_t* ranges, int num_ranges, void* out,
                         StreamHandle stream);

}  // namespace attnkit::fa3
