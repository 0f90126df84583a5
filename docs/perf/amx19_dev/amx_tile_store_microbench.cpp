// AMX tile-pipelining microbenchmark (session 19, 2026-11-24, AMX dev VM; not part of the build).
// One core, operands from a buffer of KB kilobytes (L1/L2 resident), TFLOP/s of tdpbf16ps
// ("cycles/dot@3.0GHz" is ns x 3, not core cycles: the core runs ~3.7 GHz in mode 3):
//   mode 3  2x2 dots from registers only (the tile unit's own rate: 3.78 TFLOP/s on one core,
//           3.37 per core with both cores busy, as the bench's cpu_amx_bf16_peak)
//   mode 0  2x2 blocking, 4 tile loads per 4 dots (the kernel's micro-step): 3.06 (16 KB), 2.2 (256
//   KB) mode 1  1x2 double-buffered operands: 3.06 / 1.70 mode 4  B loads only (A kept in
//   registers): 3.06 / 3.47 mode 5  P.V-like (O loaded at the start and stored after 4 key
//   chunks): 2.26 / 1.83 mode 6/7  the extend kernel's S pass of a row-tile pair over a 128-key
//   block (zero, 4 depth
//           chunks, 4 tile stores per 16 dots): 1.17-1.27 / one pair 1.3-1.8
//   mode 8  mode 6 with switches: NOST=1 (no zero, no stores) 2.6-2.8; NOS=1 (no stores) 2.6-2.7;
//           NOZ=1 (no zero) same as with it; ST1=1 (1 store per 16 dots) 1.77; STQ=1 (store the
//           operand tiles instead of the accumulators) 1.09; CS=1 / OFF= (store layout and offset)
//           no effect. So each group of tile stores stalls ~50-80 ns whatever is stored.
//   mode 9  mode 0 (32 KB) with vector work after each 4-dot micro-step: VI=N independent zmm FMAs
//           (8 accumulators), VR=N roundscale / scalef, VW=N a dependent FMA chain, VL / VS vector
//           loads / stores; NOTILE=1 the vector work alone. Micro-step alone 24.0 per dot; VI=64
//           alone 19.3, both 32.9-34.3; VI=256 alone 79.2, both 91-96; VR=64 alone 46, both 56;
//           VS=16 +4.6; VW chains overlap (max, not sum). (09:55Z.) Independent zmm FMAs ran at
//           ~0.65 per core cycle then; at 10:50Z, quiet, at ~1.7 (VI=256 alone 33, VI=64 alone 9.4,
//           VI=64 with the micro-step 27.6 = full overlap, VI=256 with it 47.6 = partial).
//   modes 10-12 (session 20, 12:45Z, the same VM): mode 6's S pass with two accumulator sets
//           (tmm0-1 / tmm2-3) alternating by key tile, 2x1 blocking (Q tiles reloaded per depth,
//           1.5 tile loads per dot): 10 = each set stores after its dots 1.44-1.49; 11 = no stores
//           2.07-2.14 (2x2 without stores: 2.31-2.33); 12 = the previous set's stores issued after
//           the current set's first dots 1.50-1.51; mode 8 in the same runs 1.20. In the extend
//           kernel (scores_micro / scores_pair in this form, test_intel_amx 311 passed) the 2k
//           causal prefill got slower, 29.3-32.2 vs 26.7-26.9 ms (2 threads, 4 alternated pairs):
//           twice the micro-steps between the softmax rows and 1.5x the tile loads; reverted.
// The core's state moves between runs on this shared VM: at 10:35Z mode 3 read 2.55 instead of
// 3.78 (clock or a shared tile unit); the ratios held (mode 0 at 16 KB 2.55, mode 8 1.13, with
// NOS=1 2.29).
// Build: g++ -O2 -mamx-tile -mamx-bf16 -mavx512f -o tp amx_tile_store_microbench.cpp
// Run:   ./tp MODE KB   (e.g. ./tp 8 256; NOS=1 ./tp 8 256; NOTILE=1 VI=64 ./tp 9 32)
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
// One 2 x 2 micro-step, the extend kernel's: A tiles (rows a0, a1; stride sa) in tmm4 / tmm5, B
// tiles (b0, b1; stride 64) in tmm6 / tmm7, four dots into tmm0-3.
static inline void step2x2(const char* a0, const char* a1, int sa, const char* b0, const char* b1) {
  _tile_loadd(4, a0, sa);
  _tile_loadd(6, b0, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b1, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a1, sa);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}
static inline void zero4() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
// Session 20 (modes 10-12): one key tile of the S pass on accumulator set (A, B): zero, 4 depth
// chunks of 2 dots (Q rows 0-15 / 16-31 from q0 + 4096, stride 256; K tile k0 + cc x 8 KB), then
// (mode 10) its own stores, or (mode 12) the other set's (C, D) stores of `prev` after depth 0.
// A macro: the _tile_* intrinsics take their tile numbers as literal tokens.
#define S_SET(NAME, A, B, C, D)                                                                \
  static inline long NAME(const char* q0, const char* k0, int mode, float* prev, float* own) { \
    _tile_zero(A);                                                                             \
    _tile_zero(B);                                                                             \
    for (int cc = 0; cc < 4; ++cc) {                                                           \
      _tile_loadd(4, q0 + cc * 64, 256);                                                       \
      _tile_loadd(6, k0 + cc * 8 * 1024, 64);                                                  \
      _tile_dpbf16ps(A, 4, 6);                                                                 \
      _tile_loadd(5, q0 + 4096 + cc * 64, 256);                                                \
      _tile_dpbf16ps(B, 5, 6);                                                                 \
      if (mode == 12 && cc == 0 && prev != nullptr) {                                          \
        _tile_stored(C, prev, 512);                                                            \
        _tile_stored(D, prev + 16 * 128, 512);                                                 \
      }                                                                                        \
    }                                                                                          \
    if (mode == 10) {                                                                          \
      _tile_stored(A, own, 512);                                                               \
      _tile_stored(B, own + 16 * 128, 512);                                                    \
    }                                                                                          \
    return 8;                                                                                  \
  }
S_SET(s_set_01, 0, 1, 2, 3)
S_SET(s_set_23, 2, 3, 0, 1)
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  int mode = atoi(argv[1]);
  long kb = atol(argv[2]);
  size_t bytes = kb * 1024;
  char* a = (char*)aligned_alloc(4096, bytes);
  char* q = (char*)aligned_alloc(4096, 65536);
  for (size_t i = 0; i < bytes; ++i) a[i] = (char)(i * 7);
  for (int i = 0; i < 65536; ++i) q[i] = (char)(i * 3);
  float* o = (float*)aligned_alloc(4096, 1 << 20);
  memset(o, 0, 1 << 20);
  const long tiles = bytes / 1024;
  long dots = 0;
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = now();
    dots = 0;
    for (int it = 0; it < 200; ++it) {
      if (mode == 0) {  // 2x2: 4 acc (0-3), A 4,5 (q, L1), B 6,7 (a buffer)
        zero4();
        for (long t = 0; t + 1 < tiles; t += 2) {
          int qi = (t >> 1) & 15;
          step2x2(q + qi * 2048, q + qi * 2048 + 1024, 64, a + t * 1024, a + (t + 1) * 1024);
          dots += 4;
        }
      } else if (mode ==
                 1) {  // 1x2 double-buffered: acc 0,1 ; set X: A4 B5 B6? use A2,B3,B4 / A5,B6,B7
        _tile_zero(0);
        _tile_zero(1);
        for (long t = 0; t + 3 < tiles; t += 4) {
          int qi = (t >> 2) & 15;
          _tile_loadd(2, q + qi * 2048, 64);
          _tile_loadd(3, a + t * 1024, 64);
          _tile_loadd(4, a + (t + 1) * 1024, 64);
          _tile_dpbf16ps(0, 2, 3);
          _tile_dpbf16ps(1, 2, 4);
          _tile_loadd(5, q + qi * 2048 + 1024, 64);
          _tile_loadd(6, a + (t + 2) * 1024, 64);
          _tile_loadd(7, a + (t + 3) * 1024, 64);
          _tile_dpbf16ps(0, 5, 6);
          _tile_dpbf16ps(1, 5, 7);
          dots += 4;
        }
      } else if (mode == 2) {  // 2x2 but accumulators 2 sets? : acc 0,1 (row0: B6,B7), acc 2,3
                               // row1; A ping-pong 4/5 per step, B 6,7
        zero4();
        for (long t = 0; t + 1 < tiles; t += 2) {
          int qi = (t >> 1) & 15;
          _tile_loadd(6, a + t * 1024, 64);
          _tile_loadd(7, a + (t + 1) * 1024, 64);
          _tile_loadd(4, q + qi * 2048, 64);
          _tile_loadd(5, q + qi * 2048 + 1024, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
          dots += 4;
        }
      } else if (mode == 3) {  // 2x2 from registers only (peak)
        for (long t = 0; t + 1 < tiles; t += 2) {
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
          dots += 4;
        }
      } else if (mode == 4) {  // 2x2 with only B loads (A fixed in regs)
        for (long t = 0; t + 1 < tiles; t += 2) {
          _tile_loadd(6, a + t * 1024, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(2, 5, 6);
          _tile_loadd(7, a + (t + 1) * 1024, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
          dots += 4;
        }
      } else if (mode == 6 || mode == 7 || mode == 8) {
        // The extend kernel's S pass of a row-tile pair over a 128-key block (32 KB = 32 tiles:
        // 4 depth chunks x 8 key tiles), 8 pairs per block (mode 7: one); Q stride 256, S stores
        // stride 512. Mode 8's switches: NOST (no zero / store), NOZ, NOS, QS=64 (contiguous Q
        // tiles), CS / OFF (store layout / offset), STQ (store the operand tiles), ST1 (1 store).
        const bool sw = mode == 8;
        alignas(4096) static float sbig[65536];
        const int nost = sw && getenv("NOST") != 0;
        const int noz = sw && getenv("NOZ") != 0;
        const int nos = sw && getenv("NOS") != 0;
        const int qs = sw && getenv("QS") ? atoi(getenv("QS")) : 256;
        for (long blk = 0; blk + 31 < tiles; blk += 32) {
          for (int pair = 0; pair < (mode == 7 ? 1 : 8); ++pair) {
            const char* q0 = q + pair * 8192;
            const char* q1 = q0 + 4096;
            for (int kt = 0; kt < 8; kt += 2) {
              if (!nost && !noz) {
                zero4();
              }
              for (int cc = 0; cc < 4; ++cc) {
                const char* kb = a + (blk + cc * 8 + kt) * 1024;
                const char* qa = qs == 64 ? q0 + cc * 1024 : q0 + cc * 64;
                const char* qb = qs == 64 ? q1 + cc * 1024 : q1 + cc * 64;
                step2x2(qa, qb, qs, kb, kb + 1024);
                dots += 4;
              }
              if (!nost && !nos) {
                const int cs = sw && getenv("CS") != 0;
                const long off = sw && getenv("OFF") ? atol(getenv("OFF")) : 0;
                float* sx = (float*)((char*)sbig + off);
                if (cs) {
                  _tile_stored(0, sx + kt * 256, 64);
                  _tile_stored(1, sx + (kt + 1) * 256, 64);
                  _tile_stored(2, sx + 2048 + kt * 256, 64);
                  _tile_stored(3, sx + 2048 + (kt + 1) * 256, 64);
                } else if (sw && getenv("STQ")) {
                  _tile_stored(4, sx + kt * 16, 512);
                  _tile_stored(5, sx + (kt + 1) * 16, 512);
                  _tile_stored(6, sx + 16 * 128 + kt * 16, 512);
                  _tile_stored(7, sx + 16 * 128 + (kt + 1) * 16, 512);
                } else if (sw && getenv("ST1")) {
                  _tile_stored(0, sx + kt * 16, 512);
                } else {
                  _tile_stored(0, sx + kt * 16, 512);
                  _tile_stored(1, sx + (kt + 1) * 16, 512);
                  _tile_stored(2, sx + 16 * 128 + kt * 16, 512);
                  _tile_stored(3, sx + 16 * 128 + (kt + 1) * 16, 512);
                }
              }
            }
          }
        }
      } else if (mode == 10 || mode == 11 || mode == 12) {
        // Session 20: mode 6's S pass with two accumulator sets (tmm0-1, tmm2-3) alternating by
        // key tile, 2x1 blocking (Q rows 0-15 / 16-31 in tmm4 / tmm5 reloaded per depth, K in
        // tmm6). Mode 10: each set stores its two tiles after its dots; mode 11: no stores; mode
        // 12: the previous set's two stores issued after the current set's depth-0 dots.
        alignas(4096) static float sx[65536];
        for (long blk = 0; blk + 31 < tiles; blk += 32) {
          for (int pair = 0; pair < 8; ++pair) {
            const char* q0 = q + pair * 8192;
            for (int kt = 0; kt < 8; ++kt) {
              const char* k0 = a + (blk + kt) * 1024;
              float* prev = sx + (kt == 0 ? 7 : kt - 1) * 16;
              const bool first = blk == 0 && pair == 0 && kt == 0;
              if ((kt & 1) == 0) {
                dots += s_set_01(q0, k0, mode, first ? nullptr : prev, sx + kt * 16);
              } else {
                dots += s_set_23(q0, k0, mode, prev, sx + kt * 16);
              }
            }
          }
        }
      } else if (mode == 9) {  // mode 0 micro-steps with vector work between them: VW=ops (ALU
                               // only), VS=stores per step, VL=loads
        static int vw = getenv("VW") ? atoi(getenv("VW")) : 0,
                   vs = getenv("VS") ? atoi(getenv("VS")) : 0,
                   vl = getenv("VL") ? atoi(getenv("VL")) : 0;
        static float vbuf[4096];
        __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
               a7 = a0;
        __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.5f), z = _mm512_setzero_ps();
        zero4();
        for (long t = 0; t + 1 < tiles; t += 2) {
          int qi = (t >> 1) & 15;
          static int notile = getenv("NOTILE") != 0;
          if (!notile) {
            step2x2(q + qi * 2048, q + qi * 2048 + 1024, 64, a + t * 1024, a + (t + 1) * 1024);
          }
          dots += 4;
          static int vi = getenv("VI") ? atoi(getenv("VI")) : 0;
          for (int i = 0; i < vi; i += 8) {
            a0 = _mm512_fmadd_ps(a0, y, x);
            a1 = _mm512_fmadd_ps(a1, y, x);
            a2 = _mm512_fmadd_ps(a2, y, x);
            a3 = _mm512_fmadd_ps(a3, y, x);
            a4 = _mm512_fmadd_ps(a4, y, x);
            a5 = _mm512_fmadd_ps(a5, y, x);
            a6 = _mm512_fmadd_ps(a6, y, x);
            a7 = _mm512_fmadd_ps(a7, y, x);
          }
          static int vr = getenv("VR") ? atoi(getenv("VR")) : 0;
          for (int i = 0; i < vr; i += 4) {
            a0 = _mm512_roundscale_ps(a0, 0);
            a1 = _mm512_scalef_ps(a1, y);
            a2 = _mm512_roundscale_ps(a2, 0);
            a3 = _mm512_scalef_ps(a3, y);
          }
          for (int i = 0; i < vw; i += 4) {
            x = _mm512_fmadd_ps(x, y, y);
            y = _mm512_fmadd_ps(y, x, x);
            z = _mm512_add_ps(z, x);
            z = _mm512_max_ps(z, y);
          }
          for (int i = 0; i < vl; ++i) {
            z = _mm512_add_ps(z, _mm512_load_ps(vbuf + ((t * 16 + i * 16) & 4095)));
          }
          for (int i = 0; i < vs; ++i) {
            _mm512_store_ps(vbuf + ((t * 64 + i * 16) & 4095), z);
          }
        }
        z = _mm512_add_ps(
            z, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))));
        float tt[16];
        _mm512_storeu_ps(tt, z);
        if (tt[0] == 123.f) printf("x");
      } else if (mode == 5) {  // P.V like: O loaded+stored each 4 key chunks (acc reload), 2x2
        for (long t = 0; t + 7 < tiles; t += 8) {
          int oi = (t >> 3) & 15;
          float* ob = o + oi * 1024;
          _tile_loadd(0, ob, 64);
          _tile_loadd(1, ob + 256, 64);
          _tile_loadd(2, ob + 512, 64);
          _tile_loadd(3, ob + 768, 64);
          for (int k = 0; k < 4; ++k) {
            int qi = k;
            step2x2(q + qi * 2048, q + qi * 2048 + 1024, 64, a + (t + 2 * k) * 1024,
                    a + (t + 2 * k + 1) * 1024);
            dots += 4;
          }
          _tile_stored(0, ob, 64);
          _tile_stored(1, ob + 256, 64);
          _tile_stored(2, ob + 512, 64);
          _tile_stored(3, ob + 768, 64);
        }
      }
    }
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  double fl = dots * 16.0 * 16 * 32 * 2;
  printf("mode %d KB %ld: %.3f TFLOP/s/core  %.1f cycles/dot@3.0GHz\n", mode, kb, fl / best / 1e12,
         best * 3.0e9 / dots);
}
