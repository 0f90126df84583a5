// `attnkit bench --graph` end to end through the binary (ATTNKIT_CLI_PATH, gpu label): CUDA-graph
// replays of small decode points on every backend with graph support that claims them, with the
// replay metadata refresh's host time (init_forward_metadata_replay_cuda_graph, DESIGN.md section
// 9's "metadata refresh < 20 us" workload) in the text line and the JSON. Checks that the
// measurement exists and is consistent, never its value (performance is the benchmark's job).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/cli_runner.h"

namespace attnkit {
namespace {

using attnkit::test_support::CliRun;
using attnkit::test_support::write_text_file;

// GQA 32/8 d 128 decode at two batch sizes, page 16, one long enough to split.
constexpr const char* kDecodeFile = R"({
  "kind": "decode",
  "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16},
  "cases": [{"batch": 4, "kv_len": 300}, {"batch": 2, "kv_len": 9000}]
})";

class BenchGraph : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchGraph, ReportsTheReplayRefreshHostTime) {
  const std::string backend = GetParam();
  const std::string dir = ::testing::TempDir();
  const std::string cases = dir + "bench_graph_" + backend + ".json";
  const std::string json = dir + "bench_graph_" + backend + "_out.json";
  write_text_file(cases, kDecodeFile);
  const CliRun r = attnkit::test_support::run_cli(
      ATTNKIT_CLI_PATH, "bench --backend " + backend + " --cases '" + cases +
                            "' --device cuda --graph --launches 4 --warmup 1 --iters 3 --json '" +
                            json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("replay metadata refresh, host: median"), std::string::npos) << r.out;

  std::ifstream f(json);
  ASSERT_TRUE(f.good()) << json;
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.at("results").size(), 2u) << j.dump(2);
  for (const auto& x : j.at("results")) {
    ASSERT_EQ(x.at("status"), "ok") << x.dump(2);
    EXPECT_EQ(x.at("timing"), "cuda graph") << x.dump(2);
    const auto& refresh = x.at("replay_refresh");
    // One refresh per replay, max(iters, 100) in each pattern.
    EXPECT_EQ(refresh.at("samples").get<int>(), 100) << x.dump(2);
    const double med = refresh.at("us_median").get<double>();
    EXPECT_GT(med, 0.0) << x.dump(2);
    EXPECT_GE(refresh.at("us_p90").get<double>(), med) << x.dump(2);
    EXPECT_GE(refresh.at("us_max").get<double>(), refresh.at("us_p90").get<double>()) << x.dump(2);
    EXPECT_GT(refresh.at("idle_us_median").get<double>(), 0.0) << x.dump(2);
  }
}

INSTANTIATE_TEST_SUITE_P(GraphBackends, BenchGraph,
                         ::testing::Values("triton", "flashinfer", "fa3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace attnkit
