// The blocked extend/prefill kernel of intel_amx: AMX-BF16 tiles (extend_amx), or the same blocks
// by register blocks where AMX is absent (vdpbf16ps, or f32 FMAs on AVX-512F alone).
//
// One work item = (request, kv head, kAmxRowsPerItem query rows), where a row is a (query token,
// head of the GQA group) pair, so the heads of a group share every packed K/V block.
//   stage Q rows as bf16 [rows, Dp] (zero padded: Dp = D rounded up to the 32-element tile depth,
//   rows rounded up to a pair of 16-row tiles)
//   for each block of kAmxKeyBlock keys in the item's visible range:
//     pack K^T into VNNI tiles (16x16 dword transpose) and V into VNNI tiles (row-pair interleave),
//     reading bf16 pool rows in place (other dtypes, or dims that are not multiples of 32, are
//     converted into a bf16 stage first)
//     for each pair of 16-row tiles that sees any key of the block (2x2 register blocking: every
//     K/V tile load feeds two row tiles, every Q/P tile load two key/column tiles):
//       S[32, kAmxKeyBlock] = Q . K^T       (tmm0-3 = S tiles, tmm4-5 = Q tiles, tmm6-7 = K tiles)
//       online softmax of S in f32 (AVX-512), P -> bf16, rescale O rows whose max grew by more
//       than kRescaleThreshold (else the stale max is kept: p <= 2^threshold stays exact in f32);
//       blocks that every row of a tile sees in full (no mask, no soft-cap) take a lean path
//       O[32, Dvp] += P . V                 (tmm0-3 = O tiles, tmm4-5 = P tiles, tmm6-7 = V tiles)
//     S of the next pair is issued before the softmax of the current one (two S buffers), so
//     the tile unit works while the vector units run the softmax. The pipelined loop defers a
//     pair's P . V over ExtendWork::pv_blocks blocks (their P side by side in its P rows), so its
//     O tiles are loaded and stored once per segment; a row whose max is raised meanwhile has its
//     O row and its pending P rescaled.
//   O / l -> out, lse.
// The same kernel without tiles computes both products by register blocks over the same packed
// blocks: vdpbf16ps for AVX512-BF16 CPUs without AMX (extend_blocked_avx512_bf16; e.g. AMD Zen 4 /
// Zen 5), f32 FMAs on AVX-512F alone (extend_blocked_avx512; e.g. Skylake / Ice Lake Xeons); both
// run the plain block loop and never touch the tile state.
// Tiles: the tile permission is requested by detect_cpu() (arch_prctl ARCH_REQ_XCOMP_PERM); the
// backend selects extend_amx only when that succeeded. Each thread loads the tile configuration
// once per call and releases the tiles when done. Both variants run with flush-to-zero /
// denormals-are-zero (as the tile unit and vdpbf16ps themselves do) and restore the MXCSR.
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
#include "backends/intel_amx/kernels/amx_tiles.h"
#include "backends/intel_amx/kernels/vec_avx512.h"

namespace attnkit::cpu_attention {
namespace {

using V = VecAvx512;

constexpr int kTileRows = 16;      // rows of every tile
constexpr int kTileRowBytes = 64;  // bytes per tile row
constexpr int kTileDepth = 32;     // bf16 elements per tile row: the K depth of one dot
constexpr int kTileCols = 16;      // f32 columns of a result tile (and dwords of a B tile row)
constexpr int kPairRows = 2 * kTileRows;               // rows of a row-tile pair
constexpr int kKeyTiles = kAmxKeyBlock / kTileCols;    // result tiles of S across the key block
constexpr int kKeyChunks = kAmxKeyBlock / kTileDepth;  // dot depths of P . V across the block
constexpr int kMaxRowTiles = kAmxRowsPerItem / kTileRows;
constexpr int kMaxPvBlocks = kAmxPvKeys / kAmxKeyBlock;  // compute blocks of one P . V segment
constexpr int kMaxPvChunks = kAmxPvKeys / kTileDepth;    // its 32-key depth chunks
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// log2 units: the running max is only raised (and O rescaled) when a block's max exceeds it by
// more.
constexpr float kRescaleThreshold = 8.f;
// Query rows staged ahead of the one being converted: their lines are prefetched (the rows of one
// item come from tokens a whole q row apart, which the hardware prefetchers follow poorly; the
// staging took ~2 ms of a 26 ms 2k prefill on 2 cores, session 81).
constexpr int kQPrefetchRows = 32;
// Forwards whose bf16 output is at least this large write it with streaming stores (no read for
// ownership of lines that are only written; the output of a 2k prefill is 16 MiB). Smaller ones
// keep it in the cache for the caller.
constexpr int64_t kStreamOutputBytes = int64_t{8} << 20;
static_assert(kKeyTiles % 2 == 0, "Q . K^T fills tmm0-3 with 2 x 2 S tiles per pass");
static_assert(kAmxKeyBlock % kTileDepth == 0 && kAmxRowsPerItem % kPairRows == 0);
static_assert(kAmxMinRowsPerItem % kPairRows == 0);
// Zeros standing in for the key/value rows past the end of a block (read in place).
alignas(64) constexpr uint16_t kZeroRow[kMaxHeadDim] = {};

// Every tile 16 rows x 64 bytes; tmm0-7 are used.
void load_tile_config() {
  constexpr int kTilesUsed = 8;
  TileConfig cfg;
  cfg.palette_id = kPaletteAmx;
  for (int t = 0; t < kTilesUsed; ++t) {
    cfg.colsb[t] = kTileRowBytes;
    cfg.rows[t] = kTileRows;
  }
  tile_config(&cfg);
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Lanes [lo, hi) of a 16-lane vector (either bound may lie outside 0..16).
__mmask16 lane_range(int lo, int hi) {
  lo = std::clamp(lo, 0, V::kWidth);
  hi = std::clamp(hi, 0, V::kWidth);
  if (hi <= lo) return 0;
  const uint32_t width = static_cast<uint32_t>(hi - lo);
  return static_cast<__mmask16>(((1u << width) - 1u) << lo);
}

// 2^x for x <= kRescaleThreshold, relative error < 5e-5 (degree-4 Taylor on |f| <= 1/2): the
// probabilities are rounded to bf16 (relative step 2^-8) before P . V anyway. NaN stays NaN (as
// in VecAvx512::exp2).
V::F exp2_probability(V::F x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, V::set1(kExp2Floor), _CMP_NLT_UQ);
  x = _mm512_max_ps(V::set1(kExp2Floor), x);
  const V::F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V::F f = V::sub(x, n);
  V::F p = V::fma(V::set1(kExp2C4), f, V::set1(kExp2C3));
  p = V::fma(p, f, V::set1(kExp2C2));
  p = V::fma(p, f, V::set1(kExp2C1));
  p = V::fma(p, f, V::set1(1.f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// 2^x for finite x <= kRescaleThreshold (no -inf lanes: the full-block path), same polynomial;
// arguments below -149 give 0 through scalef.
V::F exp2_finite(V::F x) {
  const V::F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V::F f = V::sub(x, n);
  V::F p = V::fma(V::set1(kExp2C4), f, V::set1(kExp2C3));
  p = V::fma(p, f, V::set1(kExp2C2));
  p = V::fma(p, f, V::set1(kExp2C1));
  p = V::fma(p, f, V::set1(1.f));
  return _mm512_scalef_ps(p, n);
}

// 2^x for finite x (the lean rows of softmax_row_fast), degree-3 near-minimax polynomial on
// |f| <= 1/2: relative error < 7.5e-5, far below the bf16 rounding of P (2^-9); one FMA less than
// exp2_finite.
constexpr float kExp2D3C0 = 0.99992807f;
constexpr float kExp2D3C1 = 0.69326099f;
constexpr float kExp2D3C2 = 0.24261115f;
constexpr float kExp2D3C3 = 0.05517167f;
V::F exp2_deg3(V::F x) {
  const V::F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V::F f = V::sub(x, n);
  V::F p = V::fma(V::set1(kExp2D3C3), f, V::set1(kExp2D3C2));
  p = V::fma(p, f, V::set1(kExp2D3C1));
  p = V::fma(p, f, V::set1(kExp2D3C0));
  return _mm512_scalef_ps(p, n);
}

// bf16 bits (round to nearest even) of 16 f32 values: one AVX512-BF16 instruction (kNative), or
// on AVX-512F alone the same rounding in integer arithmetic (NaN stays a quiet NaN).
template <bool kNative>
__m256i bf16x16(__m512 x) {
  if constexpr (kNative) {
    const __m256bh h = _mm512_cvtneps_pbh(x);
    return reinterpret_cast<const __m256i&>(h);
  } else {
    constexpr int kHalf = 16;
    constexpr int kRoundHalf = 0x7FFF;     // below half an ulp of the 16 kept bits
    constexpr int kQuietBit = 0x00400000;  // the top mantissa bit of f32
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, kHalf), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(kRoundHalf)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded =
        _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, _mm512_set1_epi32(kQuietBit)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, kHalf));
  }
}

// bf16 bits of lo (the low 16 words) and hi (the high 16).
template <bool kNative>
__m512i bf16x32(__m512 lo, __m512 hi) {
  if constexpr (kNative) {
    const __m512bh h = _mm512_cvtne2ps_pbh(hi, lo);
    return reinterpret_cast<const __m512i&>(h);
  } else {
    return _mm512_inserti64x4(_mm512_castsi256_si512(bf16x16<false>(lo)), bf16x16<false>(hi), 1);
  }
}

// dst[0, n) = bf16(src[0, n)) (round to nearest even), then zeros up to n_padded. n % 16 == 0.
template <class S, bool kNative>
void convert_row_bf16(const typename S::T* src, int n, int n_padded, uint16_t* dst) {
  if constexpr (std::is_same_v<S, StoreBf16>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(uint16_t));
  } else {
    for (int d = 0; d < n; d += V::kWidth) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d),
                          bf16x16<kNative>(V::template load_as<S>(src + d)));
    }
  }
  std::fill(dst + n, dst + n_padded, uint16_t{0});
}

template <bool kNative>
void convert_act_row_bf16(const void* base, DType dtype, int64_t offset, int n, int n_padded,
                          uint16_t* dst) {
  switch (dtype) {
    case DType::kBF16:
      return convert_row_bf16<StoreBf16, kNative>(static_cast<const uint16_t*>(base) + offset, n,
                                                  n_padded, dst);
    case DType::kF16:
      return convert_row_bf16<StoreF16, kNative>(static_cast<const uint16_t*>(base) + offset, n,
                                                 n_padded, dst);
    default:
      return convert_row_bf16<StoreF32, kNative>(static_cast<const float*>(base) + offset, n,
                                                 n_padded, dst);
  }
}

// out[j] = column j of the 16x16 dword matrix in[0..15] (row i = in[i]).
void transpose_16x16_epi32(const __m512i in[16], __m512i out[16]) {
  __m512i t[16];
  __m512i u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
  // u[4g + e], 128-bit lane L: rows 4g .. 4g + 3 at column 4L + e.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  constexpr int kEvenLanes = 0x88;  // lanes (a0, a2, b0, b2)
  constexpr int kOddLanes = 0xDD;   // lanes (a1, a3, b1, b3)
  for (int e = 0; e < 4; ++e) {
    const __m512i a = _mm512_shuffle_i32x4(u[e], u[4 + e], kEvenLanes);
    const __m512i b = _mm512_shuffle_i32x4(u[e], u[4 + e], kOddLanes);
    const __m512i c = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], kEvenLanes);
    const __m512i d = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], kOddLanes);
    out[e] = _mm512_shuffle_i32x4(a, c, kEvenLanes);
    out[4 + e] = _mm512_shuffle_i32x4(b, d, kEvenLanes);
    out[8 + e] = _mm512_shuffle_i32x4(a, c, kOddLanes);
    out[12 + e] = _mm512_shuffle_i32x4(b, d, kOddLanes);
  }
}

struct AmxScratch {
  uint16_t* q;         // [kAmxRowsPerItem, dp]
  uint16_t* k_stage;   // [kAmxKeyBlock, dp]
  uint16_t* k_packed;  // [dp / 32][kKeyTiles] tiles of [16 dword rows][16 keys]
  uint16_t* v_stage;   // [kAmxKeyBlock, dvp], dvp = Dv rounded up to 32
  uint16_t* v_packed;  // [kKeyChunks][dvp / 16] tiles of [16 key pairs][16 columns x 2]
  float* s;            // [2][32, KB] (KB <= kAmxMaxKeyBlock)
  uint16_t* p;         // [kAmxRowsPerItem, p_stride_] (p_stride_ <= kAmxPvKeys)
  float* o;            // [kAmxRowsPerItem, dvp]
  float* m;            // [kAmxRowsPerItem]
  float* l;            // [kAmxRowsPerItem]
};

AmxScratch carve(const ThreadScratch& ts, int tid, const AmxScratchLayout& lay) {
  float* b = ts.base + tid * ts.stride;
  auto bf = [&](int64_t off) { return reinterpret_cast<uint16_t*>(b + off); };
  return {bf(lay.q), bf(lay.k_stage), bf(lay.k_packed), bf(lay.v_stage), bf(lay.v_packed),
          b + lay.s, bf(lay.p),       b + lay.o,        b + lay.m,       b + lay.l};
}

// Per-row facts of an item.
struct RowInfo {
  int token = 0;  // query index within the request
  int head = 0;   // q head
  int lo = 0;     // visible keys [lo, hi)
  int hi = 0;
};

// ---- The same two products without tiles: register blocks over the packed layouts ----
// One row of a packed tile is one zmm of 16 bf16 pairs: a K^T tile row holds dims (2i, 2i + 1) of
// 16 keys, a V tile row keys (2i, 2i + 1) of 16 columns. So C[row][16 columns] += A[row][2i ..
// 2i + 1] . (tile row i) is one pair step with the A pair broadcast: one vdpbf16ps (its dword
// folds into the instruction as a {1to16} memory operand), or two f32 FMAs on AVX-512F alone. A
// register block of kR rows x kJ column vectors reads each tile row once per kR rows and each A
// pair once per kJ vectors; 16 accumulators (kR * kJ) keep two ports busy through the latency.

// The A pair (a[0], a[1]) in every dword lane.
__m512i broadcast_pair_bits(const uint16_t* a) {
  uint32_t pair = 0;
  std::memcpy(&pair, a, sizeof(pair));
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// One pair step of the vdpbf16ps variant: B = a tile row, A = the pair broadcast.
struct Bf16DotStep {
  using A = __m512bh;
  using B = __m512bh;
  static B load_b(const uint16_t* row) {
    return (__m512bh)_mm512_loadu_si512(row);  // NOLINT: a vector bit cast
  }
  static A load_a(const uint16_t* a) {
    return (__m512bh)broadcast_pair_bits(a);  // NOLINT: a vector bit cast
  }
  static __m512 madd(__m512 acc, const A& a, const B& b) { return _mm512_dpbf16_ps(acc, a, b); }
};

// One pair step on AVX-512F alone (no AVX512-BF16): each dword of a tile row or an A pair holds
// two bf16, the even element's f32 is the dword << 16 and the odd one's the dword & 0xFFFF0000,
// so a pair step is two FMAs per accumulator (the same products, summed in f32).
struct F32FmaStep {
  struct Pair {
    __m512 even;
    __m512 odd;
  };
  using A = Pair;
  using B = Pair;
  static Pair split(__m512i w) {
    constexpr int kHalf = 16;
    const __m512i odd_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, kHalf)),
            _mm512_castsi512_ps(_mm512_and_si512(w, odd_mask))};
  }
  static B load_b(const uint16_t* row) { return split(_mm512_loadu_si512(row)); }
  static A load_a(const uint16_t* a) { return split(broadcast_pair_bits(a)); }
  static __m512 madd(__m512 acc, const A& a, const B& b) {
    return _mm512_fmadd_ps(a.odd, b.odd, _mm512_fmadd_ps(a.even, b.even, acc));
  }
};

// acc[r][j] += sum over `chunks` depth chunks c and tile rows i of
//   pair(a + r * a_stride + c * kTileDepth + 2 i) . (b[j] + c * b_chunk_stride + i * 32)
// a: kR rows of bf16 pairs along the depth; b[j]: the first tile row of column vector j, the
// next depth chunk's tile b_chunk_stride elements further; Step: the pair step of the variant.
// The accumulators live in a local copy: the operand loads are may-alias vector loads, so
// accumulating through the reference would store every accumulator after every step.
template <class Step, int kR, int kJ>
void register_block(const uint16_t* a, int64_t a_stride, const uint16_t* const (&b)[kJ],
                    int64_t b_chunk_stride, int chunks, __m512 (&acc_io)[kR][kJ]) {
  __m512 acc[kR][kJ];
  for (int r = 0; r < kR; ++r) {
    for (int j = 0; j < kJ; ++j) acc[r][j] = acc_io[r][j];
  }
  for (int c = 0; c < chunks; ++c) {
    const uint16_t* ac = a + c * kTileDepth;
    for (int i = 0; i < kTileRows; ++i) {
      typename Step::B bv[kJ];
      for (int j = 0; j < kJ; ++j) bv[j] = Step::load_b(b[j] + c * b_chunk_stride + i * kTileDepth);
      for (int r = 0; r < kR; ++r) {
        const typename Step::A av = Step::load_a(ac + r * a_stride + 2 * i);
        for (int j = 0; j < kJ; ++j) acc[r][j] = Step::madd(acc[r][j], av, bv[j]);
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    for (int j = 0; j < kJ; ++j) acc_io[r][j] = acc[r][j];
  }
}

// How BlockedExtend computes its two products.
enum class Products {
  kTiles,    // AMX tiles (extend_amx)
  kBf16Dot,  // vdpbf16ps register blocks (extend_blocked_avx512_bf16)
  kF32Fma,   // f32 FMA register blocks on AVX-512F (extend_blocked_avx512)
};

// KB: keys per compute block (S width, P depth): kAmxKeyBlock, or 2 x kAmxKeyBlock over two
// consecutive packed blocks (only with K/V packed once per forward).
// kProducts: AMX tiles (extend_amx), or register blocks of vdpbf16ps (AVX512-BF16 CPUs without
// AMX) or of f32 FMAs (AVX-512F alone), with the same packed blocks, softmax, masks and plan, and
// the plain (unpipelined) block loop: the vector units do both the products and the softmax, so
// there is nothing to overlap. Without AVX512-BF16 the bf16 roundings (P, packed K/V of other
// dtypes, the output) are done in integer arithmetic (bf16x16).
template <class S, int KB, Products kProducts>
class BlockedExtend {
 public:
  static constexpr bool kTiles = kProducts == Products::kTiles;
  static constexpr bool kNativeBf16 = kProducts != Products::kF32Fma;
  using T = typename S::T;
  static_assert(KB % kAmxKeyBlock == 0 && KB <= kAmxMaxKeyBlock);
  static constexpr int kBlockKeyTiles = KB / kTileCols;    // S tiles across the compute block
  static constexpr int kBlockKeyChunks = KB / kTileDepth;  // P . V dot depths across it

  // fast_softmax: ExtendWork::fast_softmax (the lean rows' one-pass softmax_row_fast);
  // masked_rows: ExtendWork::masked_rows (the masked units' rows between the tile micro-steps);
  // stream_output: bf16 output rows by streaming stores where 32-byte aligned (the caller fences).
  // pv_blocks: ExtendWork::pv_blocks (the tile kernel's P . V segment; 1 for the register blocks).
  BlockedExtend(const CpuAttentionParams& p, bool fast_softmax, bool masked_rows,
                bool stream_output, int pv_blocks)
      : p_(p),
        dp_(round_up(p.head_dim, kTileDepth)),
        dvp_(round_up(p.v_head_dim, kTileDepth)),
        k_in_place_(std::is_same_v<S, StoreBf16> && p.head_dim % kTileDepth == 0),
        v_in_place_(std::is_same_v<S, StoreBf16> && p.v_head_dim % kTileDepth == 0),
        capped_(p.logit_cap > 0.f),
        pre_cap_(capped_ ? p.score_scale / p.logit_cap : p.score_scale),
        post_cap_(capped_ ? p.logit_cap * kLog2e : kLog2e),
        lean_ok_(!capped_ && p.score_scale > 0.f),
        k_elems_(static_cast<int64_t>(kAmxKeyBlock) * dp_),
        block_elems_(amx_packed_block_elems(p.head_dim, p.v_head_dim)),
        fast_softmax_(fast_softmax),
        masked_rows_(masked_rows),
        stream_output_(stream_output),
        q_elem_bytes_(dtype_storage_bytes(p.act_dtype, 1)),
        pv_blocks_(kTiles ? std::clamp(pv_blocks, 1, kAmxPvKeys / KB) : 1),
        p_stride_(pv_blocks_ * KB) {}

  // packed: this item's (request, kv head) blocks packed by pack_block (block b at
  // packed + b * block_elems_), or nullptr to pack each visited block into the scratch.
  void run_item(const CpuRequest& rq, const ExtendItem& it, const AmxScratch& sc,
                const uint16_t* packed, bool pipelined) {
    const int nr = it.row_end - it.row_begin;
    const int row_tiles = (nr + kPairRows - 1) / kPairRows * 2;
    const int rows_padded = row_tiles * kTileRows;
    RowInfo rows[kAmxRowsPerItem];
    TileKeys tiles[kMaxRowTiles];
    for (int r = 0; r < rows_padded; ++r) {
      if (r + kQPrefetchRows < nr) prefetch_q_row(rq, it, r + kQPrefetchRows);
      uint16_t* q_row = sc.q + static_cast<int64_t>(r) * dp_;
      if (r >= nr) {
        std::fill(q_row, q_row + dp_, uint16_t{0});
        rows[r] = {0, 0, 0, 0};
        continue;
      }
      RowInfo& ri = rows[r];
      item_row(it, r, &ri.token, &ri.head);
      visible_keys(p_, rq.first_q_pos + ri.token, rq.seq_len, &ri.lo, &ri.hi);
      TileKeys& tk = tiles[r / kTileRows];
      tk.all_lo = std::max(tk.all_lo, ri.lo);
      tk.all_hi = std::min(tk.all_hi, ri.hi);
      if (ri.hi > ri.lo) {
        tk.any_lo = std::min(tk.any_lo, ri.lo);
        tk.any_hi = std::max(tk.any_hi, ri.hi);
      }
      convert_act_row_bf16<kNativeBf16>(p_.q, p_.act_dtype, q_offset(rq, ri.token, ri.head),
                                        p_.head_dim, dp_, q_row);
    }
    int k_lo = std::numeric_limits<int>::max();
    int k_hi = 0;
    for (int t = 0; t < row_tiles; ++t) {
      k_lo = std::min(k_lo, tiles[t].any_lo);
      k_hi = std::max(k_hi, tiles[t].any_hi);
    }
    // Packed blocks start at multiples of KB; keys of a block outside a row's visible
    // range are masked by softmax_tile (the lean path only takes blocks every row sees whole).
    if (packed != nullptr && k_lo < k_hi) k_lo = k_lo / KB * KB;
    if constexpr (KB != kAmxKeyBlock) {
      if (packed == nullptr) return;  // never planned: KB > kAmxKeyBlock needs packed blocks
    }
    std::fill(sc.m, sc.m + rows_padded, kNegInf);
    std::fill(sc.l, sc.l + rows_padded, 0.f);
    std::fill(sc.o, sc.o + static_cast<int64_t>(rows_padded) * dvp_, 0.f);

    const int32_t* slots = rq.slots(p_);
    float* s_buf[2] = {sc.s, sc.s + kPairRows * KB};
    if constexpr (kTiles) {
      if (pipelined) {
        run_pipelined(sc, slots, it.kv_head, packed, tiles, row_tiles, rows, nr, k_lo, k_hi, s_buf);
      }
    } else {
      pipelined = false;
    }
    for (int k0 = k_lo; !pipelined && k0 < k_hi; k0 += KB) {
      const int n = std::min(KB, k_hi - k0);
      int active[kMaxRowTiles / 2];
      int num_active = 0;
      for (int t = 0; t < row_tiles; t += 2) {
        if (tiles[t].sees(k0, n) || tiles[t + 1].sees(k0, n)) active[num_active++] = t;
      }
      if (num_active == 0) continue;
      const uint16_t* kp = sc.k_packed;
      if (packed != nullptr) {
        kp = packed + static_cast<int64_t>(k0 / kAmxKeyBlock) * block_elems_;
      } else {
        stage_and_pack(slots + k0, n, it.kv_head, sc, sc.k_packed, sc.v_packed);
      }
      const uint16_t* vp = packed != nullptr ? kp + k_elems_ : sc.v_packed;
      Groups g[kMaxRowTiles / 2];
      for (int a = 0; a < num_active; ++a) g[a] = live_groups(tiles, active[a], k0, n);
      scores_pair(sc, active[0], s_buf[0], kp, g[0]);
      for (int a = 0; a < num_active; ++a) {
        if (a + 1 < num_active) scores_pair(sc, active[a + 1], s_buf[(a + 1) & 1], kp, g[a + 1]);
        const int t = active[a];
        float* s = s_buf[a & 1];
        for (int half = 0; half < 2; ++half) {
          float* s_tile = s + half * kTileRows * KB;
          if (lean_ok_ && n == KB && tiles[t + half].covers(k0, n)) {
            softmax_tile_full(sc, t + half, s_tile, 0);
          } else {
            softmax_tile(sc, t + half, k0, n, rows, nr, s_tile, g[a], 0);
          }
        }
        pv_pair(sc, t, vp, g[a]);
      }
    }
    for (int r = 0; r < nr; ++r) {
      const int token = rq.q_start + rows[r].token;
      const float* o_row = sc.o + static_cast<int64_t>(r) * dvp_;
      if (p_.act_dtype != DType::kBF16) {
        finalize_rows(p_, token, rows[r].head, 1, sc.m + r, sc.l + r, o_row, dvp_);
        continue;
      }
      store_row_bf16(token, rows[r].head, sc.m[r], sc.l[r], o_row);
    }
  }

 private:
  // Item row r's query index within its request and its q head.
  void item_row(const ExtendItem& it, int r, int* token, int* head) const {
    const int group = p_.group();
    const int flat = it.row_begin + r;
    *token = flat / group;
    *head = it.kv_head * group + flat % group;
  }

  // Element offset in q of (query index token of rq, q head).
  int64_t q_offset(const CpuRequest& rq, int token, int head) const {
    return (rq.q_start + token) * p_.q_token_stride + head * p_.q_head_stride;
  }

  // Prefetches the q elements of item row r.
  void prefetch_q_row(const CpuRequest& rq, const ExtendItem& it, int r) const {
    int token = 0;
    int head = 0;
    item_row(it, r, &token, &head);
    const char* row = static_cast<const char*>(p_.q) + q_offset(rq, token, head) * q_elem_bytes_;
    constexpr int kLine = 64;
    for (int64_t b = 0; b < p_.head_dim * q_elem_bytes_; b += kLine) {
      _mm_prefetch(row + b, _MM_HINT_T0);
    }
  }

  // Visible-key facts of one 16-row tile: the union [any_lo, any_hi) of its rows' ranges and the
  // intersection [all_lo, all_hi) (every row sees those keys; padding rows see none).
  struct TileKeys {
    int any_lo = std::numeric_limits<int>::max();
    int any_hi = 0;
    int all_lo = 0;
    int all_hi = std::numeric_limits<int>::max();
    bool sees(int k0, int n) const { return any_hi > k0 && any_lo < k0 + n; }
    bool covers(int k0, int n) const { return all_lo <= k0 && all_hi >= k0 + n; }
  };

  // The 32-key groups [lo, hi) of a compute block (one S pass: key tiles 2 lo .. 2 hi; one P . V
  // depth chunk each) that some row of a pair sees. A masked unit (a causal diagonal block, a
  // window edge) computes S, its softmax and P . V over these groups only: the other keys are
  // masked for every row of the pair, so their P would be zero.
  struct Groups {
    int lo = 0;
    int hi = 0;
  };

  // live groups of pair (t, t + 1) in the compute block at k0 (n keys).
  static Groups live_groups(const TileKeys* tiles, int t, int k0, int n) {
    const int lo = std::max(std::min(tiles[t].any_lo, tiles[t + 1].any_lo), k0) - k0;
    const int hi = std::min(std::max(tiles[t].any_hi, tiles[t + 1].any_hi), k0 + n) - k0;
    if (hi <= lo) return Groups{};
    return Groups{lo / kTileDepth, (hi + kTileDepth - 1) / kTileDepth};
  }

  // One 32-key depth chunk of a P . V segment: its packed V block, its chunk there and its P
  // column (slot * KB + chunk within the compute block * 32).
  struct PvChunk {
    const uint16_t* vb = nullptr;
    int kcl = 0;
    int p_col = 0;
  };
  // The P . V of a row pair over the live chunks of up to pv_blocks_ compute blocks (its segment):
  // their P lies side by side in the pair's P rows, one slot per block.
  struct PvSegment {
    int t = -1;  // first row tile of the pair; -1: none
    int n = 0;
    PvChunk c[kMaxPvChunks];
    bool valid() const { return t >= 0; }
  };

  // Appends the live chunks g of the compute block whose V starts at vp (P at slot `slot`).
  void add_chunks(PvSegment* sg, const uint16_t* vp, Groups g, int slot) const {
    for (int kc = g.lo; kc < g.hi; ++kc) {
      sg->c[sg->n++] = {vp + static_cast<int64_t>(kc / kKeyChunks) * block_elems_, kc % kKeyChunks,
                        slot * KB + kc * kTileDepth};
    }
  }

  // One (key block, row-tile pair) unit of the pipelined loop.
  struct Unit {
    int k0 = 0;
    int n = 0;
    int t = -1;         // first row tile of the pair; -1: none
    bool lean = false;  // both tiles see the whole block (softmax_row_full applies)
    Groups g;           // the 32-key groups some row of the pair sees (all of them when lean)
    bool valid() const { return t >= 0; }
  };

  // The first unit after (k0, t) in (block, pair) order (t = -2: from the start of block k0).
  Unit next_unit(int k0, int t, const TileKeys* tiles, int row_tiles, int k_hi) const {
    for (; k0 < k_hi; k0 += KB, t = -2) {
      const int n = std::min(KB, k_hi - k0);
      for (int u = t + 2; u < row_tiles; u += 2) {
        if (tiles[u].sees(k0, n) || tiles[u + 1].sees(k0, n)) {
          Unit r;
          r.k0 = k0;
          r.n = n;
          r.t = u;
          r.lean = lean_ok_ && n == KB && tiles[u].covers(k0, n) && tiles[u + 1].covers(k0, n);
          r.g = live_groups(tiles, u, k0, n);
          return r;
        }
      }
    }
    return Unit{};
  }

  const uint16_t* unit_k(const uint16_t* packed, const AmxScratch& sc, const Unit& u) const {
    return packed != nullptr ? packed + static_cast<int64_t>(u.k0 / kAmxKeyBlock) * block_elems_
                             : sc.k_packed;
  }
  const uint16_t* unit_v(const uint16_t* packed, const AmxScratch& sc, const Unit& u) const {
    return packed != nullptr ? unit_k(packed, sc, u) + k_elems_ : sc.v_packed;
  }

  // A pair's units whose softmax has run and whose P . V waits for its segment to fill.
  struct Pending {
    int count = 0;
    Unit u[kMaxPvBlocks];
  };

  // The item's (block, pair) units as a software pipeline: step u issues the tile work of S(u + 1)
  // and of a ready P . V segment in 4-dot micro-steps with the softmax rows of unit u between them,
  // so that the vector units run the softmax while the tile unit works (a whole S pass issued
  // before the softmax, as the plain loop does, leaves the out-of-order window full of waiting
  // tile work). A pair's P . V is deferred over pv_blocks_ of its units (their P side by side in
  // its P rows; the O tiles loaded and stored once per segment) and becomes ready after the
  // segment's last softmax or the pair's last unit. Units whose softmax needs masks (diagonal or
  // partial blocks) run their softmax after the tile work of the step. A ready segment runs first,
  // alone, when unit u is the same pair (its softmax rescales O rows the segment adds into); with
  // per-item packing every unit is its own segment and the pipeline drains at each block (the next
  // block is packed into the same scratch).
  void run_pipelined(const AmxScratch& sc, const int32_t* slots, int kv_head,
                     const uint16_t* packed, const TileKeys* tiles, int row_tiles,
                     const RowInfo* rows, int nr, int k_lo, int k_hi, float* const s_buf[2]) {
    Unit cur = next_unit(k_lo, -2, tiles, row_tiles, k_hi);
    if (!cur.valid()) return;
    if (packed == nullptr)
      stage_and_pack(slots + cur.k0, cur.n, kv_head, sc, sc.k_packed, sc.v_packed);
    int cur_buf = 0;
    scores_pair(sc, cur.t, s_buf[cur_buf], unit_k(packed, sc, cur), cur.g);
    Pending pending[kMaxRowTiles / 2];
    PvSegment ready;
    while (cur.valid()) {
      const Unit next = next_unit(cur.k0, cur.t, tiles, row_tiles, k_hi);
      const bool repack = packed == nullptr && next.valid() && next.k0 != cur.k0;
      if (ready.valid() && ready.t == cur.t) {
        pv_segment(sc, ready);
        ready = PvSegment{};
      }
      const Unit* s_next = next.valid() && !repack ? &next : nullptr;
      float* s_cur = s_buf[cur_buf];
      float* s_nxt = s_buf[cur_buf ^ 1];
      const uint16_t* kp_next = s_next ? unit_k(packed, sc, next) : nullptr;
      const PvSegment* pv = ready.valid() ? &ready : nullptr;
      Pending& pend = pending[cur.t / 2];
      const int slot = pend.count;
      if (cur.lean) {
        const float scale = pre_cap_ * post_cap_;
        step_interleaved(sc, s_next, s_nxt, kp_next, pv, [&](int i) {
          softmax_row(sc, cur.t * kTileRows + i, s_cur + i * KB, scale, slot);
        });
      } else if (masked_rows_) {
        step_interleaved(sc, s_next, s_nxt, kp_next, pv, [&](int i) {
          softmax_row_masked(sc, cur.t * kTileRows + i, cur.k0, cur.n, rows, nr, s_cur + i * KB,
                             cur.g, slot);
        });
      } else {
        if (s_next != nullptr) scores_pair(sc, next.t, s_nxt, kp_next, next.g);
        if (pv != nullptr) pv_segment(sc, *pv);
        for (int half = 0; half < 2; ++half) {
          softmax_tile(sc, cur.t + half, cur.k0, cur.n, rows, nr, s_cur + half * kTileRows * KB,
                       cur.g, slot);
        }
      }
      ready = PvSegment{};
      pend.u[pend.count++] = cur;
      const bool pair_done = std::max(tiles[cur.t].any_hi, tiles[cur.t + 1].any_hi) <= cur.k0 + KB;
      if (pend.count == pv_blocks_ || pair_done || packed == nullptr) {
        ready.t = cur.t;
        for (int e = 0; e < pend.count; ++e) {
          add_chunks(&ready, unit_v(packed, sc, pend.u[e]), pend.u[e].g, e);
        }
        pend.count = 0;
      }
      if (repack) {
        pv_segment(sc, ready);
        ready = PvSegment{};
        stage_and_pack(slots + next.k0, next.n, kv_head, sc, sc.k_packed, sc.v_packed);
        scores_pair(sc, next.t, s_nxt, sc.k_packed, next.g);
      }
      cur = next;
      cur_buf ^= 1;
    }
    if (ready.valid()) pv_segment(sc, ready);
  }

  // One pipeline step: S of unit s_unit (nullptr: none) into s_dst from K at kp, P . V of segment
  // pv (nullptr: none), each over its live groups, and the softmax of the 32 rows of the current
  // pair, row(i) for its row i, the rows spread evenly between the 4-dot micro-steps.
  template <class RowFn>
  void step_interleaved(const AmxScratch& sc, const Unit* s_unit, float* s_dst, const uint16_t* kp,
                        const PvSegment* pv, RowFn&& row) {
    const int dc = dp_ / kTileDepth;
    const int s_steps = s_unit != nullptr ? (s_unit->g.hi - s_unit->g.lo) * dc : 0;
    const int pv_chunks = pv != nullptr ? pv->n : 0;
    const int pv_steps = (dvp_ / kTileDepth) * pv_chunks;
    const int total = s_steps + pv_steps;
    int done = 0;
    for (int i = 0; i < total; ++i) {
      if (i < s_steps) {
        scores_micro(sc, s_unit->t, s_dst, kp, s_unit->g.lo + i / dc, i % dc, dc);
      } else {
        const int j = i - s_steps;
        pv_micro(sc, *pv, j / pv_chunks, j % pv_chunks);
      }
      const int target = (i + 1) * kPairRows / total;
      for (; done < target; ++done) row(done);
    }
    for (; done < kPairRows; ++done) row(done);
  }

  // Depth chunk c of S pass `pass` (key tiles 2 pass, 2 pass + 1) of pair t: zeroes the
  // accumulators at c == 0, stores them at c == dc - 1.
  void scores_micro(const AmxScratch& sc, int t, float* s, const uint16_t* kp, int pass, int c,
                    int dc) {
    const int q_stride = dp_ * static_cast<int>(sizeof(uint16_t));
    const uint16_t* q0 = sc.q + static_cast<int64_t>(t) * kTileRows * dp_;
    const uint16_t* q1 = q0 + static_cast<int64_t>(kTileRows) * dp_;
    constexpr int kSStride = KB * sizeof(float);
    const int kt = 2 * pass;
    const uint16_t* kb = kp + static_cast<int64_t>(kt / kKeyTiles) * block_elems_;
    const int ktl = kt % kKeyTiles;
    if (c == 0) {
      tile_zero<0>();
      tile_zero<1>();
      tile_zero<2>();
      tile_zero<3>();
    }
    tile_load<4>(q0 + c * kTileDepth, q_stride);
    tile_load<6>(k_tile(kb, c, ktl), kTileRowBytes);
    tile_dpbf16ps<0, 4, 6>();
    tile_load<7>(k_tile(kb, c, ktl + 1), kTileRowBytes);
    tile_dpbf16ps<1, 4, 7>();
    tile_load<5>(q1 + c * kTileDepth, q_stride);
    tile_dpbf16ps<2, 5, 6>();
    tile_dpbf16ps<3, 5, 7>();
    if (c == dc - 1) {
      float* s1 = s + kTileRows * KB;
      tile_store<0>(s + kt * kTileCols, kSStride);
      tile_store<1>(s + (kt + 1) * kTileCols, kSStride);
      tile_store<2>(s1 + kt * kTileCols, kSStride);
      tile_store<3>(s1 + (kt + 1) * kTileCols, kSStride);
    }
  }

  // Chunk i of P . V pass `pass` (O column tiles 2 pass, 2 pass + 1) of segment sg: loads the
  // O tiles at its first chunk, stores them after its last.
  void pv_micro(const AmxScratch& sc, const PvSegment& sg, int pass, int i) {
    const int o_stride = dvp_ * static_cast<int>(sizeof(float));
    const int p_bytes = p_stride_ * static_cast<int>(sizeof(uint16_t));
    const int j = 2 * pass;
    float* o0j = sc.o + static_cast<int64_t>(sg.t) * kTileRows * dvp_ + j * kTileCols;
    float* o1j = o0j + static_cast<int64_t>(kTileRows) * dvp_;
    const PvChunk& ch = sg.c[i];
    const uint16_t* p0 = p_at(sc, sg.t * kTileRows, 0) + ch.p_col;
    const uint16_t* p1 = p0 + static_cast<int64_t>(kTileRows) * p_stride_;
    if (i == 0) {
      tile_load<0>(o0j, o_stride);
      tile_load<1>(o0j + kTileCols, o_stride);
      tile_load<2>(o1j, o_stride);
      tile_load<3>(o1j + kTileCols, o_stride);
    }
    tile_load<4>(p0, p_bytes);
    tile_load<6>(v_tile(ch.vb, ch.kcl, j), kTileRowBytes);
    tile_dpbf16ps<0, 4, 6>();
    tile_load<7>(v_tile(ch.vb, ch.kcl, j + 1), kTileRowBytes);
    tile_dpbf16ps<1, 4, 7>();
    tile_load<5>(p1, p_bytes);
    tile_dpbf16ps<2, 5, 6>();
    tile_dpbf16ps<3, 5, 7>();
    if (i == sg.n - 1) {
      tile_store<0>(o0j, o_stride);
      tile_store<1>(o0j + kTileCols, o_stride);
      tile_store<2>(o1j, o_stride);
      tile_store<3>(o1j + kTileCols, o_stride);
    }
  }

  // softmax_tile_full for one row r (scores at s_row, raw): the same arithmetic, with the row's
  // max update done in scalar (raised only past kRescaleThreshold, as update_max does).
  void softmax_row_full(const AmxScratch& sc, int r, const float* s_row, float scale, int slot) {
    constexpr int kVecs = KB / V::kWidth;
    V::F mx = V::load(s_row);
    for (int v = 1; v < kVecs; ++v) mx = V::max(mx, V::load(s_row + v * V::kWidth));
    const float b_max = V::reduce_max(mx) * scale;
    const float m_old = sc.m[r];
    float alpha = 1.f;
    // Always raised for a row's first keys: -inf + threshold = -inf.
    if (b_max > m_old + kRescaleThreshold) {
      alpha = _mm512_cvtss_f32(V::exp2(V::set1(m_old - b_max)));
      sc.m[r] = b_max;
    }
    const V::F scale_vec = V::set1(scale);
    const V::F neg_m = V::set1(-sc.m[r]);
    uint16_t* p_row = p_at(sc, r, slot);
    V::F sum = V::zero();
    for (int v = 0; v < kVecs; v += 2) {
      const V::F e0 = exp2_finite(V::fma(V::load(s_row + v * V::kWidth), scale_vec, neg_m));
      const V::F e1 = exp2_finite(V::fma(V::load(s_row + (v + 1) * V::kWidth), scale_vec, neg_m));
      sum = V::add(sum, V::add(e0, e1));
      _mm512_storeu_si512(p_row + v * V::kWidth, bf16x32<kNativeBf16>(e0, e1));
    }
    sc.l[r] = sc.l[r] * alpha + V::reduce_add(sum);
    if (alpha != 1.f) rescale_row(sc, r, slot, alpha);
  }

  // softmax_row_full with the max pass folded into the exp pass (default; ATTNKIT_AMX_SOFTMAX=0
  // keeps softmax_row_full): P is computed against the row's current running max while the block
  // max is tracked; only when the block max exceeds it by more than kRescaleThreshold (a row's
  // first block, or a rare jump) is the row redone by softmax_row_full. Degree-3 exp2.
  void softmax_row_fast(const AmxScratch& sc, int r, const float* s_row, float scale, int slot) {
    constexpr int kVecs = KB / V::kWidth;
    const float m_old = sc.m[r];
    if (m_old == kNegInf) return softmax_row_full(sc, r, s_row, scale, slot);
    const V::F scale_vec = V::set1(scale);
    const V::F neg_m = V::set1(-m_old);
    uint16_t* p_row = p_at(sc, r, slot);
    V::F sum = V::zero();
    V::F mx = V::set1(kNegInf);
    for (int v = 0; v < kVecs; v += 2) {
      const V::F x0 = V::fma(V::load(s_row + v * V::kWidth), scale_vec, neg_m);
      const V::F x1 = V::fma(V::load(s_row + (v + 1) * V::kWidth), scale_vec, neg_m);
      mx = V::max(mx, V::max(x0, x1));
      const V::F e0 = exp2_deg3(x0);
      const V::F e1 = exp2_deg3(x1);
      sum = V::add(sum, V::add(e0, e1));
      _mm512_storeu_si512(p_row + v * V::kWidth, bf16x32<kNativeBf16>(e0, e1));
    }
    // mx is the block max minus the running max (log2 units).
    if (V::reduce_max(mx) > kRescaleThreshold) return softmax_row_full(sc, r, s_row, scale, slot);
    sc.l[r] += V::reduce_add(sum);
  }

  void softmax_row(const AmxScratch& sc, int r, const float* s_row, float scale, int slot) {
    if (fast_softmax_) return softmax_row_fast(sc, r, s_row, scale, slot);
    softmax_row_full(sc, r, s_row, scale, slot);
  }

  // finalize_rows for one bf16 output row, 16 columns per conversion (v_head_dim % 16 == 0).
  void store_row_bf16(int token, int hq, float m, float l, const float* o_row) const {
    float factor = 0.f;
    float lse = 0.f;
    row_epilogue(p_, hq, m, l, &factor, &lse);
    uint16_t* dst = static_cast<uint16_t*>(p_.out) + token * p_.out_token_stride +
                    static_cast<int64_t>(hq) * p_.out_head_stride;
    const V::F f = V::set1(factor);
    constexpr uintptr_t kStreamAlign = 32;
    const bool stream = stream_output_ && reinterpret_cast<uintptr_t>(dst) % kStreamAlign == 0;
    for (int d = 0; d < p_.v_head_dim; d += V::kWidth) {
      auto* out = reinterpret_cast<__m256i*>(dst + d);
      const __m256i bits = bf16x16<kNativeBf16>(V::mul(V::load(o_row + d), f));
      if (stream) {
        _mm256_stream_si256(out, bits);
      } else {
        _mm256_storeu_si256(out, bits);
      }
    }
    if (p_.lse != nullptr) p_.lse[token * p_.lse_token_stride + hq * p_.lse_head_stride] = lse;
  }

  // Points rows[0, kAmxKeyBlock) at the n bf16 rows (slots [0, n)) of kv head h of `cache`, in
  // place or converted into `stage`; rows past n point at zeros.
  void gather_rows(const void* cache, int64_t row_stride, int64_t head_stride, const int32_t* slots,
                   int n, int h, int dim, int dim_padded, bool in_place, uint16_t* stage,
                   const uint16_t** rows) const {
    const T* base = static_cast<const T*>(cache) + h * head_stride;
    for (int t = 0; t < kAmxKeyBlock; ++t) {
      if (t >= n) {
        rows[t] = kZeroRow;
        continue;
      }
      const T* src = base + static_cast<int64_t>(slots[t]) * row_stride;
      if (in_place) {
        rows[t] = reinterpret_cast<const uint16_t*>(src);
      } else {
        uint16_t* dst = stage + static_cast<int64_t>(t) * dim_padded;
        convert_row_bf16<S, kNativeBf16>(src, dim, dim_padded, dst);
        rows[t] = dst;
      }
    }
  }

 public:
  // Packs keys [k0, min(k0 + kAmxKeyBlock, seq_len)) of kv head h of rq into dst (one packed
  // block: K tiles, then V tiles at dst + k_elems_).
  void pack_block(const CpuRequest& rq, int h, int k0, const AmxScratch& sc, uint16_t* dst) {
    // Blocks past seq_len (padding up to a multiple of KB) are all zeros.
    const int n = std::clamp(rq.seq_len - k0, 0, kAmxKeyBlock);
    stage_and_pack(rq.slots(p_) + std::min(k0, rq.seq_len), n, h, sc, dst, dst + k_elems_);
  }

 private:
  // Packs the block's n keys/values (slots [0, n)) of kv head h into the VNNI tile layouts at
  // k_dst and v_dst (rows past n are zeros).
  void stage_and_pack(const int32_t* slots, int n, int h, const AmxScratch& sc, uint16_t* k_dst,
                      uint16_t* v_dst) {
    const uint16_t* k_rows[kAmxKeyBlock];
    const uint16_t* v_rows[kAmxKeyBlock];
    gather_rows(p_.k_cache, p_.k_row_stride, p_.k_head_stride, slots, n, h, p_.head_dim, dp_,
                k_in_place_, sc.k_stage, k_rows);
    gather_rows(p_.v_cache, p_.v_row_stride, p_.v_head_stride, slots, n, h, p_.v_head_dim, dvp_,
                v_in_place_, sc.v_stage, v_rows);
    // K^T: tile (c, kt) row r (d pair 2r, 2r+1 of depth chunk c), column j (key kt * 16 + j).
    const int depth_chunks = dp_ / kTileDepth;
    for (int c = 0; c < depth_chunks; ++c) {
      for (int kt = 0; kt < kKeyTiles; ++kt) {
        __m512i in[kTileRows];
        __m512i out[kTileRows];
        for (int j = 0; j < kTileRows; ++j) {
          in[j] = _mm512_loadu_si512(k_rows[kt * kTileCols + j] + c * kTileDepth);
        }
        transpose_16x16_epi32(in, out);
        uint16_t* tile = k_tile(k_dst, c, kt);
        for (int r = 0; r < kTileRows; ++r) _mm512_storeu_si512(tile + r * kTileDepth, out[r]);
      }
    }
    // V: tile (kc, j) row r = keys (kc * 32 + 2r, + 1) interleaved over columns j * 16 .. + 16;
    // one permute per 16 columns interleaves 32-column halves of the even and odd rows.
    const __m512i lo_pairs = pair_interleave_index(0);
    const __m512i hi_pairs = pair_interleave_index(kTileCols);
    const int col_pairs = dvp_ / kTileDepth;
    for (int kc = 0; kc < kKeyChunks; ++kc) {
      for (int r = 0; r < kTileRows; ++r) {
        const uint16_t* even = v_rows[kc * kTileDepth + 2 * r];
        const uint16_t* odd = v_rows[kc * kTileDepth + 2 * r + 1];
        for (int cp = 0; cp < col_pairs; ++cp) {
          const __m512i a = _mm512_loadu_si512(even + cp * kTileDepth);
          const __m512i b = _mm512_loadu_si512(odd + cp * kTileDepth);
          _mm512_storeu_si512(v_tile(v_dst, kc, 2 * cp) + r * kTileDepth,
                              _mm512_permutex2var_epi16(a, lo_pairs, b));
          _mm512_storeu_si512(v_tile(v_dst, kc, 2 * cp + 1) + r * kTileDepth,
                              _mm512_permutex2var_epi16(a, hi_pairs, b));
        }
      }
    }
  }

  // Word indices (a[first], b[first], a[first + 1], b[first + 1], ...) for permutex2var_epi16:
  // 16 columns of the even row (a) and the odd row (b) as bf16 pairs.
  static __m512i pair_interleave_index(int first) {
    alignas(64) uint16_t idx[2 * kTileCols];
    constexpr int kSecondSource = 2 * kTileCols;  // word index 32 + i selects b[i]
    for (int i = 0; i < kTileCols; ++i) {
      idx[2 * i] = static_cast<uint16_t>(first + i);
      idx[2 * i + 1] = static_cast<uint16_t>(kSecondSource + first + i);
    }
    return _mm512_load_si512(idx);
  }

  template <class U>
  static U* k_tile(U* k_packed, int c, int kt) {
    return k_packed + static_cast<int64_t>(c * kKeyTiles + kt) * kTileRows * kTileDepth;
  }
  template <class U>
  U* v_tile(U* v_packed, int kc, int j) const {
    return v_packed + static_cast<int64_t>(kc * (dvp_ / kTileCols) + j) * kTileRows * kTileDepth;
  }

  // s[32, KB] = Q rows of tiles t, t + 1 . K^T of the block, 2 x 2 S tiles per pass, over the
  // live groups g only (the other columns of s are left as they were: the softmax reads none).
  void scores_pair(const AmxScratch& sc, int t, float* s, const uint16_t* kp, Groups g) {
    if constexpr (kTiles) {
      scores_pair_tiles(sc, t, s, kp, g);
    } else {
      scores_pair_blocks(sc, t, s, kp, g);
    }
  }

  // scores_pair on tiles (instantiated for kTiles only, like the rest of the tile code).
  void scores_pair_tiles(const AmxScratch& sc, int t, float* s, const uint16_t* kp, Groups g) {
    const int q_stride = dp_ * static_cast<int>(sizeof(uint16_t));
    const uint16_t* q0 = sc.q + static_cast<int64_t>(t) * kTileRows * dp_;
    const uint16_t* q1 = q0 + static_cast<int64_t>(kTileRows) * dp_;
    constexpr int kSStride = KB * sizeof(float);
    float* s1 = s + kTileRows * KB;
    for (int kt = 2 * g.lo; kt < 2 * g.hi; kt += 2) {
      // Key tiles kt, kt + 1 lie in packed block kt / kKeyTiles (kKeyTiles is even).
      const uint16_t* kb = kp + static_cast<int64_t>(kt / kKeyTiles) * block_elems_;
      const int ktl = kt % kKeyTiles;
      tile_zero<0>();
      tile_zero<1>();
      tile_zero<2>();
      tile_zero<3>();
      for (int c = 0; c < dp_ / kTileDepth; ++c) {
        tile_load<4>(q0 + c * kTileDepth, q_stride);
        tile_load<6>(k_tile(kb, c, ktl), kTileRowBytes);
        tile_dpbf16ps<0, 4, 6>();
        tile_load<7>(k_tile(kb, c, ktl + 1), kTileRowBytes);
        tile_dpbf16ps<1, 4, 7>();
        tile_load<5>(q1 + c * kTileDepth, q_stride);
        tile_dpbf16ps<2, 5, 6>();
        tile_dpbf16ps<3, 5, 7>();
      }
      tile_store<0>(s + kt * kTileCols, kSStride);
      tile_store<1>(s + (kt + 1) * kTileCols, kSStride);
      tile_store<2>(s1 + kt * kTileCols, kSStride);
      tile_store<3>(s1 + (kt + 1) * kTileCols, kSStride);
    }
  }

  // Raises the running max of the 16 rows of tile t to block_max[i] where it exceeds it by more
  // than kRescaleThreshold; alpha[i] = the factor the row's l and O must be scaled by.
  void update_max(const AmxScratch& sc, int t, const float* block_max, float* alpha) {
    float* m_tile = sc.m + t * kTileRows;
    const V::F m_old = V::load(m_tile);
    const V::F b_max = V::load(block_max);
    // Always raised for a row's first keys: -inf + threshold = -inf.
    const __mmask16 raise =
        _mm512_cmp_ps_mask(b_max, V::add(m_old, V::set1(kRescaleThreshold)), _CMP_GT_OQ);
    const V::F m_new = _mm512_mask_blend_ps(raise, m_old, b_max);
    V::store(alpha, _mm512_mask_blend_ps(raise, V::set1(1.f), V::exp2(V::sub(m_old, m_new))));
    V::store(m_tile, m_new);
  }

  // Row r of P at slot `slot` of its pair's P . V segment (the slot's compute block of keys).
  uint16_t* p_at(const AmxScratch& sc, int r, int slot) const {
    return sc.p + static_cast<int64_t>(r) * p_stride_ + slot * KB;
  }

  // Row r's max was raised (alpha = 2^(old - new)) while its softmax filled `slot` of its pair's
  // segment: its O row and the P of the segment's earlier slots, whose P . V is still to come, are
  // relative to the old max. Both are scaled (the P in bf16: one more rounding of those entries).
  void rescale_row(const AmxScratch& sc, int r, int slot, float alpha) {
    const V::F a = V::set1(alpha);
    float* o_row = sc.o + static_cast<int64_t>(r) * dvp_;
    for (int d = 0; d < dvp_; d += V::kWidth) V::store(o_row + d, V::mul(V::load(o_row + d), a));
    uint16_t* p_row = p_at(sc, r, 0);
    for (int j = 0; j < slot * KB; j += V::kWidth) {
      const V::F x = V::template load_as<StoreBf16>(p_row + j);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_row + j),
                          bf16x16<kNativeBf16>(V::mul(x, a)));
    }
  }

  // Online softmax of score row r (keys k0 .. k0 + n; scores at s_row, overwritten with the capped
  // and masked log2-domain values), over the pair's live groups g only (P . V reads no other
  // column of P): the row's visible keys (RowInfo) are kept, the rest set to -inf; P row in bf16, m
  // / l updated (the max raised only past kRescaleThreshold, as update_max does), the O row
  // rescaled when it was. softmax_tile runs it on the 16 rows of a tile; the pipelined loop's
  // masked units spread it between their tile micro-steps (ExtendWork::masked_rows).
  void softmax_row_masked(const AmxScratch& sc, int r, int k0, int n, const RowInfo* rows, int nr,
                          float* s_row, Groups g, int slot) {
    constexpr int kVecsPerGroup = kTileDepth / V::kWidth;
    const int v_lo = g.lo * kVecsPerGroup;
    const int v_hi = g.hi * kVecsPerGroup;
    const int j_lo = r < nr ? std::max(rows[r].lo - k0, 0) : 0;
    const int j_hi = std::max(r < nr ? std::min(rows[r].hi - k0, n) : 0, j_lo);
    V::F mx = V::set1(kNegInf);
    for (int v = v_lo; v < v_hi; ++v) {
      V::F y = V::mul(V::load(s_row + v * V::kWidth), V::set1(pre_cap_));
      if (capped_) y = V::tanh(y);
      const __mmask16 lanes = lane_range(j_lo - v * V::kWidth, j_hi - v * V::kWidth);
      const V::F x = _mm512_mask_mul_ps(V::set1(kNegInf), lanes, y, V::set1(post_cap_));
      V::store(s_row + v * V::kWidth, x);
      mx = V::max(mx, x);
    }
    const float b_max = V::reduce_max(mx);
    const float m_old = sc.m[r];
    float alpha = 1.f;
    // Always raised for a row's first keys: -inf + threshold = -inf.
    if (b_max > m_old + kRescaleThreshold) {
      alpha = _mm512_cvtss_f32(V::exp2(V::set1(m_old - b_max)));
      sc.m[r] = b_max;
    }
    uint16_t* p_row = p_at(sc, r, slot);
    if (j_hi == j_lo) {
      std::fill(p_row + v_lo * V::kWidth, p_row + v_hi * V::kWidth, uint16_t{0});
      return;
    }
    const V::F m_vec = V::set1(sc.m[r]);
    V::F sum = V::zero();
    for (int v = v_lo; v < v_hi; ++v) {
      const V::F e = exp2_probability(V::sub(V::load(s_row + v * V::kWidth), m_vec));
      sum = V::add(sum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_row + v * V::kWidth),
                          bf16x16<kNativeBf16>(e));
    }
    sc.l[r] = sc.l[r] * alpha + V::reduce_add(sum);
    if (alpha != 1.f) rescale_row(sc, r, slot, alpha);
  }

  // Online softmax of the 16 score rows of tile t (keys k0 .. k0 + n, the groups g), row by row.
  void softmax_tile(const AmxScratch& sc, int t, int k0, int n, const RowInfo* rows, int nr,
                    float* s, Groups g, int slot) {
    for (int i = 0; i < kTileRows; ++i) {
      softmax_row_masked(sc, t * kTileRows + i, k0, n, rows, nr, s + i * KB, g, slot);
    }
  }

  // softmax_tile for a block every row of tile t sees in full, without soft-cap: the raw scores
  // are only scanned for their max (score_scale > 0 keeps the order), and each probability is one
  // FMA (scale, subtract the max) and one exp2 from the raw score; no masks.
  void softmax_tile_full(const AmxScratch& sc, int t, const float* s, int slot) {
    constexpr int kVecs = KB / V::kWidth;
    static_assert(kVecs % 2 == 0, "probabilities are converted to bf16 32 at a time");
    const float scale = pre_cap_ * post_cap_;  // score_scale * log2(e)
    const V::F scale_vec = V::set1(scale);
    alignas(64) float block_max[kTileRows];
    for (int i = 0; i < kTileRows; ++i) {
      const float* s_row = s + i * KB;
      V::F mx = V::load(s_row);
      for (int v = 1; v < kVecs; ++v) mx = V::max(mx, V::load(s_row + v * V::kWidth));
      block_max[i] = V::reduce_max(mx);
    }
    V::store(block_max, V::mul(V::load(block_max), scale_vec));
    alignas(64) float alpha[kTileRows];
    update_max(sc, t, block_max, alpha);
    const float* m_tile = sc.m + t * kTileRows;
    float* l_tile = sc.l + t * kTileRows;
    for (int i = 0; i < kTileRows; ++i) {
      const int r = t * kTileRows + i;
      uint16_t* p_row = p_at(sc, r, slot);
      const float* s_row = s + i * KB;
      const V::F neg_m = V::set1(-m_tile[i]);
      V::F sum = V::zero();
      for (int v = 0; v < kVecs; v += 2) {
        const V::F e0 = exp2_finite(V::fma(V::load(s_row + v * V::kWidth), scale_vec, neg_m));
        const V::F e1 = exp2_finite(V::fma(V::load(s_row + (v + 1) * V::kWidth), scale_vec, neg_m));
        sum = V::add(sum, V::add(e0, e1));
        _mm512_storeu_si512(p_row + v * V::kWidth, bf16x32<kNativeBf16>(e0, e1));
      }
      l_tile[i] = l_tile[i] * alpha[i] + V::reduce_add(sum);
      if (alpha[i] != 1.f) rescale_row(sc, r, slot, alpha[i]);
    }
  }

  // O rows of tiles t, t + 1 += P . V over the key block (P at slot 0): 2 x 2 O tiles per pass.
  void pv_pair(const AmxScratch& sc, int t, const uint16_t* vp, Groups g) {
    if constexpr (kTiles) {
      PvSegment sg;
      sg.t = t;
      add_chunks(&sg, vp, g, 0);
      pv_segment(sc, sg);
    } else {
      pv_pair_blocks(sc, t, vp, g);
    }
  }

  // O rows of pair sg.t += P . V over the segment's chunks on tiles: per pass of 2 x 2 O tiles,
  // one O load and store for the whole segment.
  void pv_segment(const AmxScratch& sc, const PvSegment& sg) {
    for (int pass = 0; pass < dvp_ / kTileDepth; ++pass) {
      for (int i = 0; i < sg.n; ++i) pv_micro(sc, sg, pass, i);
    }
  }

  // The register-block products of this variant.
  template <int kR, int kJ>
  static void products(const uint16_t* a, int64_t a_stride, const uint16_t* const (&b)[kJ],
                       int64_t b_chunk_stride, int chunks, __m512 (&acc)[kR][kJ]) {
    using Step = std::conditional_t<kProducts == Products::kBf16Dot, Bf16DotStep, F32FmaStep>;
    register_block<Step, kR, kJ>(a, a_stride, b, b_chunk_stride, chunks, acc);
  }

  // scores_pair by register blocks: 4 rows x 4 key vectors (64 keys) each.
  void scores_pair_blocks(const AmxScratch& sc, int t, float* s, const uint16_t* kp, Groups g) {
    constexpr int kR = 4;
    constexpr int kJ = 4;
    static_assert(kBlockKeyTiles % kJ == 0 && kPairRows % kR == 0);
    const uint16_t* q = sc.q + static_cast<int64_t>(t) * kTileRows * dp_;
    // Consecutive depth chunks of one key tile are kKeyTiles tiles apart.
    constexpr int64_t kChunkStride = static_cast<int64_t>(kKeyTiles) * kTileRows * kTileDepth;
    // Whole register blocks of 64 keys around the live groups (2 key tiles per group).
    for (int kv0 = 2 * g.lo / kJ * kJ; kv0 < round_up(2 * g.hi, kJ); kv0 += kJ) {
      const uint16_t* b[kJ];
      for (int j = 0; j < kJ; ++j) {
        const int kt = kv0 + j;
        b[j] = k_tile(kp + static_cast<int64_t>(kt / kKeyTiles) * block_elems_, 0, kt % kKeyTiles);
      }
      for (int r0 = 0; r0 < kPairRows; r0 += kR) {
        __m512 acc[kR][kJ];
        for (auto& row : acc) {
          for (auto& a : row) a = _mm512_setzero_ps();
        }
        products<kR, kJ>(q + static_cast<int64_t>(r0) * dp_, dp_, b, kChunkStride, dp_ / kTileDepth,
                         acc);
        for (int r = 0; r < kR; ++r) {
          for (int j = 0; j < kJ; ++j) {
            _mm512_storeu_ps(s + (r0 + r) * KB + (kv0 + j) * kTileCols, acc[r][j]);
          }
        }
      }
    }
  }

  // pv_pair by register blocks: O column vectors four at a time (two for the last ones when dvp /
  // 16 is not a multiple of four).
  void pv_pair_blocks(const AmxScratch& sc, int t, const uint16_t* vp, Groups g) {
    const int col_vecs = dvp_ / kTileCols;  // even: dvp is a multiple of 32
    int j0 = 0;
    for (; j0 + 4 <= col_vecs; j0 += 4) pv_cols<4, 4>(sc, t, vp, j0, g);
    for (; j0 < col_vecs; j0 += 2) pv_cols<8, 2>(sc, t, vp, j0, g);
  }

  // O rows of pair t, column vectors j0 .. j0 + kJ: loaded, += P . V over the live groups (key
  // chunks) g of the compute block's packed blocks, stored.
  template <int kR, int kJ>
  void pv_cols(const AmxScratch& sc, int t, const uint16_t* vp, int j0, Groups g) {
    static_assert(kPairRows % kR == 0);
    float* o = sc.o + static_cast<int64_t>(t) * kTileRows * dvp_;
    const uint16_t* pr = p_at(sc, t * kTileRows, 0);
    // Consecutive key chunks of one column tile are dvp / 16 tiles apart.
    const int64_t chunk_stride = static_cast<int64_t>(dvp_ / kTileCols) * kTileRows * kTileDepth;
    for (int r0 = 0; r0 < kPairRows; r0 += kR) {
      __m512 acc[kR][kJ];
      for (int r = 0; r < kR; ++r) {
        for (int j = 0; j < kJ; ++j) {
          acc[r][j] =
              _mm512_loadu_ps(o + static_cast<int64_t>(r0 + r) * dvp_ + (j0 + j) * kTileCols);
        }
      }
      for (int blk = 0; blk < KB / kAmxKeyBlock; ++blk) {
        // This packed block's chunks [c0, c1) among the live ones.
        const int c0 = std::max(g.lo - blk * kKeyChunks, 0);
        const int c1 = std::min(g.hi - blk * kKeyChunks, kKeyChunks);
        if (c1 <= c0) continue;
        const uint16_t* vb = vp + static_cast<int64_t>(blk) * block_elems_;
        const uint16_t* b[kJ];
        for (int j = 0; j < kJ; ++j) b[j] = v_tile(vb, c0, j0 + j);
        products<kR, kJ>(pr + r0 * p_stride_ + blk * kAmxKeyBlock + c0 * kTileDepth, p_stride_, b,
                         chunk_stride, c1 - c0, acc);
      }
      for (int r = 0; r < kR; ++r) {
        for (int j = 0; j < kJ; ++j) {
          _mm512_storeu_ps(o + static_cast<int64_t>(r0 + r) * dvp_ + (j0 + j) * kTileCols,
                           acc[r][j]);
        }
      }
    }
  }

  const CpuAttentionParams& p_;
  const int dp_;
  const int dvp_;
  const bool k_in_place_;  // bf16 K rows whose dim is a multiple of the tile depth: no staging
  const bool v_in_place_;
  const bool capped_;
  const float pre_cap_;
  const float post_cap_;
  const bool lean_ok_;          // softmax_tile_full applies to full blocks
  const int64_t k_elems_;       // bf16 elements of a block's packed K (its V follows)
  const int64_t block_elems_;   // bf16 elements of one packed block (K and V)
  const bool fast_softmax_;     // lean rows by softmax_row_fast
  const bool masked_rows_;      // masked units' softmax rows interleaved (ExtendWork::masked_rows)
  const bool stream_output_;    // bf16 output rows by streaming stores (kStreamOutputBytes)
  const int64_t q_elem_bytes_;  // bytes of one q element (act_dtype)
  const int pv_blocks_;         // compute blocks per P . V segment of the pipelined loop
  const int p_stride_;          // elements per P row: pv_blocks_ compute blocks
};

template <class S, int KB, Products kProducts>
void run(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& ts) {
  constexpr bool kTiles = kProducts == Products::kTiles;
  const AmxScratchLayout lay = amx_scratch_layout(p.head_dim, p.v_head_dim);
  const int64_t block_elems = amx_packed_block_elems(p.head_dim, p.v_head_dim);
  const std::vector<ExtendItem>& items = *w.items;
  const int num_items = static_cast<int>(items.size());
  int64_t out_bytes = 0;
  for (const CpuRequest& rq : *w.requests) {
    out_bytes += static_cast<int64_t>(rq.num_queries) * p.num_q_heads * p.v_head_dim *
                 static_cast<int64_t>(sizeof(uint16_t));
  }
  const bool stream_output = p.act_dtype == DType::kBF16 && out_bytes >= kStreamOutputBytes;
#pragma omp parallel num_threads(ts.num_threads)
  {
#ifdef ATTNKIT_WITH_OPENMP
    const int tid = omp_get_thread_num();
#else
    const int tid = 0;
#endif
    const AmxScratch sc = carve(ts, tid, lay);
    BlockedExtend<S, KB, kProducts> kernel(p, w.fast_softmax, w.masked_rows, stream_output,
                                           w.pv_blocks);
    const unsigned mxcsr = _mm_getcsr();
    _mm_setcsr(mxcsr | kMxcsrFtzDaz);
    if constexpr (kTiles) load_tile_config();
    const std::vector<CpuRequest>& requests = *w.requests;
    if (w.packed != nullptr) {
      // Pass 1: every (request, kv head, block) once; the implicit barrier ends it.
      const std::vector<int64_t>& begin = *w.pack_begin;
      const int64_t jobs = begin.back();
#pragma omp for schedule(dynamic, 4)
      for (int64_t j = 0; j < jobs; ++j) {
        const auto r = static_cast<size_t>(std::upper_bound(begin.begin(), begin.end(), j) -
                                           begin.begin() - 1);
        const int64_t blocks = amx_blocks_per_head(requests[r].seq_len, KB);
        const int64_t local = j - begin[r];
        kernel.pack_block(requests[r], static_cast<int>(local / blocks),
                          static_cast<int>(local % blocks) * kAmxKeyBlock, sc,
                          w.packed + j * block_elems);
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < num_items; ++i) {
      const ExtendItem& it = items[i];
      const CpuRequest& rq = requests[it.request];
      const uint16_t* packed = nullptr;
      if (w.packed != nullptr) {
        const int64_t blocks = amx_blocks_per_head(rq.seq_len, KB);
        packed = w.packed + ((*w.pack_begin)[it.request] + it.kv_head * blocks) * block_elems;
      }
      kernel.run_item(rq, it, sc, packed, w.pipelined);
    }
    if constexpr (kTiles) tile_release();
    // Streaming stores are weakly ordered: drain them before the threads join.
    if (stream_output) _mm_sfence();
    _mm_setcsr(mxcsr);
  }
}

template <class S, Products kProducts>
void run_kb(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& ts) {
  if (w.packed != nullptr && w.key_block == 2 * kAmxKeyBlock) {
    return run<S, 2 * kAmxKeyBlock, kProducts>(p, w, ts);
  }
  return run<S, kAmxKeyBlock, kProducts>(p, w, ts);
}

template <Products kProducts>
void extend_entry(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& ts) {
  switch (p.kv_dtype) {
    case DType::kBF16:
      return run_kb<StoreBf16, kProducts>(p, w, ts);
    case DType::kF16:
      return run_kb<StoreF16, kProducts>(p, w, ts);
    case DType::kF32:
      return run_kb<StoreF32, kProducts>(p, w, ts);
    case DType::kFP8E4M3:
      return run_kb<StoreFp8E4M3, kProducts>(p, w, ts);
    case DType::kFP8E5M2:
      return run_kb<StoreFp8E5M2, kProducts>(p, w, ts);
    default:
      return;  // the backend rejects every other KV dtype before planning
  }
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {

void extend_amx(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  extend_entry<Products::kTiles>(p, w, s);
}

void extend_blocked_avx512_bf16(const CpuAttentionParams& p, const ExtendWork& w,
                                const ThreadScratch& s) {
  extend_entry<Products::kBf16Dot>(p, w, s);
}

void extend_blocked_avx512(const CpuAttentionParams& p, const ExtendWork& w,
                           const ThreadScratch& s) {
  extend_entry<Products::kF32Fma>(p, w, s);
}

}  // namespace attnkit::cpu_attention
