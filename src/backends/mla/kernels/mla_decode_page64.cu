// MLA decode instantiations for page size 64 (row tiles 16/32/64 x bf16/fp8_e4m3 cache, the
// wgmma kernel for 64-row bf16 tiles).
#include "backends/mla/kernels/mla_decode_launch.cuh"

#if defined(ATTNKIT_MLA_TIMELINE)
#include <cstdio>
#include <cstdlib>
#include <vector>
#endif

namespace attnkit::mla {
template Status run_decode_page<64>(const MlaDecodeParams&, DType, StreamHandle);

// Here, where the page-64 wgmma kernel is instantiated anyway.
bool wgmma_available() {
  static cuda::PerDeviceValue ok;  // per device: a process may mix GPU generations
  return ok.get([] { return cuda::loads_as_sm90(mla_decode_wgmma_kernel<64>); }) > 0;
}

int wgmma_smem_bytes() { return MlaWgmmaTraits<64>::kSmemBytes; }

#if defined(ATTNKIT_MLA_TIMELINE)
// Diagnostic build: the timeline buffer of this translation unit's kernels (mla_decode_wgmma.cuh)
// to $ATTNKIT_MLA_TIMELINE_OUT after the launch just queued (skipped while a stream is captured).
void mla_timeline_dump(StreamHandle stream) {
  const char* path = std::getenv("ATTNKIT_MLA_TIMELINE_OUT");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (path == nullptr || cudaStreamIsCapturing(cuda::to_stream(stream), &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    return;
  }
  std::vector<unsigned long long> words(static_cast<size_t>(kTlCtas) * kTlRecords * kTlWords);
  if (cudaStreamSynchronize(cuda::to_stream(stream)) != cudaSuccess ||
      cudaMemcpyFromSymbol(words.data(), g_mla_timeline, words.size() * sizeof(words[0])) !=
          cudaSuccess) {
    std::fprintf(stderr, "mla timeline: copy failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return;
  }
  if (std::FILE* f = std::fopen(path, "wb")) {
    std::fwrite(words.data(), sizeof(words[0]), words.size(), f);
    std::fclose(f);
  }
}
#endif
}  // namespace attnkit::mla
