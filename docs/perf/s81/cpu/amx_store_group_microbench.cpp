// Session 81 (2026-12-02, AMX development VM; not part of the build). S-pass shapes, one core,
// TFLOP/s (K buffer 32 KiB / 256 KiB): 2x2 with 4 stores per 16 dots 1.93 / 1.83; without stores
// 2.47 / 2.40; 1x6 (one B tile, 6 accumulators, 6 stores per 24 dots) 2.05 / 1.53; 1x5 2.03;
// from registers 3.06 (with 4 stores per 16 dots 1.76).
// Build: g++ -O2 -mamx-tile -mamx-bf16 -mavx512f -o sg amx_store_group_microbench.cpp
// Run:   ./sg MODE [K_KIB]
// store-group microbench: S pass variants, one core
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
alignas(64) static float S[64 * 1024];
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  int mode = atoi(argv[1]);
  int kb = argc > 2 ? atoi(argv[2]) : 32;  // K buffer KiB
  memset(Q, 1, sizeof Q);
  memset(K, 1, sizeof K);
  const int ktiles = kb;  // 1 KiB tiles
  long dots = 0;
  double t0 = now();
  int iters = 200000;
  int kt = 0;
  for (int it = 0; it < iters; ++it) {
    if (mode == 0) {  // 2x2, 16 dots, 4 stores
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int d = 0; d < 4; ++d) {
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
      }
      _tile_stored(0, S, 512);
      _tile_stored(1, S + 16, 512);
      _tile_stored(2, S + 2048, 512);
      _tile_stored(3, S + 2048 + 16, 512);
      dots += 16;
    } else if (mode == 1) {  // 2x2 no stores
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int d = 0; d < 4; ++d) {
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
      }
      dots += 16;
    } else if (mode == 2) {  // 1x6 single B buffer: 24 dots, 6 stores
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_zero(4);
      _tile_zero(5);
      for (int d = 0; d < 4; ++d) {
        _tile_loadd(6, Q + d * 64, 256);
#define B6(J)                                       \
  _tile_loadd(7, K + ((kt++) % ktiles) * 1024, 64); \
  _tile_dpbf16ps(J, 6, 7);
        B6(0) B6(1) B6(2) B6(3) B6(4) B6(5)
      }
      for (int j = 0; j < 6; ++j) {
      }
      _tile_stored(0, S, 512);
      _tile_stored(1, S + 16, 512);
      _tile_stored(2, S + 32, 512);
      _tile_stored(3, S + 48, 512);
      _tile_stored(4, S + 64, 512);
      _tile_stored(5, S + 80, 512);
      dots += 24;
    } else if (mode == 3) {  // 1x5, double B buffer: 20 dots, 5 stores
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_zero(4);
      for (int d = 0; d < 4; ++d) {
        _tile_loadd(5, Q + d * 64, 256);
#define B5(J, T)                                    \
  _tile_loadd(T, K + ((kt++) % ktiles) * 1024, 64); \
  _tile_dpbf16ps(J, 5, T);
        B5(0, 6) B5(1, 7) B5(2, 6) B5(3, 7) B5(4, 6)
      }
      _tile_stored(0, S, 512);
      _tile_stored(1, S + 16, 512);
      _tile_stored(2, S + 32, 512);
      _tile_stored(3, S + 48, 512);
      _tile_stored(4, S + 64, 512);
      dots += 20;
    } else if (mode == 4) {  // 1x6 no stores
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_zero(4);
      _tile_zero(5);
      for (int d = 0; d < 4; ++d) {
        _tile_loadd(6, Q + d * 64, 256);
        B6(0) B6(1) B6(2) B6(3) B6(4) B6(5)
      }
      dots += 24;
    } else if (mode == 5) {  // 2x2 with 2 passes' worth of stores deferred? store only every other
                             // pass (wrong data, cost probe)
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int d = 0; d < 4; ++d) {
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
      }
      if (it & 1) {
        _tile_stored(0, S, 512);
        _tile_stored(1, S + 16, 512);
        _tile_stored(2, S + 2048, 512);
        _tile_stored(3, S + 2048 + 16, 512);
      }
      dots += 16;
    } else if (mode == 6) {  // 2x2 stores only 1 tile per pass
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int d = 0; d < 4; ++d) {
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
      }
      _tile_stored(0, S, 512);
      dots += 16;
    } else if (mode == 7) {  // from registers: 16 dots + 4 stores
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int d = 0; d < 4; ++d) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, S, 512);
      _tile_stored(1, S + 16, 512);
      _tile_stored(2, S + 2048, 512);
      _tile_stored(3, S + 2048 + 16, 512);
      dots += 16;
    } else if (mode == 8) {  // from registers no stores
      for (int d = 0; d < 4; ++d) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      dots += 16;
    } else if (mode == 9) {  // registers, stores to 4 distinct far buffers
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int d = 0; d < 4; ++d) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, S, 64);
      _tile_stored(1, S + 256, 64);
      _tile_stored(2, S + 512, 64);
      _tile_stored(3, S + 768, 64);
      dots += 16;
    }
  }
  double t = now() - t0;
  printf("mode %d kb %d: %.3f TFLOP/s, %.1f ns per 16 dots\n", mode, kb, dots * 16384.0 / t / 1e12,
         t / dots * 16 * 1e9);
  _tile_release();
}
