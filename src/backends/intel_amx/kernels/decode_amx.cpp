// AMX-BF16 decode kernel of intel_amx (bf16 q and KV, head dim a multiple of 32 up to kMaxHeadDim,
// v head dim = head dim, GQA group <= 16; everything else runs the avx512_bf16 decode).
//
// Why: on the AMX Xeons the vector decode is per-core compute-bound (~32 vdpbf16ps per key and kv
// head at ~0.5 vdpbf16ps per cycle), far below the memory rate. Here the tile unit does both
// products and no K/V byte is repacked:
//   S^T [16 keys, group] = K [16 keys, 32 dims] . Q^T [32 dims, group]
//     A = 16 K rows straight from the pool (one page run of 16 consecutive slots: the tile load's
//     row stride is the pool row stride), B = Q^T of the kv head's group in the VNNI pair layout,
//     packed once per item (Hq x D bf16).
//   O_even/O_odd [group, 16 dims] += P_even/P_odd [group, 16 keys x 2] . V [16 keys, 32 dims]
//     B = 16 V rows straight from the pool: B row r is key r's 32 dims, read as 16 bf16 pairs
//     (dims 2n, 2n + 1). The A rows hold p[key] in the even (P_even) or odd (P_odd) element of
//     each pair and 0 in the other, so O_even accumulates dims 2n and O_odd dims 2n + 1: twice the
//     tile work of a pair-interleaved V, but no V permute (the tile unit has time to spare; the
//     decode is bound by the reads).
// Keys are processed in sub-blocks (aligned to 16 from the item's first visible key) of 512 keys
// for items of >= 1024 keys read in place and 128 otherwise (DecodeWork::amx_sub_keys overrides;
// session 25): S of every (tile, kv head) in key-major order (a tile's 16 pool rows are
// read whole over the kv heads), an online softmax per (kv head, group head) in f32 (AVX-512),
// then P.V in the same order. Optional software prefetch into L2 (DecodeWork::amx_prefetch; off
// by default: on the device Xeon, 2 threads, it lowered the paired ratio from 44% to 33-41%): the
// S pass prefetches the sub-block's V rows, the P.V pass the next sub-block's K rows, spread over
// the (tile, kv head) steps. Tiles whose
// slots are not 16 consecutive pool rows, or that reach outside the visible keys, are copied into a
// stage first (rows outside the visible keys zero). The S and P.V passes use two tile
// configurations (loaded once per pass).
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
#include <vector>

#ifdef ATTNKIT_WITH_OPENMP
#include <omp.h>
#endif

#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/storage_types.h"

namespace attnkit::cpu_attention {
namespace {

constexpr int kTileKeys = 16;                          // keys per tile (A rows of S, B rows of P.V)
constexpr int kTileDims = 32;                          // bf16 dims per tile row
constexpr int kMaxSubKeys = 512;                       // keys per softmax sub-block, at most
constexpr int kMaxSubTiles = kMaxSubKeys / kTileKeys;  // key tiles per sub-block, at most
// The sub-block size of an item of `keys` keys (from its first tile boundary): 512 where that makes
// two or more sub-blocks and every tile is read in place (`in_place`: 16 consecutive pool rows),
// else 128; `forced` (DecodeWork::amx_sub_keys) when not 0. Larger sub-blocks mean fewer softmax
// rounds and tile-configuration switches between the S and P.V passes (session 25 on the AMX VM,
// five alternated pairs: b8 kv 4k page 16 6.79-7.05 vs 6.95-8.96 ms, b4 kv 2048 1.78-1.88 vs
// 1.84-2.33, paired-copy ratios level to +1 point: a small gain inside the VM's noise); staged
// tiles (page 1) were slower with 512 (2.81-3.38 vs 2.76-2.91 ms) and keep 128.
int sub_keys_for(int keys, bool in_place, int forced) {
  if (forced != 0) return forced;
  return in_place && keys >= 2 * kMaxSubKeys ? kMaxSubKeys : 128;
}
constexpr int kMaxGroup = 16;                          // group heads: columns of S^T, rows of O
constexpr int kMaxDimTiles = kMaxHeadDim / kTileDims;  // 32-dim chunks of a head

int64_t up16(int64_t floats) { return (floats + 15) / 16 * 16; }

struct AmxDecodeLayout {
  int64_t qt = 0;       // [Hkv][D / 32][16][group] u32: Q^T pairs
  int64_t s = 0;        // [Hkv][kMaxSubKeys][group] f32: S^T of the sub-block
  int64_t p = 0;        // [Hkv][kMaxSubTiles][2][group][16] u32: P_even / P_odd A tiles
  int64_t o = 0;        // [Hkv][D / 32][2][group][16] f32: O_even / O_odd
  int64_t acc = 0;      // [Hq][D] f32: O in dim order, for the epilogue
  int64_t m = 0;        // [Hq] running max (log2 units)
  int64_t l = 0;        // [Hq] running sum
  int64_t stage_k = 0;  // [16][Hkv][D] bf16
  int64_t stage_v = 0;  // [16][Hkv][D] bf16
  int64_t total = 0;
};

AmxDecodeLayout amx_decode_layout(int hq, int hkv, int d) {
  AmxDecodeLayout l;
  int64_t at = 0;
  auto take = [&](int64_t floats) {
    const int64_t here = at;
    at += up16(floats);
    return here;
  };
  l.qt = take(static_cast<int64_t>(hq) * d / 2);
  l.s = take(static_cast<int64_t>(hq) * kMaxSubKeys);
  l.p = take(static_cast<int64_t>(hq) * kMaxSubTiles * 2 * kTileKeys);
  l.o = take(static_cast<int64_t>(hq) * d);
  l.acc = take(static_cast<int64_t>(hq) * d);
  l.m = take(hq);
  l.l = take(hq);
  l.stage_k = take(static_cast<int64_t>(kTileKeys) * hkv * d / 2);
  l.stage_v = take(static_cast<int64_t>(kTileKeys) * hkv * d / 2);
  l.total = at;
  return l;
}

}  // namespace
}  // namespace attnkit::cpu_attention

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
#include "backends/intel_amx/kernels/amx_tiles.h"
#include "backends/intel_amx/kernels/vec_avx512.h"
#include "backends/intel_amx/kernels/vector_attention_impl.h"

namespace attnkit::cpu_attention {
namespace {

using V = VecAvx512;

// S pass: tmm0-1 S^T results [16 keys, group], tmm2-3 K tiles [16 keys, 32 dims], tmm4-5 Q^T
// [16 dim pairs, group].
TileConfig s_config(int group) {
  TileConfig c;
  c.palette_id = kPaletteAmx;
  const auto gb = static_cast<uint16_t>(4 * group);
  for (int t : {0, 1, 4, 5}) {
    c.colsb[t] = gb;
    c.rows[t] = kTileKeys;
  }
  for (int t : {2, 3}) {
    c.colsb[t] = 64;
    c.rows[t] = kTileKeys;
  }
  return c;
}

// P.V pass: tmm0-1 and tmm3-4 O_even / O_odd [group, 16] (two dim chunks in flight), tmm2 and tmm5
// V tiles [16 keys, 32 dims], tmm6-7 P_even / P_odd [group, 16 keys x 2].
TileConfig pv_config(int group) {
  TileConfig c;
  c.palette_id = kPaletteAmx;
  for (int t : {0, 1, 3, 4, 6, 7}) {
    c.colsb[t] = 64;
    c.rows[t] = static_cast<uint8_t>(group);
  }
  for (int t : {2, 5}) {
    c.colsb[t] = 64;
    c.rows[t] = kTileKeys;
  }
  return c;
}

// Where the 16 rows of one key tile are: head 0 of row 0 at base, rows row_bytes apart, heads
// head_elems apart.
struct TileSrc {
  const uint16_t* k;
  const uint16_t* v;
  int64_t k_row_bytes;
  int64_t v_row_bytes;
  int64_t k_head;
  int64_t v_head;
};

inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
}

class AmxDecode {
 public:
  AmxDecode(const CpuAttentionParams& p, const AmxDecodeLayout& lay, int prefetch, int sub_keys)
      : p_(p),
        lay_(lay),
        hq_(p.num_q_heads),
        hkv_(p.num_kv_heads),
        group_(p.group()),
        d_(p.head_dim),
        dc_(p.head_dim / kTileDims),
        capped_(p.logit_cap > 0.f),
        pre_(capped_ ? p.score_scale / p.logit_cap : p.score_scale * kLog2e),
        post_(capped_ ? p.logit_cap * kLog2e : 1.f),
        k_cache_(static_cast<const uint16_t*>(p.k_cache)),
        v_cache_(static_cast<const uint16_t*>(p.v_cache)),
        s_cfg_(s_config(p.group())),
        pv_cfg_(pv_config(p.group())),
        prefetch_(prefetch),
        forced_sub_keys_(sub_keys) {}

  void run_item(const DecodeWork& w, const DecodeItem& it, float* base) {
    const CpuRequest& rq = (*w.requests)[it.request];
    auto* qt = reinterpret_cast<uint32_t*>(base + lay_.qt);
    float* o = base + lay_.o;
    float* acc = base + lay_.acc;
    float* m = base + lay_.m;
    float* l = base + lay_.l;
    pack_qt(rq, qt);
    std::fill(m, m + hq_, kNegInf);
    std::fill(l, l + hq_, 0.f);
    std::fill(o, o + static_cast<int64_t>(hq_) * d_, 0.f);
    int lo = 0;
    int hi = 0;
    visible_keys(p_, rq.first_q_pos, rq.seq_len, &lo, &hi);
    const int a = std::max(lo, it.k_begin);
    const int b = std::min(hi, it.k_end);
    if (a < b) {
      const int32_t* slots = rq.slots(p_);
      const int a0 = a / kTileKeys * kTileKeys;
      const int sub_keys = sub_keys_for(b - a0, tiles_in_place(slots, a0, b), forced_sub_keys_);
      if (prefetch_ != 0) {
        prefetch_sub_block(slots, a0, sub_keys, a, b, /*k=*/true, /*v=*/prefetch_ == 3);
      }
      if (prefetch_ == 3) {
        prefetch_sub_block(slots, a0 + sub_keys, sub_keys, a, b, /*k=*/true, /*v=*/false);
      }
      for (int k0 = a0; k0 < b; k0 += sub_keys) sub_block(slots, k0, sub_keys, a, b, base);
    }
    // O_even / O_odd -> dims in order, noting whether any element is NaN (exact_nan_rows).
    bool any_nan = false;
    for (int h = 0; h < hkv_; ++h) {
      for (int g = 0; g < group_; ++g) {
        float* dst = acc + static_cast<int64_t>(h * group_ + g) * d_;
        for (int c = 0; c < dc_; ++c) {
          const float* e = o + o_index(h, c, 0) + g * 16;
          const float* od = o + o_index(h, c, 1) + g * 16;
          for (int n = 0; n < 16; ++n) {
            dst[kTileDims * c + 2 * n] = e[n];
            dst[kTileDims * c + 2 * n + 1] = od[n];
            any_nan |= std::isnan(e[n]) || std::isnan(od[n]);
          }
        }
      }
    }
    if (any_nan && a < b) exact_nan_rows(rq, rq.slots(p_), a, b, m, acc);
    if (it.partial < 0) {
      finalize_rows(p_, rq.q_start, 0, hq_, m, l, acc, d_);
    } else {
      store_decode_partials(p_, w, it, m, l, acc, d_);
    }
  }

 private:
  // Rows of acc (the item's unnormalised O, relative to its final maxima m) with a NaN,
  // recomputed exactly in scalar f32 from the pool. The tile P.V above multiplies each key's p by a
  // V pair whose other element is 0 (P_even / P_odd), so a NaN or Inf V element also puts 0 x NaN
  // into its pair neighbour's column, where the reference (and every other path) keeps that column
  // finite. Only an item whose O holds a NaN gets here (a non-finite KV cache); the reorder above
  // notes that on its pass over O.
  void exact_nan_rows(const CpuRequest& rq, const int32_t* slots, int a, int b, const float* m,
                      float* acc) const {
    const uint16_t* q = static_cast<const uint16_t*>(p_.q) + rq.q_start * p_.q_token_stride;
    for (int h = 0; h < hkv_; ++h) {
      for (int g = 0; g < group_; ++g) {
        const int qh = h * group_ + g;
        float* row = acc + static_cast<int64_t>(qh) * d_;
        if (std::none_of(row, row + d_, [](float x) { return std::isnan(x); })) continue;
        std::fill(row, row + d_, 0.f);
        const uint16_t* qr = q + static_cast<int64_t>(qh) * p_.q_head_stride;
        for (int key = a; key < b; ++key) {
          const uint16_t* kr = k_cache_ + slots[key] * p_.k_row_stride + h * p_.k_head_stride;
          const uint16_t* vr = v_cache_ + slots[key] * p_.v_row_stride + h * p_.v_head_stride;
          float dot = 0.f;
          for (int d = 0; d < d_; ++d) dot += bf16_bits_to_float(qr[d]) * bf16_bits_to_float(kr[d]);
          const float y = capped_ ? std::tanh(dot * pre_) * post_ : dot * pre_;
          const float pr = std::exp2(y - m[qh]);
          for (int d = 0; d < d_; ++d) row[d] += pr * bf16_bits_to_float(vr[d]);
        }
      }
    }
  }

  int64_t o_index(int h, int c, int e) const {
    return ((static_cast<int64_t>(h) * dc_ + c) * 2 + e) * group_ * 16;
  }
  int64_t p_index(int h, int t, int e) const {
    return ((static_cast<int64_t>(h) * kMaxSubTiles + t) * 2 + e) * group_ * 16;
  }

  // qt[h][c][r][g] = the bf16 pair (q[h * group + g][32c + 2r], [32c + 2r + 1]).
  void pack_qt(const CpuRequest& rq, uint32_t* qt) const {
    const uint16_t* q = static_cast<const uint16_t*>(p_.q) + rq.q_start * p_.q_token_stride;
    for (int h = 0; h < hkv_; ++h) {
      for (int g = 0; g < group_; ++g) {
        const uint16_t* row = q + static_cast<int64_t>(h * group_ + g) * p_.q_head_stride;
        for (int c = 0; c < dc_; ++c) {
          uint32_t* dst = qt + (static_cast<int64_t>(h) * dc_ + c) * 16 * group_ + g;
          for (int r = 0; r < 16; ++r) {
            uint32_t pair;
            std::memcpy(&pair, row + kTileDims * c + 2 * r, sizeof(pair));
            dst[r * group_] = pair;
          }
        }
      }
    }
  }

  // Whether keys [k0, k1) sit in consecutive pool rows.
  static bool consecutive_slots(const int32_t* slots, int k0, int k1) {
    for (int k = k0 + 1; k < k1; ++k) {
      if (slots[k] != slots[k0] + (k - k0)) return false;
    }
    return true;
  }

  // Whether every key tile of [a0, b) (a0 on a tile boundary) is 16 consecutive pool rows (the
  // slot values only; tile_src also stages tiles that reach outside the visible keys).
  static bool tiles_in_place(const int32_t* slots, int a0, int b) {
    for (int kt = a0; kt < b; kt += kTileKeys) {
      if (!consecutive_slots(slots, kt, std::min(b, kt + kTileKeys))) return false;
    }
    return true;
  }

  // The K/V rows of the sub-block of sub_keys keys at k0 (visible keys [a, b)) into L2.
  void prefetch_sub_block(const int32_t* slots, int k0, int sub_keys, int a, int b, bool k,
                          bool v) const {
    const int end = std::min(b, k0 + sub_keys);
    const int64_t kb = static_cast<int64_t>(hkv_) * d_ * 2;
    for (int key = std::max(a, k0); key < end; ++key) {
      const int64_t slot = slots[key];
      if (k) prefetch_l2(k_cache_ + slot * p_.k_row_stride, kb);
      if (v) prefetch_l2(v_cache_ + slot * p_.v_row_stride, kb);
    }
  }

  // Rows of tile [kt, kt + 16): in place when the 16 slots are consecutive and every key is
  // visible; else copied into the stage (invisible rows zero).
  TileSrc tile_src(const int32_t* slots, int kt, int a, int b, float* base, bool need_k,
                   bool need_v) const {
    const bool direct =
        kt >= a && kt + kTileKeys <= b && consecutive_slots(slots, kt, kt + kTileKeys);
    if (direct) {
      const int64_t s0 = slots[kt];
      return {k_cache_ + s0 * p_.k_row_stride,
              v_cache_ + s0 * p_.v_row_stride,
              p_.k_row_stride * 2,
              p_.v_row_stride * 2,
              p_.k_head_stride,
              p_.v_head_stride};
    }
    auto* sk = reinterpret_cast<uint16_t*>(base + lay_.stage_k);
    auto* sv = reinterpret_cast<uint16_t*>(base + lay_.stage_v);
    const int64_t row = static_cast<int64_t>(hkv_) * d_;
    const size_t bytes = static_cast<size_t>(d_) * sizeof(uint16_t);
    // Rows whose kv heads are contiguous in the pool are copied whole.
    const bool k_whole = p_.k_head_stride == d_;
    const bool v_whole = p_.v_head_stride == d_;
    auto copy_row = [&](uint16_t* dst, const uint16_t* src, int64_t head_stride, bool whole) {
      if (whole) {
        std::memcpy(dst, src, static_cast<size_t>(row) * sizeof(uint16_t));
        return;
      }
      for (int h = 0; h < hkv_; ++h) std::memcpy(dst + h * d_, src + h * head_stride, bytes);
    };
    for (int i = 0; i < kTileKeys; ++i) {
      const int key = kt + i;
      uint16_t* dk = sk + i * row;
      uint16_t* dv = sv + i * row;
      if (key < a || key >= b) {
        if (need_k) std::memset(dk, 0, static_cast<size_t>(row) * sizeof(uint16_t));
        if (need_v) std::memset(dv, 0, static_cast<size_t>(row) * sizeof(uint16_t));
        continue;
      }
      const int64_t slot = slots[key];
      if (need_k) copy_row(dk, k_cache_ + slot * p_.k_row_stride, p_.k_head_stride, k_whole);
      if (need_v) copy_row(dv, v_cache_ + slot * p_.v_row_stride, p_.v_head_stride, v_whole);
    }
    return {sk, sv, row * 2, row * 2, d_, d_};
  }

  // S^T of kv heads h and h + 1 (tmm0 / tmm1) for one key tile -> s.
  template <bool kTwo>
  void s_heads(const TileSrc& src, int h, const uint32_t* qt, float* s, int t) const {
    const int64_t qt_head = static_cast<int64_t>(dc_) * 16 * group_;
    const int64_t qt_bytes = 4 * group_;
    const uint16_t* k0 = src.k + h * src.k_head;
    const uint16_t* k1 = k0 + src.k_head;
    const uint32_t* q0 = qt + h * qt_head;
    const uint32_t* q1 = q0 + qt_head;
    tile_zero<0>();
    if constexpr (kTwo) tile_zero<1>();
    for (int c = 0; c < dc_; ++c) {
      tile_load<2>(k0 + kTileDims * c, src.k_row_bytes);
      tile_load<4>(q0 + c * 16 * group_, qt_bytes);
      if constexpr (kTwo) {
        tile_load<3>(k1 + kTileDims * c, src.k_row_bytes);
        tile_load<5>(q1 + c * 16 * group_, qt_bytes);
      }
      tile_dpbf16ps<0, 2, 4>();
      if constexpr (kTwo) tile_dpbf16ps<1, 3, 5>();
    }
    tile_store<0>(s + (static_cast<int64_t>(h) * kMaxSubKeys + t * kTileKeys) * group_, qt_bytes);
    if constexpr (kTwo) {
      tile_store<1>(s + (static_cast<int64_t>(h + 1) * kMaxSubKeys + t * kTileKeys) * group_,
                    qt_bytes);
    }
  }

  // O += P . V of kv head h for one key tile: dim chunks c (tmm0/1, V tmm2) and c + 1 (tmm3/4,
  // V tmm5) per step, P_even / P_odd in tmm6 / tmm7.
  void pv_head(const TileSrc& src, int h, int t, const uint32_t* pt, float* o) const {
    tile_load<6>(pt + p_index(h, t, 0), 64);
    tile_load<7>(pt + p_index(h, t, 1), 64);
    const uint16_t* vh = src.v + h * src.v_head;
    for (int c = 0; c < dc_; c += 2) {
      float* e0 = o + o_index(h, c, 0);
      float* o0 = o + o_index(h, c, 1);
      tile_load<0>(e0, 64);
      tile_load<1>(o0, 64);
      tile_load<2>(vh + kTileDims * c, src.v_row_bytes);
      tile_dpbf16ps<0, 6, 2>();
      tile_dpbf16ps<1, 7, 2>();
      if (c + 1 < dc_) {
        float* e1 = o + o_index(h, c + 1, 0);
        float* o1 = o + o_index(h, c + 1, 1);
        tile_load<3>(e1, 64);
        tile_load<4>(o1, 64);
        tile_load<5>(vh + kTileDims * (c + 1), src.v_row_bytes);
        tile_dpbf16ps<3, 6, 5>();
        tile_dpbf16ps<4, 7, 5>();
        tile_store<3>(e1, 64);
        tile_store<4>(o1, 64);
      }
      tile_store<0>(e0, 64);
      tile_store<1>(o0, 64);
    }
  }

  // The sub-block of sub_keys keys (the item's sub_keys_for) at k0: S pass, softmax, P.V pass.
  void sub_block(const int32_t* slots, int k0, int sub_keys, int a, int b, float* base) const {
    const int nt = std::min(sub_keys / kTileKeys, (b - k0 + kTileKeys - 1) / kTileKeys);
    const auto* qt = reinterpret_cast<const uint32_t*>(base + lay_.qt);
    float* s = base + lay_.s;
    auto* pt = reinterpret_cast<uint32_t*>(base + lay_.p);
    float* o = base + lay_.o;
    float* m = base + lay_.m;
    float* l = base + lay_.l;
    const int next = k0 + sub_keys;
    // Sub-blocks whose V (S pass) and K (P.V pass) rows this one prefetches: the same and the
    // next (modes 1, 2), one further (mode 3).
    const int v_pf = prefetch_ == 3 ? next : k0;
    const int k_pf = prefetch_ == 3 ? next + sub_keys : next;
    // S pass (key-major: a tile's rows are read whole over the kv heads). Step (t, h) prefetches
    // head h's slice of tile t's V rows (read by the P.V pass below).
    tile_config(&s_cfg_);
    for (int t = 0; t < nt; ++t) {
      const int kt = k0 + t * kTileKeys;
      const TileSrc src = tile_src(slots, kt, a, b, base, true, false);
      int h = 0;
      for (; h + 2 <= hkv_; h += 2) {
        prefetch_step(slots, v_pf + t * kTileKeys, a, b, v_cache_, p_.v_row_stride,
                      p_.v_head_stride, h, 2);
        s_heads<true>(src, h, qt, s, t);
      }
      if (h < hkv_) {
        prefetch_step(slots, v_pf + t * kTileKeys, a, b, v_cache_, p_.v_row_stride,
                      p_.v_head_stride, h, 1);
        s_heads<false>(src, h, qt, s, t);
      }
    }
    // Online softmax per (kv head, group head) over the sub-block's keys.
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(group_));
    const V::F pre = V::set1(pre_);
    const V::F post = V::set1(post_);
    for (int h = 0; h < hkv_; ++h) {
      for (int g = 0; g < group_; ++g) {
        const int q = h * group_ + g;
        V::F x[kMaxSubTiles];
        V::F mx = V::set1(kNegInf);
        for (int t = 0; t < nt; ++t) {
          const float* sp =
              s + (static_cast<int64_t>(h) * kMaxSubKeys + t * kTileKeys) * group_ + g;
          V::F y = _mm512_i32gather_ps(idx, sp, 4);
          y = capped_ ? V::mul(V::tanh(V::mul(y, pre)), post) : V::mul(y, pre);
          const int kt = k0 + t * kTileKeys;
          const __mmask16 vis = lane_mask(a - kt, b - kt);
          y = _mm512_mask_blend_ps(vis, V::set1(kNegInf), y);
          x[t] = y;
          mx = V::max(mx, y);
        }
        const float m_old = m[q];
        const float m_new = std::max(m_old, V::reduce_max(mx));
        const float alpha = m_old == kNegInf ? 0.f : std::exp2(m_old - m_new);
        const V::F mn = V::set1(m_new);
        V::F sum = V::zero();
        for (int t = 0; t < nt; ++t) {
          const V::F pr = V::exp2(V::sub(x[t], mn));
          sum = V::add(sum, pr);
          const __m256bh hb = _mm512_cvtneps_pbh(pr);
          const __m512i pe = _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(hb));
          _mm512_storeu_si512(pt + p_index(h, t, 0) + g * 16, pe);
          _mm512_storeu_si512(pt + p_index(h, t, 1) + g * 16, _mm512_slli_epi32(pe, 16));
        }
        l[q] = l[q] * alpha + V::reduce_add(sum);
        m[q] = m_new;
        if (alpha != 1.f && m_old != kNegInf) {
          const V::F al = V::set1(alpha);
          for (int c = 0; c < dc_; ++c) {
            for (int e = 0; e < 2; ++e) {
              float* r = o + o_index(h, c, e) + g * 16;
              V::store(r, V::mul(V::load(r), al));
            }
          }
        }
      }
    }
    // P.V pass.
    tile_config(&pv_cfg_);
    // Step (t, h) prefetches head h's slice of the next sub-block's tile t of K.
    for (int t = 0; t < nt; ++t) {
      const int kt = k0 + t * kTileKeys;
      const TileSrc src = tile_src(slots, kt, a, b, base, false, true);
      for (int h = 0; h < hkv_; ++h) {
        if (k_pf < b) {
          prefetch_step(slots, k_pf + t * kTileKeys, a, b, k_cache_, p_.k_row_stride,
                        p_.k_head_stride, h, 1);
        }
        pv_head(src, h, t, pt, o);
      }
    }
  }

  // Step (tile kt, kv heads h .. h + nh) of a pass: prefetch_ 1 prefetches those heads' slices
  // of the 16 rows, prefetch_ 2 and 3 rows [16 h / Hkv, 16 (h + nh) / Hkv) of the tile whole, in
  // address order (over the Hkv steps every row once).
  void prefetch_step(const int32_t* slots, int kt, int a, int b, const uint16_t* cache,
                     int64_t row_stride, int64_t head_stride, int h, int nh) const {
    if (prefetch_ == 1) {
      for (int j = h; j < h + nh; ++j)
        prefetch_slice(slots, kt, a, b, cache, row_stride, j * head_stride);
    } else if (prefetch_ >= 2) {
      const int r0 = std::max(a, kt + h * kTileKeys / hkv_);
      const int r1 = std::min(b, kt + (h + nh) * kTileKeys / hkv_);
      const int64_t bytes = static_cast<int64_t>(hkv_) * d_ * 2;
      for (int key = r0; key < r1; ++key) prefetch_l2(cache + slots[key] * row_stride, bytes);
    }
  }

  // The d_ elements at head_off of the pool rows of keys [kt, kt + 16) ∩ [a, b) into L2.
  void prefetch_slice(const int32_t* slots, int kt, int a, int b, const uint16_t* cache,
                      int64_t row_stride, int64_t head_off) const {
    const int end = std::min(b, kt + kTileKeys);
    const int64_t bytes = static_cast<int64_t>(d_) * 2;
    for (int key = std::max(a, kt); key < end; ++key) {
      prefetch_l2(cache + slots[key] * row_stride + head_off, bytes);
    }
  }

  static __mmask16 lane_mask(int lo, int hi) {
    lo = std::clamp(lo, 0, 16);
    hi = std::clamp(hi, 0, 16);
    if (hi <= lo) return 0;
    return static_cast<__mmask16>(((1u << (hi - lo)) - 1u) << lo);
  }

  const CpuAttentionParams& p_;
  const AmxDecodeLayout& lay_;
  int hq_;
  int hkv_;
  int group_;
  int d_;
  int dc_;
  bool capped_;
  float pre_;
  float post_;
  const uint16_t* k_cache_;
  const uint16_t* v_cache_;
  TileConfig s_cfg_;
  TileConfig pv_cfg_;
  int prefetch_;         // DecodeWork::amx_prefetch
  int forced_sub_keys_;  // DecodeWork::amx_sub_keys (0: sub_keys_for's rule)
};

void decode_entry(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& ts) {
  const AmxDecodeLayout lay = amx_decode_layout(p.num_q_heads, p.num_kv_heads, p.head_dim);
  const std::vector<DecodeItem>& items = *w.items;
  const int num_items = static_cast<int>(items.size());
#pragma omp parallel num_threads(ts.num_threads)
  {
    float* base = ts.base + thread_id() * ts.stride;
    AmxDecode kernel(p, lay, w.amx_prefetch, w.amx_sub_keys);
    const unsigned mxcsr = _mm_getcsr();
    _mm_setcsr(mxcsr | kMxcsrFtzDaz);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < num_items; ++i) kernel.run_item(w, items[i], base);
    tile_release();
    _mm_setcsr(mxcsr);
  }
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {

bool amx_decode_supported(const CpuAttentionParams& p) {
  const int group = p.num_kv_heads > 0 ? p.group() : 0;
  return p.act_dtype == DType::kBF16 && p.kv_dtype == DType::kBF16 && p.head_dim == p.v_head_dim &&
         p.head_dim % kTileDims == 0 && p.head_dim <= kMaxDimTiles * kTileDims && group >= 1 &&
         group <= kMaxGroup && p.q_head_stride % 2 == 0;
}

int64_t amx_decode_scratch_floats(int num_q_heads, int num_kv_heads, int head_dim) {
  return amx_decode_layout(num_q_heads, num_kv_heads, head_dim).total;
}

void decode_amx(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  if (!amx_decode_supported(p)) return decode_avx512_bf16(p, w, s);
  decode_entry(p, w, s);
}

}  // namespace attnkit::cpu_attention
