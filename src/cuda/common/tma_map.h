// TMA descriptors for the SM90 kernels: an opaque copy of the driver's 128-byte CUtensorMap (so
// that kernel parameter structs need no CUDA types; a kernel passes its address, in param space
// under __grid_constant__, to cp.async.bulk.tensor), and the host encoder shared by the fa3 and
// MLA engines.
#pragma once

#include <cstdint>

namespace attnkit::cuda {

struct alignas(64) TmaDesc {
  uint64_t words[16] = {};
};

// Element type of a tiled map.
enum class TmaElem { kBF16, kF16, kU8 };

// cuTensorMapEncodeTiled (through the runtime's driver entry point, no libcuda link) of a
// `rank`-dimensional map over `base`: dims[0] the contiguous one (elements), strides_bytes[i] the
// byte stride of dimension i + 1, box the box extents, 128-byte swizzle, 256-byte L2 promotion,
// no interleave, out-of-bounds elements zero. False (out untouched) without a CUDA build or
// driver, or when the driver rejects the map (alignment, extents).
bool encode_tiled_map(TmaElem elem, int rank, const void* base, const uint64_t* dims,
                      const uint64_t* strides_bytes, const uint32_t* box, TmaDesc* out);

}  // namespace attnkit::cuda
