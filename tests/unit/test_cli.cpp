// The `attnkit` binary (ATTNKIT_CLI_PATH): the matrix golden file, `select` output, `backends`,
// --help, and one-line error messages with a non-zero exit for bad flags and values.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include "support/cli_runner.h"
namespace {

using attnkit::test_support::CliRun;

CliRun run_cli(const std::string& args) {
  return attnkit::test_support::run_cli(ATTNKIT_CLI_PATH, args);
}

std::string read_file(const std::string& path) {
  return attnkit::test_support::read_text_file(path);
}

std::string config(const std::string& name) {
  return std::string("--model-config '") + ATTNKIT_TEST_DATA_DIR + "/configs/" + name + ".json'";
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

void expect_one_line_error(const CliRun& r) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("attnkit", 0), 0u) << r.err;
}

TEST(Cli, MatrixMarkdownMatchesDocs) {
  const CliRun r = run_cli("matrix --format md");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string golden = read_file(std::string(ATTNKIT_SOURCE_DIR) + "/docs/support_matrix.md");
  ASSERT_FALSE(golden.empty()) << "docs/support_matrix.md is missing";
  EXPECT_EQ(r.out, golden) << "docs/support_matrix.md is stale: run scripts/gen_docs.sh";
}

// README.md carries the same tables between its matrix markers: without the title line and its
// blank line, sections one level down ("## " -> "### ").
TEST(Cli, ReadmeMatrixMatchesDocs) {
  const CliRun r = run_cli("matrix --format md");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string expected = r.out.substr(r.out.find("\n\n") + 2);
  for (size_t at = 0; (at = expected.find("## ", at)) != std::string::npos; at += 4) {
    if (at == 0 || expected[at - 1] == '\n') expected.insert(at, "#");
  }
  const std::string readme = read_file(std::string(ATTNKIT_SOURCE_DIR) + "/README.md");
  const std::string begin = "<!-- matrix:begin -->\n";
  const size_t a = readme.find(begin);
  const size_t b = readme.find("<!-- matrix:end -->");
  ASSERT_NE(a, std::string::npos) << "README.md has no matrix:begin marker";
  ASSERT_NE(b, std::string::npos) << "README.md has no matrix:end marker";
  EXPECT_EQ(readme.substr(a + begin.size(), b - a - begin.size()), expected)
      << "README.md's support matrix is stale: run scripts/gen_docs.sh";
}

TEST(Cli, MatrixDefaultsToMarkdownAndHasAllTables) {
  const CliRun r = run_cli("matrix");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("## MHA"), std::string::npos);
  EXPECT_NE(r.out.find("## MLA"), std::string::npos);
  EXPECT_NE(r.out.find("## Linear attention (GDN)"), std::string::npos);
  EXPECT_NE(r.out.find("| `trtllm_mha` |"), std::string::npos);
  EXPECT_NE(r.out.find("| 16,32,64 |"), std::string::npos);
}

TEST(Cli, MatrixJsonParses) {
  const CliRun r = run_cli("matrix --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_TRUE(j.contains("backends"));
  EXPECT_EQ(j["backends"].size(), 17u);
  EXPECT_EQ(j["backends"][0]["name"], "torch_native");
  EXPECT_EQ(j["linear_attention"].size(), 2u);
}

TEST(Cli, MatrixBadFormatListsValidValues) {
  const CliRun r = run_cli("matrix --format html");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("html"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("md"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("json"), std::string::npos) << r.err;
}

TEST(Cli, SelectPrintsDecisionAndReasons) {
  const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") + " --device sm90");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill backend:      fa3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode backend:       fa3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reasons:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generic default: MHA on Hopper"), std::string::npos) << r.out;
}

TEST(Cli, SelectHybridJson) {
  const CliRun r = run_cli("select " + config("deepseek-r1") +
                           " --device sm100 --attention-backend trtllm_mla "
                           "--prefill-attention-backend fa4 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["prefill_backend"], "fa4");
  EXPECT_EQ(j["decode_backend"], "trtllm_mla");
  EXPECT_EQ(j["page_size"], 64);
  EXPECT_EQ(j["hybrid"], true);
}

TEST(Cli, SelectSpeculativeAndPageFlags) {
  const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") +
                           " --device sm90 --attention-backend fa3 --page-size 16 "
                           "--speculative-algorithm EAGLE --speculative-eagle-topk 4 "
                           "--speculative-num-steps 5 --speculative-num-draft-tokens 8 "
                           "--kv-cache-dtype fp8_e4m3 --chunked-prefill-size 4096 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["page_size"], 16);
  EXPECT_EQ(j["kv_cache_dtype"], "fp8_e4m3");
  EXPECT_EQ(j["speculative"]["topk"], 4);
  EXPECT_EQ(j["chunked_prefill_size"], 4096);
}

// Integers with leading zeros are decimal: CLI11's strtoll(base 0) had read "010" as 8 and
// refused "08" as "Could not convert" after the range check had taken them as 10 and 8.
TEST(Cli, SelectLeadingZerosAreDecimal) {
  for (const auto& [flag, value] : {std::pair{"010", 10}, {"08", 8}, {"016", 16}}) {
    const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") +
                             " --device cpu --page-size " + flag + " --format json");
    ASSERT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["page_size"], value) << flag;
  }
}

TEST(Cli, SelectRuleErrorIsOneLine) {
  const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") +
                           " --device sm90 --attention-backend trtllm_mha");
  expect_one_line_error(r);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--attention-backend trtllm_mha cannot run prefill"), std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Cli, SelectUnknownBackendListsValidValues) {
  const CliRun r =
      run_cli("select " + config("llama-3.1-8b-instruct") + " --attention-backend flashattn");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--attention-backend"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("flashattn"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("trtllm_mla"), std::string::npos) << r.err;
}

TEST(Cli, SelectUnknownDeviceListsValidValues) {
  const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") + " --device h100");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("sm90"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cpu-noamx"), std::string::npos) << r.err;
}

TEST(Cli, SelectUnknownFlagListsValidOptions) {
  const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") + " --attn-backend fa3");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--attn-backend"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("valid options:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--attention-backend"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--speculative-eagle-topk"), std::string::npos) << r.err;
}

TEST(Cli, SelectBadKvDtypeListsValidValues) {
  const CliRun r = run_cli("select " + config("llama-3.1-8b-instruct") + " --kv-cache-dtype int8");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("fp8_e4m3"), std::string::npos) << r.err;
}

TEST(Cli, SelectMissingConfigIsAnError) {
  CliRun r = run_cli("select --device sm90");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--model-config"), std::string::npos) << r.err;
  r = run_cli("select --model-config /nonexistent/config.json");
  expect_one_line_error(r);
}

// A model directory holding config.json is accepted, as load_model_config and the Python API
// accept it (CLI::ExistingFile refused it); a directory without one names the file it looked for.
TEST(Cli, SelectAcceptsAModelDirectory) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "cli_model_dir_llama";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(
      std::string(ATTNKIT_TEST_DATA_DIR) + "/configs/llama-3.1-8b-instruct.json",
      dir / "config.json");
  const CliRun from_dir = run_cli("select --device sm90 --model-config '" + dir.string() + "'");
  ASSERT_EQ(from_dir.exit_code, 0) << from_dir.err;
  const CliRun from_file = run_cli("select --device sm90 " + config("llama-3.1-8b-instruct"));
  EXPECT_EQ(from_dir.out, from_file.out);
  std::filesystem::remove(dir / "config.json");
  const CliRun empty = run_cli("select --device sm90 --model-config '" + dir.string() + "'");
  expect_one_line_error(empty);
  EXPECT_NE(empty.err.find("config.json\" does not exist"), std::string::npos) << empty.err;
}

// --linear-attn-backend for a model without linear attention is reported as ignored, as
// --linear-attn-prefill-backend and --speculative-eagle-topk are; not when it is used or not given.
TEST(Cli, SelectWarnsAboutAnUnusedLinearAttnBackend) {
  const std::string ignored = "--linear-attn-backend is ignored";
  const CliRun unused = run_cli("select --device sm90 " + config("llama-3.1-8b-instruct") +
                                " --linear-attn-backend triton");
  ASSERT_EQ(unused.exit_code, 0) << unused.err;
  EXPECT_NE(unused.out.find(ignored), std::string::npos) << unused.out;
  const CliRun json = run_cli("select --device sm90 --format json " +
                              config("llama-3.1-8b-instruct") + " --linear-attn-backend triton");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_NE(json.out.find(ignored), std::string::npos) << json.out;
  const CliRun absent = run_cli("select --device sm90 " + config("llama-3.1-8b-instruct"));
  EXPECT_EQ(absent.out.find(ignored), std::string::npos) << absent.out;
  const CliRun used = run_cli("select --device sm90 " + config("qwen3-next-80b-a3b-instruct") +
                              " --linear-attn-backend triton");
  EXPECT_EQ(used.out.find(ignored), std::string::npos) << used.out << used.err;
}

TEST(Cli, UnknownSubcommandListsSubcommands) {
  const CliRun r = run_cli("selekt");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("unknown subcommand \"selekt\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("valid subcommands: matrix, select, backends"), std::string::npos) << r.err;
  const CliRun option = run_cli("--colour");
  expect_one_line_error(option);
  EXPECT_NE(option.err.find("unknown option \"--colour\""), std::string::npos) << option.err;
  const CliRun none = run_cli("");
  expect_one_line_error(none);
  EXPECT_NE(none.err.find("valid subcommands"), std::string::npos) << none.err;
}

// Numeric flags: the message names the flag, the value and the allowed range (not CLI11's
// "Value 0 not in range 0.000000 to 1797...").
TEST(Cli, NumericFlagsSayWhatIsAllowed) {
  const std::string select = "select " + config("llama-3.1-8b-instruct") + " --device sm90 ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {select + "--page-size 0", "--page-size: 0 is not allowed: must be an integer from 1 to"},
          {select + "--page-size -16",
           "--page-size: -16 is not allowed: must be an integer from 1"},
          {select + "--page-size abc",
           "--page-size: \"abc\" is not an integer (must be an integer"},
          {select + "--page-size 1.5", "--page-size: \"1.5\" is not an integer"},
          {select + "--page-size 4294967312", "--page-size: 4294967312 is not allowed"},
          {select + "--tp-size 0", "--tp-size: 0 is not allowed: must be an integer from 1"},
          {select + "--speculative-eagle-topk 0", "--speculative-eagle-topk: 0 is not allowed"},
          {select + "--chunked-prefill-size x",
           "--chunked-prefill-size: \"x\" is not an integer (must be an integer from -1"},
          {select + "--chunked-prefill-size 0",
           "--chunked-prefill-size 0 is invalid; use -1 (off)"},
          {"demo --device cpu --page-size 0", "--page-size: 0 is not allowed: must be an integer"},
          {"demo --device cpu --page-size 2147483647",
           "--page-size: 2147483647 is not allowed: must be an integer from 1 to 4096"},
      });
  // In range: accepted.
  EXPECT_EQ(run_cli(select + "--page-size 64 --tp-size 2").exit_code, 0);
}

// A flag given a value other than a boolean: the message says it is a flag and what it takes
// (CLI11 said only "Could not convert: --verify = maybe"); a tree's draft count past its tree.
TEST(Cli, FlagValuesAndDraftTreesSayWhatIsAllowed) {
  const std::string select = "select " + config("llama-3.1-8b-instruct") + " --device sm90 ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {"run --backend torch_native --case decode_small --verify=maybe",
           "attnkit run: --verify=maybe is not allowed: --verify is a flag; give it alone, or "
           "--verify=true|false"},
          {select + "--disable-cuda-graph=sometimes",
           "--disable-cuda-graph=sometimes is not allowed: --disable-cuda-graph is a flag"},
          {select + "--speculative-algorithm EAGLE --speculative-eagle-topk 8 "
                    "--speculative-num-steps 1 --speculative-num-draft-tokens 1024",
           "--speculative-num-draft-tokens 1024 is invalid: the draft tree of "
           "--speculative-eagle-topk 8 over --speculative-num-steps 1 holds at most 1 + topk + "
           "(steps - 1) * topk^2 = 9 tokens"},
      });
  // A value option's own check still speaks for it.
  const CliRun page = run_cli(select + "--page-size=abc");
  EXPECT_NE(page.err.find("--page-size: \"abc\" is not an integer"), std::string::npos) << page.err;
  EXPECT_EQ(run_cli(select + "--disable-cuda-graph=false").exit_code, 0);
}

// Helper 61's findings (2026-11-30): a draft count whose + 1 overflowed, a suggested chunk size
// that overflowed, and flags dropped without a word.
TEST(Cli, SelectOverflowsAndIgnoredFlagsAreSaid) {
  const std::string select = "select " + config("llama-3.1-8b-instruct") + " --device sm90 ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {select + "--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
                    "--speculative-num-steps 2147483647",
           "--speculative-num-steps: 2147483647 is not allowed: must be an integer from 1 to "
           "1024"},
          {select + "--speculative-num-draft-tokens 1025", "must be an integer from 1 to 1024"},
          {select + "--chunked-prefill-size 2147483647 --page-size 64",
           "must be a multiple of the page size 64 (use 2147483584)"},
      },
      {"-2147483648", "(use -"});
  const CliRun ignored = run_cli("select " + config("llama-3.1-8b-instruct") +
                                 " --device cpu --prefill-attention-backend torch_native "
                                 "--decode-attention-backend intel_amx --attention-backend triton "
                                 "--speculative-attention-mode decode");
  EXPECT_EQ(ignored.exit_code, 0) << ignored.err;
  const std::string both = ignored.out + ignored.err;
  EXPECT_NE(both.find("--attention-backend triton serves neither phase"), std::string::npos)
      << both;
  EXPECT_NE(both.find("--speculative-attention-mode decode is ignored"), std::string::npos) << both;
  // --enable-mixed-chunk without chunked prefill: said, and not reported as on.
  const std::string mixed = "select " + config("llama-3.1-8b-instruct") +
                            " --device cpu --format json --enable-mixed-chunk";
  const CliRun off = run_cli(mixed + " --chunked-prefill-size -1");
  EXPECT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(off.out.find("\"enable_mixed_chunk\": false"), std::string::npos) << off.out;
  EXPECT_NE(off.out.find("--enable-mixed-chunk is ignored: chunked prefill is off"),
            std::string::npos)
      << off.out;
  for (const char* chunk : {"", " --chunked-prefill-size 4096"}) {
    const CliRun on = run_cli(mixed + chunk);
    EXPECT_EQ(on.exit_code, 0) << chunk << ": " << on.err;
    EXPECT_NE(on.out.find("\"enable_mixed_chunk\": true"), std::string::npos) << chunk << on.out;
    EXPECT_EQ(on.out.find("--enable-mixed-chunk is ignored"), std::string::npos) << chunk << on.out;
  }
}

TEST(Cli, HelpEverywhere) {
  for (const char* args : {"--help", "matrix --help", "select --help", "backends --help",
                           "bench --help", "run --help", "demo --help"}) {
    const CliRun r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << args << ": " << r.out;
  }
  const CliRun r = run_cli("select --help");
  EXPECT_NE(r.out.find("--speculative-attention-mode"), std::string::npos);
  EXPECT_NE(r.out.find("--linear-attn-prefill-backend"), std::string::npos);
}

// Output that could not be written is a failure: `> /dev/full` exited 0 with the output lost.
TEST(Cli, LostStandardOutputFails) {
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH, {{"matrix > /dev/full", "attnkit: writing to standard output failed"},
                         {"backends > /dev/full", "writing to standard output failed"},
                         {"run --list-cases > /dev/full", "writing to standard output failed"}});
}

// The demo's page size 16 is its own default, not the flag's.
TEST(Cli, DemoCreditsItsOwnPageSize) {
  CliRun r = run_cli("demo --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("page size: 16 (the demo's default"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("(--page-size"), std::string::npos) << r.out;
  r = run_cli("demo --device cpu --page-size 32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("page size: 32 (--page-size"), std::string::npos) << r.out;
}

// README.md's CLI block lists every flag of every subcommand's --help, under that subcommand's
// `attnkit <name>` lines (so a flag added to the code without the README fails here).
TEST(Cli, ReadmeCliSectionListsEveryFlag) {
  const std::string readme = read_file(std::string(ATTNKIT_SOURCE_DIR) + "/README.md");
  const size_t begin = readme.find("## CLI\n\n```\n");
  ASSERT_NE(begin, std::string::npos) << "README.md has no CLI block";
  const size_t end = readme.find("```", begin + 12);
  const std::string block = readme.substr(begin, end - begin);
  for (const std::string sub : {"matrix", "select", "backends", "bench", "run", "demo"}) {
    // The subcommand's lines: from its first `attnkit <sub>` line to the next other subcommand's.
    std::string lines;
    for (size_t at = block.find("\nattnkit " + sub + " "); at != std::string::npos;
         at = block.find("\nattnkit " + sub + " ", at + 1)) {
      const size_t next = block.find("\nattnkit ", at + 1);
      lines += block.substr(at, next == std::string::npos ? std::string::npos : next - at);
    }
    ASSERT_FALSE(lines.empty()) << "README CLI block lacks `attnkit " << sub << "`";
    const CliRun help = run_cli(sub + " --help");
    ASSERT_EQ(help.exit_code, 0) << help.err;
    std::istringstream in(help.out);
    for (std::string line; std::getline(in, line);) {
      const size_t flag = line.find("--");
      if (line.rfind("  --", 0) != 0 && line.rfind("  -h,--", 0) != 0) continue;
      const std::string name = line.substr(flag, line.find_first_of(" \t", flag) - flag);
      if (name == "--help") continue;
      EXPECT_NE(lines.find(name), std::string::npos)
          << "README.md's CLI block does not list `attnkit " << sub << " " << name << "`";
    }
  }
}

TEST(Cli, BackendsSaysWhatIsBuiltAndWhy) {
  const CliRun r = run_cli("backends");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("torch_native"), std::string::npos);
  EXPECT_NE(r.out.find("needs ROCm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("needs an Ascend NPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cutedsl"), std::string::npos) << r.out;
}

}  // namespace
