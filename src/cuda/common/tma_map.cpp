// Host encoder of TMA descriptors (tma_map.h).
#include "cuda/common/tma_map.h"

#ifdef ATTNKIT_WITH_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/common/driver_entry.h"

namespace attnkit::cuda {
namespace {

// The driver's cuTensorMapEncodeTiled (no libcuda link); nullptr if absent.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn =
      driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

}  // namespace

bool encode_tiled_map(TmaElem elem, int rank, const void* base, const uint64_t* dims,
                      const uint64_t* strides_bytes, const uint32_t* box, TmaDesc* out) {
  static_assert(sizeof(CUtensorMap) == sizeof(TmaDesc), "TMA descriptor size");
  constexpr int kMaxRank = 5;
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || rank < 1 || rank > kMaxRank) return false;
  cuuint64_t d[kMaxRank] = {};
  cuuint64_t s[kMaxRank] = {};
  cuuint32_t b[kMaxRank] = {};
  cuuint32_t elem_strides[kMaxRank] = {};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    elem_strides[i] = 1;
    if (i + 1 < rank) s[i] = strides_bytes[i];
  }
  const CUtensorMapDataType type = elem == TmaElem::kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : elem == TmaElem::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  CUtensorMap map;
  const CUresult r =
      encode(&map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, s, b,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(out->words, &map, sizeof(map));
  return true;
}

}  // namespace attnkit::cuda

#else

namespace attnkit::cuda {

bool encode_tiled_map(TmaElem, int, const void*, const uint64_t*, const uint64_t*, const uint32_t*,
                      TmaDesc*) {
  return false;
}

}  // namespace attnkit::cuda

#endif  // ATTNKIT_WITH_CUDA
