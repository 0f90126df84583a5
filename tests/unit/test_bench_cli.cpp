// `attnkit bench` and `attnkit run` end to end through the binary (ATTNKIT_CLI_PATH): a tiny
// verified CPU sweep whose JSON/CSV must carry the formula values, and the error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../../bench/bench_case_file.h"
#include "../../bench/bench_case_spec.h"
#include "../../bench/bench_formulas.h"
#include "harness/case_runner.h"
#include "support/cli_runner.h"

// An allocation probe for HugeCudaCaseIsRefusedBeforeAnyHostVector: while g_new_cap > 0, operator
// new refuses (std::bad_alloc) every request above it and records the largest such request, so a
// host vector built before the size check shows up without being allocated.
namespace {
std::atomic<std::size_t> g_new_cap{0};
std::atomic<std::size_t> g_new_refused{0};
}  // namespace

void* operator new(std::size_t bytes) {
  const std::size_t cap = g_new_cap.load(std::memory_order_relaxed);
  if (cap > 0 && bytes > cap) {
    std::size_t seen = g_new_refused.load();
    while (seen < bytes && !g_new_refused.compare_exchange_weak(seen, bytes)) {
    }
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(bytes > 0 ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

// What most bench tests do: `file_text` written to the case file <TempDir>/<stem>.json,
// `attnkit bench --cases <it> --json <TempDir>/<stem>_out.json <args>` run, and the JSON it wrote
// parsed (null when the run failed; a successful run without valid JSON throws, failing the test).
struct BenchRun {
  CliRun cli;
  nlohmann::json doc;
};

BenchRun run_bench(const std::string& stem, const std::string& file_text, const std::string& args) {
  const std::string cases = ::testing::TempDir() + stem + ".json";
  const std::string json = ::testing::TempDir() + stem + "_out.json";
  write_text_file(cases, file_text);
  std::filesystem::remove(json);  // a file left by an earlier run is not this run's
  BenchRun r;
  r.cli = run_cli("bench --cases '" + cases + "' --json '" + json + "' " + args);
  // Also when every case was skipped (exit 1, "no case ran"): the JSON rows say why.
  if (std::filesystem::exists(json)) r.doc = nlohmann::json::parse(read_text(json));
  return r;
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
// A prefill compute-bound on any CPU: ~410 FLOP per byte, past the ridge of an AMX host (AMX peak
// over copy, ~115) as of an AVX512-BF16 one (~15-25). kExtendFile's ~7 FLOP per byte is judged
// memory-bound wherever the vector peak over the copy exceeds that (an AVX512-BF16 Zen guest).
constexpr const char* kExtendComputeFile = R"({
  "kind": "extend",
  "fixed": {"q_heads": 4, "kv_heads": 1, "head_dim": 64, "page_size": 16},
  "cases": [{"batch": 1, "prefix_len": 0, "new_tokens": 1024}]
})";

TEST(BenchCli, VerifiedCpuSweepWritesFormulaValues) {
  const std::string csv = ::testing::TempDir() + "bench_cli_decode_out.csv";
  const BenchRun r = run_bench("bench_cli_decode", kDecodeFile,
                               "--backend torch_native --device cpu --verify --rotate-mib 1 "
                               "--warmup 1 --iters 2 --paired-rounds 3 --paired-calls 2 --csv '" +
                                   csv + "'");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  EXPECT_NE(r.cli.out.find("decode_b2_kv33_p16_h4x2_d64_kvbf16"), std::string::npos) << r.cli.out;
  EXPECT_NE(r.cli.err.find("[2/2]"), std::string::npos)
      << "progress lines on stderr: " << r.cli.err;

  Result<CaseFile> file = parse_case_file_text(kDecodeFile, "inline");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const nlohmann::json& doc = r.doc;
  EXPECT_EQ(doc["schema"], "attnkit-bench/1");
  EXPECT_NE(doc["command"].get<std::string>().find("--cases"), std::string::npos);
  EXPECT_EQ(doc["device"]["device"], "cpu");
  ASSERT_GE(doc["ceilings"].size(), 1u);
  EXPECT_EQ(doc["ceilings"][0]["name"], "cpu_copy");
  EXPECT_GT(doc["ceilings"][0]["gbs"].get<double>(), 0.0);
  // The compute ceiling (pushed last, after the copy and read ones) where one was measured.
  const nlohmann::json& peak = doc["ceilings"].back();
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
    // Judged by the run's own ridge point (is_memory_bound over the measured ceilings): the copy
    // ceiling at these 1.9 FLOP/B wherever the probe loops are optimised. Those of a Debug or
    // sanitizer build keep their register chains in memory (debug-asan on a 2-core EPYC: an AVX2
    // peak of 0.003 TFLOP/s over 13.5 GB/s of copy, a ridge of 0.23 FLOP/B), so there the point is
    // judged by the compute peak.
    const bool by_copy =
        is_memory_bound(c, doc["ceilings"][0]["gbs"].get<double>(), peak.value("tflops", 0.0));
    EXPECT_EQ(x["ceiling"], by_copy ? "cpu_copy" : peak["name"].get<std::string>());
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
    EXPECT_EQ(x["ceiling"], "cpu_copy");
#endif
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
  constexpr const char* kFile = R"({
    "kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"kv_lens": [300, 1, 17]}]
  })";
  const BenchRun r = run_bench(
      "bench_cli_uneven", kFile,
      "--backend torch_native,intel_amx --device cpu --verify --rotate-mib 1 --warmup 0 --iters 1");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  Result<CaseFile> file = parse_case_file_text(kFile, "inline");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const BenchCase& c = file->cases[0];
  const nlohmann::json& doc = r.doc;
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

// An uneven extend (prefix_lens): every request its own cached prefix, verified against the
// reference; the JSON carries the lengths, and its bytes / flops are the per-request sums.
TEST(BenchCli, UnevenExtendBatchIsVerified) {
  constexpr const char* kFile = R"({
    "kind": "extend",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"prefix_lens": [40, 0, 17], "new_tokens": 9}]
  })";
  const BenchRun r = run_bench(
      "bench_cli_uneven_extend", kFile,
      "--backend torch_native,intel_amx --device cpu --verify --rotate-mib 1 --warmup 0 --iters 1");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  Result<CaseFile> file = parse_case_file_text(kFile, "inline");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const BenchCase& c = file->cases[0];
  ASSERT_EQ(r.doc["results"].size(), 2u);
  for (const nlohmann::json& x : r.doc["results"]) {
    EXPECT_EQ(x["case"], c.name);
    EXPECT_EQ(x["status"], "ok") << x["message"];
    EXPECT_TRUE(x["verify"]["passed"].get<bool>());
    EXPECT_EQ(x["params"]["prefix_lens"], nlohmann::json::array({40, 0, 17}));
    EXPECT_EQ(x["params"]["batch"], 3);
    // 57 + 27 = 84 tokens x 2 kv heads x 64 x 2 (K, V) x 2 bytes + q / out 27 x 4 x 64 x 2 each.
    EXPECT_DOUBLE_EQ(x["bytes"].get<double>(), 84.0 * 512 + 2 * 27 * 4 * 64 * 2);
    // Causal pairs: 9 x (40 + 0 + 17) + 3 x 45, x 2 (q.k, p.V) x 64 x 4 heads x 2.
    EXPECT_DOUBLE_EQ(x["flops"].get<double>(), 2.0 * 128 * 4 * (9 * 57 + 3 * 45));
  }
}

// An extend with a sliding window, soft-cap and sinks: the CaseSpec the bench prepares carries them
// (to_case_spec; --verify alone could not tell, as the reference reads the same spec), the forward
// matches the reference, and the JSON carries them with the window's pair count.
TEST(BenchCli, WindowSoftcapSinksExtendIsVerified) {
  constexpr const char* kFile = R"({
    "kind": "extend",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16, "batch": 2},
    "cases": [{"prefix_len": 40, "new_tokens": 50, "sliding_window": 17, "logit_cap": 3.5,
               "sinks": true}]
  })";
  const BenchRun r =
      run_bench("bench_cli_window", kFile,
                "--backend intel_amx --device cpu --verify --rotate-mib 1 --warmup 0 --iters 1");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  Result<CaseFile> file = parse_case_file_text(kFile, "inline");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const BenchCase& c = file->cases[0];
  const harness::CaseSpec spec = to_case_spec(c);
  EXPECT_EQ(spec.sliding_window, 17);
  EXPECT_EQ(spec.logit_cap, 3.5f);
  EXPECT_TRUE(spec.sinks);
  EXPECT_EQ(spec.type, AttentionType::kDecoder);
  ASSERT_EQ(r.doc["results"].size(), 1u);
  for (const nlohmann::json& x : r.doc["results"]) {
    EXPECT_EQ(x["case"], c.name);
    EXPECT_EQ(x["status"], "ok") << x["message"];
    EXPECT_TRUE(x["verify"]["passed"].get<bool>());
    EXPECT_EQ(x["params"]["sliding_window"], 17);
    EXPECT_EQ(x["params"]["logit_cap"], 3.5);
    EXPECT_EQ(x["params"]["sinks"], true);
    // 50 new tokens at 40..89 see 18 keys each: 900 pairs per request, 2 x (64 + 64) FLOPs per
    // pair and head.
    EXPECT_DOUBLE_EQ(x["flops"].get<double>(), 2.0 * 900 * 4 * 256);
  }
}

// The JSON's params carry what the counts depend on: an MLA verify chain's s_q and a shared
// prefix (recomputing the s_q 2 rows from params alone gave half their FLOPs).
TEST(BenchCli, ParamsCarrySqAndSharedPrefix) {
  const std::string args =
      "--backend torch_native --device cpu --rotate-mib 1 --warmup 0 --iters 1";
  const BenchRun mla_run = run_bench("bench_cli_params_mla", R"({"kind": "mla_decode",
    "fixed": {"q_heads": 4, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "page_size": 16},
    "cases": [{"batch": 1, "kv_len": 40, "s_q": 2}]})",
                                     args);
  // No CPU backend serves MLA: the row is skipped, so the run fails ("no case ran"), its JSON
  // written all the same.
  ASSERT_NE(mla_run.cli.exit_code, 0) << mla_run.cli.out << mla_run.cli.err;
  EXPECT_NE(mla_run.cli.err.find("no case ran"), std::string::npos) << mla_run.cli.err;
  ASSERT_TRUE(mla_run.doc.contains("results")) << mla_run.cli.err;
  const BenchRun dec_run = run_bench("bench_cli_params_dec", R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"batch": 2, "kv_len": 64, "shared_prefix": 32}]})",
                                     args);
  ASSERT_EQ(dec_run.cli.exit_code, 0) << dec_run.cli.out << dec_run.cli.err;
  const nlohmann::json& mla = mla_run.doc["results"][0];
  EXPECT_EQ(mla["params"]["s_q"], 2) << mla.dump();
  EXPECT_FALSE(mla["params"].contains("shared_prefix"));
  const nlohmann::json& dec = dec_run.doc["results"][0];
  EXPECT_EQ(dec["params"]["shared_prefix"], 32) << dec.dump();
  EXPECT_FALSE(dec["params"].contains("s_q"));
}

// A decode file's verify steps (s_q drafts, topk): the chain runs as TARGET_VERIFY and matches
// the reference on a backend with topk-1 support, the JSON carries s_q / topk and the drafts'
// pair count, and the tree (topk > 1) is skipped with the descriptor's reason there.
TEST(BenchCli, DecodeVerifyStepIsVerified) {
  constexpr const char* kFile = R"({
    "kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16, "batch": 2,
              "kv_len": 70, "s_q": 5},
    "sweep": {"topk": [1, 2]}
  })";
  const BenchRun r =
      run_bench("bench_cli_verify_step", kFile,
                "--backend intel_amx --device cpu --verify --rotate-mib 1 --warmup 0 --iters 1");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  ASSERT_EQ(r.doc["results"].size(), 2u);
  const nlohmann::json& chain = r.doc["results"][0];
  EXPECT_EQ(chain["case"], "decode_b2_kv70_sq5_p16_h4x2_d64_kvbf16");
  EXPECT_EQ(chain["status"], "ok") << chain["message"];
  EXPECT_TRUE(chain["verify"]["passed"].get<bool>());
  EXPECT_EQ(chain["params"]["s_q"], 5);
  EXPECT_FALSE(chain["params"].contains("topk"));
  // Drafts see 66..70 keys: 340 pairs per request, 2 x (64 + 64) FLOPs per pair and head.
  EXPECT_DOUBLE_EQ(chain["flops"].get<double>(), 2.0 * 340 * 4 * 256);
  const nlohmann::json& tree = r.doc["results"][1];
  EXPECT_EQ(tree["params"]["topk"], 2);
  EXPECT_EQ(tree["status"], "skipped") << tree.dump();
  EXPECT_NE(tree["message"].get<std::string>().find("topk"), std::string::npos) << tree.dump();
}

// An extend is judged by its arithmetic intensity against the run's ridge point (the compute
// ceiling over the copy ceiling): 512 new tokens at 4 q / 1 kv heads, d 64 (~200 FLOP/B) against a
// given 0.5 TFLOP/s (a ridge of 100 FLOP/B at 5 GB/s of copy, less on any faster host) is
// compute-bound; 9 new tokens over a 5-token prefix (~4 FLOP/B) against 2 TFLOP/s memory-bound.
TEST(BenchCli, ExtendIsJudgedByTheRidgePoint) {
  const BenchRun prefill =
      run_bench("bench_cli_extend_prefill", R"({"kind": "extend",
        "fixed": {"q_heads": 4, "kv_heads": 1, "head_dim": 64, "page_size": 16},
        "cases": [{"batch": 1, "prefix_len": 0, "new_tokens": 512}]})",
                "--backend torch_native --device cpu --rotate-mib 1 --warmup 0 --iters 1 "
                "--gemm-tflops 0.5");
  ASSERT_EQ(prefill.cli.exit_code, 0) << prefill.cli.out << prefill.cli.err;
  ASSERT_EQ(prefill.doc["results"].size(), 1u);
  const nlohmann::json& x = prefill.doc["results"][0];
  EXPECT_EQ(x["bound"], "compute");
  EXPECT_EQ(x["ceiling"], "gemm_given");
  EXPECT_FALSE(x.contains("paired_copy")) << "paired copy rounds are for memory-bound cases";
  EXPECT_FALSE(x.contains("paired_peak")) << "no pass can measure a --gemm-tflops ceiling";
  EXPECT_NEAR(x["ceiling_ratio"].get<double>(), x["tflops"].get<double>() / 0.5, 1e-12);

  const BenchRun small =
      run_bench("bench_cli_extend_small", kExtendFile,
                "--backend torch_native --device cpu --rotate-mib 1 --warmup 0 --iters 1 "
                "--gemm-tflops 2");
  ASSERT_EQ(small.cli.exit_code, 0) << small.cli.out << small.cli.err;
  ASSERT_EQ(small.doc["results"].size(), 1u);
  const nlohmann::json& y = small.doc["results"][0];
  EXPECT_EQ(y["bound"], "memory") << y.dump();
  EXPECT_EQ(y["ceiling"], "cpu_copy") << y.dump();
  double copy_gbs = 0;
  for (const nlohmann::json& c : small.doc["ceilings"]) {
    if (c["name"] == "cpu_copy") copy_gbs = c["gbs"].get<double>();
  }
  ASSERT_GT(copy_gbs, 0) << small.doc["ceilings"].dump();
  EXPECT_NEAR(y["ceiling_ratio"].get<double>(), y["gbs"].get<double>() / copy_gbs, 1e-9)
      << y.dump();
}

// A compute-bound case on the CPU is paired with readings of the compute ceiling it is judged by
// (the vector peak here, the AMX peak on an AMX host): per round the case's TFLOP/s over that
// round's reading, and the median of those ratios.
TEST(BenchCli, ExtendPairedWithTheComputePeak) {
  const BenchRun r = run_bench("bench_cli_extend_paired", kExtendComputeFile,
                               "--backend torch_native --device cpu --rotate-mib 1 --warmup 0 "
                               "--iters 1 --paired-rounds 3 --paired-calls 2");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  const nlohmann::json& x = r.doc["results"][0];
  EXPECT_EQ(x["bound"], "compute");
  const std::string ceiling = x["ceiling"].get<std::string>();
  if (ceiling.empty()) GTEST_SKIP() << "no CPU compute ceiling on this host (no AVX2)";
  EXPECT_FALSE(x.contains("paired_copy")) << "paired copy rounds are for memory-bound cases";
  ASSERT_TRUE(x.contains("paired_peak")) << x.dump();
  const nlohmann::json& paired = x["paired_peak"];
  EXPECT_EQ(paired["ceiling"], ceiling);
  EXPECT_EQ(paired["calls_per_round"], 2);
  ASSERT_EQ(paired["ratios"].size(), 3u);
  ASSERT_EQ(paired["peak_tflops"].size(), 3u);
  ASSERT_EQ(paired["tflops"].size(), 3u);
  std::vector<double> ratios;
  for (size_t k = 0; k < 3; ++k) {
    const double peak = paired["peak_tflops"][k].get<double>();
    ASSERT_GT(peak, 0.0);
    const double tflops = paired["tflops"][k].get<double>();
    ASSERT_GT(tflops, 0.0);
    EXPECT_NEAR(paired["ratios"][k].get<double>(), tflops / peak, 1e-12);
    ratios.push_back(paired["ratios"][k].get<double>());
  }
  EXPECT_DOUBLE_EQ(paired["ratio_median"].get<double>(), median(ratios));
  EXPECT_NE(r.cli.out.find("(paired peak: median"), std::string::npos) << r.cli.out;
}

// A case whose paired rounds would take longer than --paired-max-seconds gets fewer calls per
// round or, where one call per round would already pass it, none; the row and the JSON say why.
// A cap far below any forward's time forces the no-rounds path for a decode (copy rounds) and an
// extend (peak rounds) case; the default cap leaves a small case's rounds whole and says nothing.
TEST(BenchCli, PairedRoundsPastTheCapAreSkippedWithANote) {
  for (const char* file : {kDecodeFile, kExtendFile}) {
    SCOPED_TRACE(file);
    const BenchRun r = run_bench("bench_cli_paired_cap", file,
                                 "--backend torch_native --device cpu --rotate-mib 1 --warmup 0 "
                                 "--iters 1 --paired-rounds 3 --paired-calls 2 "
                                 "--paired-max-seconds 1e-9");
    ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
    const nlohmann::json& x = r.doc["results"][0];
    if (x["ceiling"].get<std::string>().empty()) continue;  // no ceiling here: no rounds due
    EXPECT_FALSE(x.contains("paired_copy")) << x.dump();
    EXPECT_FALSE(x.contains("paired_peak")) << x.dump();
    ASSERT_TRUE(x.contains("paired_note")) << x.dump();
    const std::string note = x["paired_note"].get<std::string>();
    EXPECT_EQ(note.rfind("skipped: one call per round over 3 rounds at the timed median ", 0), 0u)
        << note;
    EXPECT_NE(note.find("--paired-max-seconds 1e-09"), std::string::npos) << note;
    EXPECT_NE(r.cli.out.find("(paired rounds skipped: "), std::string::npos) << r.cli.out;
  }
  const BenchRun whole = run_bench("bench_cli_paired_whole", kDecodeFile,
                                   "--backend torch_native --device cpu --rotate-mib 1 "
                                   "--warmup 0 --iters 1 --paired-rounds 2 --paired-calls 1");
  ASSERT_EQ(whole.cli.exit_code, 0) << whole.cli.out << whole.cli.err;
  EXPECT_FALSE(whole.doc["results"][0].contains("paired_note")) << whole.doc.dump();
  EXPECT_EQ(whole.cli.out.find("(paired rounds "), std::string::npos) << whole.cli.out;
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
          {bench + "--gemm-tflops 0",
           "--gemm-tflops: 0 is not allowed: must be a decimal number in [0.001, 100000]"},
          {bench + "--gemm-tflops fast", "--gemm-tflops: \"fast\" is not a number"},
          {run + "extend_page1_gqa4 --layers 0", "--layers: 0 is not allowed: must be an integer"},
          // Layer 0 is self-attention: one layer of a cross-attention case verified no cross.
          {run + "decode_cross_attention --layers 1",
           "--layers 1 is too few for decode_cross_attention: a cross-attention case runs "
           "self-attention on even layers and cross-attention on odd ones; give --layers 2 or "
           "more"},
          {bench + "--paired-calls 1000001",
           "--paired-calls: 1000001 is not allowed: must be an integer from 1 to 1000000"},
          {bench + "--paired-max-seconds 1e300",
           "--paired-max-seconds: 1e300 is not allowed: must be a decimal number in [1e-09, 3600]"},
          {"run --backend torch_native --case extend_page1_gqa4 --device cuda:x",
           "--device cuda:x is not a device (accepted: cpu, cuda, cuda:N)"},
          {"run --backend torch_native --case extend_page1_gqa4 --device cuda1",
           "--device cuda1 is not a device"},
          {run + R"('{"mode": "decode", "prefix_lens": [100], "page_size": 0}')",
           "--case: invalid_argument: case custom: page_size 0 must be in [1, 4096]"},
          {run + R"('{"mode": "decode", "prefix_lens": [100], "page_size": -3}')",
           "page_size -3 must be in [1, 4096]"},
          {run + R"('{"mode": "decode", "prefix_lens": [-5]}')",
           "prefix_lens[0] = -5 must be >= 0"},
          {run + R"('{"mode": "extend", "prefix_lens": [5], "new_lens": [-2]}')",
           "new_lens[0] = -2 must be >= 0"},
          {run + R"('{"mode": "decode", "prefix_lens": [5, 7], "head_dim": -1}')",
           "head dims -1/-1 must be >= 1"},
          {run + R"('{"mode": "decode", "prefix_lens": [100')",
           "--case: invalid_argument: case spec: not valid JSON"},
          {run + R"('{"prefix_lens": [2000000000], "new_lens": [2000000000]}')",
           "request 0: encoder 0 + prefix 2000000000 + new 2000000000 = 4000000000 tokens"},
          {run + R"('{"prefix_lens": [5], "new_lens": [1], "page_size": 2000000000}')",
           "page_size 2000000000 must be in [1, 4096]"},
          // A page far past every request (a million rows for a 6-token decode once had the
          // harness allocate ~20 GB) is refused before anything is allocated.
          {run + R"('{"mode": "decode", "prefix_lens": [5], "page_size": 1000000}')",
           "page_size 1000000 must be in [1, 4096] (a larger page only pads"},
          // A name is checked as one string: it was compared through two temporaries, which
          // refused short valid names and let long invalid ones through.
          {run + R"('{"name": "bad name with spaces, long", "prefix_lens": [5], "new_lens": [1]}')",
           "\"name\" = \"bad name with spaces, long\" (accepted: a non-empty string of "
           "[A-Za-z0-9_])"},
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
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow address space at start: the "
                  "CLI cannot start under ulimit -v";
#endif
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
  const std::string huge_batch = dir + "bench_cli_early_huge_batch.json";
  write_text_file(huge_batch, R"({"kind": "decode",
    "fixed": {"q_heads": 2, "kv_heads": 1, "head_dim": 64},
    "cases": [{"batch": 2147483647, "kv_len": 8}]})");
  const std::string bench = "bench --backend torch_native --device cpu --iters 1 --warmup 0 ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "--cases '" + dir + "'", "is a directory (expected a JSON file"},
          {bench + "--cases '" + shared + "'",
           "decode_b2_kv16_p16_h4x2_d64_kvbf16_shared32: shared_prefix 32 must be at most every "
           "request's cached prefix (prefix_lens[0] = 15;"},
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
          // Past the KV pool's layer bound: refused by the flag before the memory guard.
          {"run --backend torch_native --device cpu --layers 2147483647 --case "
           "'{\"mode\": \"decode\", \"prefix_lens\": [5]}'",
           "--layers: 2147483647 is not allowed: must be an integer from 1 to 65536"},
          // Within it, more memory than the host has: one error line, not the kernel's OOM kill.
          {"run --backend torch_native --device cpu --layers 65536 --case '{\"mode\": "
           "\"decode\", \"prefix_lens\": [100000], \"num_q_heads\": 8, \"num_kv_heads\": 8, "
           "\"head_dim\": 128}'",
           "MiB this host has available"},
          {"run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
           "\"prefix_lens\": [10], \"sliding_window\": 18446744073709551615}'",
           "\"sliding_window\" = 18446744073709551615 (accepted: an integer in [-2147483648, "
           "2147483647])"},
          // head_dim + v_head_dim past INT32_MAX: the memory guard sums them as doubles (the int
          // sum wrapped negative and let a 21 GB allocation through).
          {"run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
           "\"prefix_lens\": [0], \"num_q_heads\": 1, \"num_kv_heads\": 1, \"head_dim\": 64, "
           "\"v_head_dim\": 2147483584}'",
           "MiB this host has available"},
          // A case-file batch is bounded before its per-request lengths are built.
          {"bench --backend torch_native --device cpu --cases '" + huge_batch + "' --list",
           "cases[0].batch: 2147483647 is out of range (accepted: 1 to 1048576)"},
          // MLA shapes name the values that break them.
          {"run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
           "\"prefix_lens\": [5, 9], \"mla\": true, \"num_q_heads\": 4, \"kv_lora_rank\": 64, "
           "\"qk_rope_head_dim\": 16, \"head_dim\": 80}'",
           "needs num_kv_heads 1 and v_head_dim = kv_lora_rank 64 (got num_kv_heads 2, v_head_dim "
           "64)"},
          {"run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
           "\"prefix_lens\": [5], \"mla\": true, \"num_kv_heads\": 1, \"kv_lora_rank\": 64, "
           "\"qk_rope_head_dim\": 16, \"head_dim\": 48}'",
           "MLA head_dim 48 is not kv_lora_rank + qk_rope_head_dim = 80"},
      },
      {"not valid JSON", "ceiling"});
  EXPECT_TRUE(std::filesystem::exists(good));
  EXPECT_FALSE(std::filesystem::exists(dir + "o.x"));
}

// A backend that refuses a point when it is created (intel_amx has no kernels for v_head_dim 7,
// which its descriptor row does not list) is a skipped row with its reason, as one that the
// descriptor rules out, not a failed bench.
TEST(BenchCli, PointRefusedAtCreationIsSkipped) {
  const std::string cases = ::testing::TempDir() + "bench_cli_v7.json";
  write_text_file(cases, R"({"kind": "decode",
    "fixed": {"q_heads": 2, "kv_heads": 1, "head_dim": 64, "v_head_dim": 7, "page_size": 16},
    "cases": [{"batch": 1, "kv_len": 16}]})");
  const CliRun r = run_cli("bench --backend all --device cpu --cases '" + cases +
                           "' --iters 1 --warmup 0 --paired-rounds 0 --verify");
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("v_head_dim 7 is not supported by intel_amx"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("failed"), std::string::npos) << r.out;
}

// The case of the reviewer's notes: one decode point of 64 tokens.
constexpr const char* kSmallFile = R"({"kind": "decode",
  "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
  "cases": [{"batch": 1, "kv_len": 64}]})";

// A case far too large for the host is refused from its lengths at once, before the page list,
// slot vector and request table are built: here under a 4 GB address-space limit, where building
// them first ended in "host memory ran out while preparing it" (and without a limit grew the
// process for a minute).
TEST(BenchCli, HugeCaseIsRefusedBeforeAnythingIsAllocated) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow address space at start: the "
                  "CLI cannot start under ulimit -v";
#endif
  const std::string cli = ATTNKIT_CLI_PATH;
  const std::string inner = "ulimit -v 4000000; exec timeout 60 \"" + cli +
                            "\" run --backend torch_native --device cpu --case "
                            "\"{\\\"mode\\\": \\\"extend\\\", \\\"prefix_lens\\\": [0], "
                            "\\\"new_lens\\\": [2000000000]}\"";
  attnkit::test_support::expect_cli_errors(
      "/bin/sh", {{"-c '" + inner + "'", "MiB of host memory (page and request tables "}},
      {"ran out"});

  const std::string cases = ::testing::TempDir() + "bench_cli_huge.json";
  write_text_file(cases, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"batch": 1, "kv_len": 2000000000}]})");
  const CliRun r = attnkit::test_support::run_cli(
      "/bin/sh", "-c 'ulimit -v 4000000; exec timeout 120 \"" + cli +
                     "\" bench --backend torch_native --device cpu --warmup 0 --iters 1 "
                     "--rotate-mib 1 --paired-rounds 0 --cases \"" +
                     cases + "\"'");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("preparing it on cpu needs"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(r.out.find("ran out"), std::string::npos) << r.out;
}

// The options `attnkit bench` prepares a timed case with (bench_runner.cpp, run_case): one
// rotating copy here, no snapshot, poison or lse, fast random inputs.
harness::PrepareOptions bench_timing_options() {
  harness::PrepareOptions options;
  options.num_layers = 1;
  options.request_lse = false;
  options.poison = false;
  options.snapshot_pool = false;
  options.fast_inputs = true;
  return options;
}

// A bench decode point (4 / 2 heads, d 64, page 16) of `batch` requests of kv_len 2e9.
harness::CaseSpec huge_decode(int batch) {
  return harness::make_uniform_case("huge", ForwardMode::kDecode, batch, 1999999999, 1, 4, 2, 64,
                                    16, DType::kBF16, DType::kBF16);
}

// The footprint is worked out from the lengths on every device: on CUDA the pool is on the device,
// but the page list, slots and request table (its host mirror) of 2e9 tokens are 66 GB of host
// memory that the CPU-only pool check never counted.
TEST(BenchCli, HostFootprintCountsTheTablesOnEveryDevice) {
  const harness::CaseSpec spec = huge_decode(1);
  const harness::PrepareOptions options = bench_timing_options();
  // 125M pages (+ spare) x (state byte + free-list id + page id), 2e9 slots, a request table of
  // (1 + 2 spare + row 0) rows x (125M + 1) pages x 16 entries, 2e9 - 1 history slots plus the new
  // token's slot and position, all int64 but the table's int32 entries.
  const double pages = 125000000.0 + options.spare_pages;
  const double tables = pages * 17 + 2e9 * 8 + 4 * (125000000.0 + 1) * 16 * 4 + (2e9 + 1) * 8;
  const harness::HostFootprint cuda = harness::host_footprint(spec, Device::cuda(0), options);
  EXPECT_DOUBLE_EQ(cuda.tables, tables);
  EXPECT_EQ(cuda.pool, 0.0);
  EXPECT_EQ(cuda.snapshot, 0.0);
  const harness::HostFootprint cpu = harness::host_footprint(spec, Device::cpu(), options);
  EXPECT_GT(cpu.tables, tables) << "the CPU also holds the uploaded slots";
  EXPECT_DOUBLE_EQ(cpu.pool, (pages * 16 + 16) * 2 * (64 + 64) * 2);
  harness::PrepareOptions snapshot = options;
  snapshot.snapshot_pool = true;
  EXPECT_DOUBLE_EQ(harness::host_footprint(spec, Device::cuda(0), snapshot).snapshot, cpu.pool);

  const Status st = harness::check_host_footprint(spec, Device::cuda(0), options, int64_t{8} << 30);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory) << st.to_string();
  const std::string needs = "case huge: preparing it on cuda:0 needs " +
                            std::to_string(std::llround(cuda.total() / (1 << 20))) +
                            " MiB of host memory (page and request tables " +
                            std::to_string(std::llround(tables / (1 << 20))) + " MiB, inputs ";
  EXPECT_NE(st.message().find(needs), std::string::npos) << st.message() << "\n" << needs;
  EXPECT_NE(st.message().find("), above the 8192 MiB this host has available"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("KV pool"), std::string::npos) << "the pool is on the device";
  EXPECT_TRUE(
      harness::check_host_footprint(spec, Device::cuda(0), options, /*available=*/-1).is_ok());
  harness::CaseSpec small = spec;
  small.prefix_lens = {63};
  EXPECT_TRUE(
      harness::check_host_footprint(small, Device::cuda(0), options, int64_t{1} << 30).is_ok());
}

// The size check comes before any host vector, on every device: a bench point of 16 requests of
// kv_len 2e9 on cuda:0 is refused while operator new refuses anything above 1 MiB. Checked on the
// CPU alone before, the case built its page allocator, page list, slots and request table first
// (here: a 2 GB request for the allocator, refused by the probe, and "host memory ran out").
TEST(BenchCli, HugeCudaCaseIsRefusedBeforeAnyHostVector) {
  if (harness::host_memory_available() <= 0) {
    GTEST_SKIP()
        << "/proc/meminfo gives no MemAvailable: prepare_case has no size to check against";
  }
  const harness::CaseSpec spec = huge_decode(16);
  g_new_refused = 0;
  g_new_cap = std::size_t{1} << 20;
  Result<harness::PreparedCase> pc =
      harness::prepare_case(spec, Device::cuda(0), bench_timing_options());
  g_new_cap = 0;
  ASSERT_FALSE(pc.is_ok());
  EXPECT_EQ(pc.status().code(), StatusCode::kOutOfMemory) << pc.status().to_string();
  EXPECT_NE(pc.status().message().find("case huge: preparing it on cuda:0 needs "),
            std::string::npos)
      << pc.status().message();
  EXPECT_EQ(g_new_refused.load(), 0u)
      << "prepare_case asked for " << g_new_refused.load() << " bytes before refusing the case";
}

// JSON numbers past a double (1e999), a logit cap past a float and a key given twice: one error
// line naming the flag and file, not "[json.exception.out_of_range.406] ... (an exception escaped
// the subcommand)" or a silently infinite cap / silently dropped value.
TEST(BenchCli, JsonOverflowAndDuplicateKeysNameTheFlag) {
  const std::string dir = ::testing::TempDir();
  const std::string overflow = dir + "bench_cli_overflow.json";
  write_text_file(overflow, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"batch": 1, "kv_len": 1e999}]})");
  const std::string twice = dir + "bench_cli_twice.json";
  write_text_file(twice, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"batch": 1, "kv_len": 64, "kv_len": 128}]})");
  const std::string bench = "bench --backend torch_native --device cpu --cases ";
  const std::string run = "run --backend torch_native --device cpu --case ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "'" + overflow + "'", "--cases: invalid_argument: " + overflow +
                                             ": not valid JSON: number overflow parsing '1e999'"},
          {bench + "'" + twice + "'", twice + ": key \"kv_len\" is given twice in one object"},
          {run + R"('{"mode": "decode", "prefix_lens": [5], "logit_cap": 1e999}')",
           "--case: invalid_argument: case spec: not valid JSON: number overflow parsing '1e999'"},
          {run + R"('{"mode": "decode", "prefix_lens": [5], "logit_cap": 1e300}')",
           "\"logit_cap\" = 1e+300 (accepted: a finite number >= 0 (0 = off))"},
          {run + R"('{"mode": "decode", "prefix_lens": [5], "logit_cap": -2}')",
           "(accepted: a finite number >= 0 (0 = off))"},
          {run + R"('{"mode": "decode", "mode": "extend", "prefix_lens": [5]}')",
           "case spec: key \"mode\" is given twice in one object"},
      },
      {"json.exception", "escaped"});
}

// Input that cost the process its stack or its memory, or was accepted as nonsense, is refused by
// name (a review helper's findings, 2026-11-27): JSON nested past 64 levels (100000 levels crashed
// the message quoting the value), a sweep of 1.6 billion points (std::bad_alloc after 40 s), a
// batch without new tokens (--verify passed comparing nothing), speculative counts in the wrong
// mode or below 1, MLA sizes without mla, a window below -1 (was caught only at run time), empty
// --device / --backend / --case values, and a hexadecimal or out-of-range --gemm-tflops.
TEST(BenchCli, DeepHugeAndEmptyInputsAreRefusedByName) {
  const std::string dir = ::testing::TempDir();
  const auto nested = [](int depth) {
    return std::string(static_cast<size_t>(depth), '[') + "1" +
           std::string(static_cast<size_t>(depth), ']');
  };
  const std::string deep = dir + "bench_cli_deep.json";
  write_text_file(deep, R"({"kind": "decode", "fixed": {"batch": )" + nested(100000) +
                            R"(}, "sweep": {"kv_len": [64]}})");
  const std::string sweep = dir + "bench_cli_sweep.json";
  std::string values;
  for (int i = 1; i <= 200; ++i) values += (i > 1 ? ", " : "") + std::to_string(i);
  write_text_file(sweep, R"({"kind": "decode", "sweep": {"batch": [)" + values +
                             R"(], "kv_len": [)" + values + R"(], "page_size": [)" + values +
                             R"(], "head_dim": [)" + values + "]}}");
  const std::string described = dir + "bench_cli_description.json";
  write_text_file(described, R"({"kind": "decode", "description": 5, "sweep": {"kv_len": [64]}})");
  const std::string list = "bench --backend torch_native --device cpu --list --cases ";
  const std::string run = "run --backend torch_native --device cpu --case ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {list + "'" + deep + "'", deep + ": arrays / objects nested more than 64 levels deep"},
          {list + "'" + sweep + "'",
           sweep + ": the sweep has more than 100000 points (the product of its arrays' sizes, "
                   "through sweep.page_size)"},
          {list + "'" + described + "'", R"("description" must be a string, got 5)"},
          {run + R"('{"mode": "decode", "prefix_lens": )" + nested(70) + "}'",
           "case spec: arrays / objects nested more than 64 levels deep"},
          {run + R"('{"mode": "extend", "prefix_lens": [5, 0], "new_lens": [0, 0]}')",
           "no request has new tokens (new_lens are all 0)"},
          {run + R"('{"mode": "draft_extend", "prefix_lens": [10], "new_lens": [4],
                      "spec_draft_tokens": -7, "spec_topk": -3}')",
           "draft_extend needs spec_draft_tokens >= 1 and spec_topk >= 1, got -7 / -3"},
          {run + R"('{"mode": "extend", "prefix_lens": [10], "new_lens": [4], "spec_topk": 2}')",
           "spec_draft_tokens / spec_topk 0 / 2 are for target_verify and draft_extend only"},
          {run + R"('{"mode": "extend", "prefix_lens": [10], "new_lens": [4],
                      "kv_lora_rank": -1}')",
           "kv_lora_rank / qk_rope_head_dim -1 / 0 are for MLA cases only"},
          {run + R"('{"mode": "decode", "prefix_lens": [10], "sliding_window": -5}')",
           "sliding_window -5 must be -1 (off) or >= 0"},
          {run + R"('{"mode": "idle", "prefix_lens": [10]}')",
           "(accepted: extend, decode, mixed, target_verify, draft_extend)"},
          {"run --backend torch_native --case decode_page16 --device ''",
           "--device: the value is empty (accepted: cpu, cuda, cuda:N)"},
          {"run --backend '' --case decode_page16 --device cpu", "--backend: the value is empty"},
          {"run --backend torch_native --case '' --device cpu", "--case: the value is empty"},
          {list + "unused.json --device ''", "--device: the value is empty"},
          {list + "unused.json --gemm-tflops 0x10", "--gemm-tflops: \"0x10\" is not a number"},
          {list + "unused.json --gemm-tflops 1e400", "--gemm-tflops: 1e400 is out of range"},
          {"matrix --device cpu", "attnkit matrix: not expected: --device cpu"},
      },
      {"json.exception", "escaped", "bad_alloc"});
  // A leading '+' is a number, as before (std::stod took it).
  const CliRun plus = run_cli(
      "bench --backend torch_native --device cpu --cases /nonexistent.json --gemm-tflops +5");
  EXPECT_EQ(plus.err.find("--gemm-tflops"), std::string::npos) << plus.err;
  EXPECT_NE(plus.err.find("nonexistent.json"), std::string::npos) << plus.err;
  // A JSON spec after white space is still JSON; fp8 values in the subnormal range at head_dim 1
  // verify (one value rounding to 0 was a 100% relative error on the reference itself).
  CliRun r = run_cli(run + R"('  {"mode": "decode", "prefix_lens": [10]}')");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A short valid name runs under that name (the check through two temporaries refused it).
  r = run_cli(run + R"('{"name": "short_ok", "mode": "decode", "prefix_lens": [10]}')");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("short_ok"), std::string::npos) << r.out;
  r = run_cli(run + R"('{"mode": "extend", "prefix_lens": [5, 33], "new_lens": [20, 3],
      "head_dim": 1, "kv_dtype": "fp8_e4m3", "page_size": 16}' --verify)");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
}

// Every backend named is not built (or not for this platform): an error naming each and why, not
// a run of skipped rows that exits 0. `all` still means the runnable ones.
TEST(BenchCli, NamedBackendsThatCannotRunAreRefused) {
  const std::string cases = ::testing::TempDir() + "bench_cli_unrunnable.json";
  write_text_file(cases, kSmallFile);
  const CliRun probe = run_cli("backends");
  if (probe.out.find("fa3") == std::string::npos) GTEST_SKIP() << "no fa3 row: " << probe.out;
  const std::string bench = "bench --cases '" + cases + "' --device cpu --backend ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "fa3", "--backend fa3: no named backend can run on this device: fa3 "},
          {bench + "fa3,flashmla", "; flashmla "},
      },
      {"ceiling"});
  const CliRun all = run_cli(bench + "all --list");
  EXPECT_EQ(all.exit_code, 0) << all.err;
}

// --launches N on the CPU claimed N back-to-back forwards per sample while timing one; the paired
// copy rounds are CPU-only and were silently dropped on CUDA.
TEST(BenchCli, DeviceOnlyOptionsAreRefusedOnTheOtherDevice) {
  const std::string cases = ::testing::TempDir() + "bench_cli_launches.json";
  write_text_file(cases, kSmallFile);
  const std::string bench = "bench --backend torch_native --cases '" + cases + "' ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "--device cpu --launches 4",
           "--launches 4 enqueues back-to-back CUDA forwards: it needs --device cuda (got "
           "--device cpu"},
          {bench + "--device cuda --paired-rounds 3",
           "--paired-rounds applies to --device cpu only"},
          {bench + "--device cuda:0 --paired-calls 2",
           "--paired-calls applies to --device cpu only"},
          {bench + "--device cuda --paired-max-seconds 5",
           "--paired-max-seconds applies to --device cpu only"},
      },
      {"ceiling"});
}

// The output probe neither removes a dangling symlink given as --json nor leaves a file at its
// target (the run below stops at --backend, after the probe).
TEST(BenchCli, OutputProbeLeavesSymlinksAndTargetsAlone) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "bench_cli_probe_links";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cases = (dir / "cases.json").string();
  write_text_file(cases, kSmallFile);
  const std::filesystem::path link = dir / "out.json";
  const std::filesystem::path target = dir / "target.json";
  std::filesystem::create_symlink("target.json", link);
  const CliRun r = run_cli("bench --backend no_such_backend --device cpu --cases '" + cases +
                           "' --json '" + link.string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no_such_backend"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_symlink(link)) << "the probe removed the symlink";
  EXPECT_FALSE(std::filesystem::exists(target)) << "the probe created the link's target";
  // An existing file keeps its bytes.
  const std::string kept = (dir / "kept.csv").string();
  write_text_file(kept, "old bytes\n");
  EXPECT_NE(run_cli("bench --backend no_such_backend --device cpu --cases '" + cases + "' --csv '" +
                    kept + "'")
                .exit_code,
            0);
  EXPECT_EQ(read_text(kept), "old bytes\n");
}

// --json and --csv naming one new file, once through a symlinked directory: the CSV overwrote the
// JSON (the paths differ as text and the file did not exist yet for equivalent()).
TEST(BenchCli, JsonAndCsvThroughALinkedDirectoryAreOneFile) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "bench_cli_linked_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "d");
  std::filesystem::create_directory_symlink("d", dir / "l");
  const std::string cases = (dir / "cases.json").string();
  write_text_file(cases, kSmallFile);
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {{"bench --backend torch_native --device cpu --iters 1 --warmup 0 --cases '" + cases +
            "' --json '" + (dir / "d" / "x").string() + "' --csv '" + (dir / "l" / "x").string() +
            "'",
        "--json and --csv name the same file"}});
  EXPECT_FALSE(std::filesystem::exists(dir / "d" / "x"));
}

// A per-request list names the batch, so it has batch's bound (2 million kv_lens were taken).
TEST(BenchCli, PerRequestListsHaveTheBatchBound) {
  const std::string path = ::testing::TempDir() + "bench_cli_long_kv_lens.json";
  std::string lens;
  lens.reserve(2 * 1048577);
  for (int i = 0; i < 1048577; ++i) lens += i == 0 ? "1" : ",1";
  write_text_file(path, R"({"kind": "decode", "fixed": {"q_heads": 4, "kv_heads": 2,
    "head_dim": 64, "page_size": 16}, "cases": [{"kv_lens": [)" +
                            lens + "]}]}");
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {{"bench --backend torch_native --device cpu --list --cases '" + path + "'",
        "kv_lens has 1048577 lengths, one per request: out of range (accepted: 1 to 1048576 "
        "requests, as batch)"}});
}

// One point twice (an explicit case equal to a sweep point) is refused by name; a backend named
// twice, or again through `all`, runs once.
TEST(BenchCli, DuplicatePointsAreRefusedAndBackendsRunOnce) {
  const std::string dir = ::testing::TempDir();
  const std::string dup = dir + "bench_cli_dup.json";
  write_text_file(dup, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "sweep": {"kv_len": [64]}, "cases": [{"batch": 1, "kv_len": 64}]})");
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {{"bench --backend torch_native --device cpu --list --cases '" + dup + "'",
        dup + ": cases[0] repeats case decode_b1_kv64_p16_h4x2_d64_kvbf16 of sweep point "
              "{kv_len=64}"}});

  const BenchRun r =
      run_bench("bench_cli_dup_backends", kSmallFile,
                "--backend torch_native,all,torch_native --device cpu --rotate-mib 1 "
                "--warmup 0 --iters 1 --paired-rounds 0");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  std::vector<std::string> backends;
  for (const nlohmann::json& x : r.doc["results"]) backends.push_back(x["backend"]);
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(backends.front(), "torch_native") << "the first named comes first";
  EXPECT_EQ(std::count(backends.begin(), backends.end(), "torch_native"), 1);
  std::vector<std::string> unique = backends;
  std::sort(unique.begin(), unique.end());
  EXPECT_EQ(std::unique(unique.begin(), unique.end()), unique.end()) << r.cli.err;
}

// A case file that is not a regular file (/dev/zero was read forever) or past the size cap.
TEST(BenchCli, CaseFileMustBeASmallRegularFile) {
  const std::string big = ::testing::TempDir() + "bench_cli_big.json";
  write_text_file(big, std::string(static_cast<size_t>(kMaxCaseFileBytes) + 1, ' '));
  const std::string bench = "bench --backend torch_native --device cpu --cases ";
  // Under a time limit: without the check /dev/zero is read until memory runs out.
  attnkit::test_support::expect_cli_errors(
      "/bin/sh",
      {{"-c 'exec timeout 30 \"" + std::string(ATTNKIT_CLI_PATH) + "\" " + bench + "/dev/zero'",
        "case file /dev/zero is not a regular file"}});
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH, {{bench + "'" + big + "'", big + " is larger than 16 MiB"}});
  std::remove(big.c_str());
}

// --list runs nothing: every run-only option is refused beside a true --list, naming it; a false
// --list excludes nothing (the run below stops at --filter).
TEST(BenchCli, ListRefusesRunOnlyOptions) {
  const std::string cases = ::testing::TempDir() + "bench_cli_list.json";
  write_text_file(cases, kSmallFile);
  const std::string list =
      "bench --backend torch_native --device cpu --cases '" + cases + "' --list ";
  std::vector<attnkit::test_support::CliErrorCase> errors;
  for (const std::string option :
       {"--iters 3", "--launches 2", "--rotate-mib 1", "--gemm-tflops 1", "--paired-calls 2",
        "--warmup 1", "--paired-rounds 1", "--max-copies 4", "--verify", "--json x.json",
        "--csv x.csv", "--graph", "--paired-max-seconds 5"}) {
    errors.push_back({list + option, option.substr(0, option.find(' ')) + " excludes --list"});
  }
  attnkit::test_support::expect_cli_errors(ATTNKIT_CLI_PATH, errors);
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {{"bench --backend torch_native --device cpu --cases '" + cases +
            "' --list=false --json x.json --filter nomatch",
        "--filter \"nomatch\" matches none"}},
      {"excludes"});
  const CliRun ok = run_cli(list + "--filter kv64");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "decode_b1_kv64_p16_h4x2_d64_kvbf16\n");
}

// shared_prefix: the message says which rule failed, with the values; a case file's
// qk_rope_head_dim 0 is refused where it is read, naming the key.
TEST(BenchCli, SharedPrefixAndMlaErrorsSayWhichRule) {
  const std::string dir = ::testing::TempDir();
  const std::string page = dir + "bench_cli_shared_page.json";
  write_text_file(page, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16},
    "cases": [{"batch": 2, "kv_len": 64, "shared_prefix": 8}]})");
  const std::string shortest = dir + "bench_cli_shared_shortest.json";
  write_text_file(shortest, R"({"kind": "decode",
    "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 4},
    "cases": [{"kv_lens": [9, 4], "shared_prefix": 4}]})");
  const std::string rope = dir + "bench_cli_rope0.json";
  write_text_file(rope, R"({"kind": "mla_decode", "fixed": {"q_heads": 16, "qk_rope_head_dim": 0},
    "cases": [{"kv_len": 64}]})");
  const std::string bench = "bench --backend torch_native --device cpu --cases ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {bench + "'" + page + "'",
           "shared_prefix 8 must be a multiple of page_size 16 (shared tokens fill whole pages)"},
          {bench + "'" + shortest + "'",
           "shared_prefix 4 must be at most every request's cached prefix (prefix_lens[1] = 3;"},
          {bench + "'" + rope + "'",
           "fixed.qk_rope_head_dim: 0 is out of range (accepted: 1 to 2147483647)"},
      },
      {"at most every prefix_lens[r], and 0 with"});
}

// run's JSON CaseSpec: v_head_dim defaults to head_dim (as in the case files), and to kv_lora_rank
// for MLA absorbed; it stayed 128 whatever head_dim said.
TEST(BenchCli, RunJsonVHeadDimFollowsHeadDim) {
  const CliRun mha = run_cli(
      "run --backend torch_native --device cpu --verify --case '{\"mode\": \"decode\", "
      "\"prefix_lens\": [20], \"num_q_heads\": 4, \"num_kv_heads\": 2, \"head_dim\": 64}'");
  ASSERT_EQ(mha.exit_code, 0) << mha.out << mha.err;
  EXPECT_NE(mha.out.find(" d 64/64 "), std::string::npos) << mha.out;
  const CliRun given = run_cli(
      "run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
      "\"prefix_lens\": [20], \"head_dim\": 64, \"v_head_dim\": 32}'");
  EXPECT_NE(given.out.find(" d 64/32 "), std::string::npos) << given.out << given.err;
  // MLA absorbed: V is the latent part of the row (the run itself may be unsupported here).
  const CliRun mla = run_cli(
      "run --backend torch_native --device cpu --case '{\"mode\": \"decode\", "
      "\"prefix_lens\": [20], \"num_q_heads\": 4, \"num_kv_heads\": 1, \"mla\": true, "
      "\"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64, \"head_dim\": 576}'");
  EXPECT_NE(mla.out.find(" d 576/512 "), std::string::npos) << mla.out << mla.err;
  EXPECT_EQ(mla.err.find("v_head_dim = kv_lora_rank"), std::string::npos) << mla.err;
}

// run's JSON CaseSpec takes fp8_q (q handed over in fp8_e4m3): the case says so, and a backend
// without an e4m3-q path skips it by name instead of running it with a bf16 q.
TEST(BenchCli, RunJsonTakesFp8Q) {
  const CliRun r = run_cli(
      "run --backend torch_native --device cpu --case '{\"mode\": \"extend\", "
      "\"prefix_lens\": [20], \"new_lens\": [8], \"kv_dtype\": \"fp8_e4m3\", \"fp8_q\": true}'");
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("q in fp8_e4m3"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("fp8_q (q in fp8_e4m3) runs only on fa3"), std::string::npos) << r.err;
  const CliRun bad = run_cli(
      "run --backend torch_native --device cpu --case '{\"mode\": \"extend\", "
      "\"prefix_lens\": [20], \"new_lens\": [8], \"fp8_q\": 1}'");
  EXPECT_NE(bad.err.find("\"fp8_q\" = 1 (accepted: true or false)"), std::string::npos) << bad.err;
}

// Helper 61's findings (2026-11-30): values that were accepted and then dropped, ignored or
// turned into nonsense, each now refused by name; and a run that timed nothing exits non-zero.
TEST(BenchCli, DroppedOrNonsenseValuesAreRefusedByName) {
  const std::string dir = ::testing::TempDir();
  const std::string small = dir + "bench_cli_h61_small.json";
  write_text_file(small, kSmallFile);
  const std::string heads = dir + "bench_cli_h61_heads.json";
  write_text_file(heads, R"({"kind": "decode", "fixed": {"kv_heads": 2, "head_dim": 16},
    "cases": [{"heads": [8, 2], "q_heads": 4, "kv_len": 64}]})");
  const std::string skipped = dir + "bench_cli_h61_skipped.json";
  write_text_file(skipped, R"({"kind": "extend", "fixed": {"q_heads": 4, "kv_heads": 2,
    "head_dim": 16}, "cases": [{"new_tokens": 8, "sliding_window": 4}]})");
  const std::string bench = "bench --backend torch_native --device cpu --iters 1 --warmup 0 ";
  const std::string run = "run --backend torch_native --device cpu --case ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {run + R"('{"mode": "decode", "prefix_lens": [10], "logit_cap": 1e-50}')",
           "\"logit_cap\" = 1e-50 (accepted: 0 (off) or a cap of at least the smallest f32; "
           "this one rounds to 0)"},
          {run + R"('{"mode": "target_verify", "prefix_lens": [10], "spec_draft_tokens": 2,
                      "spec_topk": 1, "new_lens": [5]}')",
           "\"new_lens\" does not apply to mode target_verify"},
          {run + R"('{"mode": "decode", "prefix_lens": [10], "kv_dtype": "int32"}')",
           "\"kv_dtype\" = \"int32\" (accepted: a KV cache dtype: bf16, f16, f32, fp8_e4m3"},
          {run + R"('{"mode": "decode", "prefix_lens": [10], "q_dtype": "fp8_e4m3"}')",
           "(accepted: an activation dtype: bf16, f16, f32)"},
          {bench + "--cases '" + heads + "'",
           "cases[0]: \"heads\" and \"q_heads\" are exclusive in one object"},
          {bench + "--cases '" + small + "' --gemm-tflops 1e-320",
           "--gemm-tflops: 1e-320 is not allowed: must be a decimal number in [0.001, 100000]"},
          {bench + "--cases '" + small + "' --gemm-tflops 1e30", "--gemm-tflops: 1e30 is not"},
          {bench + "--cases '" + small + "' --iters 2147483647",
           "--iters: 2147483647 is not allowed: must be an integer from 1 to 1000000"},
          {bench + "--cases '" + small + "' --paired-rounds 0 --paired-calls 7",
           "--paired-calls has nothing to act on: --paired-rounds 0 turns the paired rounds off"},
          {bench + "--cases '" + small + "' --paired-rounds 0 --paired-max-seconds 5",
           "--paired-max-seconds has nothing to act on"},
          {"bench --device cpu --cases '" + small + "' --backend ','",
           "--backend \",\" has an empty name (expected a comma-separated list of backend names"},
          {run + R"('{"mode": "decode", "prefix_lens": [2147483000], "num_q_heads": 2147483647,
                      "num_kv_heads": 2147483647, "head_dim": 2147483647}')",
           "MiB of host memory"},
      },
      {"json.exception", "escaped", "bad_alloc", "-9223372036854775808"});
  // Every case skipped: the table says why, and the run fails.
  const CliRun none_ran = run_cli(bench + "--cases '" + skipped + "'");
  EXPECT_NE(none_ran.exit_code, 0) << none_ran.out;
  EXPECT_NE(none_ran.out.find("skipped"), std::string::npos) << none_ran.out;
  EXPECT_NE(none_ran.err.find("attnkit bench: no case ran: all 1 were skipped"), std::string::npos)
      << none_ran.err;
  // Two different uneven batches that a 16-bit list hash named alike are two cases now.
  const std::string uneven = dir + "bench_cli_h61_uneven.json";
  write_text_file(uneven, R"({"kind": "decode", "fixed": {"q_heads": 4, "kv_heads": 2,
    "head_dim": 16}, "cases": [{"kv_lens": [1, 2, 236, 362, 400]},
    {"kv_lens": [1, 2, 387, 211, 400]}]})");
  const CliRun listed =
      run_cli("bench --backend torch_native --device cpu --list --cases '" + uneven + "'");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(std::count(listed.out.begin(), listed.out.end(), '\n'), 2) << listed.out;
  // --list-cases=false is no listing: the run's options are taken.
  const CliRun not_listed =
      run_cli("run --list-cases=false --backend torch_native --device cpu --case decode_page1");
  EXPECT_EQ(not_listed.exit_code, 0) << not_listed.err;
}

// A review helper's CLI findings (2026-11-30): empty items and paths that were dropped silently,
// counts without a bound that ran for hours or past the pool's layer limit, a soft-cap that failed
// only per backend after the ceilings, a demo page size that took minutes to allocate.
TEST(BenchCli, EmptyItemsAndUnboundedCountsAreRefusedByName) {
  const std::string dir = ::testing::TempDir();
  const std::string small = dir + "bench_cli_s73_small.json";
  write_text_file(small, kSmallFile);
  const std::string bench =
      "bench --backend torch_native --device cpu --iters 1 --warmup 0 --cases '" + small + "' ";
  const std::string run = "run --backend torch_native --device cpu --case ";
  attnkit::test_support::expect_cli_errors(
      ATTNKIT_CLI_PATH,
      {
          {"bench --device cpu --cases '" + small + "' --backend ',,torch_native'",
           "--backend \",,torch_native\" has an empty name"},
          {"bench --device cpu --cases '" + small + "' --backend 'torch_native,'",
           "has an empty name"},
          {bench + "--json ''", "--json is empty (expected a file name)"},
          {bench + "--csv ''", "--csv is empty (expected a file name)"},
          {"bench --backend torch_native --device cpu --cases ''", "the case file path is empty"},
          {bench + "--paired-rounds 101",
           "--paired-rounds: 101 is not allowed: must be an integer from 0 to 100"},
          {bench + "--max-copies 65537",
           "--max-copies: 65537 is not allowed: must be an integer from 1 to 65536"},
          {run + "decode_page1 --layers 65537",
           "--layers: 65537 is not allowed: must be an integer from 1 to 65536"},
          {run + R"('{"mode": "decode", "prefix_lens": [10], "logit_cap": 3e38}')",
           "logit_cap 3e+38 must be 0 (off) or in [1e-20, 1e+20]"},
          {"demo --device cpu --page-size 4097",
           "--page-size: 4097 is not allowed: must be an integer from 1 to 4096"},
      },
      {"json.exception", "escaped", "bad_alloc", "KVPoolConfig"});
}

// A 2.5 MB case file whose "fixed" list of a million kv_lens was swept over 100000 points tried to
// copy that list into every point (~400 GB; std::bad_alloc escaped): the points' lists together are
// bounded, and the error names the point where the bound was passed.
TEST(BenchCli, PointsCopyingALongListAreBounded) {
  std::string lens;
  for (int i = 0; i < (1 << 20); ++i) lens += i ? ",1" : "1";
  std::string pages;
  for (int p = 1; p <= 17; ++p) pages += (p > 1 ? "," : "") + std::to_string(p);
  const std::string text =
      R"({"kind": "decode", "fixed": {"q_heads": 1, "kv_heads": 1, "head_dim": 16, "kv_lens": [)" +
      lens + R"(]}, "sweep": {"page_size": [)" + pages + "]}}";
  const Result<CaseFile> file = parse_case_file_text(text, "long.json");
  ASSERT_FALSE(file.is_ok());
  EXPECT_NE(file.status().message().find(
                "long.json: the points hold more than 16777216 per-request list entries "
                "(kv_lens / prefix_lens / new_lens) together, reached at sweep point "
                "{page_size=17}"),
            std::string::npos)
      << file.status().to_string();
  // Sixteen such points are within the bound.
  const std::string sixteen = text.substr(0, text.rfind(",17")) + "]}}";
  const Result<CaseFile> ok = parse_case_file_text(sixteen, "long16.json");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->cases.size(), 16u);
}

// Integer options are decimal: CLI11's own conversion read "010" as octal 8 after the range check
// had read 10. A case-file path that is not UTF-8 is written into the JSON with U+FFFD (the strict
// dump threw after the whole run, and neither output file was written).
TEST(BenchCli, LeadingZerosAreDecimalAndNonUtf8PathsAreWritten) {
  const BenchRun r = run_bench("bench_cli_s73_\xff_path", kDecodeFile,
                               "--backend torch_native --device cpu --rotate-mib 1 --warmup 0 "
                               "--iters 010 --paired-rounds 02 --paired-calls 1");
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.out << r.cli.err;
  ASSERT_TRUE(r.doc.is_object()) << r.cli.err;
  EXPECT_EQ(r.doc["settings"]["iters"], 10) << r.doc["settings"];
  ASSERT_EQ(r.doc["results"].size(), 2u);
  EXPECT_EQ(r.doc["results"][0]["paired_copy"]["ratios"].size(), 2u) << r.doc["results"][0];
  const std::string cases = r.doc["settings"]["cases_file"].get<std::string>();
  EXPECT_NE(cases.find("bench_cli_s73_\xEF\xBF\xBD_path"), std::string::npos) << cases;
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
