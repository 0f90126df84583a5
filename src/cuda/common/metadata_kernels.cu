// GPU metadata kernels: token-index flattening, page tables, draft multi-step indices.
#include <cuda_runtime.h>

#include "attnkit/kv_cache.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/metadata_kernels.h"

namespace attnkit::cuda {
namespace {

constexpr int kMetaThreads = 256;

// Sum of len[0..end) by one block; every thread returns the total.
__device__ int32_t block_prefix_total(const int32_t* len, int end) {
  __shared__ int32_t partial[kMetaThreads];
  int32_t acc = 0;
  for (int i = threadIdx.x; i < end; i += blockDim.x) acc += len[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const int32_t total = partial[0];
  __syncthreads();
  return total;
}

// grid: (bs) block: (kMetaThreads)
__global__ void __launch_bounds__(kMetaThreads) token_indices_kernel(const TokenIndexArgs args) {
  const int b = blockIdx.x;
  const int32_t offset = args.len != nullptr ? block_prefix_total(args.len, b) : b * args.len_value;
  const int32_t n = args.len != nullptr ? args.len[b] : args.len_value;
  const int32_t start =
      (args.start ? args.start[b] : 0) + (args.start_plus ? args.start_plus[b] : 0);
  const int32_t* row = args.req_to_token + args.req_pool_indices[b] * args.req_to_token_stride;
  if (threadIdx.x == 0 && args.kv_indptr != nullptr) {
    args.kv_indptr[b + 1] = offset + n;
    if (b == 0) args.kv_indptr[0] = 0;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) args.kv_indices[offset + i] = row[start + i];
}

// grid: (bs) block: (kMetaThreads)
__global__ void __launch_bounds__(kMetaThreads) page_table_kernel(const PageTableArgs args) {
  const int b = blockIdx.x;
  const int32_t n = args.seq_lens[b];
  const int32_t pages = (n + args.page_size - 1) / args.page_size;
  const int32_t* row = args.req_to_token + args.req_pool_indices[b] * args.req_to_token_stride;
  int32_t* out = args.page_table + static_cast<int64_t>(b) * args.max_pages;
  for (int p = threadIdx.x; p < args.max_pages; p += blockDim.x) {
    out[p] = p < pages ? row[static_cast<int64_t>(p) * args.page_size] / args.page_size : 0;
  }
}

// grid: (bs * topk, num_steps) block: (kMetaThreads)
__global__ void __launch_bounds__(kMetaThreads) draft_indices_kernel(const DraftIndexArgs args) {
  const int r = blockIdx.x;  // row = b * topk + j
  const int step = blockIdx.y;
  const int b = r / args.topk;
  const int j = r % args.topk;
  // Rows before r: committed tokens of their requests plus step + 1 drafts each.
  __shared__ int32_t partial[kMetaThreads];
  int32_t acc = 0;
  for (int i = threadIdx.x; i < r; i += blockDim.x) acc += args.seq_lens[i / args.topk] + step + 1;
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const int32_t offset = partial[0];
  const int32_t committed = args.seq_lens[b];
  const int32_t n = committed + step + 1;
  int32_t* indptr = args.kv_indptr + static_cast<int64_t>(step) * (args.bs * args.topk + 1);
  int32_t* indices = args.kv_indices + step * args.indices_stride + offset;
  if (threadIdx.x == 0) {
    indptr[r + 1] = offset + n;
    if (r == 0) indptr[0] = 0;
  }
  const int32_t* row = args.req_to_token + args.req_pool_indices[b] * args.req_to_token_stride;
  const int64_t* drafts =
      args.out_cache_loc + (static_cast<int64_t>(b) * args.topk + j) * args.num_steps;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    indices[i] = i < committed ? row[i] : static_cast<int32_t>(drafts[i - committed]);
  }
}

}  // namespace

Status build_token_indices(const TokenIndexArgs& args, StreamHandle stream) {
  if (args.bs == 0) return Status::ok();
  token_indices_kernel<<<args.bs, kMetaThreads, 0, to_stream(stream)>>>(args);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

Status build_new_token_slots(const ForwardBatch& batch, int32_t* out, StreamHandle stream) {
  const TensorView table = batch.req_to_token_pool->table();
  const bool chain = batch.mode == ForwardMode::kTargetVerify &&
                     batch.extend_prefix_lens_host.empty();  // seq_lens + N drafts
  TokenIndexArgs args;
  args.req_to_token = table.data_as<const int32_t>();
  args.req_to_token_stride = table.stride(0);
  args.req_pool_indices = batch.req_pool_indices.data_as<const int32_t>();
  args.start = chain ? batch.seq_lens.data_as<const int32_t>()
                     : batch.extend_prefix_lens.data_as<const int32_t>();
  args.start_plus =
      batch.encoder_lens_host.empty() ? nullptr : batch.encoder_lens.data_as<const int32_t>();
  args.len = chain ? nullptr : batch.extend_seq_lens.data_as<const int32_t>();
  args.len_value = chain ? batch.spec.draft_token_num : 0;
  args.bs = batch.batch_size;
  args.kv_indices = out;
  return build_token_indices(args, stream);
}

Status build_page_table(const PageTableArgs& args, StreamHandle stream) {
  if (args.page_size < 1) {
    return Status::invalid_argument("page_size " + std::to_string(args.page_size) +
                                    " must be >= 1");
  }
  if (args.bs == 0) return Status::ok();
  page_table_kernel<<<args.bs, kMetaThreads, 0, to_stream(stream)>>>(args);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

Status build_draft_decode_indices(const DraftIndexArgs& args, StreamHandle stream) {
  if (args.topk < 1 || args.num_steps < 1) {
    return Status::invalid_argument("draft indices: topk " + std::to_string(args.topk) +
                                    " and num_steps " + std::to_string(args.num_steps) +
                                    " must be >= 1");
  }
  if (args.bs == 0) return Status::ok();
  const dim3 grid(args.bs * args.topk, args.num_steps);
  draft_indices_kernel<<<grid, kMetaThreads, 0, to_stream(stream)>>>(args);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::cuda
