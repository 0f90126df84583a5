// Session 81 (2026-12-02, AMX development VM; not part of the build). The AMX extend's tile work
// alone, in its order: per (128-key block, pair of 16-row tiles) the S pass (2x2 blocking, 4 depth
// chunks, 4 tile stores of S per 16 dots) and the P . V pass (O tiles loaded, 4 key chunks,
// stored), 8 pairs per block, 8 blocks of K/V (L2). One core, TFLOP/s of tdpbf16ps:
//   mode 0 (all) 1.47-1.52; mode 4 (no S stores) 1.88; mode 8 (no O load / store) 2.00;
//   mode 12 (neither) 2.53; mode 1 (P . V only) 1.41-1.44; from registers (sg.cpp mode 8) 3.06.
// With 8 key chunks per O load / store (the P . V chunk loop run to 8 instead of 4;
// the figure printed counts 16 dots per pass, so double it) P . V alone runs at 1.94.
// Build: g++ -O2 -march=sapphirerapids -o unit amx_unit_pattern_microbench.cpp
// Run:   ./unit PAIRS BLOCKS MODE [S_OFFSET_BYTES] [REPS]   (e.g. ./unit 8 8 0)
// tile-only unit pattern: per (block, pair): S 2x2 passes (store S), PV 2x2 passes (O load/store)
#include <immintrin.h>
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
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  int pairs = atoi(argv[1]);
  int blocks = atoi(argv[2]);
  int mode = argc > 3 ? atoi(argv[3]) : 0;
  int soff = argc > 4 ? atoi(argv[4]) : 0;
  const int D = 128, KB = 128;
  char* base = (char*)aligned_alloc(4096, 64 << 20);
  memset(base, 0, 64 << 20);
  char* Qb = base;
  char* Pb = Qb + pairs * 32 * D * 2;
  float* Ob = (float*)(Pb + pairs * 32 * KB * 2);
  float* Sb = (float*)((char*)(Ob + pairs * 32 * D) + soff);
  char* KVb = (char*)(Sb + 2 * 32 * KB) + 4096;
  for (size_t i = 0; i < (64 << 20) / 4; i += 17) ((float*)base)[i] = 0.f;
  int reps = atoi(argc > 5 ? argv[5] : "200");
  long dots = 0;
  double t0 = now();
  for (int rep = 0; rep < reps; ++rep)
    for (int b = 0; b < blocks; ++b) {
      const char* Kp = KVb + (size_t)b * 65536;
      const char* Vp = Kp + 32768;
      for (int p = 0; p < pairs; ++p) {
        const char* q0 = Qb + p * 32 * D * 2;
        const char* q1 = q0 + 16 * D * 2;
        float* s = Sb + (p & 1) * 32 * KB;
        float* s1 = s + 16 * KB;
        if (!(mode & 1))
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
        const char* p0 = Pb + p * 32 * KB * 2;
        const char* p1 = p0 + 16 * KB * 2;
        float* o0 = Ob + p * 32 * D;
        float* o1 = o0 + 16 * D;
        if (!(mode & 2))
          for (int j = 0; j < 8; j += 2) {
            if (!(mode & 8)) {
              _tile_loadd(0, o0 + j * 16, 512);
              _tile_loadd(1, o0 + j * 16 + 16, 512);
              _tile_loadd(2, o1 + j * 16, 512);
              _tile_loadd(3, o1 + j * 16 + 16, 512);
            }
            for (int kc = 0; kc < 4; ++kc) {
              _tile_loadd(4, p0 + kc * 64, 256);
              _tile_loadd(6, Vp + (kc * 8 + j) * 1024, 64);
              _tile_dpbf16ps(0, 4, 6);
              _tile_loadd(7, Vp + (kc * 8 + j + 1) * 1024, 64);
              _tile_dpbf16ps(1, 4, 7);
              _tile_loadd(5, p1 + kc * 64, 256);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
            if (!(mode & 8)) {
              _tile_stored(0, o0 + j * 16, 512);
              _tile_stored(1, o0 + j * 16 + 16, 512);
              _tile_stored(2, o1 + j * 16, 512);
              _tile_stored(3, o1 + j * 16 + 16, 512);
            }
            dots += 16;
          }
      }
    }
  double t = now() - t0;
  printf("pairs %d blocks %d mode %d soff %d: %.3f TF/s\n", pairs, blocks, mode, soff,
         dots * 16384.0 / t / 1e12);
}
