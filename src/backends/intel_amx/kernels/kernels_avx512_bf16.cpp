// AVX-512 + AVX512-BF16 (vdpbf16ps) instantiation of the vector attention kernels. The ISA is
// enabled for the code below the pragma only; the exported entry points sit after it and just call
// in, so the library needs no -march flag and runs on any x86-64 CPU (the backend calls these only
// when cpuid and the OS report AVX-512 F/BW/VL, AVX512-BF16 and AVX512-VBMI: the whole file is
// compiled with vpermi2b allowed).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c")
#include "backends/intel_amx/kernels/vec_avx512.h"
#include "backends/intel_amx/kernels/vector_attention_impl.h"

namespace attnkit::cpu_attention {
namespace {

// AVX-512 plus the bf16 pair dot product: q.k of bf16 rows 32 elements per instruction, and
// P.V two keys per instruction (V rows interleaved in pairs, P rounded to bf16 pairs). fp8_e4m3
// K/V rows are widened to bf16 exactly (every e4m3 value is a bf16 value), so fp8 runs the same
// dot products on half the bytes: the decode's fast path by two byte-table lookups per 64 values
// (vpermi2b, below), the other paths by bit moves (fp8e4m3_words_to_bf16).
//
// bf16 bits of (e4m3 magnitude code m) * 2^-8, split into low and high bytes (the tables of
// VecAvx512Bf16::fp8e4m3x64_to_bf16). Normal codes (exponent field e > 0): exponent e + 112,
// mantissa bits m & 7 at bits 4..6; subnormals (e = 0): (m & 7) * 2^-17; 0x7F: NaN.
constexpr uint16_t e4m3_bf16_bits(int m) {
  constexpr int kBf16ExponentOffset = 112;
  if (m == kFp8E4M3NanMagnitude) return kBf16QuietNan;
  const int e = m >> 3;
  const int f = m & 7;
  if (e > 0) return static_cast<uint16_t>(((e + kBf16ExponentOffset) << 7) | (f << 4));
  if (f == 0) return 0;
  int exponent = 127 - 17;  // f * 2^-17, normalised: the leading bit of f is the implicit one
  int mant = f;
  while (mant < 4) {
    mant <<= 1;
    --exponent;
  }
  return static_cast<uint16_t>(((exponent + 2) << 7) | ((mant & 3) << 5));
}
struct E4M3Bf16Bytes {
  alignas(64) uint8_t low[128];
  alignas(64) uint8_t high[128];
};
constexpr E4M3Bf16Bytes make_e4m3_bf16_bytes() {
  E4M3Bf16Bytes t{};
  for (int m = 0; m < 128; ++m) {
    t.low[m] = static_cast<uint8_t>(e4m3_bf16_bits(m) & 0xFF);
    t.high[m] = static_cast<uint8_t>(e4m3_bf16_bits(m) >> 8);
  }
  return t;
}
alignas(64) constexpr E4M3Bf16Bytes kE4M3Bf16Bytes = make_e4m3_bf16_bytes();
constexpr const uint8_t* kE4M3Bf16Low = kE4M3Bf16Bytes.low;
constexpr const uint8_t* kE4M3Bf16High = kE4M3Bf16Bytes.high;
// Every entry against the e4m3 definition: normal codes (exponent field e >= 1) are
// (1 + f / 8) * 2^(e - 7) * 2^-8, i.e. bf16 bits 0x3800 + (m << 4); subnormal codes f * 2^-9 *
// 2^-8 = f * 2^-17 (0x3700, 0x3780, 0x37C0, 0x3800, ... for f = 1, 2, 3, 4); 0x7F NaN.
constexpr bool e4m3_table_ok() {
  constexpr uint16_t kSubnormal[8] = {0, 0x3700, 0x3780, 0x37C0, 0x3800, 0x3820, 0x3840, 0x3860};
  for (int m = 0; m < 0x7F; ++m) {
    const uint16_t want = m < 8 ? kSubnormal[m] : static_cast<uint16_t>(0x3800 + (m << 4));
    if (e4m3_bf16_bits(m) != want) return false;
  }
  return e4m3_bf16_bits(kFp8E4M3NanMagnitude) == kBf16QuietNan;
}
static_assert(e4m3_table_ok());

struct VecAvx512Bf16 : VecAvx512 {
  static constexpr bool kHasBf16Dot = true;
  static constexpr int kBf16PerDot = 32;

  static __m512bh as_bh(__m512i x) {
    return (__m512bh)x;
  }  // NOLINT: a vector bit cast (reinterpret_cast went through the stack with GCC 12)

  // fp8_e4m3 bytes (the low byte of each 16-bit word; high bytes zero) -> bf16 bits of the value
  // times 2^-8 (the kFp8E4M3ViaF16Scale convention of the f16 path, so the scales are shared); the
  // NaN code 0x7F / 0xFF gives a bf16 NaN.
  // Normal numbers (exponent field e > 0): bf16 exponent e + 127 - 7 - 8 = e + 112 is a constant
  // OR (no carry: the fp8 fields land on bits 4..10, 112 << 7 on bits 11..13); the 8 subnormals
  // (e = 0) come from a table.
  static __m512i fp8e4m3_words_to_bf16(__m512i w) {
    constexpr int kAandBorC = 0xEA;  // ternary-logic truth table of (a & b) | c
    constexpr int kAorBandC = 0xF8;  // a | (b & c)
    constexpr int16_t kBf16Exponent112 = 0x3800;
    constexpr int16_t kFieldsAt4 = 0x07F0;  // e4m3 exponent + mantissa after << 4
    constexpr int16_t kExponentBits = 0x78;
    constexpr int16_t kBf16Sign = static_cast<int16_t>(0x8000);
    // bf16 of m * 2^-9 * 2^-8 for the subnormal mantissas m = 0..7 (the rest unused).
    alignas(64) static constexpr uint16_t kSubnormals[32] = {0x0000, 0x3700, 0x3780, 0x37C0,
                                                             0x3800, 0x3820, 0x3840, 0x3860};
    const __m512i normal =
        _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(kFieldsAt4),
                                  _mm512_set1_epi16(kBf16Exponent112), kAandBorC);
    const __mmask32 subnormal = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(kExponentBits));
    const __mmask32 nan =
        _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(kFp8E4M3MagnitudeMask)),
                                _mm512_set1_epi16(kFp8E4M3NanMagnitude));
    const __m512i magnitude = _mm512_mask_mov_epi16(
        _mm512_mask_permutexvar_epi16(normal, subnormal, w, _mm512_load_si512(kSubnormals)), nan,
        _mm512_set1_epi16(kBf16QuietNan));
    return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(w, kFp8SignToF16Shift),
                                     _mm512_set1_epi16(kBf16Sign), kAorBandC);
  }

  // 64 fp8_e4m3 bytes -> the bf16 bits of their values times 2^-8 (as fp8e4m3_words_to_bf16; the
  // NaN code 0x7F / 0xFF gives a bf16 NaN) by two 128-entry byte tables (vpermi2b: the low and
  // the high byte of each bf16 by the magnitude, the sign OR-ed in), in unpack order: lo holds
  // the values of bytes 0-7 of each 128-bit lane (elements 0-7, 16-23, 32-39, 48-55), hi bytes
  // 8-15.
  static void fp8e4m3x64_to_bf16(__m512i x, __m512i* lo, __m512i* hi) {
    constexpr int kAorBandC = 0xF8;  // a | (b & c)
    const __m512i low = _mm512_permutex2var_epi8(_mm512_load_si512(kE4M3Bf16Low), x,
                                                 _mm512_load_si512(kE4M3Bf16Low + 64));
    const __m512i high =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(_mm512_load_si512(kE4M3Bf16High), x,
                                                           _mm512_load_si512(kE4M3Bf16High + 64)),
                                  x, _mm512_set1_epi8(static_cast<char>(0x80)), kAorBandC);
    *lo = _mm512_unpacklo_epi8(low, high);
    *hi = _mm512_unpackhi_epi8(low, high);
  }

  // 64 consecutive K elements as two vectors of bf16 pairs: in order for bf16 KV, in the unpack
  // order of fp8e4m3x64_to_bf16 for fp8 (q is stored in that order then: store_q_row).
  template <class S>
  static void load_k_pairs64(const typename S::T* p, __m512bh* k0, __m512bh* k1) {
    if constexpr (std::is_same_v<S, StoreBf16>) {
      *k0 = as_bh(_mm512_loadu_si512(p));
      *k1 = as_bh(_mm512_loadu_si512(p + 32));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      __m512i lo;
      __m512i hi;
      fp8e4m3x64_to_bf16(_mm512_loadu_si512(p), &lo, &hi);
      *k0 = as_bh(lo);
      *k1 = as_bh(hi);
    }
  }

  // 32 consecutive K elements as bf16 pairs.
  template <class S>
  static __m512bh load_k_pairs(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreBf16>) {
      return as_bh(_mm512_loadu_si512(p));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      return as_bh(fp8e4m3_words_to_bf16(
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))));
    }
  }
  // 16 K elements (the tail of a head dim that is a multiple of 16 but not of 32), zero-extended.
  template <class S>
  static __m512bh load_k_half(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreBf16>) {
      return as_bh(_mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      return as_bh(fp8e4m3_words_to_bf16(_mm512_cvtepu8_epi16(
          _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))));
    }
  }
  // 16 columns of two V rows as bf16 pairs (row0[i], row1[i]).
  template <class S>
  static __m512bh load_v_pairs(const typename S::T* row0, const typename S::T* row1) {
    constexpr int kHighWord = 16;
    if constexpr (std::is_same_v<S, StoreBf16>) {
      const __m512i a =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row0)));
      const __m512i b =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row1)));
      return as_bh(_mm512_or_si512(a, _mm512_slli_epi32(b, kHighWord)));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      const __m512i a =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row0)));
      const __m512i b =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row1)));
      return as_bh(fp8e4m3_words_to_bf16(_mm512_or_si512(a, _mm512_slli_epi32(b, kHighWord))));
    }
  }
  // 16 f32 probabilities -> 8 bf16 pairs (round to nearest even).
  static void store_bf16_pairs(float const* p, uint32_t* out) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(p));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), reinterpret_cast<const __m256i&>(h));
  }
  static __m512 dot_bf16(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
  static __m512bh broadcast_pair(uint32_t pair) {
    return as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
  }
};

// ---- Decode fast path: bf16 q, bf16 or fp8_e4m3 KV, head_dim == v_head_dim == kD ----
//
// One item = one request's key range, every kv head (as run_decode). Per key block (16 keys):
//   q.k:     kQkKeys keys at a time over all kv heads (fast_qk_key_major): every K load feeds
//            the GQA group's heads, every q load (from L1) the kQkKeys keys; the first two levels
//            of the reduction tree fold each head's kQkKeys partial vectors into one, which goes
//            to the thread's scratch;
//   then per kv head, tiles of up to kMaxTileHeads query heads (fast_tile_block):
//   softmax: the tree's last two levels turn a head's four folded vectors into 16 scores, then
//            everything stays in registers (masked lanes -inf, the tile's maxima and sums reduced
//            together, one vector exp2 for the rescale factors only when a running maximum
//            moved, no scalar libm call);
//   P.V:     bf16 KV: 32 columns of two V rows per step, interleaved into bf16 pairs with one
//            vpunpcklwd / vpunpckhwd each (no widening loads), so the f32 accumulators hold the
//            columns of each 32-column chunk in unpack order: lane L of the low half is column
//            8 * (L / 4) + L % 4, of the high half that plus 4; fp8_e4m3 KV: 64 columns of two
//            rows per step, their bytes interleaved and widened by the byte tables straight into
//            pairs (v_pairs gives the order). unpermute_acc restores the order once per item,
//            before the epilogue. With fp8 KV, q is stored in the widened K elements' order
//            (store_q_row).
// The K rows kFastPrefetchBlocks blocks ahead are prefetched row by row during q.k, the V slices
// spread over the P.V passes of the kv heads in address order.
// How many key blocks ahead the next K/V rows are prefetched, and with which hint. Measured on the
// 2-core Zen 5 dev VM (1 thread, b8 kv4096, alternating runs): prefetcht1 (into L2) made this
// kernel 1.3-2x slower than prefetcht0 or prefetchnta; 2 blocks and 1 block were within the noise.
constexpr int kFastPrefetchBlocks = 2;
inline void fast_prefetch(const void* row, int64_t bytes) {
  const char* c = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}
// Besides, the K and V slices kFarPrefetchBlocks blocks ahead are prefetched into L2
// (prefetcht1), one (key, kv head) pair per step of q.k: more misses in flight than the L1
// prefetch alone. Dev VM (Zen 5, 2 threads, b8 kv4096 bf16, user cycles of the kernel over 40
// calls, perf): 0.57-0.63 G without, 0.43-0.49 G with it at 3, 4, 6, 8 or 12 blocks (2026-11-22).
// fp8_e4m3 KV too since its widening became table lookups (session 30, Zen 4 dev VM, b8 kv4096
// fp8, alternated: 1 thread 5.6-5.8 vs 7.9-8.0 ms without; 4, 8 or 12 blocks level); with the
// older bit-move widening it had made fp8 8% slower.
constexpr int kFarPrefetchBlocks = 4;

inline void far_prefetch(const void* k_row, const void* v_row, int64_t bytes) {
  const char* k = static_cast<const char*>(k_row);
  const char* v = static_cast<const char*>(v_row);
  for (int64_t off = 0; off < bytes; off += 64) {
    _mm_prefetch(k + off, _MM_HINT_T1);
    _mm_prefetch(v + off, _MM_HINT_T1);
  }
}
// Keys per q.k step of the decode fast path: each q load feeds this many keys, and the step's
// partial vectors are folded (two levels of the reduction tree) into one vector per head.
constexpr int kQkKeys = 4;
constexpr int kQuadsPerBlock = kKeyBlock / kQkKeys;

template <int kD>
constexpr int kMaxTileHeads = kD <= 128 ? 4 : 2;

struct FastConsts {
  bool capped;
  __m512 pre;   // score_scale (/ cap when capped, else * log2 e)
  __m512 post;  // cap * log2 e when capped
};

// The kG 32-column chunks of two V rows (row0, row1 at the group's first column) as bf16 pairs
// (row0[c], row1[c]): vlo[g] / vhi[g] the two halves of chunk g. bf16 KV: one vpunpcklwd /
// vpunpckhwd per half, so lane L of vlo[g] is column 32 g + 8 (L / 4) + L % 4 and of vhi[g] that
// plus 4. fp8_e4m3 KV (kG == 2: 64 columns): the two rows' bytes interleaved, then converted by
// fp8e4m3x64_to_bf16, which lands on pairs directly, so vector v of (vlo[0], vhi[0], vlo[1],
// vhi[1]) lane 4 a + e is column 16 a + 4 v + e. unpermute_acc restores either order.
template <class S, int kG>
inline void v_pairs(const typename S::T* row0, const typename S::T* row1, __m512bh* vlo,
                    __m512bh* vhi) {
  using V = VecAvx512Bf16;
  if constexpr (std::is_same_v<S, StoreBf16>) {
    for (int g = 0; g < kG; ++g) {
      const __m512i r0 = _mm512_loadu_si512(row0 + 32 * g);
      const __m512i r1 = _mm512_loadu_si512(row1 + 32 * g);
      vlo[g] = V::as_bh(_mm512_unpacklo_epi16(r0, r1));
      vhi[g] = V::as_bh(_mm512_unpackhi_epi16(r0, r1));
    }
  } else {
    static_assert(std::is_same_v<S, StoreFp8E4M3> && kG == 2);
    const __m512i x0 = _mm512_loadu_si512(row0);
    const __m512i x1 = _mm512_loadu_si512(row1);
    __m512i p[4];
    V::fp8e4m3x64_to_bf16(_mm512_unpacklo_epi8(x0, x1), &p[0], &p[1]);
    V::fp8e4m3x64_to_bf16(_mm512_unpackhi_epi8(x0, x1), &p[2], &p[3]);
    vlo[0] = V::as_bh(p[0]);
    vhi[0] = V::as_bh(p[1]);
    vlo[1] = V::as_bh(p[2]);
    vhi[1] = V::as_bh(p[3]);
  }
}

// out[j] = the sum (kMax: the maximum) of the 16 lanes of w[j], for the kN <= 4 heads of a tile
// together: the first two levels by VecAvx512::quad_fold, then two 128-bit lane swaps: 13 vector
// operations for the four heads instead of four full reductions.
template <bool kMax, int kN>
inline void reduce_heads(const __m512* w, float* out) {
  using V = VecAvx512Bf16;
  static_assert(kN >= 1 && kN <= 4);
  constexpr int kSwapHalves = 0x4E;  // 128-bit lanes (2, 3, 0, 1)
  constexpr int kSwapPairs = 0xB1;   // 128-bit lanes (1, 0, 3, 2)
  __m512 v[4];
  for (int j = 0; j < 4; ++j) v[j] = w[j < kN ? j : 0];
  __m512 q = V::quad_fold<kMax>(v);
  q = V::fold<kMax>(q, _mm512_shuffle_f32x4(q, q, kSwapHalves));
  q = V::fold<kMax>(q, _mm512_shuffle_f32x4(q, q, kSwapPairs));
  alignas(16) float r[4];
  _mm_store_ps(r, _mm512_castps512_ps128(q));
  for (int j = 0; j < kN; ++j) out[j] = r[j];
}

// Softmax and P.V of one key block for kN query heads of one kv head: quads [kN][kQuadsPerBlock]
// the q.k partial sums (from fast_qk_key_major), v_rows the block's V slices of that kv head (zeros
// after n), acc/m/l the heads' state; pf_v (or null) the next V slices to prefetch. The block
// maxima and sums of the kN heads are reduced together (reduce_heads), and when no head's running
// maximum moved (most blocks after the first few) the rescale factors are exactly 1: the
// accumulators are then reloaded without the multiply and l without the scale.
template <class S, int kD, int kN>
__attribute__((noinline)) void fast_tile_block(const FastConsts& c, const __m512* quads,
                                               const typename S::T* const* v_rows, int n,
                                               float* acc, float* m, float* l,
                                               const void* const* pf_v, int64_t pf_bytes) {
  using V = VecAvx512Bf16;
  constexpr int kC = kD / 32;
  const __mmask16 valid = static_cast<__mmask16>(n >= kKeyBlock ? 0xFFFF : (1u << n) - 1);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 pr[kN];
  for (int j = 0; j < kN; ++j) {
    __m512 x = V::combine_quads(quads + j * kQuadsPerBlock);
    x = c.capped ? V::mul(V::tanh(V::mul(x, c.pre)), c.post) : V::mul(x, c.pre);
    pr[j] = _mm512_mask_blend_ps(valid, neg_inf, x);
  }
  float block_max[kN];
  reduce_heads<true, kN>(pr, block_max);
  alignas(64) float m_old[16] = {};
  alignas(64) float m_new[16] = {};
  bool rescale = false;
  for (int j = 0; j < kN; ++j) {
    m_old[j] = m[j];
    m_new[j] = std::max(m[j], block_max[j]);
    rescale |= m_new[j] != m_old[j];
    m[j] = m_new[j];
    pr[j] = V::exp2(V::sub(pr[j], V::set1(m_new[j])));
  }
  float block_sum[kN];
  reduce_heads<false, kN>(pr, block_sum);
  // exp2(-inf - m) is 0: a head's first block rescales nothing. (Zeroed only to keep GCC's
  // -Wmaybe-uninitialized quiet: alpha is read only when rescale is set.)
  alignas(64) float alpha[16] = {};
  if (rescale) {
    V::store(alpha, V::exp2(V::sub(V::load(m_old), V::load(m_new))));
    for (int j = 0; j < kN; ++j) l[j] = l[j] * alpha[j] + block_sum[j];
  } else {
    for (int j = 0; j < kN; ++j) l[j] += block_sum[j];
  }
  alignas(32) uint32_t pp[kN][kKeyBlock / 2];
  for (int j = 0; j < kN; ++j) {
    const __m256bh h = _mm512_cvtneps_pbh(pr[j]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(pp[j]), reinterpret_cast<const __m256i&>(h));
  }
  // P.V over groups of kG 32-column chunks: the group's accumulators (kN * kG * 2 vectors) stay
  // in registers over the block's key pairs, and each pair's kN probability broadcasts feed kG
  // chunks. Two chunks at kN 4 too (16 accumulators, 16 independent dot chains instead of 8):
  // session 29, Zen 5 dev VM, one thread, L2/L3-resident KV (b1 / b4 kv 512, b1 kv 2048,
  // --rotate-mib 1, two alternated rounds): 32.2-32.7 vs 29.7-31.8 GB/s; level when streaming
  // from memory (b8 kv 4096: 18.7-19.4 vs 19.0-19.7 GB/s one thread, 34.3-35.0 vs 34.1-38.5 two).
  constexpr int kG = kN <= 4 ? std::min(kC, 2) : 1;
  static_assert(kC % kG == 0, "whole chunk groups");
  const int pairs = (n + 1) / 2;
  for (int c0 = 0; c0 < kC; c0 += kG) {
    // This group's share of the next block's V slices, one slice per step of the pair loop below
    // (spread out: a burst of prefetches stalls on the miss buffers).
    const int pf_begin = c0 * kKeyBlock / kC;
    const int pf_count = kG * kKeyBlock / kC;
    // Opaque to the optimiser, so the broadcasts below are not hoisted out of this loop (and
    // spilled): they are cheap loads where they are.
    const uint32_t* ppg = &pp[0][0];
    asm("" : "+r"(ppg));
    __m512 lo[kN][kG];
    __m512 hi[kN][kG];
    for (int j = 0; j < kN; ++j) {
      for (int g = 0; g < kG; ++g) {
        lo[j][g] = V::load(acc + j * kD + 32 * (c0 + g));
        hi[j][g] = V::load(acc + j * kD + 32 * (c0 + g) + 16);
      }
      if (rescale) {
        const __m512 a = V::set1(alpha[j]);
        for (int g = 0; g < kG; ++g) {
          lo[j][g] = V::mul(lo[j][g], a);
          hi[j][g] = V::mul(hi[j][g], a);
        }
      }
    }
    for (int i = 0; i < std::max(pairs, pf_count); ++i) {
      if (pf_v != nullptr && i < pf_count && pf_v[pf_begin + i] != nullptr) {
        fast_prefetch(pf_v[pf_begin + i], pf_bytes);
      }
      if (i >= pairs) continue;
      __m512bh b[kN];
      for (int j = 0; j < kN; ++j) b[j] = V::broadcast_pair(ppg[j * (kKeyBlock / 2) + i]);
      __m512bh vlo[kG];
      __m512bh vhi[kG];
      v_pairs<S, kG>(v_rows[2 * i] + 32 * c0, v_rows[2 * i + 1] + 32 * c0, vlo, vhi);
      for (int g = 0; g < kG; ++g) {
        for (int j = 0; j < kN; ++j) {
          lo[j][g] = _mm512_dpbf16_ps(lo[j][g], vlo[g], b[j]);
          hi[j][g] = _mm512_dpbf16_ps(hi[j][g], vhi[g], b[j]);
        }
      }
    }
    for (int j = 0; j < kN; ++j) {
      for (int g = 0; g < kG; ++g) {
        V::store(acc + j * kD + 32 * (c0 + g), lo[j][g]);
        V::store(acc + j * kD + 32 * (c0 + g) + 16, hi[j][g]);
      }
    }
  }
}

// quads[j * kQuadsPerBlock] = VecAvx512::quad_sums of the q.k partial vectors of query head j (of
// kN, q [kN][kD]) with the kQkKeys K slices k[0..3].
template <class S, int kD, int kN>
inline void qk_heads_quad(const typename S::T* const* k, const uint16_t* q, __m512* quads) {
  using V = VecAvx512Bf16;
  constexpr int kC = kD / 32;
  static_assert(kC % 2 == 0, "64-element steps");
  __m512 a[kN][kQkKeys];
  for (int j = 0; j < kN; ++j) {
    for (int t = 0; t < kQkKeys; ++t) a[j][t] = _mm512_setzero_ps();
  }
  for (int cc = 0; cc < kC; cc += 2) {
    __m512bh kk[2][kQkKeys];
    for (int t = 0; t < kQkKeys; ++t) V::load_k_pairs64<S>(k[t] + 32 * cc, &kk[0][t], &kk[1][t]);
    for (int j = 0; j < kN; ++j) {
      for (int c = 0; c < 2; ++c) {
        const __m512bh qq = V::as_bh(_mm512_loadu_si512(q + j * kD + 32 * (cc + c)));
        for (int t = 0; t < kQkKeys; ++t) a[j][t] = _mm512_dpbf16_ps(a[j][t], qq, kk[c][t]);
      }
    }
  }
  for (int j = 0; j < kN; ++j) quads[j * kQuadsPerBlock] = V::quad_sums(a[j]);
}

// q.k of one key block (pool row offsets k_off, n keys) for every q head, kQkKeys keys at a
// time: those keys' slices of all kv heads are read in turn, so the block's rows of K are read
// as a few sequential streams, each K load feeds the GQA group's heads and each q load
// (from L1, q [Hq][kD]) kQkKeys keys. quads [Hq][kQuadsPerBlock] (VecAvx512::quad_sums of the
// partial vectors; keys t >= n read a zero row). Prefetches the K rows at next_k_off (n_next
// keys), one row per key, and (into L2) the K and V rows at far_k_off / far_v_off (n_far keys).
template <class S, int kD>
__attribute__((noinline)) void fast_qk_key_major(const CpuAttentionParams& p, const int64_t* k_off,
                                                 int n, const int64_t* next_k_off, int n_next,
                                                 const int64_t* far_k_off, const int64_t* far_v_off,
                                                 int n_far, const uint16_t* q, __m512* quads) {
  using T = typename S::T;
  const int hkv = p.num_kv_heads;
  const int group = p.group();
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const T* zero = reinterpret_cast<const T*>(kZeroRow);
  const int64_t slice_bytes = kD * static_cast<int64_t>(sizeof(T));
  for (int t0 = 0; t0 < kKeyBlock; t0 += kQkKeys) {
    const int quad = t0 / kQkKeys;
    if (t0 >= n) {
      for (int hq = 0; hq < p.num_q_heads; ++hq) {
        quads[hq * kQuadsPerBlock + quad] = _mm512_setzero_ps();
      }
      continue;
    }
    for (int h = 0; h < hkv; ++h) {
      const T* k[kQkKeys];
      for (int t = t0; t < t0 + kQkKeys; ++t) {
        if (t < n_next) fast_prefetch(k_cache + h * p.k_head_stride + next_k_off[t], slice_bytes);
        if (t < n_far) {
          far_prefetch(k_cache + h * p.k_head_stride + far_k_off[t],
                       v_cache + h * p.v_head_stride + far_v_off[t], slice_bytes);
        }
        k[t - t0] = t < n ? k_cache + h * p.k_head_stride + k_off[t] : zero;
      }
      __m512* out = quads + quad;
      int g0 = 0;
      for (; g0 + 4 <= group; g0 += 4) {
        const int hq = h * group + g0;
        qk_heads_quad<S, kD, 4>(k, q + static_cast<int64_t>(hq) * kD, out + hq * kQuadsPerBlock);
      }
      const int hq = h * group + g0;
      switch (group - g0) {
        case 3:
          qk_heads_quad<S, kD, 3>(k, q + static_cast<int64_t>(hq) * kD, out + hq * kQuadsPerBlock);
          break;
        case 2:
          qk_heads_quad<S, kD, 2>(k, q + static_cast<int64_t>(hq) * kD, out + hq * kQuadsPerBlock);
          break;
        case 1:
          qk_heads_quad<S, kD, 1>(k, q + static_cast<int64_t>(hq) * kD, out + hq * kQuadsPerBlock);
          break;
        default:
          break;
      }
    }
  }
}

// Restores the column order of n_rows accumulator rows of kD floats (see v_pairs).
template <class S, int kD>
inline void unpermute_acc(float* acc, int n_rows) {
  if constexpr (std::is_same_v<S, StoreBf16>) {
    const __m512i idx0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i idx1 =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int r = 0; r < n_rows; ++r) {
      for (int cc = 0; cc < kD / 32; ++cc) {
        float* x = acc + r * kD + 32 * cc;
        const __m512 lo = _mm512_loadu_ps(x);
        const __m512 hi = _mm512_loadu_ps(x + 16);
        _mm512_storeu_ps(x, _mm512_permutex2var_ps(lo, idx0, hi));
        _mm512_storeu_ps(x + 16, _mm512_permutex2var_ps(lo, idx1, hi));
      }
    }
  } else {
    // Per 64 columns, 128-bit block a of vector v holds columns 16 a + 4 v .. + 3: a 4 x 4
    // transpose of the blocks.
    constexpr int kLow2 = 0x44;   // blocks (a0, a1, b0, b1)
    constexpr int kHigh2 = 0xEE;  // blocks (a2, a3, b2, b3)
    constexpr int kEven = 0x88;   // blocks (a0, a2, b0, b2)
    constexpr int kOdd = 0xDD;    // blocks (a1, a3, b1, b3)
    for (int r = 0; r < n_rows; ++r) {
      for (int c = 0; c < kD / 64; ++c) {
        float* x = acc + r * kD + 64 * c;
        __m512 v[4];
        for (int i = 0; i < 4; ++i) v[i] = _mm512_loadu_ps(x + 16 * i);
        const __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], kLow2);
        const __m512 t1 = _mm512_shuffle_f32x4(v[2], v[3], kLow2);
        const __m512 t2 = _mm512_shuffle_f32x4(v[0], v[1], kHigh2);
        const __m512 t3 = _mm512_shuffle_f32x4(v[2], v[3], kHigh2);
        _mm512_storeu_ps(x, _mm512_shuffle_f32x4(t0, t1, kEven));
        _mm512_storeu_ps(x + 16, _mm512_shuffle_f32x4(t0, t1, kOdd));
        _mm512_storeu_ps(x + 32, _mm512_shuffle_f32x4(t2, t3, kEven));
        _mm512_storeu_ps(x + 48, _mm512_shuffle_f32x4(t2, t3, kOdd));
      }
    }
  }
}

// One q row (kD bf16) into the scratch in the element order of the K pairs: as it is for bf16
// KV; for fp8 KV per 64 elements those that fp8e4m3x64_to_bf16 puts in lo (elements 0-7, 16-23,
// 32-39, 48-55), then those in hi.
template <class S, int kD>
inline void store_q_row(const uint16_t* src, uint16_t* dst) {
  if constexpr (std::is_same_v<S, StoreBf16>) {
    std::memcpy(dst, src, kD * sizeof(uint16_t));
  } else {
    alignas(64) static constexpr uint16_t kLoOrder[32] = {
        0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18, 19, 20, 21, 22, 23,
        32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55};
    const __m512i lo = _mm512_load_si512(kLoOrder);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(8));
    for (int c = 0; c < kD / 64; ++c) {
      const __m512i a = _mm512_loadu_si512(src + 64 * c);
      const __m512i b = _mm512_loadu_si512(src + 64 * c + 32);
      _mm512_storeu_si512(dst + 64 * c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(dst + 64 * c + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

template <class S, int kD>
void fast_span(const CpuAttentionParams& p, const FastConsts& c, const int32_t* slots, int k_begin,
               int k_end, const uint16_t* q, float* acc, float* m, float* l, __m512* quads) {
  using T = typename S::T;
  constexpr int kTile = kMaxTileHeads<kD>;
  const int hkv = p.num_kv_heads;
  const int group = p.group();
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const T* zero = reinterpret_cast<const T*>(kZeroRow);
  const int64_t slice_bytes = kD * static_cast<int64_t>(sizeof(T));
  int64_t k_off[kKeyBlock];
  int64_t v_off[kKeyBlock];
  int64_t next_k_off[kKeyBlock];
  int64_t next_v_off[kKeyBlock];
  int64_t far_k_off[kKeyBlock];
  int64_t far_v_off[kKeyBlock];
  const T* v_rows[kKeyBlock];
  const void* pf_v[kKeyBlock];
  for (int k0 = k_begin; k0 < k_end; k0 += kKeyBlock) {
    const int n = std::min(kKeyBlock, k_end - k0);
    key_row_offsets(p, slots, k0, n, k_off, v_off);
    const int pf0 = k0 + kFastPrefetchBlocks * kKeyBlock;
    const int n_next = std::clamp(k_end - pf0, 0, kKeyBlock);
    key_row_offsets(p, slots, pf0, n_next, next_k_off, next_v_off);
    const int pff = k0 + kFarPrefetchBlocks * kKeyBlock;
    const int n_far = std::clamp(k_end - pff, 0, kKeyBlock);
    key_row_offsets(p, slots, pff, n_far, far_k_off, far_v_off);
    fast_qk_key_major<S, kD>(p, k_off, n, next_k_off, n_next, far_k_off, far_v_off, n_far, q,
                             quads);
    for (int h = 0; h < hkv; ++h) {
      const T* v_base = v_cache + h * p.v_head_stride;
      for (int t = 0; t < kKeyBlock; ++t) v_rows[t] = t < n ? v_base + v_off[t] : zero;
      // Pass h prefetches the next V block's (key, head) slices h * kKeyBlock .. + kKeyBlock - 1
      // in key-major order, so the prefetches walk each pool row (and page) in address order;
      // over the Hkv passes every slice is prefetched once.
      for (int t = 0; t < kKeyBlock; ++t) {
        const int sl = h * kKeyBlock + t;
        const int key = sl / hkv;
        const int head = sl - key * hkv;
        pf_v[t] = key < n_next ? v_cache + head * p.v_head_stride + next_v_off[key] : nullptr;
      }
      for (int g0 = 0; g0 < group; g0 += kTile) {
        const int hq = h * group + g0;
        const void* const* pv = g0 == 0 ? pf_v : nullptr;
        const __m512* dh = quads + hq * kQuadsPerBlock;
        float* ah = acc + static_cast<int64_t>(hq) * kD;
        switch (std::min(kTile, group - g0)) {
          case 4:
            if constexpr (kTile >= 4) {
              fast_tile_block<S, kD, 4>(c, dh, v_rows, n, ah, m + hq, l + hq, pv, slice_bytes);
            }
            break;
          case 3:
            if constexpr (kTile >= 3) {
              fast_tile_block<S, kD, 3>(c, dh, v_rows, n, ah, m + hq, l + hq, pv, slice_bytes);
            }
            break;
          case 2:
            fast_tile_block<S, kD, 2>(c, dh, v_rows, n, ah, m + hq, l + hq, pv, slice_bytes);
            break;
          default:
            fast_tile_block<S, kD, 1>(c, dh, v_rows, n, ah, m + hq, l + hq, pv, slice_bytes);
            break;
        }
      }
    }
  }
}

template <class S, int kD>
void fast_decode(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& ts) {
  const int hq = p.num_q_heads;
  const VectorScratchLayout lay = vector_scratch_layout(hq, kD, kD);
  const bool capped = p.logit_cap > 0.f;
  const FastConsts c{capped,
                     _mm512_set1_ps(capped ? p.score_scale / p.logit_cap : p.score_scale * kLog2e),
                     _mm512_set1_ps(capped ? p.logit_cap * kLog2e : 1.f)};
  const std::vector<DecodeItem>& items = *w.items;
  const int num_items = static_cast<int>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(ts.num_threads)
  for (int i = 0; i < num_items; ++i) {
    float* base = ts.base + thread_id() * ts.stride;
    uint16_t* q = reinterpret_cast<uint16_t*>(base + lay.q_bf16);
    float* acc = base + lay.acc;
    float* m = base + lay.m;
    float* l = base + lay.l;
    const DecodeItem& it = items[i];
    const CpuRequest& rq = (*w.requests)[it.request];
    const uint16_t* q_src = static_cast<const uint16_t*>(p.q) + rq.q_start * p.q_token_stride;
    for (int h = 0; h < hq; ++h) {
      store_q_row<S, kD>(q_src + h * p.q_head_stride, q + static_cast<int64_t>(h) * kD);
    }
    std::fill(m, m + hq, kNegInf);
    std::fill(l, l + hq, 0.f);
    std::fill(acc, acc + static_cast<int64_t>(hq) * kD, 0.f);
    int lo = 0;
    int hi = 0;
    visible_keys(p, rq.first_q_pos, rq.seq_len, &lo, &hi);
    fast_span<S, kD>(p, c, rq.slots(p), std::max(lo, it.k_begin), std::min(hi, it.k_end), q, acc, m,
                     l, reinterpret_cast<__m512*>(base + lay.dots));
    unpermute_acc<S, kD>(acc, hq);
    if (it.partial < 0) {
      finalize_rows(p, rq.q_start, 0, hq, m, l, acc, kD);
      continue;
    }
    store_decode_partials(p, w, it, m, l, acc, kD);
  }
}

template <class S>
bool try_fast_decode(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  switch (p.head_dim) {
    case 64:
      fast_decode<S, 64>(p, w, s);
      return true;
    case 128:
      fast_decode<S, 128>(p, w, s);
      return true;
    case 256:
      fast_decode<S, 256>(p, w, s);
      return true;
    default:
      return false;
  }
}

void decode_entry(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  if (p.act_dtype == DType::kBF16 && p.head_dim == p.v_head_dim) {
    if (p.kv_dtype == DType::kBF16 && try_fast_decode<StoreBf16>(p, w, s)) return;
    if (p.kv_dtype == DType::kFP8E4M3 && try_fast_decode<StoreFp8E4M3>(p, w, s)) return;
  }
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
