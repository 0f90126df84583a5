// Portable scalar instantiation of the vector attention kernels.
#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/vec_scalar.h"
#include "backends/intel_amx/kernels/vector_attention_impl.h"

namespace attnkit::cpu_attention {

void decode_scalar(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  dispatch_kv<VecScalar, DecodeRunner>(p, w, s);
}

void extend_scalar(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  dispatch_kv<VecScalar, ExtendRunner>(p, w, s);
}

}  // namespace attnkit::cpu_attention
