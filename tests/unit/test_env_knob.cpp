// env_knob.h: ATTNKIT_* knobs accept exactly their documented values; anything else is reported
// once per variable (naming the variable, the value, what is accepted and the default used) and
// the default is returned. Each test uses its own variable names: the warn-once set is per process.
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <thread>
#include <vector>

#include "core/env_knob.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

using test_support::ScopedEnv;

// stderr written while `f` runs.
template <typename F>
std::string stderr_of(F&& f) {
  testing::internal::CaptureStderr();
  f();
  return testing::internal::GetCapturedStderr();
}

TEST(EnvKnob, ParseIntIsStrict) {
  EXPECT_EQ(parse_env_int("0"), 0);
  EXPECT_EQ(parse_env_int("128"), 128);
  EXPECT_EQ(parse_env_int("-3"), -3);
  EXPECT_EQ(parse_env_int("2147483647"), INT_MAX);
  EXPECT_EQ(parse_env_int("-2147483648"), INT_MIN);
  for (const char* bad : {"", "128abc", "abc", " 1", "1 ", "+1", "0x10", "1.5", "-", "l",
                          "2147483648", "-2147483649", "99999999999999999999"}) {
    EXPECT_FALSE(parse_env_int(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(EnvKnob, FlagGoodValues) {
  const char* name = "ATTNKIT_TEST_FLAG_GOOD";
  std::string err = stderr_of([&] {
    EXPECT_TRUE(env_flag(name, true));  // unset
    EXPECT_FALSE(env_flag(name, false));
    {
      ScopedEnv e(name, "");  // empty = unset
      EXPECT_TRUE(env_flag(name, true));
      EXPECT_FALSE(env_flag(name, false));
    }
    {
      ScopedEnv e(name, "0");
      EXPECT_FALSE(env_flag(name, true));
    }
    {
      ScopedEnv e(name, "1");
      EXPECT_TRUE(env_flag(name, false));
    }
  });
  EXPECT_EQ(err, "");
}

TEST(EnvKnob, FlagBadValueWarnsOnceAndKeepsDefault) {
  const char* name = "ATTNKIT_TEST_FLAG_BAD";
  ScopedEnv e(name, "l");
  std::string err = stderr_of([&] { EXPECT_TRUE(env_flag(name, true)); });
  EXPECT_EQ(err, "attnkit: ignoring ATTNKIT_TEST_FLAG_BAD=l (accepted: 0, 1); using 1\n");
  err = stderr_of([&] { EXPECT_TRUE(env_flag(name, true)); });
  EXPECT_EQ(err, "");  // once per variable
  const char* other = "ATTNKIT_TEST_FLAG_BAD2";
  ScopedEnv e2(other, "yes");
  err = stderr_of([&] { EXPECT_FALSE(env_flag(other, false)); });
  EXPECT_EQ(err, "attnkit: ignoring ATTNKIT_TEST_FLAG_BAD2=yes (accepted: 0, 1); using 0\n");
}

TEST(EnvKnob, IntFromSet) {
  const char* name = "ATTNKIT_TEST_INT_SET";
  std::string err = stderr_of([&] {
    EXPECT_EQ(env_int(name, 128, {128, 256}), 128);
    ScopedEnv e(name, "256");
    EXPECT_EQ(env_int(name, 128, {128, 256}), 256);
  });
  EXPECT_EQ(err, "");
  for (const char* bad : {"100", "256abc", "-256"}) {
    const std::string n = std::string(name) + "_" + std::to_string(std::hash<std::string>{}(bad));
    ScopedEnv e(n.c_str(), bad);
    err = stderr_of([&] { EXPECT_EQ(env_int(n.c_str(), 128, {128, 256}), 128); });
    EXPECT_EQ(err, "attnkit: ignoring " + n + "=" + bad + " (accepted: 128, 256); using 128\n");
  }
}

TEST(EnvKnob, IntRange) {
  const char* name = "ATTNKIT_TEST_INT_RANGE";
  {
    ScopedEnv e(name, "4096");
    EXPECT_EQ(stderr_of([&] { EXPECT_EQ(env_int_range(name, 0, 1, 4096), 4096); }), "");
  }
  {
    ScopedEnv e(name, "1");
    EXPECT_EQ(stderr_of([&] { EXPECT_EQ(env_int_range(name, 0, 1, 4096), 1); }), "");
  }
  ScopedEnv e(name, "4097");
  EXPECT_EQ(
      stderr_of([&] { EXPECT_EQ(env_int_range(name, 0, 1, 4096), 0); }),
      "attnkit: ignoring ATTNKIT_TEST_INT_RANGE=4097 (accepted: integers 1..4096); using 0\n");
}

TEST(EnvKnob, IntPredicate) {
  const char* name = "ATTNKIT_TEST_INT_IF";
  auto pow2 = [](int x) { return x > 0 && (x & (x - 1)) == 0; };
  {
    ScopedEnv e(name, "64");
    EXPECT_EQ(stderr_of([&] { EXPECT_EQ(env_int_if(name, 256, pow2, "powers of two"), 64); }), "");
  }
  ScopedEnv e(name, "96");
  EXPECT_EQ(stderr_of([&] { EXPECT_EQ(env_int_if(name, 256, pow2, "powers of two"), 256); }),
            "attnkit: ignoring ATTNKIT_TEST_INT_IF=96 (accepted: powers of two); using 256\n");
}

TEST(EnvKnob, Choice) {
  const char* name = "ATTNKIT_TEST_CHOICE";
  EXPECT_EQ(env_choice(name, {"end", "early"}, "end"), "end");
  {
    ScopedEnv e(name, "early");
    EXPECT_EQ(stderr_of([&] {
                EXPECT_EQ(env_choice(name, {"end", "early"}, "end"), "early");
              }),
              "");
  }
  ScopedEnv e(name, "Early");  // exact spelling only
  EXPECT_EQ(stderr_of([&] {
              EXPECT_EQ(env_choice(name, {"end", "early"}, "end"), "end");
            }),
            "attnkit: ignoring ATTNKIT_TEST_CHOICE=Early (accepted: end, early); using end\n");
}

TEST(EnvKnob, WarnOnceAcrossThreads) {
  const char* name = "ATTNKIT_TEST_THREADS";
  ScopedEnv e(name, "2");
  const std::string err = stderr_of([&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 100; ++i) EXPECT_FALSE(env_flag(name, false));
      });
    }
    for (std::thread& t : threads) t.join();
  });
  EXPECT_EQ(err, "attnkit: ignoring ATTNKIT_TEST_THREADS=2 (accepted: 0, 1); using 0\n");
}

}  // namespace
}  // namespace attnkit
