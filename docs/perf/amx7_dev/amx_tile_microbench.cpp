// Throw-away AMX microbenchmark of session 7 (not built by CMake): one core, the 2x2 S pattern
// of extend_amx.cpp (2 K + 2 Q tile loads per 4 tdpbf16ps). argv[1] = KiB the K tiles rotate
// over (L1 / L2 / beyond); argv[2] = 0 loads + dots only, 1 = + tilezero/tilestored per 4 depth
// chunks (an S pass), 2 = 1 + one softmax-like row of AVX-512 work per 4 dots, 5 / 6 = 4 row
// tiles x 1 key tile (Q reloaded from L1 per row tile; 6: K double-buffered).
// g++ -O2 -march=sapphirerapids amx_tile_microbench.cpp && ./a.out 256 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
struct alignas(64) Cfg {
  uint8_t p = 1, s = 0, r[14] = {};
  uint16_t c[16] = {};
  uint8_t rows[16] = {};
};
#define LD(t, p, s) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ST(t, p, s) \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define DP(c, a, b) asm volatile("tdpbf16ps %tmm" #b ", %tmm" #a ", %tmm" #c)
#define Z(t) asm volatile("tilezero %tmm" #t)
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.c[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  int64_t kbytes = atol(argv[1]) * 1024;
  int mode = atoi(argv[2]);
  char* K = (char*)aligned_alloc(4096, kbytes);
  memset(K, 0x3a, kbytes);
  char* Q = (char*)aligned_alloc(4096, 8192);
  memset(Q, 0x3a, 8192);
  float* S = (float*)aligned_alloc(4096, 65536);
  memset(S, 0, 65536);
  int64_t tiles = kbytes / 1024;
  int64_t iters = 1 << 20;
  int64_t off = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    const char* k0 = K + (off % tiles) * 1024;
    const char* k1 = K + ((off + 1) % tiles) * 1024;
    off += 2;
    if ((mode == 1 || mode == 2) && (i & 3) == 0) {
      Z(0);
      Z(1);
      Z(2);
      Z(3);
    }
    if (mode == 5) {  // 4 row tiles x 1 key tile: 1 K load (rotating) + 4 Q loads (L1) per 4 dots
      LD(6, k0, 64);
      LD(4, Q + (i & 3) * 64, 256);
      DP(0, 4, 6);
      LD(5, Q + 1024 + (i & 3) * 64, 256);
      DP(1, 5, 6);
      LD(4, Q + 2048 + (i & 3) * 64, 256);
      DP(2, 4, 6);
      LD(5, Q + 3072 + (i & 3) * 64, 256);
      DP(3, 5, 6);
      if ((i & 3) == 0) {
      }
      continue;
    }
    if (mode == 6) {  // same, K double-buffered in tmm6/tmm7
      if (i & 1) {
        LD(7, k0, 64);
        LD(4, Q + (i & 3) * 64, 256);
        DP(0, 4, 7);
        LD(5, Q + 1024 + (i & 3) * 64, 256);
        DP(1, 5, 7);
        LD(4, Q + 2048 + (i & 3) * 64, 256);
        DP(2, 4, 7);
        LD(5, Q + 3072 + (i & 3) * 64, 256);
        DP(3, 5, 7);
      } else {
        LD(6, k0, 64);
        LD(4, Q + (i & 3) * 64, 256);
        DP(0, 4, 6);
        LD(5, Q + 1024 + (i & 3) * 64, 256);
        DP(1, 5, 6);
        LD(4, Q + 2048 + (i & 3) * 64, 256);
        DP(2, 4, 6);
        LD(5, Q + 3072 + (i & 3) * 64, 256);
        DP(3, 5, 6);
      }
      continue;
    }
    LD(4, Q + (i & 3) * 64, 256);
    LD(6, k0, 64);
    DP(0, 4, 6);
    LD(7, k1, 64);
    DP(1, 4, 7);
    LD(5, Q + 4096 + (i & 3) * 64, 256);
    DP(2, 5, 6);
    DP(3, 5, 7);
    if (mode >= 2) {
      // one softmax row: 8 vectors of S (L1), fma + exp-like polynomial + cvt + store
      float* row = S + ((i * 16) & 4095);
      __m512 acc = _mm512_setzero_ps();
      for (int v = 0; v < 8; v += 2) {
        __m512 x0 = _mm512_fmadd_ps(_mm512_loadu_ps(row + v * 16), _mm512_set1_ps(0.1f),
                                    _mm512_set1_ps(-1.f));
        __m512 x1 = _mm512_fmadd_ps(_mm512_loadu_ps(row + v * 16 + 16), _mm512_set1_ps(0.1f),
                                    _mm512_set1_ps(-1.f));
        __m512 n0 = _mm512_roundscale_ps(x0, 8), n1 = _mm512_roundscale_ps(x1, 8);
        __m512 f0 = _mm512_sub_ps(x0, n0), f1 = _mm512_sub_ps(x1, n1);
        __m512 p0 = _mm512_fmadd_ps(_mm512_set1_ps(0.01f), f0, _mm512_set1_ps(0.05f));
        __m512 p1 = _mm512_fmadd_ps(_mm512_set1_ps(0.01f), f1, _mm512_set1_ps(0.05f));
        p0 = _mm512_fmadd_ps(p0, f0, _mm512_set1_ps(0.2f));
        p1 = _mm512_fmadd_ps(p1, f1, _mm512_set1_ps(0.2f));
        p0 = _mm512_fmadd_ps(p0, f0, _mm512_set1_ps(0.7f));
        p1 = _mm512_fmadd_ps(p1, f1, _mm512_set1_ps(0.7f));
        p0 = _mm512_fmadd_ps(p0, f0, _mm512_set1_ps(1.f));
        p1 = _mm512_fmadd_ps(p1, f1, _mm512_set1_ps(1.f));
        p0 = _mm512_scalef_ps(p0, n0);
        p1 = _mm512_scalef_ps(p1, n1);
        acc = _mm512_add_ps(acc, _mm512_add_ps(p0, p1));
        __m512bh h = _mm512_cvtne2ps_pbh(p1, p0);
        _mm512_storeu_si512((void*)(Q + 8192 - 2048 + ((v * 32) & 1023)), (__m512i)h);
      }
      S[4096 + (i & 255)] = _mm512_reduce_add_ps(acc);
      if (mode == 3) continue;
    }
    if ((mode == 1 || mode == 2) && (i & 3) == 3) {
      ST(0, S, 512);
      ST(1, S + 16, 512);
      ST(2, S + 16 * 128, 512);
      ST(3, S + 16 * 128 + 16, 512);
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("K %ld KB mode %d: %.2f TFLOP/s (%.1f ns per 4 dp)\n", kbytes / 1024, mode,
         iters * 4 * 16384.0 / s / 1e12, s / iters * 1e9);
  _tile_release();
}
