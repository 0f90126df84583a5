// More tokens than a grid's z extent: the triton kernels launch in slices. A test binary of its
// own so that tests/CMakeLists.txt can run it RUN_SERIAL: it takes 8-9 s alone on an H200, but ran
// past ctest's 300 s (and 400 s) timeout beside other GPU tests under ctest -j in sessions 51, 72
// and 73 (the cause of that slowdown was not looked into).
#include <gtest/gtest.h>

#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

// More tokens than a grid's z extent (65535): the SIMT extend (f32 activations) and the
// tensor-core decode put the token on blockIdx.z, and such a launch failed with a raw "invalid
// configuration argument" after the cache write. They launch in slices now; checked against the
// fp64 reference (700 requests x 100 new tokens; 66000 decode requests).
TEST(TritonInputs, TokensPastTheGridZLimitRun) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  CaseSpec extend;
  extend.name = "grid_z_extend_f32";
  extend.mode = ForwardMode::kExtend;
  extend.page_size = 16;
  extend.prefix_lens.assign(700, 0);
  extend.new_lens.assign(700, 100);
  extend.num_q_heads = 2;
  extend.num_kv_heads = 1;
  extend.head_dim = extend.v_head_dim = 64;
  extend.q_dtype = extend.kv_dtype = DType::kF32;
  extend.seed = 13;
  test_support::run_shared_case("triton", Device::cuda(0), extend, true);

  CaseSpec decode = extend;
  decode.name = "grid_z_decode";
  decode.mode = ForwardMode::kDecode;
  decode.prefix_lens.assign(66000, 2);
  decode.new_lens.assign(66000, 1);
  decode.num_q_heads = 4;
  decode.q_dtype = decode.kv_dtype = DType::kBF16;
  test_support::run_shared_case("triton", Device::cuda(0), decode, true);
}

}  // namespace
}  // namespace attnkit
