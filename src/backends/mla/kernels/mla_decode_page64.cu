// MLA decode instantiations for page size 64 (row tiles 16/32/64 x bf16/fp8_e4m3 cache, the
// wgmma kernel for 64-row bf16 tiles).
#include "backends/mla/kernels/mla_decode_launch.cuh"

namespace attnkit::mla {
template Status run_decode_page<64>(const MlaDecodeParams&, DType, StreamHandle);

// Here, where the page-64 wgmma kernel is instantiated anyway.
bool wgmma_available() {
  static const bool ok = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, mla_decode_wgmma_kernel<64>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.binaryVersion == 90;
  }();
  return ok;
}

int wgmma_smem_bytes() { return MlaWgmmaTraits<64>::kSmemBytes; }
}  // namespace attnkit::mla
