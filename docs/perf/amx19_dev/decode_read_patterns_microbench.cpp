// Decode read-pattern microbenchmark (session 19, 2026-11-24, AMX dev VM; not part of the build).
// Reads MB MiB (default 1024) in 32 KiB regions (16 pool rows of 2 KiB: one page of 16 tokens x 8
// kv heads x 128 dims bf16), regions in order or shuffled (SHUF=1), HP=1 madvise(MADV_HUGEPAGE):
//   mode 0  sequential AVX-512 sum                        11.7-15.9 GB/s per core (varies by run)
//   mode 1  tile loads in the AMX decode's order (per kv head and 32-dim chunk, 16 rows 2 KiB
//           apart) + one dot each                          12.5-15.8 (= mode 0)
//   mode 2  the same tile loads, no dot                    15.7
//   mode 3  vector copy of the region into a stage, then tile loads from the stage   12.0
//   mode 4  mode 1 + prefetcht0 of the region two ahead   12.7
//   mode 5  contiguous tile loads (stride 64)              15.0
//   mode 6  vector loads in the decode's order             14.8
//   mode 7  the decode's exact S pass (2 kv heads per step, Q^T tiles, S^T tile stores)  13.8-14.0
//   mode 8  mode 7 + prefetcht0 of the next region        8.7
// Shuffled regions read as fast as ordered ones; a 64 MiB buffer (LLC) 26-28 GB/s per core.
// Build: g++ -O2 -fopenmp -mamx-tile -mamx-bf16 -mavx512f -o rd decode_read_patterns_microbench.cpp
// Run:   OMP_NUM_THREADS=1 [SHUF=1] [MB=64] ./rd MODE
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
struct alignas(64) Cfg {
  uint8_t pal = 1, start = 0;
  uint8_t res[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static void cfg(int mode) {
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  if (mode >= 7) {
    for (int t : {0, 1, 4, 5}) c.colsb[t] = 16;
  }
  _tile_loadconfig(&c);
}
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  const size_t bytes = size_t(getenv("MB") ? atoi(getenv("MB")) : 1024) << 20;  // 1 GiB
  char* buf = (char*)aligned_alloc(1 << 21, bytes);
  if (getenv("HP")) madvise(buf, bytes, MADV_HUGEPAGE);
  memset(buf, 1, bytes);
  int mode = atoi(argv[1]);
  int nt = omp_get_max_threads();
  const size_t region = 32768;  // 16 rows x 2 KiB
  double best = 1e9;
  float sink = 0;
  for (int rep = 0; rep < (getenv("REPS") ? atoi(getenv("REPS")) : 5); ++rep) {
    double t0 = now();
#pragma omp parallel reduction(+ : sink)
    {
      int tid = omp_get_thread_num();
      size_t per = bytes / nt;
      char* b = buf + tid * per;
      char* e = b + per;
      alignas(64) static thread_local char stage[32768];
      alignas(64) static thread_local char qbuf[16384];
      alignas(64) static thread_local char sbuf[16384];
      if (mode >= 1) cfg(mode);
      __m512 acc = _mm512_setzero_ps();
      size_t nreg = per / region;
      static thread_local std::vector<size_t> perm;
      if (perm.empty()) {
        perm.resize(nreg);
        for (size_t i = 0; i < nreg; ++i) perm[i] = i;
        if (getenv("SHUF")) {
          uint64_t s = tid * 7 + 1;
          for (size_t i = nreg - 1; i > 0; --i) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t j = (s >> 33) % (i + 1);
            std::swap(perm[i], perm[j]);
          }
        }
      }
      for (size_t ri = 0; ri < nreg; ++ri) {
        char* r = b + perm[ri] * region;
        if (mode == 0) {
          for (size_t o = 0; o < region; o += 64)
            acc = _mm512_add_ps(acc, _mm512_load_ps((float*)(r + o)));
        } else if (mode == 1) {  // tile loads in decode order: 8 heads, 4 chunks, rows stride 2KiB
          for (int h = 0; h < 8; ++h)
            for (int c = 0; c < 4; ++c) {
              _tile_loadd(2, r + h * 256 + c * 64, 2048);
              _tile_dpbf16ps(0, 2, 4);
            }
        } else if (mode == 2) {  // tile loads only, no dot
          for (int h = 0; h < 8; ++h)
            for (int c = 0; c < 4; ++c) {
              _tile_loadd(2, r + h * 256 + c * 64, 2048);
            }
        } else if (mode ==
                   3) {  // vector copy into stage then tile loads from stage (stage rows 2KiB)
          for (size_t o = 0; o < region; o += 64)
            _mm512_store_ps((float*)(stage + o), _mm512_load_ps((float*)(r + o)));
          for (int h = 0; h < 8; ++h)
            for (int c = 0; c < 4; ++c) {
              _tile_loadd(2, stage + h * 256 + c * 64, 2048);
              _tile_dpbf16ps(0, 2, 4);
            }
        } else if (mode == 4) {  // tile loads with prefetcht0 of next region sequential
          for (size_t o = 0; o < region; o += 64) _mm_prefetch(r + region * 2 + o, _MM_HINT_T0);
          for (int h = 0; h < 8; ++h)
            for (int c = 0; c < 4; ++c) {
              _tile_loadd(2, r + h * 256 + c * 64, 2048);
              _tile_dpbf16ps(0, 2, 4);
            }
        } else if (mode == 5) {  // tile loads, row-major order: a tile = 16 rows x 64B but iterate
                                 // r by row chunk? contiguous tiles (stride 64)
          for (int i = 0; i < 32; ++i) {
            _tile_loadd(2, r + i * 1024, 64);
            _tile_dpbf16ps(0, 2, 4);
          }
        } else if (mode == 7 ||
                   mode == 8) {  // exact S pass: tmm0,1 acc (16x16B), tmm2,3 K, tmm4,5 Q^T (16x16B)
          for (int h = 0; h < 8; h += 2) {
            _tile_zero(0);
            _tile_zero(1);
            for (int c = 0; c < 4; ++c) {
              _tile_loadd(2, r + h * 256 + c * 64, 2048);
              _tile_loadd(4, qbuf + (h * 4 + c) * 256, 16);
              _tile_loadd(3, r + (h + 1) * 256 + c * 64, 2048);
              _tile_loadd(5, qbuf + ((h + 1) * 4 + c) * 256, 16);
              _tile_dpbf16ps(0, 2, 4);
              _tile_dpbf16ps(1, 3, 5);
            }
            _tile_stored(0, sbuf + h * 256, 16);
            _tile_stored(1, sbuf + (h + 1) * 256, 16);
            if (mode == 8) {
              for (int i = 0; i < 16; ++i)
                _mm_prefetch(r + region + (h / 2) * 8192 + i * 512, _MM_HINT_T0);
            }
          }
        } else if (mode == 6) {  // vector loads in decode order (stride 2KiB)
          for (int h = 0; h < 8; ++h)
            for (int c = 0; c < 4; ++c)
              for (int row = 0; row < 16; ++row)
                acc =
                    _mm512_add_ps(acc, _mm512_load_ps((float*)(r + row * 2048 + h * 256 + c * 64)));
        }
      }
      float t[16];
      _mm512_storeu_ps(t, acc);
      sink += t[0];
      if (mode >= 1) _tile_release();
    }
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  printf("mode %d threads %d: %.2f GB/s (sink %g)\n", mode, nt, bytes / best / 1e9, sink);
}
