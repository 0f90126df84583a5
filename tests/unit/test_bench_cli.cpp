// `attnkit bench` and `attnkit run` end to end through the binary (ATTNKIT_CLI_PATH): a tiny
// verified CPU sweep whose JSON/CSV must carry the formula values, and the error paths.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../../bench/bench_case_file.h"
#include "../../bench/bench_formulas.h"
#include "support/cli_runner.h"

namespace attnkit::bench {
namespace {

using attnkit::test_support::CliRun;
using attnkit::test_support::write_text_file;

CliRun run_cli(const std::string& args) {
  return attnkit::test_support::run_cli(ATTNKIT_CLI_PATH, args);
}

std::string read_text(const std::string& path) {
  return attnkit::test_support::read_text_file(path);
}

// Two small decode points (ragged page fill: 33 and 40 tokens at page 16) and one causal extend.
constexpr const char* kDecodeFile = R"({
  "kind": "decode",
  "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
  "sweep": {"batch": [2], "kv_len": [33, 40]}
})";
constexpr const char* kExtendFile = R"({
  "kind": "extend",
  "fixed": {"q_heads": 4, "kv_heads": 1, "head_dim": 64, "page_size": 16},
  "cases": [{"batch": 2, "prefix_len": 5, "new_tokens": 9}]
})";

TEST(BenchCli, VerifiedCpuSweepWritesFormulaValues) {
  const std::string dir = ::testing::TempDir();
  const std::string cases = dir + "bench_cli_decode.json";
  const std::string json = dir + "bench_cli_decode_out.json";
  const std::string csv = dir + "bench_cli_decode_out.csv";
  write_text_file(cases, kDecodeFile);
  const CliRun r = run_cli("bench --backend torch_native --cases '" + cases +
                           "' --device cpu --verify --rotate-mib 1 --warmup 1 --iters 2 "
                           "--paired-rounds 3 --paired-calls 2 --json '" +
                           json + "' --csv '" + csv + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("decode_b2_kv33_p16_h4x2_d64_kvbf16"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[2/2]"), std::string::npos) << "progress lines on stderr: " << r.err;

  Result<CaseFile> file = parse_case_file_text(kDecodeFile, "inline");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const nlohmann::json doc = nlohmann::json::parse(read_text(json));
  EXPECT_EQ(doc["schema"], "attnkit-bench/1");
  EXPECT_NE(doc["command"].get<std::string>().find("--cases"), std::string::npos);
  EXPECT_EQ(doc["device"]["device"], "cpu");
  ASSERT_GE(doc["ceilings"].size(), 1u);
  EXPECT_EQ(doc["ceilings"][0]["name"], "cpu_copy");
  EXPECT_GT(doc["ceilings"][0]["gbs"].get<double>(), 0.0);
  ASSERT_EQ(doc["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& x = doc["results"][i];
    const BenchCase& c = file->cases[i];
    EXPECT_EQ(x["case"], c.name);
    EXPECT_EQ(x["status"], "ok") << x["message"];
    EXPECT_TRUE(x["verify"]["passed"].get<bool>());
    EXPECT_DOUBLE_EQ(x["bytes"].get<double>(), attention_bytes(c));
    EXPECT_DOUBLE_EQ(x["flops"].get<double>(), attention_flops(c));
    const double ms = x["ms_median"].get<double>();
    ASSERT_GT(ms, 0.0);
    EXPECT_NEAR(x["gbs"].get<double>(), gb_per_s(attention_bytes(c), ms), 1e-9);
    EXPECT_GE(x["copies"].get<int>(), 1);
    EXPECT_EQ(x["ceiling"], "cpu_copy");
    // Paired copy rounds: per round the case's GB/s over that round's copy pass.
    const nlohmann::json& paired = x["paired_copy"];
    EXPECT_EQ(paired["calls_per_round"], 2);
    ASSERT_EQ(paired["ratios"].size(), 3u);
    ASSERT_EQ(paired["copy_gbs"].size(), 3u);
    ASSERT_EQ(paired["gbs"].size(), 3u);
    std::vector<double> ratios;
    for (size_t k = 0; k < 3; ++k) {
      const double copy = paired["copy_gbs"][k].get<double>();
      ASSERT_GT(copy, 0.0);
      EXPECT_NEAR(paired["ratios"][k].get<double>(), paired["gbs"][k].get<double>() / copy, 1e-12);
      ratios.push_back(paired["ratios"][k].get<double>());
    }
    EXPECT_DOUBLE_EQ(paired["ratio_median"].get<double>(), median(ratios));
  }
  const std::string csv_text = read_text(csv);
  EXPECT_EQ(std::count(csv_text.begin(), csv_text.end(), '\n'), 3) << csv_text;
}

// An uneven batch (kv_lens): every request its own length, verified against the reference, and the
// JSON's bytes / flops are the per-request sums.
TEST(BenchCli, UnevenDecodeBatchIsVerified) {
  const std::string dir = ::testing::TempDir();
  const std::string cases = dir + "bench_cli_uneven.json";
  const std::string json = dir + "bench_cli_uneven_out.json";
  constexpr const char* kFile = R"({
    "kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"kv_lens": [300, 1, 17]}]
  })";
  write_text_file(cases, kFile);
  const CliRun r =
      run_cli("bench --backend torch_native,intel_amx --cases '" + cases +
              "' --device cpu --verify --rotate-mib 1 --warmup 0 --iters 1 --json '" + json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Result<CaseFile> file = parse_case_file_text(kFile, "inline");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const BenchCase& c = file->cases[0];
  const nlohmann::json doc = nlohmann::json::parse(read_text(json));
  ASSERT_EQ(doc["results"].size(), 2u);
  for (const nlohmann::json& x : doc["results"]) {
    EXPECT_EQ(x["case"], c.name);
    EXPECT_EQ(x["status"], "ok") << x["message"];
    EXPECT_TRUE(x["verify"]["passed"].get<bool>());
    EXPECT_EQ(x["params"]["kv_lens"], nlohmann::json::array({300, 1, 17}));
    EXPECT_DOUBLE_EQ(x["bytes"].get<double>(), attention_bytes(c));
    // 318 tokens x 2 kv heads x 64 x 2 (K, V) x 2 bytes + q / out 3 x 4 x 64 x 2 bytes each.
    EXPECT_DOUBLE_EQ(x["bytes"].get<double>(), 318.0 * 512 + 2 * 3 * 4 * 64 * 2);
  }
}

TEST(BenchCli, ExtendIsJudgedAgainstTheComputeCeiling) {
  const std::string dir = ::testing::TempDir();
  const std::string cases = dir + "bench_cli_extend.json";
  const std::string json = dir + "bench_cli_extend_out.json";
  write_text_file(cases, kExtendFile);
  const CliRun r = run_cli("bench --backend torch_native --cases '" + cases +
                           "' --device cpu --rotate-mib 1 --warmup 0 --iters 1 --gemm-tflops 2 "
                           "--json '" +
                           json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json doc = nlohmann::json::parse(read_text(json));
  ASSERT_EQ(doc["results"].size(), 1u);
  const nlohmann::json& x = doc["results"][0];
  EXPECT_EQ(x["bound"], "compute");
  EXPECT_EQ(x["ceiling"], "gemm_given");
  EXPECT_FALSE(x.contains("paired_copy")) << "paired copy rounds are for memory-bound cases";
  EXPECT_NEAR(x["ceiling_ratio"].get<double>(), x["tflops"].get<double>() / 2.0, 1e-12);
}

TEST(BenchCli, ErrorsExitNonZeroWithAMessage) {
  const std::string dir = ::testing::TempDir();
  CliRun r = run_cli("bench --backend torch_native --cases /nonexistent/cases.json --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot be opened"), std::string::npos) << r.err;

  const std::string cases = dir + "bench_cli_errors.json";
  write_text_file(cases, kDecodeFile);
  r = run_cli("bench --backend torch_native --cases '" + cases + "' --device cpu --filter nomatch");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("matches none"), std::string::npos) << r.err;

  r = run_cli("bench --backend no_such_backend --cases '" + cases + "' --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no_such_backend"), std::string::npos) << r.err;

  const std::string bad = dir + "bench_cli_bad.json";
  write_text_file(bad, R"({"kind": "decode", "sweep": {"kv_len": [0]}})");
  r = run_cli("bench --backend torch_native --cases '" + bad + "' --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("sweep.kv_len[0]"), std::string::npos) << r.err;

  r = run_cli("run --backend torch_native --case no_such_case --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no_such_case"), std::string::npos) << r.err;

  r = run_cli(
      "run --backend torch_native --case '{\"mode\": \"decode\", \"colour\": 1}' --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("colour"), std::string::npos) << r.err;
}

// Numeric flags and a bad --case name the flag / field, the value and what is allowed; an invalid
// case is refused as such, before the backend's support is looked at.
TEST(BenchCli, BadValuesSayWhatIsAllowed) {
  const std::string bench = "bench --backend torch_native --cases unused.json --device cpu ";
  const std::string run = "run --backend torch_native --device cpu --case ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "--iters 0", "--iters: 0 is not allowed: must be an integer from 1 to"},
          {bench + "--warmup -1", "--warmup: -1 is not allowed: must be an integer from 0 to"},
          {bench + "--launches two", "--launches: \"two\" is not an integer"},
          {bench + "--graph",
           "--graph times CUDA-graph replays: it needs --device cuda (got "
           "--device cpu)"},
          {bench + "--gemm-tflops 0", "--gemm-tflops: 0 is not allowed: must be a number > 0"},
          {bench + "--gemm-tflops fast", "--gemm-tflops: \"fast\" is not a number"},
          {run + "extend_page1_gqa4 --layers 0", "--layers: 0 is not allowed: must be an integer"},
          {"run --backend torch_native --case extend_page1_gqa4 --device cuda:x",
           "--device cuda:x is not a device (accepted: cpu, cuda, cuda:N)"},
          {"run --backend torch_native --case extend_page1_gqa4 --device cuda1",
           "--device cuda1 is not a device"},
          {run + R"('{"mode": "decode", "prefix_lens": [100], "page_size": 0}')",
           "--case: invalid_argument: case custom: page_size 0 must be >= 1"},
          {run + R"('{"mode": "decode", "prefix_lens": [100], "page_size": -3}')",
           "page_size -3 must be >= 1"},
          {run + R"('{"mode": "decode", "prefix_lens": [-5]}')",
           "prefix_lens[0] = -5 must be >= 0"},
          {run + R"('{"mode": "extend", "prefix_lens": [5], "new_lens": [-2]}')",
           "new_lens[0] = -2 must be >= 0"},
          {run + R"('{"mode": "decode", "prefix_lens": [5, 7], "head_dim": -1}')",
           "head dims -1/128 must be >= 1"},
          {run + R"('{"mode": "decode", "prefix_lens": [100')",
           "--case: invalid_argument: case spec: not valid JSON"},
          {run + R"('{"prefix_lens": [2000000000], "new_lens": [2000000000]}')",
           "request 0: encoder 0 + prefix 2000000000 + new 2000000000 = 4000000000 tokens"},
          {run + R"('{"prefix_lens": [5], "new_lens": [1], "page_size": 2000000000}')",
           "whole pages of page_size 2000000000 plus one"},
          {run + R"('{"name": "a b", "prefix_lens": [5], "new_lens": [1]}')",
           "\"name\" = \"a b\" (accepted: a non-empty string of [A-Za-z0-9_])"},
          // Listing runs nothing: options that act on a run are refused beside it.
          {"run --list-cases --backend torch_native", "--backend excludes --list-cases"},
          {"run --list-cases --case decode_page16 --verify", "excludes --list-cases"},
          {"bench --backend all --cases bench/cases/decode.json --list --json out.json",
           "--json excludes --list"},
      },
      {"cannot run", "max_context_len"});
}

// A case too large for the machine's memory (here: 1 GB of address space) ends with one error
// line, not with std::terminate's "terminate called after throwing an instance of
// 'std::bad_alloc'" and an abort.
TEST(BenchCli, CaseTooLargeForMemoryIsAnErrorNotAnAbort) {
  const std::string cli = ATTNKIT_CLI_PATH;
  const std::string inner = "ulimit -v 1000000; exec \"" + cli +
                            "\" run --backend torch_native --device cpu --case "
                            "\"{\\\"prefix_lens\\\": [200000000], \\\"new_lens\\\": [1]}\"";
  attnkit::test_support::expect_cli_errors("/bin/sh", {{"-c '" + inner + "'", "out_of_memory"}},
                                           {"terminate called"});
}

// A case file that is a directory, a point the harness cannot prepare and an output file that
// cannot be written end with one error line before anything is timed (they used to print the
// progress lines and the ceilings first, or report the directory as "not valid JSON").
TEST(BenchCli, BadPointsAndOutputPathsFailBeforeTiming) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "bench_cli_early_good.json";
  write_text_file(good, kDecodeFile);
  const std::string shared = dir + "bench_cli_early_shared.json";
  write_text_file(shared, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "sweep": {"batch": [2], "kv_len": [16], "shared_prefix": [32]}})");
  const std::string bench = "bench --backend torch_native --device cpu --iters 1 --warmup 0 ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "--cases '" + dir + "'", "is a directory (expected a JSON file"},
          {bench + "--cases '" + shared + "'",
           "decode_b2_kv16_p16_h4x2_d64_kvbf16_shared32: shared_prefix 32 must be a multiple of "
           "page_size, at most every prefix_lens[r]"},
          {bench + "--cases '" + good + "' --json /nonexistent_dir/out.json",
           "--json /nonexistent_dir/out.json: directory /nonexistent_dir does not exist"},
          {bench + "--cases '" + good + "' --csv '" + dir + "'", "is a directory"},
          // The input case file, one file for both outputs, and a file that cannot be created
          // (these overwrote the case file, lost the JSON, or failed after the sweep).
          {bench + "--cases '" + good + "' --csv '" + good + "'",
           "is the --cases file (it would be overwritten)"},
          {bench + "--cases '" + good + "' --json '" + dir + "o.x' --csv '" + dir + "o.x'",
           "--json and --csv name the same file"},
          {bench + "--cases '" + good + "' --json /proc/attnkit_out.json",
           "--json /proc/attnkit_out.json cannot be opened for writing"},
          // --list still checks --backend.
          {"bench --backend no_such_backend --cases '" + good + "' --list", "no_such_backend"},
          // More memory than the host has: one error line, not the kernel's OOM kill.
          {bench + "--cases '" + good + "' --rotate-mib 2000000000", "MiB this host has available"},
          {"run --backend torch_native --device cpu --layers 2147483647 --case "
           "'{\"mode\": \"decode\", \"prefix_lens\": [5]}'",
           "MiB this host has available"},
          {"run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
           "\"prefix_lens\": [10], \"sliding_window\": 18446744073709551615}'",
           "\"sliding_window\" = 18446744073709551615 (accepted: an integer in [-2147483648, "
           "2147483647])"},
      },
      {"not valid JSON", "ceiling"});
  EXPECT_TRUE(std::filesystem::exists(good));
  EXPECT_FALSE(std::filesystem::exists(dir + "o.x"));
}

TEST(BenchCli, RunVerifiesOneJsonCase) {
  const CliRun r = run_cli(
      "run --backend torch_native --device cpu --verify --case '{\"mode\": \"decode\", "
      "\"page_size\": 16, \"prefix_lens\": [20, 3], \"num_q_heads\": 4, \"num_kv_heads\": 2, "
      "\"head_dim\": 64, \"v_head_dim\": 64}'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("verify:  PASS"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace attnkit::bench
