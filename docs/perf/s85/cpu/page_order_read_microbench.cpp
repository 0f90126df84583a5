// Session 85 (2026-12-03, AMX development VM; not part of the build). How fast two threads read
// 1 GiB laid out as the decode bench's pool pages (32 KiB = page 16 x 8 kv heads x d 128 bf16),
// without any attention math: pages in address order, pages shuffled (the bench's default), and
// shuffled pages read with software prefetch of the next page or with 2 / 4 pages interleaved.
// Each figure is against a 2-thread memcpy of the same 1 GiB in the same process (bytes read +
// written, as the bench's cpu_copy ceiling; the bench's own copy ceiling read 41.7-44.5 GB/s the
// same hour, its read-only ceiling 28.7-29.9). Three rounds, figures in docs/perf/amx_notes.md
// "Session 85":
//
//   in order 26.1-26.8 GB/s; shuffled 22.3-23.7; shuffled + prefetcht0 of the whole next page
//   17.9-19.0; + prefetcht2 of the next page / the one after 18.3-22.0 / 20.5-21.3; 2 or 4 pages
//   interleaved 25.7-26.8 (copy 37.5-40.3 GB/s in the same process): interleaving gives shuffled
//   pages back their in-order rate, software prefetch of whole pages costs 5-20%, and no reader of
//   this layout gets near 70% of the bench's copy (29-31 GB/s).
//
// Build: g++ -O2 -fopenmp -mavx512f -o rd <this file>
// Run: OMP_PROC_BIND=spread OMP_PLACES=cores ./rd
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
constexpr size_t kPage = 32768;
constexpr size_t kPages = (size_t{1} << 30) / kPage;
constexpr const char* kModes[] = {"in order",
                                  "shuffled",
                                  "shuffled + prefetcht0 next page",
                                  "shuffled + prefetcht2 next page",
                                  "shuffled + prefetcht2 page after next",
                                  "shuffled, 2 pages interleaved",
                                  "shuffled, 4 pages interleaved"};

// Sums `n` pages (each read in address order, the pages' 64-byte lines interleaved) into acc.
template <int kN>
static void read_pages(const char* const* p, __m512* acc) {
  for (size_t o = 0; o < kPage; o += 128) {
    for (int i = 0; i < kN; ++i) {
      acc[2 * i] = _mm512_add_ps(acc[2 * i], _mm512_load_ps(p[i] + o));
      acc[2 * i + 1] = _mm512_add_ps(acc[2 * i + 1], _mm512_load_ps(p[i] + o + 64));
    }
  }
}

int main() {
  char* src = static_cast<char*>(aligned_alloc(2 << 20, kPages * kPage));
  char* dst = static_cast<char*>(aligned_alloc(2 << 20, kPages * kPage));
  memset(src, 1, kPages * kPage);
  memset(dst, 2, kPages * kPage);
  std::vector<size_t> order(kPages);
  for (size_t i = 0; i < kPages; ++i) order[i] = i;
  std::mt19937 rng(1);
  std::shuffle(order.begin(), order.end(), rng);
  float sink = 0.f;
  for (int round = 0; round < 3; ++round) {
    const double t0 = now();
#pragma omp parallel num_threads(2)
    {
      const size_t half = kPages * kPage / 2;
      const size_t t = static_cast<size_t>(omp_get_thread_num());
      memcpy(dst + t * half, src + t * half, half);
    }
    const double copy = 2.0 * kPages * kPage / (now() - t0) / 1e9;
    printf("round %d: copy (r + w) %.1f GB/s\n", round, copy);
    for (int mode = 0; mode < 7; ++mode) {
      const int group = mode == 5 ? 2 : mode == 6 ? 4 : 1;
      const double t1 = now();
#pragma omp parallel num_threads(2) reduction(+ : sink)
      {
        const size_t t = static_cast<size_t>(omp_get_thread_num());
        const size_t lo = t * kPages / 2;
        const size_t hi = (t + 1) * kPages / 2;
        __m512 acc[8];
        for (auto& a : acc) a = _mm512_setzero_ps();
        for (size_t i = lo; i + group <= hi; i += group) {
          const char* p[4];
          for (int j = 0; j < group; ++j) p[j] = src + (mode == 0 ? i + j : order[i + j]) * kPage;
          const size_t ahead = mode == 4 ? 2 : 1;
          if (mode >= 2 && mode <= 4 && i + ahead < hi) {
            const char* q = src + order[i + ahead] * kPage;
            for (size_t o = 0; o < kPage; o += 64) {
              if (mode == 2) {
                _mm_prefetch(q + o, _MM_HINT_T0);
              } else {
                _mm_prefetch(q + o, _MM_HINT_T2);
              }
            }
          }
          if (group == 1) read_pages<1>(p, acc);
          if (group == 2) read_pages<2>(p, acc);
          if (group == 4) read_pages<4>(p, acc);
        }
        __m512 s = acc[0];
        for (int a = 1; a < 8; ++a) s = _mm512_add_ps(s, acc[a]);
        sink += _mm512_reduce_add_ps(s);
      }
      const double gbs = kPages * kPage / (now() - t1) / 1e9;
      printf("  %-40s %5.1f GB/s  %3.0f%% of copy\n", kModes[mode], gbs, 100.0 * gbs / copy);
    }
  }
  printf("(checksum %g)\n", sink);
  return 0;
}
