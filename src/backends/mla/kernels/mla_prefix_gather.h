// Gather of one prefix chunk's latent rows for the MLA chunked prefix cache (mla_prefix_cache.h):
// host-facing entry point, no CUDA types.
#pragma once

#include <cstdint>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::mla {

struct PrefixGatherParams {
  const void* pool = nullptr;   // the layer's latent pool rows (pool dtype)
  int64_t pool_stride_row = 0;  // elements
  const int32_t* req_to_token = nullptr;
  int64_t req_to_token_stride = 0;
  const int32_t* req_pool_indices = nullptr;  // [bs]
  // Chunk-local token offsets [bs + 1]: request r's chunk tokens are [indptr[r], indptr[r + 1]),
  // its prefix positions chunk_starts[r] + (t - indptr[r]) (PrefixChunkLayout).
  const int32_t* chunk_indptr = nullptr;
  const int32_t* chunk_starts = nullptr;  // [bs]
  int bs = 0;
  int tokens = 0;       // chunk tokens (indptr[bs])
  int width = 0;        // kv_lora_rank + qk_rope_head_dim
  float k_scale = 1.f;  // fp8 / fp4 pools: stored x / k_scale
  // fp4 pools only: the layer's fp8_e4m3 block scales [rows, 1, width / 16] (one per 16 values).
  const uint8_t* scales = nullptr;
  int64_t scale_stride_row = 0;  // bytes
  void* latent = nullptr;        // [tokens, width] activation dtype, contiguous
};

// latent[t] = dequantised pool row of chunk token t, rounded to `act` (bf16 or f16).
// Pool dtypes: bf16, f16, fp8_e4m3, fp8_e5m2, fp4_e2m1 (code * block scale * k_scale).
Status gather_prefix_latent(const PrefixGatherParams& p, DType pool_dtype, DType act,
                            StreamHandle stream);

}  // namespace attnkit::mla
