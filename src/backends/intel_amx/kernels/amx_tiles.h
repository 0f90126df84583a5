// The AMX tile operations the extend kernel uses (tile_load<3>(...), tile_dpbf16ps<0, 4, 6>()),
// thin wrappers of the hardware intrinsics. Include only from a translation unit compiled with
// amx-tile,amx-bf16 enabled.
//
// Test-only: with ATTNKIT_AMX_EMULATE defined (a development build: -DATTNKIT_AMX_EMULATE in
// CMAKE_CXX_FLAGS), the wrappers run a plain C++ model of the eight tile registers instead, and
// detect_cpu() reports AMX wherever AVX512-BF16 exists, so the AMX kernel's packing, blocking
// and softmax can be checked against the reference on a CPU without AMX. The model follows the
// architecture's definition of TDPBF16PS (bf16 pairs widened to f32, the pair's products summed
// into the f32 accumulator); it is slow and never built into a release.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attnkit::cpu_attention {

// The 64-byte tile configuration ldtilecfg reads (palette 1: 8 tiles, rows x colsb bytes each).
inline constexpr int kPaletteAmx = 1;
struct alignas(64) TileConfig {
  uint8_t palette_id = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// MXCSR flush-to-zero (bit 15) and denormals-are-zero (bit 6), as the tile unit itself computes.
inline constexpr unsigned kMxcsrFtzDaz = 0x8040;

}  // namespace attnkit::cpu_attention

#ifdef ATTNKIT_AMX_EMULATE

namespace attnkit::cpu_attention::amx_model {

inline constexpr int kTiles = 8;
inline constexpr int kRows = 16;
inline constexpr int kRowBytes = 64;

struct alignas(64) Tile {
  uint8_t bytes[kRows][kRowBytes];
};

inline Tile* tiles() {
  thread_local Tile t[kTiles];
  return t;
}

// The configured shape of each tile (rows, bytes per row), as ldtilecfg sets it from the 64-byte
// configuration (colsb: 16 x uint16 at byte 16; rows: 16 x uint8 at byte 48).
struct Shape {
  int rows = kRows;
  int colsb = kRowBytes;
};

inline Shape* shapes() {
  thread_local Shape s[kTiles];
  return s;
}

inline void configure(const void* cfg) {
  const auto* c = static_cast<const uint8_t*>(cfg);
  for (int t = 0; t < kTiles; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, sizeof(colsb));
    shapes()[t].colsb = colsb;
    shapes()[t].rows = c[48 + t];
    std::memset(tiles()[t].bytes, 0, sizeof(Tile));
  }
}

inline void load(int t, const void* base, int64_t stride) {
  const auto* b = static_cast<const uint8_t*>(base);
  const Shape s = shapes()[t];
  std::memset(tiles()[t].bytes, 0, sizeof(Tile));
  for (int r = 0; r < s.rows; ++r) std::memcpy(tiles()[t].bytes[r], b + r * stride, s.colsb);
}

inline void store(int t, void* base, int64_t stride) {
  auto* b = static_cast<uint8_t*>(base);
  const Shape s = shapes()[t];
  for (int r = 0; r < s.rows; ++r) std::memcpy(b + r * stride, tiles()[t].bytes[r], s.colsb);
}

inline void zero(int t) { std::memset(tiles()[t].bytes, 0, sizeof(Tile)); }

inline float bf16_to_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// C[m][n] += sum_k A[m][2k] * B[k][2n] + A[m][2k + 1] * B[k][2n + 1] (16 x 16 f32 C, 16 x 32
// bf16 A, 16 x (16 x 2) bf16 B in the VNNI pair layout).
// M = rows of C, N = colsb of C / 4, K pairs = colsb of A / 4 (= rows of B).
inline void dpbf16ps(int c, int a, int b) {
  const int m_rows = shapes()[c].rows;
  const int n_cols = shapes()[c].colsb / 4;
  const int k_pairs = shapes()[a].colsb / 4;
  // The shape rules of the real instruction (which faults on a mismatch).
  if (shapes()[a].rows != m_rows || shapes()[b].rows != k_pairs ||
      shapes()[b].colsb != shapes()[c].colsb) {
    const Shape sc = shapes()[c], sa = shapes()[a], sb = shapes()[b];
    std::fprintf(stderr,
                 "amx emulation: tdpbf16ps tmm%d (%d x %d bytes) += tmm%d (%d x %d) . tmm%d (%d x "
                 "%d): needs A rows = C rows, B rows = A bytes / 4 and B bytes = C bytes\n",
                 c, sc.rows, sc.colsb, a, sa.rows, sa.colsb, b, sb.rows, sb.colsb);
    std::abort();  // the real instruction faults here
  }
  for (int m = 0; m < m_rows; ++m) {
    for (int n = 0; n < n_cols; ++n) {
      float acc;
      std::memcpy(&acc, tiles()[c].bytes[m] + 4 * n, sizeof(acc));
      for (int k = 0; k < k_pairs; ++k) {
        const uint8_t* ap = tiles()[a].bytes[m] + 4 * k;
        const uint8_t* bp = tiles()[b].bytes[k] + 4 * n;
        acc += bf16_to_f32(ap) * bf16_to_f32(bp) + bf16_to_f32(ap + 2) * bf16_to_f32(bp + 2);
      }
      std::memcpy(tiles()[c].bytes[m] + 4 * n, &acc, sizeof(acc));
    }
  }
}

}  // namespace attnkit::cpu_attention::amx_model

namespace attnkit::cpu_attention {
namespace {
inline void tile_config(const void* cfg) { amx_model::configure(cfg); }
inline void tile_release() {}
template <int kT>
inline void tile_zero() {
  amx_model::zero(kT);
}
template <int kT>
inline void tile_load(const void* base, int64_t stride) {
  amx_model::load(kT, base, stride);
}
template <int kT>
inline void tile_store(void* base, int64_t stride) {
  amx_model::store(kT, base, stride);
}
template <int kC, int kA, int kB>
inline void tile_dpbf16ps() {
  amx_model::dpbf16ps(kC, kA, kB);
}
}  // namespace
}  // namespace attnkit::cpu_attention

#else

// The intrinsics (_tile_loadd, ...) are macros that paste the tile number into the instruction
// text, so they cannot take a template parameter; these wrappers emit the same instructions with
// the number as an immediate operand (%c). Unlike GCC 12's _tile_loadd they clobber "memory":
// the packed K/V and P buffers are written by ordinary stores just before the tile loads read
// them, and the compiler must not sink those stores past the loads.
namespace attnkit::cpu_attention {
namespace {
inline void tile_config(const void* cfg) { _tile_loadconfig(cfg); }
inline void tile_release() { _tile_release(); }
template <int kT>
inline void tile_zero() {
  asm volatile("tilezero %%tmm%c0" ::"i"(kT));
}
template <int kT>
inline void tile_load(const void* base, int64_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(kT) : "memory");
}
template <int kT>
inline void tile_store(void* base, int64_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(kT) : "memory");
}
// C += A . B (AT&T operand order: B, A, C).
template <int kC, int kA, int kB>
inline void tile_dpbf16ps() {
  asm volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(kB), "i"(kA), "i"(kC));
}
}  // namespace
}  // namespace attnkit::cpu_attention

#endif
