// AVX-512 + AVX512-BF16 (vdpbf16ps) instantiation of the vector attention kernels. The ISA is
// enabled for the code below the pragma only; the exported entry points sit after it and just call
// in, so the library needs no -march flag and runs on any x86-64 CPU (the backend calls these only
// when cpuid and the OS report AVX-512 F/BW/VL and AVX512-BF16).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#include "backends/intel_amx/kernels/vec_avx512.h"
#include "backends/intel_amx/kernels/vector_attention_impl.h"

namespace attnkit::cpu_attention {
namespace {

// AVX-512 plus the bf16 pair dot product: q.k of bf16 rows 32 elements per instruction.
struct VecAvx512Bf16 : VecAvx512 {
  static constexpr bool kHasBf16Dot = true;
  static constexpr int kBf16PerDot = 32;
  static __m512bh load_bf16_pairs(const uint16_t* p) {
    return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
  }
  // 16 bf16 (the tail of a head dim that is a multiple of 16 but not of 32), zero-extended.
  static __m512bh load_bf16_half(const uint16_t* p) {
    return reinterpret_cast<__m512bh>(
        _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static __m512 dot_bf16(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};

void decode_entry(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  dispatch_kv<VecAvx512Bf16, DecodeRunner>(p, w, s);
}

void extend_entry(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  dispatch_kv<VecAvx512Bf16, ExtendRunner>(p, w, s);
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {

void decode_avx512_bf16(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  decode_entry(p, w, s);
}

void extend_avx512_bf16(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  extend_entry(p, w, s);
}

}  // namespace attnkit::cpu_attention
