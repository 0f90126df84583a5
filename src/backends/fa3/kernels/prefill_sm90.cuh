// The fa3 backend's SM90 prefill/extend kernel: warp-specialised, one CTA per SM (persistent).
//
//   warpgroup 0 (producer, 40 registers): gathers the Q tile and the K/V tiles of every key block
//     through the page table with 16-byte cp.async into a kStages-deep shared-memory ring laid
//     out in the 128-byte swizzle that the wgmma descriptors read; completion is published on
//     mbarriers (full) after a proxy fence, and a stage is refilled only after the consumers
//     release it (empty).
//   warpgroups 1, 2 (consumers, 232 registers): 64 query rows each. Per key block:
//     S = Q K^T (wgmma m64nNk16, A and B from shared memory, f32 accumulators), causal / length
//     mask, online softmax in registers (exp2 domain), P converted in registers to the A fragment,
//     O += P V (wgmma with A from registers, V read MN-major through the transposing descriptor).
//   Key blocks run from the last (the only ones that need the causal mask) down to the first.
//
// Layout of shared memory (dynamic, aligned to 1024 bytes in the kernel):
//   Q [kBlockM x D] | K [kStages][kBlockN x D] | V [kStages][kBlockN x D] | mbarriers
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/fa3/kernels/fa3_params.h"
#include "cuda/sm90/sm90_primitives.cuh"
#include "cuda/sm90/wgmma_sm90.cuh"

namespace attnkit::fa3 {

template <int kD, bool kBf16>
struct PrefillTraits {
  static_assert(kD == 64 || kD == 128 || kD == 256, "fa3 wgmma head dims: 64, 128, 256");
  static constexpr int kHeadDim = kD;
  static constexpr int kBlockM = fa3::kBlockM;
  // Registers per consumer thread: O kD/2 + S kBlockN/2 + P kBlockN/4 f32 words; d 256 keeps the
  // key block at 64 so that 128 + 32 + 16 fits under the 232-register budget.
  static constexpr int kBlockN = kD <= 128 ? 128 : 64;
  // 3 stages fit at d <= 128 (d 128: Q 32 KB + 3 x 64 KB = 224 KB of the 227 KB per block).
  static constexpr int kStages = kD <= 128 ? 3 : 2;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(128 * kProducerRegs + 128 * kConsumerWarpgroups * kConsumerRegs <= 65536,
                "register budget of one CTA per SM");
  static constexpr int kChunksPerRow = kD / 8;  // 16-byte chunks
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kKVBytes = kBlockN * kD * 2;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr int kBarOffset = kVOffset + kStages * kKVBytes;
  // q_full, q_empty, then per stage k_full, v_full, empty.
  static constexpr int kNumBarriers = 2 + 3 * kStages;
  static constexpr int kAlign = 1024;
  static constexpr int kSmemBytes = kBarOffset + kNumBarriers * 8 + kAlign;
  static_assert(kQBytes % kAlign == 0 && kKVBytes % kAlign == 0, "1024-byte swizzle atoms");
  // Producer gather: each warp owns kBlockN / 4 rows of a K/V tile; one row's slot per lane.
  static constexpr int kRowsPerWarp = kBlockN / 4;
  static constexpr int kRowsPerPass = 32 / kChunksPerRow;  // rows one warp copies per pass
  static_assert(kRowsPerWarp <= 32 && kChunksPerRow <= 32 && 32 % kChunksPerRow == 0, "gather");
  static constexpr int kKVPasses = kRowsPerWarp / kRowsPerPass;
  static constexpr int kQPasses = kBlockM * kChunksPerRow / 128;
};

// One work unit's geometry, decoded identically by producer and consumers.
struct TileInfo {
  int request, q_start, q_len, kv_len, m0, head, n_blocks, causal_limit;
};

template <typename Tr>
__device__ __forceinline__ TileInfo decode_tile(const Fa3Params& p, int unit) {
  TileInfo t;
  const int tile = unit / p.num_q_heads;
  t.head = unit - tile * p.num_q_heads;
  const int32_t* tw = p.plan + kPlanHeaderWords + p.bs * kRequestWords + tile * kTileWords;
  t.request = tw[0];
  t.m0 = tw[1] * Tr::kBlockM;
  const int32_t* rw = p.plan + kPlanHeaderWords + t.request * kRequestWords;
  t.q_start = rw[0];
  t.q_len = rw[1];
  t.kv_len = rw[2];
  // Last key any row of the tile may see (+1).
  const int prefix = t.kv_len - t.q_len;
  t.causal_limit = prefix + t.m0;  // position of the tile's first row
  const int n_end = p.causal ? min(t.kv_len, prefix + t.m0 + Tr::kBlockM) : t.kv_len;
  t.n_blocks = (n_end + Tr::kBlockN - 1) / Tr::kBlockN;
  return t;
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kBf16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// ---- producer ----

template <typename Tr>
__device__ __forceinline__ void producer(const Fa3Params& p, uint8_t* smem) {
  using namespace sm90;
  constexpr int C = Tr::kChunksPerRow;
  const int tid = threadIdx.x;  // 0..127
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t base = smem_addr(smem);
  const uint32_t sQ = base + Tr::kQOffset;
  const uint32_t bars = base + Tr::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8;
  auto k_full = [&](int s) { return bars + 16 + 24 * s; };
  auto v_full = [&](int s) { return bars + 16 + 24 * s + 8; };
  auto empty = [&](int s) { return bars + 16 + 24 * s + 16; };
  const char* q_base = static_cast<const char*>(p.q);
  const char* k_base = static_cast<const char*>(p.k_pool);
  const char* v_base = static_cast<const char*>(p.v_pool);

  // Completion of a cp.async group is published one group late (wait_group 1), so two groups are
  // in flight; `pending` is the barrier of the group not yet published.
  uint32_t pending = 0;
  auto commit = [&](uint32_t bar) {
    cp_async_commit();
    if (pending != 0) {
      cp_async_wait<1>();
      fence_proxy_async();
      mbar_arrive(pending);
    }
    pending = bar;
  };
  auto flush = [&]() {
    if (pending != 0) {
      cp_async_wait<0>();
      fence_proxy_async();
      mbar_arrive(pending);
      pending = 0;
    }
  };

  int it = 0;
  int tcount = 0;
  const int units = p.num_tiles * p.num_q_heads;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x, ++tcount) {
    const TileInfo t = decode_tile<Tr>(p, unit);
    const int kvh = t.head / p.group;
    const int32_t* pt = p.req_to_token +
                        static_cast<int64_t>(p.req_pool_indices[t.request]) * p.req_to_token_stride;

    // Q tile: row r = token m0 + r of the request (rows past q_len are zero-filled).
    mbar_wait(q_empty, (tcount & 1) ^ 1);
#pragma unroll 4
    for (int i = 0; i < Tr::kQPasses; ++i) {
      const int c = tid + 128 * i;
      const int row = c / C, chunk = c % C;
      const int token = t.m0 + row;
      const bool valid = token < t.q_len;
      const char* src =
          valid ? q_base + ((static_cast<int64_t>(t.q_start + token) * p.q_stride_token +
                             static_cast<int64_t>(t.head) * p.q_stride_head + chunk * 8) *
                            2)
                : q_base;
      cp_async_16(sQ + swizzle_offset(Tr::kBlockM, row, chunk), src, valid ? 16 : 0);
    }
    commit(q_full);

    for (int nb = t.n_blocks - 1; nb >= 0; --nb, ++it) {
      const int stage = it % Tr::kStages;
      const uint32_t phase = (it / Tr::kStages) & 1;
      // The slot of row warp * kRowsPerWarp + lane (-1: past kv_len, zero-filled).
      const int my_key = nb * Tr::kBlockN + warp * Tr::kRowsPerWarp + lane;
      int my_slot = -1;
      if (lane < Tr::kRowsPerWarp && my_key < t.kv_len) {
        const int in_page = my_key % p.page_size;
        my_slot = pt[my_key - in_page] + in_page;
      }
      mbar_wait(empty(stage), phase ^ 1);
      const uint32_t sK = base + Tr::kKOffset + stage * Tr::kKVBytes;
      const uint32_t sV = base + Tr::kVOffset + stage * Tr::kKVBytes;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        const char* pool = kv == 0 ? k_base : v_base;
        const int64_t stride_row = kv == 0 ? p.k_stride_row : p.v_stride_row;
        const int64_t head_off =
            static_cast<int64_t>(kvh) * (kv == 0 ? p.k_stride_head : p.v_stride_head);
        const uint32_t tile = kv == 0 ? sK : sV;
#pragma unroll 4
        for (int pass = 0; pass < Tr::kKVPasses; ++pass) {
          const int r_in_warp = pass * Tr::kRowsPerPass + lane / C;
          const int chunk = lane % C;
          const int slot = __shfl_sync(0xffffffffu, my_slot, r_in_warp);
          const int row = warp * Tr::kRowsPerWarp + r_in_warp;
          const char* src =
              slot >= 0
                  ? pool + (static_cast<int64_t>(slot) * stride_row + head_off + chunk * 8) * 2
                  : pool;
          cp_async_16(tile + swizzle_offset(Tr::kBlockN, row, chunk), src, slot >= 0 ? 16 : 0);
        }
        commit(kv == 0 ? k_full(stage) : v_full(stage));
      }
    }
    flush();
  }
}

// ---- consumers ----

template <typename Tr, bool kBf16>
__device__ __forceinline__ void consumer(const Fa3Params& p, uint8_t* smem, int g) {
  using namespace sm90;
  constexpr int kD = Tr::kHeadDim;
  constexpr int kN = Tr::kBlockN;
  constexpr int kS = kN / 2;  // S accumulators per thread
  constexpr int kO = kD / 2;  // O accumulators per thread
  const int tid = threadIdx.x - 128 * (g + 1);
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t base = smem_addr(smem);
  const uint32_t sQ = base + Tr::kQOffset + g * 64 * 128;  // this warpgroup's 64 rows
  const uint32_t bars = base + Tr::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8;
  auto k_full = [&](int s) { return bars + 16 + 24 * s; };
  auto v_full = [&](int s) { return bars + 16 + 24 * s + 8; };
  auto empty = [&](int s) { return bars + 16 + 24 * s + 16; };
  const float kNegInf = -__int_as_float(0x7f800000);
  // Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 1 and 2,
  // 256 threads: 128 arrive from the other warpgroup, 128 sync here), so one's softmax runs while
  // the other's wgmmas keep the tensor cores busy. Warpgroup 1 opens with a pass to warpgroup 0 and
  // skips its very last pass, so every sync has exactly one matching arrive.
  const bool pingpong = p.pingpong != 0;
  auto turn_wait = [&]() {
    if (pingpong) asm volatile("bar.sync %0, 256;" ::"r"(1 + g) : "memory");
  };
  auto turn_pass = [&]() {
    if (pingpong) asm volatile("bar.arrive %0, 256;" ::"r"(2 - g) : "memory");
  };
  if (g == 1) turn_pass();

  int it = 0;
  int tcount = 0;
  const int units = p.num_tiles * p.num_q_heads;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x, ++tcount) {
    const TileInfo t = decode_tile<Tr>(p, unit);
    // This thread's two rows (r, r + 8) within the tile and their query positions.
    const int row0 = g * 64 + warp * 16 + lane / 4;
    const int qpos0 = t.causal_limit + row0;
    float o[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    float m[2] = {kNegInf, kNegInf};
    float l[2] = {0.f, 0.f};

    mbar_wait(q_full, tcount & 1);
    for (int nb = t.n_blocks - 1; nb >= 0; --nb, ++it) {
      const int stage = it % Tr::kStages;
      const uint32_t phase = (it / Tr::kStages) & 1;
      const uint32_t sK = base + Tr::kKOffset + stage * Tr::kKVBytes;
      const uint32_t sV = base + Tr::kVOffset + stage * Tr::kKVBytes;

      float s[kS];
      mbar_wait(k_full(stage), phase);
      turn_wait();
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        wgmma_ss<kN, kBf16, 0>(s, desc_k_major(sQ, Tr::kBlockM, kk), desc_k_major(sK, kN, kk),
                               kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      turn_pass();
      wgmma_wait<0>();
      fence_regs(s);
      if (nb == 0) mbar_arrive(q_empty);  // the tile's last read of Q

      // Mask: keys past kv_len, and (causal) keys after the row's position.
      const int n0 = nb * kN;
      const bool need_mask =
          n0 + kN > t.kv_len || (p.causal && n0 + kN - 1 > t.causal_limit + g * 64);
      if (need_mask) {
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + 8 * j + 2 * (lane % 4) + (e & 1);
            const int qpos = qpos0 + 8 * (e >> 1);
            const bool visible = key < t.kv_len && (!p.causal || key <= qpos);
            if (!visible) s[4 * j + e] = kNegInf;
          }
        }
      }

      // Online softmax over the two rows.
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = kNegInf;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[h], mx * p.scale_log2);
        const float m_use = m_new == kNegInf ? 0.f : m_new;
        corr[h] = exp2_approx(m[h] - m_use);  // m = -inf -> 0
        m[h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const float v = exp2_approx(fmaf(s[4 * j + e], p.scale_log2, -m_use));
            s[4 * j + e] = v;
            sum += v;
          }
        }
        l[h] = l[h] * corr[h] + sum;
      }
      uint32_t pa[kN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        pa[kk][0] = pack2<kBf16>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<kBf16>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<kBf16>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<kBf16>(s[8 * kk + 6], s[8 * kk + 7]);
      }
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[4 * j + 0] *= corr[0];
        o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1];
        o[4 * j + 3] *= corr[1];
      }

      mbar_wait(v_full(stage), phase);
      fence_regs(o);
      turn_wait();
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        wgmma_rs<kD, kBf16, 1>(o, pa[kk], desc_mn_major(sV, kN, kk), 1);
      }
      wgmma_commit();
      if (g == 0 || nb > 0 || unit + static_cast<int>(gridDim.x) < units) turn_pass();
      wgmma_wait<0>();
      fence_regs(o);
      mbar_arrive(empty(stage));
    }

    // Epilogue: O / l, natural-log LSE.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int token = t.m0 + row0 + 8 * h;
      if (token < t.q_len) {
        const int64_t trow = t.q_start + token;
        auto* out = static_cast<uint32_t*>(p.out);
        const int64_t obase =
            (trow * p.o_stride_token + static_cast<int64_t>(t.head) * p.o_stride_head) / 2;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          const int col = 8 * j + 2 * (lane % 4);
          out[obase + col / 2] = pack2<kBf16>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        }
        if (p.lse != nullptr && lane % 4 == 0) {
          constexpr float kLn2 = 0.693147180559945309f;
          const float m_use = m[h] == kNegInf ? 0.f : m[h];
          p.lse[trow * p.lse_stride_token + static_cast<int64_t>(t.head) * p.lse_stride_head] =
              sum > 0.f ? (m_use + __log2f(sum)) * kLn2 : kNegInf;
        }
      }
    }
  }
}

// grid: (min(work units, SMs)) persistent; block: (384) = producer warpgroup + 2 consumers.
template <int kD, bool kBf16>
__global__ void __launch_bounds__(PrefillTraits<kD, kBf16>::kThreads, 1)
    prefill_sm90_kernel(const __grid_constant__ Fa3Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = PrefillTraits<kD, kBf16>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = sm90::smem_addr(smem_raw);
  uint8_t* smem = smem_raw + ((Tr::kAlign - raw % Tr::kAlign) % Tr::kAlign);
  const uint32_t bars = sm90::smem_addr(smem) + Tr::kBarOffset;
  if (threadIdx.x == 0) {
    sm90::mbar_init(bars, 128);                                // q_full: producer threads
    sm90::mbar_init(bars + 8, 128 * Tr::kConsumerWarpgroups);  // q_empty: consumer threads
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbar_init(bars + 16 + 24 * s, 128);                                 // k_full
      sm90::mbar_init(bars + 16 + 24 * s + 8, 128);                             // v_full
      sm90::mbar_init(bars + 16 + 24 * s + 16, 128 * Tr::kConsumerWarpgroups);  // empty
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    producer<Tr>(p, smem);
  } else {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    consumer<Tr, kBf16>(p, smem, wg - 1);
  }
#endif
}

}  // namespace attnkit::fa3
