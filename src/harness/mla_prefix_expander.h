// The case table's stand-in for an MLA model's prefix decompression (kv_b_proj + the shared rope
// part), used by cases with CaseSpec::mla_prefix_chunk > 0 (the MLA chunked prefix cache). A
// fixed, cheap, per-head mix of latent columns that the fp64 reference can replay exactly:
//   k[t, h, d < nope]   = 0.5 (x[(d + 37 h) % R] - x[(3 d + 11 h + 5) % R])
//   k[t, h, nope + e]   = x[R + e]                      (rope part, shared by the heads)
//   v[t, h, d]          = 0.5 (x[(5 d + 7 h + 1) % R] + x[(d + 101 h + 64) % R])
// with x = latent row t, R = kv_lora_rank, nope = qk_head_dim - qk_rope_head_dim; computed in f32
// and rounded to the tensors' dtype (bf16 or f16) on the host and on CUDA alike.
#pragma once

#include "attnkit/attention_layer.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::harness {

// latent [n, R + rope], k [n, H, nope + rope], v [n, H, Dv]: contiguous, one dtype, one device.
Status expand_mla_prefix_for_tests(const TensorView& latent, const TensorView& k,
                                   const TensorView& v, int kv_lora_rank, StreamHandle stream);

#ifdef ATTNKIT_WITH_CUDA
Status expand_mla_prefix_for_tests_cuda(const TensorView& latent, const TensorView& k,
                                        const TensorView& v, int kv_lora_rank, StreamHandle stream);
#endif

// A decompressor running the expander above with `chunk_tokens` per chunk.
MlaPrefixDecompressor make_test_mla_prefix_decompressor(int chunk_tokens, int kv_lora_rank);

}  // namespace attnkit::harness
