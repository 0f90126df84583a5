// MLA absorbed (576/512) attention over an fp4_e2m1 or fp8_e4m3 KV pool on the triton backend's
// SIMT kernel template (portable; see mla_quantized_portable.cu). The caller fills the triton
// AttentionParams exactly as the triton backend does for MLA (V = the first 512 columns of the K
// row, V's fp4 block scales = the K row's scales, v_scale = k_scale).
#pragma once

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/triton/kernels/attention_params.h"

namespace attnkit::flashinfer {

Status run_mla_quantized_portable(const triton::AttentionParams& p, DType q_dtype, DType kv_dtype,
                                  bool extend, int grid_splits, StreamHandle stream);

}  // namespace attnkit::flashinfer
