// Read-only bandwidth, 1..8 concurrent streams per thread (each thread's share split into S
// contiguous parts read in lockstep), AVX-512 loads; optional software prefetch distance (bytes).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
__attribute__((target("avx512f"))) static __m512i sum_streams(const char* p, int64_t bytes, int s,
                                                              int64_t pf) {
  const int64_t part = bytes / s / 256 * 256;
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (int64_t off = 0; off < part; off += 256) {
    for (int j = 0; j < s; ++j) {
      const char* q = p + j * part + off;
      if (pf)
        _mm_prefetch(q + pf, _MM_HINT_T0), _mm_prefetch(q + pf + 64, _MM_HINT_T0),
            _mm_prefetch(q + pf + 128, _MM_HINT_T0), _mm_prefetch(q + pf + 192, _MM_HINT_T0);
      acc[j] = _mm512_add_epi64(acc[j], _mm512_load_si512(q));
      acc[j] = _mm512_add_epi64(acc[j], _mm512_load_si512(q + 64));
      acc[j] = _mm512_add_epi64(acc[j], _mm512_load_si512(q + 128));
      acc[j] = _mm512_add_epi64(acc[j], _mm512_load_si512(q + 192));
    }
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm512_add_epi64(acc[0], acc[j]);
  return acc[0];
}
volatile long long sink;
int main(int argc, char** argv) {
  const int64_t bytes = int64_t(512) << 20;
  char* buf = static_cast<char*>(std::aligned_alloc(4096, bytes));
  const int T = omp_get_max_threads();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < bytes; i += 4096) std::memset(buf + i, 1, 4096);
  for (int rep = 0; rep < 3; ++rep)
    for (int s : {1, 2, 4, 8})
      for (int64_t pf : {0, 512, 2048}) {
        std::vector<double> g;
        for (int r = 0; r < 5; ++r) {
          auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(T)
          {
            const int t = omp_get_thread_num();
            const int64_t share = bytes / T;
            __m512i a = sum_streams(buf + t * share, share, s, pf);
            sink = _mm512_reduce_add_epi64(a);
          }
          auto t1 = std::chrono::steady_clock::now();
          g.push_back(bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
        }
        std::sort(g.begin(), g.end());
        std::printf("rep %d streams %d pf %5lld: median %.1f best %.1f GB/s\n", rep, s,
                    (long long)pf, g[2], g[4]);
      }
}
