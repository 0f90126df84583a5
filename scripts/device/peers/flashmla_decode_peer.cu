// Peer benchmark for issue 7: DeepSeek's public FlashMLA dense decode kernel (sm90, bf16, page 64)
// timed on the device beside `attnkit bench --backend flashmla`, on the same shapes. Not part of
// the library or its build: FlashMLA's sources and the CUTLASS headers they need are fetched into
// the git-ignored `.peers/flashmla` (see scripts/device/flashmla_peer.sh) and travel to the device
// in `carry`; nothing of them is committed. This file only drives FlashMLA's three host entry
// points (scheduler metadata, split-KV decode, combine) the way its PyTorch binding does, on
// cudaMalloc'ed buffers.
//
// Usage: flashmla_decode_peer <batch> <kv_len> <q_heads> <s_q> [warmup iters]
// Prints one line per case: "flashmla_peer b.. kv.. h.. s_q.. ms_median ms_min TFLOP/s
// max_rel_err". Inputs are hashed values in [-1, 1) (never zeros), pages in a shuffled order; the
// output is checked against an fp64 reference on 24 sampled (request, row) pairs and poisoned with
// NaN first, so a kernel that wrote nothing fails the check. FLOPs: 2 * b * s_q * h_q * kv * (576 +
// 512).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {

constexpr int kDk = 576;
constexpr int kDv = 512;
constexpr int kPage = 64;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__host__ __device__ inline float hash_value(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  // [-1, 1) in steps of 2^-10, never exactly zero (odd numerators).
  const int v = static_cast<int>((x >> 40) & 0x3FF) * 2 + 1 - 1024;
  return static_cast<float>(v) / 1024.0f;
}

__global__ void fill_kernel(__nv_bfloat16* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(hash_value(i, seed));
}

__global__ void poison_kernel(__nv_bfloat16* p, uint64_t n) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(NAN);
}

float bf16_round(float f) { return __bfloat162float(__float2bfloat16(f)); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s batch kv_len q_heads s_q [warmup iters]\n", argv[0]);
    return 2;
  }
  const int b = std::atoi(argv[1]);
  const int kv = std::atoi(argv[2]);
  const int h_q = std::atoi(argv[3]);
  const int s_q = std::atoi(argv[4]);
  const int warmup = argc > 5 ? std::atoi(argv[5]) : 5;
  const int iters = argc > 6 ? std::atoi(argv[6]) : 30;
  if (b <= 0 || kv <= 0 || h_q <= 0 || s_q <= 0 || iters <= 0 || warmup < 0) {
    std::fprintf(stderr, "batch, kv_len, q_heads, s_q, iters must be positive\n");
    return 2;
  }
  const int h_k = 1;
  const int q_seq_per_hk = s_q * h_q;
  const int blocks_per_seq = (kv + kPage - 1) / kPage;
  const int num_blocks = b * blocks_per_seq;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int num_sm_parts = std::max(prop.multiProcessorCount / h_k / ((q_seq_per_hk + 63) / 64), 1);

  const uint64_t q_elems = static_cast<uint64_t>(b) * q_seq_per_hk * kDk;
  const uint64_t k_elems = static_cast<uint64_t>(num_blocks) * kPage * kDk;
  const uint64_t o_elems = static_cast<uint64_t>(b) * q_seq_per_hk * kDv;
  __nv_bfloat16 *q = nullptr, *k = nullptr, *o = nullptr;
  float *lse = nullptr, *lse_acc = nullptr, *o_acc = nullptr;
  int *seqlens = nullptr, *table = nullptr, *num_splits = nullptr;
  DecodingSchedMeta* meta = nullptr;
  const int total_splits = b + num_sm_parts;
  check(cudaMalloc(&q, q_elems * 2), "cudaMalloc q");
  check(cudaMalloc(&k, k_elems * 2), "cudaMalloc kcache");
  check(cudaMalloc(&o, o_elems * 2), "cudaMalloc out");
  check(cudaMalloc(&lse, static_cast<size_t>(b) * q_seq_per_hk * 4), "cudaMalloc lse");
  check(cudaMalloc(&lse_acc, static_cast<size_t>(total_splits) * q_seq_per_hk * 4), "cudaMalloc");
  check(cudaMalloc(&o_acc, static_cast<size_t>(total_splits) * q_seq_per_hk * kDv * 4),
        "cudaMalloc");
  check(cudaMalloc(&seqlens, b * 4), "cudaMalloc seqlens");
  check(cudaMalloc(&table, static_cast<size_t>(b) * blocks_per_seq * 4), "cudaMalloc table");
  check(cudaMalloc(&num_splits, (b + 1) * 4), "cudaMalloc num_splits");
  check(cudaMalloc(&meta, static_cast<size_t>(num_sm_parts) * sizeof(DecodingSchedMeta)),
        "cudaMalloc");
  fill_kernel<<<1024, 256>>>(q, q_elems, 1u);
  fill_kernel<<<4096, 256>>>(k, k_elems, 2u);
  check(cudaGetLastError(), "fill");

  // Pages in a shuffled order (as attnkit's bench shuffles its pool).
  std::vector<int> h_table(static_cast<size_t>(b) * blocks_per_seq);
  for (size_t i = 0; i < h_table.size(); ++i) h_table[i] = static_cast<int>(i);
  uint64_t rng = 12345;
  for (size_t i = h_table.size(); i > 1; --i) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(h_table[i - 1], h_table[(rng >> 33) % i]);
  }
  std::vector<int> h_seqlens(b, kv);
  check(cudaMemcpy(table, h_table.data(), h_table.size() * 4, cudaMemcpyHostToDevice), "memcpy");
  check(cudaMemcpy(seqlens, h_seqlens.data(), b * 4, cudaMemcpyHostToDevice), "memcpy");

  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  GetDecodeSchedMetaParams sp = {b,       s_q,     64,   5,          -1,           -1,    nullptr,
                                 nullptr, seqlens, meta, num_splits, num_sm_parts, stream};
  smxx::decode::run_get_decoding_sched_meta_kernel(sp);
  check(cudaGetLastError(), "sched meta");

  const float scale = 1.0f / std::sqrt(static_cast<float>(kDk));
  DenseAttnDecodeParams p{};
  p.b = b;
  p.s_q = s_q;
  p.q_seq_per_hk = q_seq_per_hk;
  p.seqlens_k_ptr = seqlens;
  p.h_q = h_q;
  p.h_k = h_k;
  p.num_blocks = num_blocks;
  p.q_head_per_hk = h_q / h_k;
  p.is_causal = s_q > 1;
  p.d = kDk;
  p.d_v = kDv;
  p.scale_softmax = scale;
  p.scale_softmax_log2 = scale * static_cast<float>(M_LOG2E);
  p.q_ptr = q;
  p.k_ptr = k;
  p.o_ptr = o;
  p.softmax_lse_ptr = lse;
  p.q_batch_stride = static_cast<int64_t>(q_seq_per_hk) * kDk;
  p.k_batch_stride = static_cast<int64_t>(kPage) * kDk;
  p.o_batch_stride = static_cast<int64_t>(q_seq_per_hk) * kDv;
  p.q_row_stride = kDk;
  p.k_row_stride = kDk;
  p.o_row_stride = kDv;
  p.q_head_stride = p.q_batch_stride;
  p.k_head_stride = kDk;
  p.o_head_stride = p.o_batch_stride;
  p.block_table = table;
  p.block_table_batch_stride = blocks_per_seq;
  p.page_block_size = kPage;
  p.tile_scheduler_metadata_ptr = meta;
  p.num_sm_parts = num_sm_parts;
  p.num_splits_ptr = num_splits;
  p.total_num_splits = total_splits;
  p.softmax_lseaccum_ptr = lse_acc;
  p.oaccum_ptr = o_acc;
  p.stream = stream;
  CombineParams cp = {b,
                      s_q,
                      h_q,
                      kDv,
                      lse,
                      o,
                      h_k * q_seq_per_hk,
                      h_q,
                      h_q * s_q * kDv,
                      h_q * kDv,
                      kDv,
                      lse_acc,
                      o_acc,
                      h_k * q_seq_per_hk,
                      h_q,
                      h_q * s_q * kDv,
                      h_q * kDv,
                      kDv,
                      meta,
                      num_splits,
                      num_sm_parts,
                      nullptr,
                      stream};
  auto forward = [&]() {
    sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);
    smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(cp);
  };

  poison_kernel<<<1024, 256, 0, stream>>>(o, o_elems);
  forward();
  check(cudaStreamSynchronize(stream), "first forward");
  check(cudaGetLastError(), "first forward");

  // fp64 reference on sampled (request, row) pairs. Row r of request i is query token r / h_q,
  // head r % h_q (the binding's [b, s_q * h_q] view with one kv head); causal for s_q > 1: token t
  // sees kv - s_q + t + 1 keys.
  std::vector<__nv_bfloat16> h_o(o_elems);
  check(cudaMemcpy(h_o.data(), o, o_elems * 2, cudaMemcpyDeviceToHost), "memcpy out");
  double max_rel = 0;
  int nan_count = 0;
  for (size_t i = 0; i < o_elems; ++i) nan_count += std::isnan(__bfloat162float(h_o[i])) ? 1 : 0;
  // Element offset of key j of request req in the cache (its page through the shuffled table).
  auto key_offset = [&](int req, int j) {
    const int page = h_table[static_cast<size_t>(req) * blocks_per_seq + j / kPage];
    return (static_cast<uint64_t>(page) * kPage + j % kPage) * kDk;
  };
  for (int sample = 0; sample < 24; ++sample) {
    const int req = (sample * 37) % b;
    const int row = (sample * 53 + 7) % q_seq_per_hk;
    const int tok = row / h_q;
    const int keys = p.is_causal ? kv - s_q + tok + 1 : kv;
    const uint64_t q_off = (static_cast<uint64_t>(req) * q_seq_per_hk + row) * kDk;
    std::vector<double> s(keys), acc(kDv, 0.0);
    double mx = -1e300;
    for (int j = 0; j < keys; ++j) {
      const uint64_t k_off = key_offset(req, j);
      double dot = 0;
      for (int d = 0; d < kDk; ++d)
        dot += static_cast<double>(bf16_round(hash_value(q_off + d, 1u))) *
               bf16_round(hash_value(k_off + d, 2u));
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double l = 0;
    for (int j = 0; j < keys; ++j) {
      const uint64_t k_off = key_offset(req, j);
      const double w = std::exp(s[j] - mx);
      l += w;
      for (int d = 0; d < kDv; ++d) acc[d] += w * bf16_round(hash_value(k_off + d, 2u));
    }
    double num = 0, den = 0;
    const uint64_t o_off = (static_cast<uint64_t>(req) * q_seq_per_hk + row) * kDv;
    for (int d = 0; d < kDv; ++d) {
      const double ref = acc[d] / l;
      const double got = __bfloat162float(h_o[o_off + d]);
      num += (got - ref) * (got - ref);
      den += ref * ref;
    }
    max_rel = std::max(max_rel, std::sqrt(num / std::max(den, 1e-300)));
  }

  for (int i = 0; i < warmup; ++i) forward();
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(e0, stream), "cudaEventRecord");
    forward();
    check(cudaEventRecord(e1, stream), "cudaEventRecord");
    check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  check(cudaGetLastError(), "timed forwards");
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double flops = 2.0 * b * s_q * h_q * static_cast<double>(kv) * (kDk + kDv);
  const bool ok = nan_count == 0 && max_rel < 2e-2;
  std::printf(
      "flashmla_peer b%d kv%d h%d s_q%d parts %d ms_median %.4f ms_min %.4f TFLOP/s %.1f "
      "max_rel_l2 %.2e nan %d %s\n",
      b, kv, h_q, s_q, num_sm_parts, med, ms.front(), flops / (med * 1e-3) / 1e12, max_rel,
      nan_count, ok ? "verified" : "WRONG");
  return ok ? 0 : 1;
}
