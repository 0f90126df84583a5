// Session 84 (2026-12-03, AMX development VM; not part of the build). A one-core model of the AMX
// extend's unit (a 128-key block x a 32-row pair): S = Q . K^T in 2 x 2 micro-steps (4 passes of
// 4 depth chunks, each pass's 4 result tiles stored to a 32 x 128 f32 S buffer), the lean one-pass
// softmax of the previous pair's 32 rows (f32 -> bf16 P) interleaved with the micro-steps, and
// P . V (4 key chunks x 4 column passes, O 32 x 128 f32 loaded and stored once per unit). 8 pairs
// share a packed K and V block (32 KiB each); Q, P and O are per pair (L2, as in the kernel).
// us per unit, best of 7 rounds of 2000 x 8 units:
//
//   mode 0 (block S, rows beside S and P . V micro-steps)   tiles 1.38-1.57, softmax 0.67-0.76,
//                                                           together 2.18-2.46 (the sum)
//   ALU=1 (an exp2 without FMA-unit operations, below)      softmax 0.89-1.01, together 2.22-2.63
//   SMALL=1 (every tile operand from one L1-hot 4 KiB)      tiles 1.07-1.47, together 1.47-1.82,
//                                                           ALU=1 1.66-1.96: still 0.45-0.65 of
//                                                           the softmax's 0.73 added
//   HQ / HK / HP / HV / HO=1 (that operand stream L1-hot)   one at a time 2.04-2.34, the S side
//                                                           (HQ HK) 2.29-2.32, the P . V side
//                                                           (HP HV HO) 1.99-2.03 with tiles
//                                                           1.26-1.31, all five 1.77-1.82 with
//                                                           tiles 1.15-1.17: the sum throughout
//   NOSST=1 (no S tile stores) / NOPST=1 (no P stores)      tiles 1.38-1.41, together 1.97-1.99 /
//                                                           together 2.30: still the sum
//   mode 1 (32-key S ring, rows per chunk beside the pass)  2.10-2.32, 4-5% under mode 0 in the
//                                                           same runs (chunk rows alone 0.96-0.99)
//   mode 2 (every pair's S first, then every P . V)         2.18-2.23 against 2.41-2.46 in the
//                                                           same runs (tiles 1.51-1.53)
//   CHECK=1: the FMA-free exp2's error over [LO, 8]         max rel 1.2e-3, rms 6e-4 (LO=-100)
//
// So the lean softmax rows add nearly their whole time to the tile work whatever its exp2 is made
// of and wherever the tile operands come from (docs/perf/amx_notes.md "Session 84").
//
// Session 85 switches (same VM type; one core, taskset -c 0; docs/perf/amx_notes.md "Session 85"):
//   NOFMA=1 (x = s - m by vaddps, the scale folded into q)  with ALU=1: softmax 0.94-0.96, together
//                                                           2.69-2.73 (tiles 1.57)
//   TAB=1 (with ALU NOFMA: 2^x from the 32-entry table     softmax 0.62-0.66, together 2.31-2.46
//   alone, no residual: 6 operations, none on the FMA     (tiles 1.53-1.55): the sum or more;
//   unit; max rel error 1.09%)                             CHECK=1 TAB=1: max rel 1.09e-2
//   SRO=1 (rows read S from a separate read-only buffer)   together 2.49 (tiles 1.54, rows 0.65)
//   + NOSST NOPST NOOST (no S, P or O stores at all)       tiles 1.10, rows 0.63, together 1.63;
//                                                           the deg-3 rows 0.78, together 1.81
//   + SMALL                                                tiles 0.91, rows 0.63, together 1.26
//   NOSST / NOOST / NOPST / NOSST NOOST (degree-3 rows)    tiles 1.44-1.46 / 1.23-1.35 /
//                                                           1.49-1.59 / 1.08 (every store:
//                                                           1.46-1.58); together 2.08-2.14 /
//                                                           2.15-2.16 / 2.34-2.38 / 1.75-1.77
// So a row without any FMA-unit operation still adds its time to the tile work; only with no
// store anywhere and every operand L1-hot does a third of it overlap.
// Build: g++ -O2 -mamx-tile -mamx-bf16 -mavx512f -mavx512bf16 -mavx512dq -o um <this file>
// Run: ./um MODE, with the switches above in the environment (NOSM / NOTILE: one side alone).
// Session 85 added NOFMA, TAB, SRO and NOOST.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
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

alignas(4096) static uint16_t kblk[128 * 128];     // K^T tiles: depth chunk c, key tile kt
alignas(4096) static uint16_t vblk[128 * 128];     // V tiles: key chunk i, column tile j
alignas(4096) static uint16_t qall[8 * 32 * 128];  // 8 pairs x 32 rows x 128 dims
alignas(4096) static float sblk[2][32 * 128];      // block S, double buffer
alignas(4096) static float sring[2][32 * 32];      // 32-key S ring (mode 1)
alignas(4096) static uint16_t pbuf[8][32 * 128];   // P per pair
alignas(4096) static float obuf[8][32 * 128];      // O per pair
static float mrow[8][32], lrow[8][32];
static bool g_nofma, g_tab, g_noost, g_sro, g_noload;
alignas(4096) static float sro[32 * 128];
static bool g_alu, g_nopst, g_nosst, g_small, g_nosm, g_notile, g_hq, g_hk, g_hp, g_hv, g_ho;
static int g_redo;
static __m512i g_sink;

// 2^x, degree-3 polynomial (the kernel's lean rows).
static inline __m512 exp2_deg3(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.0555041f), f, _mm512_set1_ps(0.2402265f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931472f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 2^x (x <= 8, finite) without FMA-unit operations: t = x + 1.5 * 2^18 rounds x to 1/32 (n and
// the table index j in t's low bits), 2^(j / 32) from a 32-entry table (vpermt2d; each entry less
// j << 18, so that adding k << 18 puts n into the exponent), the residual 2^r ~ 1 + r ln 2 added
// as E * |r| * ln 2 computed on the bit patterns (bits(a) + bits(b) - bits(1)), sign restored.
struct AluExp2 {
  alignas(64) int32_t tab[32];
  __m512i tlo, thi, kmin, kconst, absmask, signmask;
  __m512 c5;
  AluExp2() {
    for (int j = 0; j < 32; ++j) {
      const float v = static_cast<float>(exp2(static_cast<double>(j) / 32));
      int32_t b;
      memcpy(&b, &v, 4);
      tab[j] = b - (j << 18);
    }
    tlo = _mm512_load_si512(tab);
    thi = _mm512_load_si512(tab + 16);
    const float fc5 = 393216.f;
    int32_t bc5;
    memcpy(&bc5, &fc5, 4);
    c5 = _mm512_set1_ps(fc5);
    kmin = _mm512_set1_epi32(bc5 - 126 * 32);
    const float ln2 = 0.69314718f;
    int32_t bl;
    memcpy(&bl, &ln2, 4);
    kconst = _mm512_set1_epi32(bl - 2 * 0x3f800000);
    absmask = _mm512_set1_epi32(0x7fffffff);
    signmask = _mm512_set1_epi32(INT32_MIN);
  }
  // table only: 2^(n/32) with n = round(32 x); max rel error 1.09%.
  __m512 tab_only(__m512 x) const {
    const __m512 t = _mm512_add_ps(x, c5);
    const __m512i k = _mm512_max_epi32(_mm512_castps_si512(t), kmin);
    return _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_permutex2var_epi32(tlo, k, thi), _mm512_slli_epi32(k, 18)));
  }
  __m512 operator()(__m512 x) const {
    const __m512 t = _mm512_add_ps(x, c5);
    const __m512i k = _mm512_max_epi32(_mm512_castps_si512(t), kmin);
    const __m512i eb =
        _mm512_add_epi32(_mm512_permutex2var_epi32(tlo, k, thi), _mm512_slli_epi32(k, 18));
    const __m512 r = _mm512_sub_ps(x, _mm512_sub_ps(t, c5));
    const __m512i rb = _mm512_castps_si512(r);
    __m512i cb = _mm512_add_epi32(_mm512_add_epi32(eb, kconst), _mm512_and_si512(rb, absmask));
    cb = _mm512_max_epi32(cb, _mm512_setzero_si512());
    cb = _mm512_ternarylogic_epi32(cb, rb, signmask, 0xF8);  // cb | (rb & sign)
    return _mm512_add_ps(_mm512_castsi512_ps(eb), _mm512_castsi512_ps(cb));
  }
};
static const AluExp2* g_ex;

static inline void store_p(uint16_t* p, __m512 e0, __m512 e1) {
  const __m512i bits = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
  if (g_nopst) {
    g_sink = _mm512_xor_si512(g_sink, bits);
  } else {
    _mm512_storeu_si512(p, bits);
  }
}

// One row's lean softmax over `n` scores (a multiple of 32) at s, P at p.
static inline void softmax_row(const float* s, int n, uint16_t* p, float m, float* l) {
  const __m512 sc = _mm512_set1_ps(1e-6f), nm = _mm512_set1_ps(-m);
  __m512 mx = _mm512_set1_ps(-1e30f), sum = _mm512_setzero_ps();
  __m512i mxi = _mm512_set1_epi32(INT32_MIN);
  for (int v = 0; v < n; v += 32) {
    __m512 x0, x1;
    if (g_nofma) {
      x0 = _mm512_add_ps(_mm512_load_ps(s + v), nm);
      x1 = _mm512_add_ps(_mm512_load_ps(s + v + 16), nm);
    } else {
      x0 = _mm512_fmadd_ps(_mm512_load_ps(s + v), sc, nm);
      x1 = _mm512_fmadd_ps(_mm512_load_ps(s + v + 16), sc, nm);
    }
    __m512 e0, e1;
    if (g_alu) {
      mxi =
          _mm512_max_epi32(mxi, _mm512_max_epi32(_mm512_castps_si512(x0), _mm512_castps_si512(x1)));
      if (g_tab) {
        e0 = g_ex->tab_only(x0);
        e1 = g_ex->tab_only(x1);
      } else {
        e0 = (*g_ex)(x0);
        e1 = (*g_ex)(x1);
      }
    } else {
      mx = _mm512_max_ps(mx, _mm512_max_ps(x0, x1));
      e0 = exp2_deg3(x0);
      e1 = exp2_deg3(x1);
    }
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
    store_p(p + v, e0, e1);
  }
  if (g_alu ? _mm512_cmpgt_epi32_mask(mxi, _mm512_set1_epi32(0x41000000)) != 0
            : _mm512_reduce_max_ps(mx) > 8.f) {
    ++g_redo;
  }
  *l += _mm512_reduce_add_ps(sum);
}

static inline void zero4() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
// Depth chunk c of the S pass over key tiles kt, kt + 1 of the pair at q0.
static inline void s_step(const uint16_t* q0, int kt, int c) {
  if (g_small) {
    q0 = qall;
    kt = 0;
    c = 0;
  }
  if (g_hq) q0 = qall + (c & 1) * 64;
  const int kk = g_hk ? (c & 1) * 2 : c * 8 + kt;
  _tile_loadd(4, q0 + c * 32, 256);
  _tile_loadd(6, kblk + kk * 512, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, kblk + (kk + 1) * 512, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, q0 + 16 * 128 + c * 32, 256);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}
static inline void s_store(float* s, int stride, int col) {
  if (g_nosst) return;
  _tile_stored(0, s + col, stride * 4);
  _tile_stored(1, s + col + 16, stride * 4);
  _tile_stored(2, s + 16 * stride + col, stride * 4);
  _tile_stored(3, s + 16 * stride + col + 16, stride * 4);
}
// P . V of pair pr: key chunk i, column pass j (O tiles 2j, 2j + 1).
static inline void pv_step(int pr, int i, int j) {
  if (g_small) {
    pr = 0;
    j = 0;
    if (i != 0 && i != 3) i = 1;
  }
  float* o0 = obuf[g_ho ? 0 : pr] + (g_ho ? 0 : j * 32);
  float* o1 = o0 + 16 * 128;
  if (i == 0) {
    _tile_loadd(0, o0, 512);
    _tile_loadd(1, o0 + 16, 512);
    _tile_loadd(2, o1, 512);
    _tile_loadd(3, o1 + 16, 512);
  }
  const uint16_t* pp = g_hp ? pbuf[0] + (i & 1) * 32 : pbuf[pr] + i * 32;
  const int vv = g_hv ? (i & 1) * 2 : i * 8 + 2 * j;
  _tile_loadd(4, pp, 256);
  _tile_loadd(6, vblk + vv * 512, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, vblk + (vv + 1) * 512, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, pp + 16 * 128, 256);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
  if (i == 3 && !g_noost) {
    _tile_stored(0, o0, 512);
    _tile_stored(1, o0 + 16, 512);
    _tile_stored(2, o1, 512);
    _tile_stored(3, o1 + 16, 512);
  }
}

// The S pass of pair pr into s, `per_step` softmax rows of pair prev (S at sp) after each
// micro-step; returns the next row.
static int s_with_rows(int pr, float* s, int prev, const float* sp, int row, int per_step) {
  const uint16_t* q0 = qall + pr * 32 * 128;
  for (int kt = 0; kt < 8; kt += 2) {
    zero4();
    for (int c = 0; c < 4; ++c) {
      if (!g_notile) s_step(q0, kt, c);
      for (int k = 0; k < per_step && !g_nosm && row < 32; ++k, ++row) {
        softmax_row(g_sro ? sro + row * 128 : sp + row * 128, 128, pbuf[prev] + row * 128,
                    mrow[prev][row], &lrow[prev][row]);
      }
    }
    if (!g_notile) s_store(s, 128, kt * 16);
  }
  return row;
}

static void unit_block(int pr) {  // mode 0
  const int prev = (pr + 7) & 7;
  const float* sp = sblk[(pr + 1) & 1];
  int row = s_with_rows(pr, sblk[pr & 1], prev, sp, 0, 1);
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < 4; ++i) {
      if (!g_notile) pv_step(prev, i, j);
      if (!g_nosm && row < 32) {
        softmax_row(g_sro ? sro + row * 128 : sp + row * 128, 128, pbuf[prev] + row * 128,
                    mrow[prev][row], &lrow[prev][row]);
        ++row;
      }
    }
  }
}

static void unit_chunk(int pr) {  // mode 1
  const uint16_t* q0 = qall + pr * 32 * 128;
  for (int kt = 0; kt < 8; kt += 2) {
    float* s = sring[(kt >> 1) & 1];
    const float* sp = sring[((kt >> 1) + 1) & 1];
    const int pk = ((kt >> 1) + 3) & 3;  // the previous pass's key chunk
    const int ppr = kt == 0 ? (pr + 7) & 7 : pr;
    zero4();
    for (int c = 0; c < 4; ++c) {
      if (!g_notile) s_step(q0, kt, c);
      for (int r = c * 8; !g_nosm && r < c * 8 + 8; ++r) {
        softmax_row(sp + r * 32, 32, pbuf[ppr] + r * 128 + pk * 32, mrow[ppr][r], &lrow[ppr][r]);
      }
    }
    if (!g_notile) s_store(s, 32, 0);
  }
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < 4 && !g_notile; ++i) pv_step(pr, i, j);
  }
}

static void block_phases() {  // mode 2: 8 units
  for (int pr = 0; pr < 8; ++pr)
    s_with_rows(pr, sblk[pr & 1], (pr + 7) & 7, sblk[(pr + 1) & 1], 0, 2);
  for (int pr = 0; pr < 8; ++pr) {
    for (int j = 0; j < 4; ++j) {
      for (int i = 0; i < 4 && !g_notile; ++i) pv_step(pr, i, j);
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 2) return 1;
  syscall(SYS_arch_prctl, 0x1023, 18);  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  Cfg cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  const int mode = atoi(argv[1]);
  const AluExp2 ex;
  g_ex = &ex;
  g_alu = getenv("ALU") != nullptr;
  g_nofma = getenv("NOFMA") != nullptr;
  g_tab = getenv("TAB") != nullptr;
  g_noost = getenv("NOOST") != nullptr;
  g_sro = getenv("SRO") != nullptr;
  for (int i = 0; i < 32 * 128; ++i) sro[i] = -0.001f * (i % 97);
  g_nopst = getenv("NOPST") != nullptr;
  g_nosst = getenv("NOSST") != nullptr;
  g_small = getenv("SMALL") != nullptr;
  g_nosm = getenv("NOSM") != nullptr;
  g_notile = getenv("NOTILE") != nullptr;
  g_hq = getenv("HQ") != nullptr;
  g_hk = getenv("HK") != nullptr;
  g_hp = getenv("HP") != nullptr;
  g_hv = getenv("HV") != nullptr;
  g_ho = getenv("HO") != nullptr;
  if (getenv("CHECK") != nullptr) {
    const double lo = getenv("LO") != nullptr ? atof(getenv("LO")) : -100.0;
    double worst = 0, sq = 0;
    long n = 0;
    for (double xd = lo; xd <= 8.0; xd += 0.000731, ++n) {
      const __m512 xv = _mm512_set1_ps(static_cast<float>(xd));
      const float got = _mm512_cvtss_f32(getenv("TAB") ? ex.tab_only(xv) : ex(xv));
      const double want = exp2(static_cast<double>(static_cast<float>(xd)));
      const double rel = fabs(got - want) / want;
      sq += rel * rel;
      if (rel > worst) worst = rel;
    }
    printf("FMA-free exp2 over [%g, 8]: max rel %.3g, rms %.3g\n", lo, worst, sqrt(sq / n));
    return 0;
  }
  for (int i = 0; i < 128 * 128; ++i) {
    kblk[i] = 0x3c00 + (i * 7 & 0xff);
    vblk[i] = 0x3c00 + (i * 5 & 0xff);
  }
  for (int i = 0; i < 8 * 32 * 128; ++i) qall[i] = 0x3c00 + (i * 3 & 0xff);
  for (int p = 0; p < 8; ++p) {
    for (int r = 0; r < 32; ++r) mrow[p][r] = 1e3f;
  }
  double best = 1e9;
  long units = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const double t0 = now();
    units = 0;
    for (int it = 0; it < 2000; ++it) {
      if (mode == 2) {
        block_phases();
      } else {
        for (int pr = 0; pr < 8; ++pr) mode == 1 ? unit_chunk(pr) : unit_block(pr);
      }
      units += 8;
    }
    const double dt = now() - t0;
    if (dt < best) best = dt;
  }
  printf("mode %d%s%s%s%s: %.2f us per unit (%.3f TFLOP/s of dots; %d row redos)\n", mode,
         g_alu ? " ALU" : "", g_small ? " SMALL" : "", g_nosm ? " NOSM" : "",
         g_notile ? " NOTILE" : "", best / units * 1e6, units * 32.0 * 128 * 128 * 4 / best / 1e12,
         g_redo);
  _tile_release();
  return 0;
}
