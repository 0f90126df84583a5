// Session 82 (2026-12-03, AMX development VM; not part of the build). The AMX extend's tile work
// alone with P . V deferred over SEG 128-key blocks (O tiles loaded / stored once per segment), in
// block-major (order 0, the kernel's) or pair-major (order 1) order; 8 pairs, 16 blocks of K/V
// (L2), thread CPU time, best of 5 rounds, TFLOP/s of tdpbf16ps on one core (measured while CI
// compiled on the other core). Seg 1: 1.55-1.59. Seg 2: 1.79-1.82 (order 1: 1.75). Seg 4:
// 1.74-1.85 (order 1: 1.85-1.89). Seg 8: 1.57-1.72. Mode 4 (no S stores): seg 1 1.99, seg 4
// pair-major 2.24. Mode 8 (no O traffic): seg 1 2.14. Mode 12 (neither): 2.59-2.67.
// Build: g++ -O2 -march=sapphirerapids -o seg amx_pv_segment_microbench.cpp
// Run:   ./seg PAIRS BLOCKS SEG ORDER [MODE] [REPS]   (e.g. ./seg 8 16 4 0)
#include <immintrin.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  int pairs = atoi(argv[1]), blocks = atoi(argv[2]), seg = atoi(argv[3]), order = atoi(argv[4]);
  int mode = argc > 5 ? atoi(argv[5]) : 0;
  int reps = argc > 6 ? atoi(argv[6]) : 50;
  const int D = 128, KB = 128;
  const int KS = KB * seg;
  char* base = (char*)aligned_alloc(4096, 256 << 20);
  memset(base, 0, 256 << 20);
  char* Qb = base;
  char* Pb = Qb + pairs * 32 * D * 2;  // per pair [32, KS] bf16 (pair-major: one shared)
  size_t pbytes = (size_t)(order ? 1 : pairs) * 32 * KS * 2;
  float* Ob = (float*)(Pb + pbytes + 4096);
  float* Sb = (float*)((char*)(Ob + pairs * 32 * D) + 4096 + 256);
  char* KVb = (char*)(Sb + 2 * 32 * KB) + 4096;
  long dots = 0;
  auto spass = [&](const char* q0, const char* Kp, float* s) {
    const char* q1 = q0 + 16 * D * 2;
    float* s1 = s + 16 * KB;
    for (int kt = 0; kt < 8; kt += 2) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int cc = 0; cc < 4; ++cc) {
        _tile_loadd(4, q0 + cc * 64, 256);
        _tile_loadd(6, Kp + (cc * 8 + kt) * 1024, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, Kp + (cc * 8 + kt + 1) * 1024, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, q1 + cc * 64, 256);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      if (!(mode & 4)) {
        _tile_stored(0, s + kt * 16, 512);
        _tile_stored(1, s + kt * 16 + 16, 512);
        _tile_stored(2, s1 + kt * 16, 512);
        _tile_stored(3, s1 + kt * 16 + 16, 512);
      }
      dots += 16;
    }
  };
  // P . V over nb blocks starting at block b0 (P columns from pcol0 in a [32, KS] buffer)
  auto pv = [&](const char* p0, int pstride, float* o0, int b0, int nb) {
    const char* p1 = p0 + 16 * pstride;
    float* o1 = o0 + 16 * D;
    for (int j = 0; j < 8; j += 2) {
      if (!(mode & 8)) {
        _tile_loadd(0, o0 + j * 16, 512);
        _tile_loadd(1, o0 + j * 16 + 16, 512);
        _tile_loadd(2, o1 + j * 16, 512);
        _tile_loadd(3, o1 + j * 16 + 16, 512);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int b = 0; b < nb; ++b) {
        const char* Vp = KVb + (size_t)(b0 + b) * 65536 + 32768;
        for (int kc = 0; kc < 4; ++kc) {
          int col = (b * 4 + kc) * 64;
          _tile_loadd(4, p0 + col, pstride);
          _tile_loadd(6, Vp + (kc * 8 + j) * 1024, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(7, Vp + (kc * 8 + j + 1) * 1024, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_loadd(5, p1 + col, pstride);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        dots += 16;
      }
      if (!(mode & 8)) {
        _tile_stored(0, o0 + j * 16, 512);
        _tile_stored(1, o0 + j * 16 + 16, 512);
        _tile_stored(2, o1 + j * 16, 512);
        _tile_stored(3, o1 + j * 16 + 16, 512);
      }
    }
  };
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    dots = 0;
    double t0 = now();
    for (int rep = 0; rep < reps; ++rep) {
      if (order == 0) {  // block-major: per block, per pair: S then P.V over seg blocks when the
                         // segment closes
        for (int b = 0; b < blocks; ++b) {
          for (int p = 0; p < pairs; ++p) {
            spass(Qb + p * 32 * D * 2, KVb + (size_t)b * 65536, Sb + (p & 1) * 32 * KB);
            if (b % seg == seg - 1)
              pv(Pb + (size_t)p * 32 * KS * 2, KS * 2, Ob + p * 32 * D, b - seg + 1, seg);
          }
        }
      } else {  // pair-major
        for (int p = 0; p < pairs; ++p)
          for (int b = 0; b < blocks; ++b) {
            spass(Qb + p * 32 * D * 2, KVb + (size_t)b * 65536, Sb + (b & 1) * 32 * KB);
            if (b % seg == seg - 1) pv(Pb, KS * 2, Ob + p * 32 * D, b - seg + 1, seg);
          }
      }
    }
    double t = now() - t0;
    double tf = dots * 16384.0 / t / 1e12;
    if (tf > best) best = tf;
  }
  printf("pairs %d blocks %d seg %d order %d mode %d: best %.3f TF/s\n", pairs, blocks, seg, order,
         mode, best);
}
