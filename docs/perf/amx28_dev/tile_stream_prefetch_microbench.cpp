#include <immintrin.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
struct alignas(64) Cfg {
  uint8_t palette = 1, start = 0;
  uint8_t r0[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  size_t bytes = (size_t)1 << 30;
  int W = atoi(argv[1]);
  int mode = atoi(argv[2]);
  long D = atol(argv[3]);
  int hot = argc > 4 ? atoi(argv[4]) : 0;
  size_t sz = hot ? (1 << 20) : bytes;
  char* p = (char*)aligned_alloc(1 << 21, bytes);
  madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 0, bytes);
  Cfg c;
  for (int i = 0; i < 8; i++) {
    c.colsb[i] = 64;
    c.rows[i] = 16;
  }
  _tile_loadconfig(&c);
  alignas(64) static char z[1024] = {};
  _tile_loadd(1, z, 64);
  _tile_loadd(7, z, 64);
  _tile_zero(2);
  _tile_zero(3);
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    size_t total = 0;
    while (total < bytes) {
      for (size_t off = 0; off < sz; off += 2048) {
        const char* ch = p + off;
        if (mode) {
          for (int l = 0; l < 32; l++) {
            const char* q = ch + l * 64 + D;
            if (q < p + sz) {
              if (mode == 1)
                _mm_prefetch(q, _MM_HINT_T0);
              else if (mode == 2)
                _mm_prefetch(q, _MM_HINT_T1);
              else if (mode == 3)
                _mm_prefetch(q, _MM_HINT_T2);
              else
                _mm_prefetch(q, _MM_HINT_NTA);
            }
          }
        }
        _tile_loadd(0, ch, 64);
        _tile_loadd(4, ch + 1024, 64);
        _tile_dpbf16ps(2, 0, 1);
        _tile_dpbf16ps(3, 4, 1);
        for (int w = 0; w < W; w++) {
          _tile_dpbf16ps(5, 1, 7);
          _tile_dpbf16ps(6, 1, 7);
        }
      }
      total += sz;
    }
    double t = now() - t0;
    if (t < best) best = t;
  }
  alignas(64) float o[256];
  _tile_stored(2, o, 64);
  printf("W=%d mode=%d D=%ld hot=%d: %.2f GB/s (%g)\n", W, mode, D, hot, bytes / best / 1e9, o[0]);
  _tile_release();
}
