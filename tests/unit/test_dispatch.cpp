// ValueList / dispatch_value (src/cuda/common/dispatch.h): the compile-time lists that say which
// kernels exist, and the names their messages give.
#include <gtest/gtest.h>

#include <string>

#include "cuda/common/dispatch.h"

namespace attnkit {
namespace {

using Dims = ValueList<64, 80, 128, 256>;

TEST(DispatchTest, DispatchReachesTheValueOrNamesTheList) {
  int seen = 0;
  const Status ok = dispatch_value<Dims>(128, "head_dim", [&]<int kD>() {
    seen = kD;
    return Status();
  });
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  EXPECT_EQ(seen, 128);
  const Status missing = dispatch_value<Dims>(96, "head_dim", [&]<int kD>() {
    seen = kD;
    return Status();
  });
  EXPECT_EQ(missing.code(), StatusCode::kUnsupported);
  EXPECT_NE(missing.to_string().find("head_dim 96 is not compiled in (built: 64, 80, 128, 256)"),
            std::string::npos)
      << missing.to_string();
  EXPECT_EQ(seen, 128) << "no instantiation may run for a value outside the list";
}

// to_string_if lists only the values a predicate keeps (the flashinfer backend's "head dims built"
// message: the list cut by ATTNKIT_HEAD_DIMS), in the list's order; "none" when it keeps none.
TEST(DispatchTest, ToStringIfListsTheKeptValues) {
  EXPECT_EQ(Dims::to_string(), "64, 80, 128, 256");
  EXPECT_EQ(Dims::to_string_if([](int d) { return d >= 128; }), "128, 256");
  EXPECT_EQ(Dims::to_string_if([](int d) { return d == 80; }), "80");
  EXPECT_EQ(Dims::to_string_if([](int) { return false; }), "none");
  EXPECT_TRUE(Dims::contains(80));
  EXPECT_FALSE(Dims::contains(96));
  EXPECT_EQ(
      head_dims_built<Dims>([](int d) { return d == 128; }),
      "128; the kernels cover 64, 80, 128, 256, ATTNKIT_HEAD_DIMS chooses which are compiled");
}

}  // namespace
}  // namespace attnkit
