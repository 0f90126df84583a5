// Factories of the natively paged MLA backends `flashmla` (page 64) and `cutlass_mla` (page 128)
// (CUDA builds only; descriptors in src/registry/builtin.cpp). Both run absorbed decode and
// target_verify with topk 1 on the shared tensor-core MLA decode kernels (src/backends/mla/kernels)
// with their page size compiled into the paged loader. Every other forward of the context goes
// to the page-1 `flashinfer` MLA host path: fp4 KV (the portable SIMT fp4 kernel,
// mla_quantized_portable.cu), absorbed extend / draft extend and the non-absorbed 192/128 prefill
// (the triton backend's kernels), which read the pool token by token and so serve any page size.
#pragma once

#include <memory>

#include "attnkit/backend.h"

namespace attnkit {
namespace mla {
struct MlaDecodeStats;  // mla_decode_engine.h
}

Result<std::unique_ptr<AttentionBackend>> create_flashmla_backend(const BackendContext& ctx);
Result<std::unique_ptr<AttentionBackend>> create_cutlass_mla_backend(const BackendContext& ctx);
// The MLA decode engine's counters of a backend made by one of the factories above; nullptr for
// any other backend.
const mla::MlaDecodeStats* mla_paged_stats(const AttentionBackend& backend);

}  // namespace attnkit
