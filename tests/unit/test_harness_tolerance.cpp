// harness::widen_tolerance: the bounds `attnkit run / bench --verify` and the fa3 GPU tests hold
// fa3's FP8 kernel to (apply_backend_arithmetic), and that a backend without FP8 arithmetic keeps
// the output dtype's bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/torch_native/torch_native_backend.h"
#include "harness/case_runner.h"

namespace attnkit::harness {
namespace {

Comparison bf16_comparison(double max_ref, bool lse) {
  Comparison c;
  c.tolerance = tolerance_for(DType::kBF16);
  c.max_abs_tolerance = 4.0 * c.tolerance * std::max(1.0, max_ref);  // kMaxAbsFactor
  c.lse_tolerance = lse ? c.tolerance : std::numeric_limits<double>::infinity();
  return c;
}

TEST(HarnessTolerance, WidenToTheFp8Bounds) {
  Comparison c = bf16_comparison(3.0, true);
  const double abs_per_rel = c.max_abs_tolerance / c.tolerance;
  // An FP8-kernel error (session 57, H200: rel L2 3.3e-2, LSE 6.7e-2) fails the bf16 bounds.
  c.rel_l2 = 3.3e-2;
  c.request_rel_l2 = 3.5e-2;
  c.max_abs = 0.12;
  c.lse_max_abs = 6.7e-2;
  EXPECT_FALSE(c.passed());
  widen_tolerance(&c, kFp8ArithmeticRelTolerance, kFp8ArithmeticLseTolerance);
  EXPECT_DOUBLE_EQ(c.tolerance, kFp8ArithmeticRelTolerance);
  EXPECT_DOUBLE_EQ(c.max_abs_tolerance, abs_per_rel * kFp8ArithmeticRelTolerance);
  EXPECT_DOUBLE_EQ(c.lse_tolerance, kFp8ArithmeticLseTolerance);
  EXPECT_TRUE(c.passed()) << c.summary();
  // Past the FP8 bounds it still fails; NaN and pool checks are not widened.
  Comparison worse = c;
  worse.rel_l2 = 0.08;
  EXPECT_FALSE(worse.passed());
  Comparison nan = c;
  nan.nan_inf_count = 1;
  EXPECT_FALSE(nan.passed());
  Comparison stray = c;
  stray.pool_stray_writes = 1;
  EXPECT_FALSE(stray.passed());
}

TEST(HarnessTolerance, LooserBoundsAndUncomparedLseStay) {
  Comparison c = bf16_comparison(1.0, false);
  widen_tolerance(&c, kFp8ArithmeticRelTolerance, kFp8ArithmeticLseTolerance);
  EXPECT_TRUE(std::isinf(c.lse_tolerance));  // no LSE requested: nothing to bound
  Comparison loose = bf16_comparison(1.0, true);
  loose.tolerance = 0.2;
  loose.max_abs_tolerance = 2.0;
  loose.lse_tolerance = 0.5;
  widen_tolerance(&loose, kFp8ArithmeticRelTolerance, kFp8ArithmeticLseTolerance);
  EXPECT_DOUBLE_EQ(loose.tolerance, 0.2);
  EXPECT_DOUBLE_EQ(loose.max_abs_tolerance, 2.0);
  EXPECT_DOUBLE_EQ(loose.lse_tolerance, 0.5);
}

TEST(HarnessTolerance, BackendsWithoutFp8ArithmeticKeepTheirBounds) {
  BackendContext ctx;
  ctx.num_q_heads = 4;
  ctx.num_kv_heads = 2;
  ctx.qk_head_dim = ctx.v_head_dim = 64;
  Result<std::unique_ptr<AttentionBackend>> b = create_torch_native_backend(ctx);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  Comparison c = bf16_comparison(2.0, true);
  const Comparison before = c;
  apply_backend_arithmetic(**b, &c);
  EXPECT_EQ(c.tolerance, before.tolerance);
  EXPECT_EQ(c.max_abs_tolerance, before.max_abs_tolerance);
  EXPECT_EQ(c.lse_tolerance, before.lse_tolerance);
}

}  // namespace
}  // namespace attnkit::harness
