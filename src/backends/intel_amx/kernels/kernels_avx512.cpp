// AVX-512 (F, BW, VL) instantiation of the vector attention kernels. The ISA is enabled for the
// code below the pragma only; the exported entry points sit after it and just call in, so the
// library needs no -march flag and runs on any x86-64 CPU (the backend calls these only when cpuid
// and the OS report AVX-512 F/BW/VL).
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which -Wuninitialized
// reports at every inlined use; the header lines are exempted, nothing else.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef ATTNKIT_WITH_OPENMP
#include <omp.h>
#endif

#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/storage_types.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#include "backends/intel_amx/kernels/vec_avx512.h"
#include "backends/intel_amx/kernels/vector_attention_impl.h"

namespace attnkit::cpu_attention {
namespace {

void decode_entry(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  dispatch_kv<VecAvx512, DecodeRunner>(p, w, s);
}

void extend_entry(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  dispatch_kv<VecAvx512, ExtendRunner>(p, w, s);
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {

void decode_avx512(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  decode_entry(p, w, s);
}

void extend_avx512(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  extend_entry(p, w, s);
}

}  // namespace attnkit::cpu_attention
