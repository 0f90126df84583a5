// Session 81 (2026-12-02, AMX development VM; not part of the build). One 2x2 S micro-step (4 tile
// loads, 4 dots; the 4 S tiles stored every 4th step) with N softmax rows of 128 keys (degree-3
// exp2, bf16 P stored) after it. One core, ns per step:
//   tiles alone 38-41; 1 row alone 12.4-12.7, with the step 44-48 (partial overlap; one run 84);
//   2 rows alone 24, with the step 62-64 (none). The VM's rates move between runs.
// Build: g++ -O2 -march=sapphirerapids -o ov amx_softmax_overlap_microbench.cpp
// Run:   ./ov TILES(0/1/2: none / with S stores / without) ROWS_PER_STEP [K_KIB]
// overlap microbench: 2x2 S micro-step (4 loads, 4 dots) + softmax-like vector work per step
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
struct alignas(64) Cfg {
  uint8_t pal = 1, start = 0;
  uint8_t res[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
alignas(64) static char Q[64 * 1024];
alignas(64) static char K[1024 * 1024];
alignas(64) static float S[2][32 * 128];
alignas(64) static uint16_t P[32 * 128];
__attribute__((always_inline)) inline __m512 exp2d3(__m512 x) {
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.055f), f, _mm512_set1_ps(0.2426f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999f));
  return _mm512_scalef_ps(p, n);
}
static float sink;
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  int tiles = atoi(argv[1]);
  int vrows = atoi(argv[2]);
  int kb = argc > 3 ? atoi(argv[3]) : 32;  // vrows: softmax rows (128 keys) per 4-dot step x 4
  memset(Q, 1, sizeof Q);
  memset(K, 1, sizeof K);
  for (int i = 0; i < 32 * 128; ++i) {
    S[0][i] = -(i % 97) * 0.1f;
    S[1][i] = S[0][i];
  }
  const int ktiles = kb;
  long steps = 0;
  int kt = 0;
  int iters = 400000;
  __m512 sum = _mm512_setzero_ps();
  const __m512 sc = _mm512_set1_ps(0.12f), nm = _mm512_set1_ps(-1.f);
  double t0 = now();
  int row = 0;
  for (int it = 0; it < iters; ++it) {
    int d = it & 3;
    if (tiles) {
      if (d == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      const char* b0 = K + ((kt++) % ktiles) * 1024;
      const char* b1 = K + ((kt++) % ktiles) * 1024;
      _tile_loadd(4, Q + d * 64, 256);
      _tile_loadd(6, b0, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b1, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, Q + 4096 + d * 64, 256);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
      if (d == 3 && tiles == 1) {
        float* s = S[(it >> 2) & 1];
        _tile_stored(0, s, 512);
        _tile_stored(1, s + 16, 512);
        _tile_stored(2, s + 2048, 512);
        _tile_stored(3, s + 2048 + 16, 512);
      }
    }
    for (int v = 0; v < vrows; ++v) {  // one 128-key softmax row from the other S buffer
      const float* sr = S[((it >> 2) & 1) ^ 1] + (row & 31) * 128;
      uint16_t* pr = P + (row & 31) * 128;
      ++row;
      __m512 s2 = _mm512_setzero_ps();
      for (int j = 0; j < 8; j += 2) {
        __m512 e0 = exp2d3(_mm512_fmadd_ps(_mm512_load_ps(sr + j * 16), sc, nm));
        __m512 e1 = exp2d3(_mm512_fmadd_ps(_mm512_load_ps(sr + j * 16 + 16), sc, nm));
        s2 = _mm512_add_ps(s2, _mm512_add_ps(e0, e1));
        __m512bh h = _mm512_cvtne2ps_pbh(e1, e0);
        _mm512_store_si512(pr + j * 16, (__m512i)h);
      }
      sum = _mm512_add_ps(sum, s2);
    }
    ++steps;
  }
  double t = now() - t0;
  sink = _mm512_reduce_add_ps(sum);
  printf("tiles %d vrows %d kb %d: %.1f ns per step (%.2f TF/s eq)\n", tiles, vrows, kb,
         t / steps * 1e9, steps * 4 * 16384.0 / t / 1e12);
  _tile_release();
}
