// The page-size dispatch, the schedule launch and the shared-memory requirement of the MLA decode
// kernel family.
#include "backends/mla/kernels/mla_combine.cuh"
#include "backends/mla/kernels/mla_decode.h"
#include "backends/mla/kernels/mla_decode_mma.cuh"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::mla {

int max_smem_bytes() {
  int most = 0;
  const auto take = [&](int bytes) { most = bytes > most ? bytes : most; };
  take(MlaDecodeTraits<1, 1, false>::kSmemBytes);
  take(MlaDecodeTraits<1, 1, true>::kSmemBytes);
  take(MlaDecodeTraits<2, 1, false>::kSmemBytes);
  take(MlaDecodeTraits<2, 1, true>::kSmemBytes);
  take(MlaDecodeTraits<4, 1, false>::kSmemBytes);
  take(MlaDecodeTraits<4, 1, true>::kSmemBytes);
  return most;
}

Status launch_schedule(const MlaDecodeParams& p, int32_t* sched, int32_t* split_indptr,
                       StreamHandle stream) {
  const int min_parts = schedule_min_parts(p.num_parts, p.rows_per_req);
  mla_schedule_kernel<<<1, 32, 0, cuda::to_stream(stream)>>>(
      p.seq_lens, p.kv_len_extra, p.bs, p.num_parts, min_parts, sched, split_indptr);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

Status run_decode(const MlaDecodeParams& p, int page_size, DType kv_dtype, StreamHandle stream) {
  ATTNKIT_RETURN_IF_ERROR(dispatch_value<MlaPageSizes>(
      page_size, "mla decode: page_size",
      [&]<int kPage>() { return run_decode_page<kPage>(p, kv_dtype, stream); }));
  if (p.skip_combine != 0) return Status::ok();
  const int64_t rows = static_cast<int64_t>(p.bs) * p.rows_per_req;
  const int blocks = static_cast<int>((rows + kCombineWarps - 1) / kCombineWarps);
  mla_combine_kernel<<<blocks, 32 * kCombineWarps, 0, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::mla
