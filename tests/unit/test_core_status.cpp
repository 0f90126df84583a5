// Status, Result and the error-propagation macros.
#include <gtest/gtest.h>

#include <string>

#include "attnkit/status.h"

namespace attnkit {
namespace {

TEST(StatusTest, DefaultIsOk) {
  const Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_TRUE(static_cast<bool>(s));
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(StatusTest, CodeNamesAreDistinctSnakeCase) {
  const StatusCode codes[] = {StatusCode::kOk,          StatusCode::kInvalidArgument,
                              StatusCode::kUnsupported, StatusCode::kNotBuilt,
                              StatusCode::kOutOfMemory, StatusCode::kNotFound,
                              StatusCode::kCudaError,   StatusCode::kInternal};
  const char* expected[] = {"ok",         "invalid_argument", "unsupported",
                            "not_built",  "out_of_memory",    "not_found",
                            "cuda_error", "internal"};
  for (size_t i = 0; i < std::size(codes); ++i) {
    EXPECT_STREQ(status_code_name(codes[i]), expected[i]);
  }
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  EXPECT_EQ(Status::invalid_argument("a").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Status::unsupported("a").code(), StatusCode::kUnsupported);
  EXPECT_EQ(Status::not_built("a").code(), StatusCode::kNotBuilt);
  EXPECT_EQ(Status::out_of_memory("a").code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Status::not_found("a").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::cuda_error("a").code(), StatusCode::kCudaError);
  EXPECT_EQ(Status::internal("a").code(), StatusCode::kInternal);
  const Status s = Status::invalid_argument("page_size 16 is not supported by flashmla (needs 64)");
  EXPECT_FALSE(s.is_ok());
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_EQ(s.message(), "page_size 16 is not supported by flashmla (needs 64)");
  EXPECT_EQ(s.to_string(),
            "invalid_argument: page_size 16 is not supported by flashmla (needs 64)");
}

TEST(StatusTest, ErrorWithoutMessagePrintsCodeOnly) {
  EXPECT_EQ(Status(StatusCode::kInternal, "").to_string(), "internal");
}

Result<int> parse_positive(int x) {
  if (x <= 0) return Status::invalid_argument("x " + std::to_string(x) + " must be > 0");
  return x;
}

Status twice_positive(int x, int* out) {
  ATTNKIT_ASSIGN_OR_RETURN(int v, parse_positive(x));
  *out = 2 * v;
  return Status::ok();
}

Status check_both(int a, int b) {
  ATTNKIT_RETURN_IF_ERROR(parse_positive(a).status());
  int unused = 0;
  ATTNKIT_RETURN_IF_ERROR(twice_positive(b, &unused));
  return Status::ok();
}

TEST(ResultTest, ValueAndError) {
  Result<int> good = parse_positive(3);
  ASSERT_TRUE(good.is_ok());
  EXPECT_EQ(*good, 3);
  EXPECT_EQ(good.value(), 3);
  Result<int> bad = parse_positive(-2);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "x -2 must be > 0");
}

TEST(ResultTest, MovesOutValue) {
  Result<std::string> r(std::string("payload"));
  const std::string taken = std::move(r).value();
  EXPECT_EQ(taken, "payload");
}

TEST(MacroTest, AssignOrReturnPropagates) {
  int out = -1;
  EXPECT_TRUE(twice_positive(21, &out).is_ok());
  EXPECT_EQ(out, 42);
  out = -1;
  const Status s = twice_positive(0, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
}

TEST(MacroTest, ReturnIfErrorPropagatesFirstError) {
  EXPECT_TRUE(check_both(1, 1).is_ok());
  EXPECT_EQ(check_both(-1, 1).message(), "x -1 must be > 0");
  EXPECT_EQ(check_both(1, -7).message(), "x -7 must be > 0");
}

}  // namespace
}  // namespace attnkit
