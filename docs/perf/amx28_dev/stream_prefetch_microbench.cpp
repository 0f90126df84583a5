#include <immintrin.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
// Stream a buffer; per 1 KiB chunk do W dependent-ish zmm FMA work that consumes the chunk.
// prefetch mode: 0 none, 1 T0, 2 T1, 3 T2, 4 NTA at distance D bytes, one prefetch per line.
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main(int argc, char** argv) {
  size_t bytes = (size_t)1 << 30;
  int W = atoi(argv[1]);
  int mode = atoi(argv[2]);
  long D = atol(argv[3]);
  int hot = argc > 4 ? atoi(argv[4]) : 0;
  size_t sz = hot ? (1 << 20) : bytes;
  char* p = (char*)aligned_alloc(1 << 21, bytes);
  madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 1, bytes);
  __m512 acc[8];
  for (int i = 0; i < 8; i++) acc[i] = _mm512_set1_ps(0.f);
  __m512 m = _mm512_set1_ps(1.0001f);
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    size_t total = 0;
    for (size_t pass = 0; total < bytes; pass++) {
      for (size_t off = 0; off < sz; off += 1024) {
        const char* c = p + off;
        for (int l = 0; l < 16; l++) {
          if (mode) {
            const char* q = c + l * 64 + D;
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
          __m512 x = _mm512_load_ps((const float*)(c + l * 64));
          acc[l & 7] = _mm512_add_ps(acc[l & 7], x);
        }
        for (int w = 0; w < W; w++) {
          for (int i = 0; i < 8; i++) acc[i] = _mm512_fmadd_ps(acc[i], m, acc[(i + 1) & 7]);
        }
      }
      total += sz;
    }
    double t = now() - t0;
    if (t < best) best = t;
  }
  float s = 0;
  for (int i = 0; i < 8; i++) s += _mm512_reduce_add_ps(acc[i]);
  printf("W=%d mode=%d D=%ld hot=%d: %.2f GB/s (%g)\n", W, mode, D, hot, bytes / best / 1e9, s);
}
