// detail::set_kv_cuda: the device-side KV scatter with quantisation (see set_kv_cuda.h for the
// exact rules, which match the CPU scatter in kv_pool.cpp bit for bit).
#include <cuda_runtime.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dtype_convert.cuh"
#include "kv/set_kv_cuda.h"

namespace attnkit::detail {
namespace {

constexpr int kScatterThreads = 128;
constexpr float kFp4Max = 6.0f;
constexpr uint8_t kE4M3MaxCode = 0x7E;
constexpr int kNibbleBits = 4;

// Source/destination geometry shared by the kernels.
struct ScatterArgs {
  const void* src;       // [T, H, D] f32/f16/bf16, stride(2) == 1
  int64_t src_stride_t;  // elements
  int64_t src_stride_h;
  void* dst;             // [rows, H, D] pool dtype, contiguous
  uint8_t* dst_scales;   // fp4: [rows, H, D / 16]
  const int64_t* loc;    // [T]
  KVGuardRecord* guard;  // the pool's error word; nullptr = skip bad slots without recording
  int64_t rows;          // dst.size(0): slots outside [0, rows) are skipped
  int layer;             // recorded with a bad slot
  int tokens;
  int heads;
  int dim;
  float scale;
};

template <typename SrcT>
__device__ __forceinline__ float load_src(const ScatterArgs& a, int t, int h, int d) {
  const SrcT* row = static_cast<const SrcT*>(a.src) + t * a.src_stride_t + h * a.src_stride_h;
  return cuda::to_float(row[d]);
}

template <typename SrcT, DType kDst>
__device__ __forceinline__ void store_one(const ScatterArgs& a, int64_t index, float x) {
  if constexpr (kDst == DType::kBF16) {
    static_cast<__nv_bfloat16*>(a.dst)[index] = __float2bfloat16_rn(x);
  } else if constexpr (kDst == DType::kF16) {
    static_cast<__half*>(a.dst)[index] = __float2half_rn(x);
  } else if constexpr (kDst == DType::kF32) {
    static_cast<float*>(a.dst)[index] = x;
  } else if constexpr (kDst == DType::kFP8E4M3) {
    static_cast<uint8_t*>(a.dst)[index] = cuda::float_to_fp8_e4m3(__fdiv_rn(x, a.scale));
  } else {
    static_cast<uint8_t*>(a.dst)[index] = cuda::float_to_fp8_e5m2(__fdiv_rn(x, a.scale));
  }
}

// Device slot guard: true when `slot` is a row of the pool. Otherwise the caller writes nothing,
// and thread 0 of the block records (layer, t, slot) unless a bad write is already recorded.
// Block-uniform (every thread reads the same loc[t]), so the early return needs no barrier.
__device__ __forceinline__ bool slot_in_pool(const ScatterArgs& a, int t, int64_t slot) {
  // One unsigned compare covers slot < 0 (it wraps to a huge value) and slot >= rows.
  if (static_cast<uint64_t>(slot) < static_cast<uint64_t>(a.rows)) return true;
  if (threadIdx.x == 0 && a.guard != nullptr &&
      atomicCAS(&a.guard->flag, kGuardNone, kGuardBadWrite) == kGuardNone) {
    a.guard->layer = a.layer;
    a.guard->token = t;
    a.guard->slot = slot;
  }
  return false;
}

// grid: (T * H) block: (kScatterThreads); one thread per element.
template <typename SrcT, DType kDst>
__global__ void __launch_bounds__(kScatterThreads) scatter_kernel(const ScatterArgs a) {
  const int t = blockIdx.x / a.heads;
  const int h = blockIdx.x % a.heads;
  const int64_t slot = a.loc[t];
  if (!slot_in_pool(a, t, slot)) return;
  const int64_t dst_row = (slot * a.heads + h) * a.dim;
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    store_one<SrcT, kDst>(a, dst_row + d, load_src<SrcT>(a, t, h, d));
  }
}

// The smallest e4m3 value >= (amax / 6) / scale, clamped to 448; 0 for amax == 0.
__device__ __forceinline__ uint8_t fp4_block_scale_code(float amax, float scale) {
  if (!(amax > 0.0f) || !(scale > 0.0f)) return 0;
  const float exact = __fdiv_rn(__fdiv_rn(amax, kFp4Max), scale);
  if (!(exact < cuda::fp8_e4m3_to_float(kE4M3MaxCode))) return kE4M3MaxCode;
  uint8_t code = cuda::float_to_fp8_e4m3(exact);
  if (cuda::fp8_e4m3_to_float(code) < exact) ++code;  // positive codes are ordered like values
  return code;
}

// grid: (T * H) block: (kScatterThreads); one thread per 16-value group.
template <typename SrcT>
__global__ void __launch_bounds__(kScatterThreads) scatter_fp4_kernel(const ScatterArgs a) {
  const int t = blockIdx.x / a.heads;
  const int h = blockIdx.x % a.heads;
  const int groups = a.dim / kFp4GroupSize;
  const int64_t slot = a.loc[t];
  if (!slot_in_pool(a, t, slot)) return;
  uint8_t* packed = static_cast<uint8_t*>(a.dst) + (slot * a.heads + h) * a.dim / 2;
  uint8_t* scales = a.dst_scales + (slot * a.heads + h) * groups;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float values[kFp4GroupSize];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kFp4GroupSize; ++i) {
      values[i] = load_src<SrcT>(a, t, h, g * kFp4GroupSize + i);
      const float m = fabsf(values[i]);
      if (m > amax) amax = m;  // NaN compares false and is ignored
    }
    const uint8_t block_code = fp4_block_scale_code(amax, a.scale);
    scales[g] = block_code;
    const float block = cuda::fp8_e4m3_to_float(block_code);
    const float denom = __fmul_rn(block, a.scale);
#pragma unroll
    for (int i = 0; i < kFp4GroupSize; i += 2) {
      const uint8_t lo = block == 0.0f ? 0 : cuda::float_to_fp4_e2m1(__fdiv_rn(values[i], denom));
      const uint8_t hi =
          block == 0.0f ? 0 : cuda::float_to_fp4_e2m1(__fdiv_rn(values[i + 1], denom));
      packed[(g * kFp4GroupSize + i) / 2] = static_cast<uint8_t>(lo | (hi << kNibbleBits));
    }
  }
}

// grid: (ceil(T / kScatterThreads)) block: (kScatterThreads); records the first bad token.
__global__ void check_slots_kernel(const int64_t* loc, int tokens, int64_t rows, int* first_bad) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < tokens && (loc[t] < 0 || loc[t] >= rows)) atomicMin(first_bad, t);
}

bool check_indices_enabled() { return env_flag("ATTNKIT_CHECK_INDICES", false); }

Status check_slots(const TensorView& loc, int64_t rows, cudaStream_t stream) {
  const int tokens = static_cast<int>(loc.size(0));
  int* first_bad = nullptr;
  ATTNKIT_CUDA_TRY(cudaMallocAsync(&first_bad, sizeof(int), stream));
  const int none = tokens;
  Status st = [&]() -> Status {
    ATTNKIT_CUDA_TRY(
        cudaMemcpyAsync(first_bad, &none, sizeof(int), cudaMemcpyHostToDevice, stream));
    const int blocks = (tokens + kScatterThreads - 1) / kScatterThreads;
    check_slots_kernel<<<blocks, kScatterThreads, 0, stream>>>(loc.data_as<const int64_t>(), tokens,
                                                               rows, first_bad);
    ATTNKIT_CUDA_TRY(cudaGetLastError());
    int bad = none;
    ATTNKIT_CUDA_TRY(cudaMemcpyAsync(&bad, first_bad, sizeof(int), cudaMemcpyDeviceToHost, stream));
    ATTNKIT_CUDA_TRY(cudaStreamSynchronize(stream));
    if (bad < tokens) {
      int64_t slot = 0;
      ATTNKIT_CUDA_TRY(cudaMemcpy(&slot, loc.data_as<const int64_t>() + bad, sizeof(int64_t),
                                  cudaMemcpyDeviceToHost));
      return Status::invalid_argument(
          "set_kv: loc[" + std::to_string(bad) + "] = " + std::to_string(slot) +
          " is outside the pool rows [0, " + std::to_string(rows) + ")");
    }
    return Status::ok();
  }();
  const cudaError_t free_err = cudaFreeAsync(first_bad, stream);
  ATTNKIT_RETURN_IF_ERROR(st);
  ATTNKIT_CUDA_TRY(free_err);
  return Status::ok();
}

template <typename SrcT>
Status launch_for_src(const ScatterArgs& a, DType dst_dtype, cudaStream_t stream) {
  const int blocks = a.tokens * a.heads;
  switch (dst_dtype) {
    case DType::kBF16:
      scatter_kernel<SrcT, DType::kBF16><<<blocks, kScatterThreads, 0, stream>>>(a);
      break;
    case DType::kF16:
      scatter_kernel<SrcT, DType::kF16><<<blocks, kScatterThreads, 0, stream>>>(a);
      break;
    case DType::kF32:
      scatter_kernel<SrcT, DType::kF32><<<blocks, kScatterThreads, 0, stream>>>(a);
      break;
    case DType::kFP8E4M3:
      scatter_kernel<SrcT, DType::kFP8E4M3><<<blocks, kScatterThreads, 0, stream>>>(a);
      break;
    case DType::kFP8E5M2:
      scatter_kernel<SrcT, DType::kFP8E5M2><<<blocks, kScatterThreads, 0, stream>>>(a);
      break;
    case DType::kFP4E2M1:
      scatter_fp4_kernel<SrcT><<<blocks, kScatterThreads, 0, stream>>>(a);
      break;
    default:
      return Status::invalid_argument(std::string("set_kv: pool dtype ") + dtype_name(dst_dtype) +
                                      " is not a KV cache dtype");
  }
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status kv_guard_read_and_clear(void* guard, KVGuardRecord* out, StreamHandle stream) {
  *out = KVGuardRecord{};
  if (guard == nullptr) return Status::ok();
  cudaStream_t s = cuda::to_stream(stream);
  KVGuardRecord record;
  ATTNKIT_CUDA_TRY(
      cudaMemcpyAsync(&record, guard, sizeof(KVGuardRecord), cudaMemcpyDeviceToHost, s));
  ATTNKIT_CUDA_TRY(cudaStreamSynchronize(s));
  if (record.flag != 0) {
    ATTNKIT_CUDA_TRY(cudaMemsetAsync(guard, 0, sizeof(KVGuardRecord), s));
    ATTNKIT_CUDA_TRY(cudaStreamSynchronize(s));
  }
  *out = record;
  return Status::ok();
}

Status check_slots_cuda(const TensorView& loc, int64_t rows, StreamHandle stream) {
  if (loc.size(0) == 0 || !check_indices_enabled()) return Status::ok();
  return check_slots(loc, rows, cuda::to_stream(stream));
}

Status set_kv_cuda(const TensorView& dst, const TensorView& dst_scales, const TensorView& loc,
                   const TensorView& src, float scale, int layer, void* guard,
                   StreamHandle stream) {
  const int64_t tokens = src.size(0);
  if (tokens == 0) return Status::ok();
  // One block per (token, head): the grid's x extent is an int (at most 2^31 - 1 blocks).
  const int64_t blocks = tokens * dst.size(1);
  if (blocks > std::numeric_limits<int32_t>::max()) {
    return Status::invalid_argument("set_kv: " + std::to_string(tokens) + " tokens x " +
                                    std::to_string(dst.size(1)) +
                                    " heads = " + std::to_string(blocks) +
                                    " scatter blocks; at most 2147483647 per call (split the "
                                    "tokens over several calls)");
  }
  cudaStream_t s = cuda::to_stream(stream);
  ScatterArgs a{};
  a.src = src.data;
  a.src_stride_t = src.stride(0);
  a.src_stride_h = src.stride(1);
  a.dst = dst.data;
  a.dst_scales = static_cast<uint8_t*>(dst_scales.data);
  a.loc = loc.data_as<const int64_t>();
  a.guard = static_cast<KVGuardRecord*>(guard);
  a.rows = dst.size(0);
  a.layer = layer;
  a.tokens = static_cast<int>(tokens);
  a.heads = static_cast<int>(dst.size(1));
  a.dim = static_cast<int>(dst.size(2));
  a.scale = scale;
  switch (src.dtype) {
    case DType::kF32:
      return launch_for_src<float>(a, dst.dtype, s);
    case DType::kF16:
      return launch_for_src<__half>(a, dst.dtype, s);
    case DType::kBF16:
      return launch_for_src<__nv_bfloat16>(a, dst.dtype, s);
    default:
      return Status::invalid_argument(std::string("set_kv: src dtype ") + dtype_name(src.dtype) +
                                      " is not supported (accepted: f32, f16, bf16)");
  }
}

}  // namespace attnkit::detail
