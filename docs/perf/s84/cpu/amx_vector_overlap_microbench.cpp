// Session 84 (2026-12-03, AMX development VM: Intel Xeon guest, 2 vCPUs, AMX-BF16; not part of
// the build). Which AVX-512 operations run beside AMX tile dots? One core; a step is 4
// independent tdpbf16ps (2 x 2 blocking, operands in registers; TILES=2: the four operand tiles
// loaded from L1 first, as the extend kernel's micro-step) followed by 128 zmm operations in 16
// independent chains; ns per step, best of 5 rounds of 200000 steps:
//
//   operation (OP)              alone   with 4 dots   with 4 loads + 4 dots   (4 dots alone 21.4)
//   1  vaddps                    19.6      23.1          24.5    overlaps
//   15 vsubps                    19.5      22.9          23.8    overlaps
//   8  vpaddd                    18.1      22.8          25.4    overlaps
//   10 vpmaxsd                   37.3      42.8          43.5    overlaps (one port)
//   9  vpslld                    36.8      43.1          43.8    overlaps (one port)
//   11 vpermt2ps                 36.6      46.2          51.0    partly
//   14 vcvtne2ps2bf16            79.1      88.8          88.8    mostly
//   5  vfmadd231ps               19.6      43.0          42.8    serialised: the sum
//   6  vmulps                    19.6      43.4          -       serialised
//   7  vmaxps                    19.6      44.0          -       serialised
//   13 vcvtdq2ps                 19.4      43.7          43.3    serialised
//   2  vscalefps                 19.8      43.4          -       serialised
//   4  vroundscaleps             39.7      87.3          -       serialised, and worse
//
// So while the tile unit computes, the 512-bit FMA-unit operations (FMA, MUL, MAX, conversions
// to float, SCALEF, ROUNDSCALE) wait for it, and the FADD, integer ALU and shuffle operations do
// not. The extend kernel's lean softmax row is made of the first kind; a model of the kernel's
// unit (amx_unit_overlap_model.cpp) shows it adding nearly its whole time to the tile work, and a
// row free of FMA-unit operations (more operations) doing the same.
// Build: g++ -O2 -mamx-tile -mamx-bf16 -mavx512f -mavx512bf16 -o ov <this file>
// Run: ./ov OP TILES (TILES 0: the vector work alone, 1: with 4 dots, 2: with 4 loads + 4 dots)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

struct alignas(64) Cfg {
  uint8_t pal = 1, start = 0;
  uint8_t res[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
alignas(4096) static char g_buf[4096];

template <int kOp, int kTiles>
double run(__m512* a, __m512 b, __m512i idx, long steps) {
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now();
    for (long s = 0; s < steps; ++s) {
      if (kTiles == 2) {
        _tile_loadd(4, g_buf, 64);
        _tile_loadd(6, g_buf + 1024, 64);
        _tile_loadd(7, g_buf + 2048, 64);
        _tile_loadd(5, g_buf + 3072, 64);
      }
      if (kTiles != 0) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
#pragma GCC unroll 16
      for (int r = 0; r < 8; ++r) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          const __m512i ai = _mm512_castps_si512(a[i]);
          const __m512i an = _mm512_castps_si512(a[(i + 3) & 15]);
          if (kOp == 1) a[i] = _mm512_add_ps(a[i], b);
          if (kOp == 2) a[i] = _mm512_scalef_ps(a[i], b);
          if (kOp == 4) a[i] = _mm512_roundscale_ps(a[i], 0);
          if (kOp == 5) a[i] = _mm512_fmadd_ps(a[i], b, b);
          if (kOp == 6) a[i] = _mm512_mul_ps(a[i], b);
          if (kOp == 7) a[i] = _mm512_max_ps(a[i], b);
          if (kOp == 8) a[i] = _mm512_castsi512_ps(_mm512_add_epi32(ai, an));
          if (kOp == 9) a[i] = _mm512_castsi512_ps(_mm512_slli_epi32(ai, 1));
          if (kOp == 10) a[i] = _mm512_castsi512_ps(_mm512_max_epi32(ai, an));
          if (kOp == 11) a[i] = _mm512_permutex2var_ps(a[i], idx, b);
          if (kOp == 13) a[i] = _mm512_cvtepi32_ps(ai);
          if (kOp == 14) a[i] = (__m512)_mm512_cvtne2ps_pbh(a[i], b);
          if (kOp == 15) a[i] = _mm512_sub_ps(a[i], b);
        }
      }
    }
    const double dt = now() - t0;
    if (dt < best) best = dt;
  }
  return best / steps * 1e9;
}

template <int kOp>
double run_op(int tiles, __m512* a, __m512 b, __m512i idx, long steps) {
  if (tiles == 0) return run<kOp, 0>(a, b, idx, steps);
  if (tiles == 1) return run<kOp, 1>(a, b, idx, steps);
  return run<kOp, 2>(a, b, idx, steps);
}

int main(int argc, char** argv) {
  if (argc < 3) return 1;
  syscall(SYS_arch_prctl, 0x1023, 18);  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  const int op = atoi(argv[1]);
  const int tiles = atoi(argv[2]);
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  const __m512i idx = _mm512_set_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  const long steps = 200000;
  double ns = 0;
  switch (op) {
    case 1:
      ns = run_op<1>(tiles, a, b, idx, steps);
      break;
    case 2:
      ns = run_op<2>(tiles, a, b, idx, steps);
      break;
    case 4:
      ns = run_op<4>(tiles, a, b, idx, steps);
      break;
    case 5:
      ns = run_op<5>(tiles, a, b, idx, steps);
      break;
    case 6:
      ns = run_op<6>(tiles, a, b, idx, steps);
      break;
    case 7:
      ns = run_op<7>(tiles, a, b, idx, steps);
      break;
    case 8:
      ns = run_op<8>(tiles, a, b, idx, steps);
      break;
    case 9:
      ns = run_op<9>(tiles, a, b, idx, steps);
      break;
    case 10:
      ns = run_op<10>(tiles, a, b, idx, steps);
      break;
    case 11:
      ns = run_op<11>(tiles, a, b, idx, steps);
      break;
    case 13:
      ns = run_op<13>(tiles, a, b, idx, steps);
      break;
    case 14:
      ns = run_op<14>(tiles, a, b, idx, steps);
      break;
    case 15:
      ns = run_op<15>(tiles, a, b, idx, steps);
      break;
    default:
      ns = run_op<0>(tiles, a, b, idx, steps);
      break;
  }
  float sink = 0;
  for (int i = 0; i < 16; ++i) sink += _mm512_reduce_add_ps(a[i]);
  printf("op %d tiles %d: %.1f ns per step (sink %g)\n", op, tiles, ns, sink);
  _tile_release();
  return 0;
}
