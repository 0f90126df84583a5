// MLA decode instantiations for page size 128 (row tiles 16/32/64 x bf16/fp8_e4m3 cache).
#include "backends/mla/kernels/mla_decode_launch.cuh"

namespace attnkit::mla {
template Status run_decode_page<128>(const MlaDecodeParams&, DType, StreamHandle);
}  // namespace attnkit::mla
