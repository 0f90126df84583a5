// The benchmark's FLOP/byte formulas against hand-computed values, and case-file parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../bench/bench_case_file.h"
#include "../../bench/bench_case_spec.h"
#include "../../bench/bench_formulas.h"

namespace attnkit::bench {
namespace {

BenchCase decode_case(int batch, int kv_len, int hq, int hkv, int d, DType kv_dtype) {
  BenchCase c;
  c.kind = BenchKind::kDecode;
  c.batch = batch;
  c.kv_len = kv_len;
  c.q_heads = hq;
  c.kv_heads = hkv;
  c.head_dim = d;
  c.v_head_dim = d;
  c.kv_dtype = kv_dtype;
  return c;
}

BenchCase extend_case(int batch, int prefix, int new_tokens, int hq, int hkv, int d, bool causal) {
  BenchCase c;
  c.kind = BenchKind::kExtend;
  c.batch = batch;
  c.prefix_len = prefix;
  c.new_tokens = new_tokens;
  c.causal = causal;
  c.q_heads = hq;
  c.kv_heads = hkv;
  c.head_dim = d;
  c.v_head_dim = d;
  return c;
}

// Absorbed MLA decode (DeepSeek latent 512 + rope 64 over one kv head), s_q query tokens each.
BenchCase mla_decode_case(int batch, int kv_len, int heads, int s_q) {
  BenchCase c;
  c.kind = BenchKind::kMlaDecode;
  c.batch = batch;
  c.kv_len = kv_len;
  c.q_heads = heads;
  c.kv_heads = 1;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.s_q = s_q;
  return c;
}

// The paired rounds' forwards per round: as asked while the rounds fit kPairedMaxSeconds, fewer
// past it, none (no paired rounds) where one call per round is already over. 9 rounds of 5 calls
// of 1 ms: 5; of 2 s: 3 (9 x 3 x 2 s = 54 s); of 6.2 s (the 2k CPU prefill of a reference backend
// on a fast host): 1; of 20 s: 0.
TEST(BenchFormulas, PairedCallsPerRoundCapped) {
  EXPECT_EQ(paired_calls_per_round(1.0, 9, 5), 5);
  EXPECT_EQ(paired_calls_per_round(2000.0, 9, 5), 3);
  EXPECT_EQ(paired_calls_per_round(3000.0, 9, 5), 2);  // 60 s / (9 x 3 s) = 2.2
  EXPECT_EQ(paired_calls_per_round(6200.0, 9, 5), 1);
  EXPECT_EQ(paired_calls_per_round(20000.0, 9, 5), 0);
  EXPECT_EQ(paired_calls_per_round(0.0, 9, 5), 5);
  EXPECT_EQ(paired_calls_per_round(100.0, 0, 7), 7);
}

TEST(BenchFormulas, StoredBytesCountsFp4Scales) {
  EXPECT_EQ(stored_bytes(DType::kBF16, 128), 256);
  EXPECT_EQ(stored_bytes(DType::kF32, 3), 12);
  EXPECT_EQ(stored_bytes(DType::kFP8E4M3, 128), 128);
  // 128 fp4 values: 64 data bytes + 8 scale bytes (one per 16 values).
  EXPECT_EQ(stored_bytes(DType::kFP4E2M1, 128), 72);
  // 17 values: ceil(17 / 2) = 9 data bytes, ceil(17 / 16) = 2 scales.
  EXPECT_EQ(stored_bytes(DType::kFP4E2M1, 17), 11);
}

TEST(BenchFormulas, KvBytesPerToken) {
  // 8 kv heads x 128 x 2 bytes for K, the same for V.
  EXPECT_EQ(kv_bytes_per_token(decode_case(1, 1, 32, 8, 128, DType::kBF16)), 4096);
  EXPECT_EQ(kv_bytes_per_token(decode_case(1, 1, 32, 8, 128, DType::kFP8E5M2)), 2048);
  // 1024 fp4 values per tensor: 512 + 64 scale bytes, K and V.
  EXPECT_EQ(kv_bytes_per_token(decode_case(1, 1, 32, 8, 128, DType::kFP4E2M1)), 1152);
  BenchCase v_differs = decode_case(1, 1, 16, 2, 192, DType::kBF16);
  v_differs.v_head_dim = 128;
  EXPECT_EQ(kv_bytes_per_token(v_differs), 2 * 192 * 2 + 2 * 128 * 2);
  BenchCase mla;
  mla.kind = BenchKind::kMlaDecode;
  mla.kv_lora_rank = 512;
  mla.qk_rope_head_dim = 64;
  mla.kv_dtype = DType::kBF16;
  // One 576-wide latent row; V is inside it and is not counted twice.
  EXPECT_EQ(kv_bytes_per_token(mla), 1152);
}

TEST(BenchFormulas, DecodeBytesAndFlops) {
  const BenchCase c = decode_case(4, 1024, 32, 8, 128, DType::kBF16);
  // KV 4 x 1024 x 4096 = 16777216; q and out 4 x 32 x 128 x 2 = 32768 each.
  EXPECT_DOUBLE_EQ(attention_bytes(c), 16777216.0 + 32768.0 + 32768.0);
  // 2 x (128 + 128) x 32 heads x 4 requests x 1024 keys.
  EXPECT_DOUBLE_EQ(attention_flops(c), 67108864.0);
  EXPECT_TRUE(is_memory_bound(c));
}

TEST(BenchFormulas, ExtendPairsCountOnlyVisibleKeys) {
  // Causal, prefix 3, 4 new tokens: the new tokens see 4, 5, 6, 7 keys.
  EXPECT_EQ(attended_pairs_per_request(extend_case(1, 3, 4, 1, 1, 8, true)), 22);
  EXPECT_EQ(attended_pairs_per_request(extend_case(1, 3, 4, 1, 1, 8, false)), 28);
  // Brute-force count against the closed form over a grid of lengths.
  for (int prefix : {0, 1, 5, 64}) {
    for (int n : {1, 2, 7, 33}) {
      int64_t visible = 0;
      for (int q = 0; q < n; ++q) {
        for (int k = 0; k < prefix + n; ++k) visible += (k <= prefix + q) ? 1 : 0;
      }
      EXPECT_EQ(attended_pairs_per_request(extend_case(1, prefix, n, 1, 1, 8, true)), visible)
          << "prefix " << prefix << " new " << n;
    }
  }
}

TEST(BenchFormulas, ExtendWindowPairsAndKeys) {
  // The worked example of attended_pairs_at: prefix 0, 4 new, window 1, causal: 1 + 2 + 2 + 2.
  BenchCase c = extend_case(1, 0, 4, 1, 1, 8, true);
  c.sliding_window = 1;
  EXPECT_EQ(attended_pairs_per_request(c), 7);
  // Brute force (q sees k when q - k <= w and k <= q, or |q - k| <= w without the causal mask)
  // over lengths and windows,
  // including windows wider than the sequence (no change) and 0 (the row's own key).
  for (bool causal : {true, false}) {
    for (int prefix : {0, 1, 5, 64}) {
      for (int n : {1, 2, 7, 33}) {
        for (int w : {0, 1, 3, 6, 40, 200}) {
          int64_t visible = 0;
          int first = prefix + n;
          for (int i = 0; i < n; ++i) {
            const int q = prefix + i;
            for (int k = 0; k < prefix + n; ++k) {
              const bool seen = causal ? k <= q && q - k <= w : std::abs(q - k) <= w;
              visible += seen ? 1 : 0;
              if (seen) first = std::min(first, k);
            }
          }
          BenchCase wc = extend_case(3, prefix, n, 1, 1, 8, causal);
          wc.sliding_window = w;
          EXPECT_EQ(attended_pairs_per_request(wc), visible)
              << "causal " << causal << " prefix " << prefix << " new " << n << " window " << w;
          // Keys read: from the first one any query sees to the end, per request (the pool holds
          // them all).
          EXPECT_EQ(kv_tokens_total(wc), 3 * (prefix + n));
          EXPECT_EQ(kv_tokens_read(wc), 3 * (prefix + n - first))
              << "causal " << causal << " prefix " << prefix << " new " << n << " window " << w;
        }
      }
    }
  }
}

TEST(BenchFormulas, ExtendBytesAndFlops) {
  const BenchCase c = extend_case(2, 3, 4, 2, 1, 8, true);
  // 2 x (8 + 8) per pair and head, 2 heads, 2 requests, 22 pairs each.
  EXPECT_DOUBLE_EQ(attention_flops(c), 2816.0);
  // KV: 2 requests x 7 tokens x (1 head x 8 x 2 bytes x 2) = 448; q and out: 8 tokens x 2 heads x
  // 8 x 2 bytes = 256 each.
  EXPECT_DOUBLE_EQ(attention_bytes(c), 448.0 + 256.0 + 256.0);
  EXPECT_FALSE(is_memory_bound(c));
  // The usual 4 * pairs * heads * head_dim when head_dim == v_head_dim.
  const BenchCase big = extend_case(1, 0, 4096, 32, 8, 128, true);
  EXPECT_DOUBLE_EQ(attention_flops(big), 4.0 * (4096.0 * 4097.0 / 2.0) * 32.0 * 128.0);
}

TEST(BenchFormulas, MlaDecodeBytesAndFlops) {
  const BenchCase c = mla_decode_case(2, 10, 16, 1);
  // 2 x (576 + 512) x 16 heads x 2 requests x 10 keys.
  EXPECT_DOUBLE_EQ(attention_flops(c), 696320.0);
  // KV 2 x 10 x 1152; q 2 x 16 x 576 x 2; out 2 x 16 x 512 x 2.
  EXPECT_DOUBLE_EQ(attention_bytes(c), 23040.0 + 36864.0 + 32768.0);
}

// Decode is judged by GB/s unless the run's ridge point (compute FLOP/s over copy bytes/s) is
// known and the case's FLOP/B reach it: MLA decode at 128 heads, s_q 2, on an H100-like machine.
TEST(BenchFormulas, MemoryBoundByTheRidgePoint) {
  BenchCase c = mla_decode_case(128, 4096, 128, 2);
  const double intensity = attention_flops(c) / attention_bytes(c);
  EXPECT_GT(intensity, 400.0);
  EXPECT_TRUE(is_memory_bound(c));                  // no ceilings: the kind decides
  EXPECT_TRUE(is_memory_bound(c, 3000.0, 0.0));     // no compute ceiling
  EXPECT_FALSE(is_memory_bound(c, 3000.0, 760.0));  // ridge ~253 FLOP/B
  c.s_q = 1;
  EXPECT_LT(attention_flops(c) / attention_bytes(c), 253.0);
  EXPECT_TRUE(is_memory_bound(c, 3000.0, 760.0));
  // GQA decode stays memory-bound on any machine.
  const BenchCase d = decode_case(16, 4096, 32, 8, 128, DType::kBF16);
  EXPECT_TRUE(is_memory_bound(d, 3000.0, 760.0));
  EXPECT_TRUE(is_memory_bound(d, 3000.0, 1e9));
  // Extend: a 4k prefill is compute-bound; one or four new tokens over a 4k prefix (GQA 32/8 d 128,
  // ~4 FLOP/B per new token) are memory-bound like the decode they nearly are; 64 new tokens
  // (~240 FLOP/B) stay just under the ridge of 760 TFLOP/s over 3000 GB/s (~253), 128 (~470) are
  // over it. Without ceilings an extend is compute-bound.
  const BenchCase prefill = extend_case(1, 0, 4096, 32, 8, 128, true);
  EXPECT_GT(attention_flops(prefill) / attention_bytes(prefill), 1000.0);
  EXPECT_FALSE(is_memory_bound(prefill, 3000.0, 760.0));
  for (int n : {1, 4}) {
    const BenchCase small = extend_case(64, 4096, n, 32, 8, 128, true);
    EXPECT_LT(attention_flops(small) / attention_bytes(small), 4.0 * n + 1) << n;
    EXPECT_TRUE(is_memory_bound(small, 3000.0, 760.0)) << n;
    EXPECT_FALSE(is_memory_bound(small)) << n;
  }
  EXPECT_TRUE(is_memory_bound(extend_case(16, 4096, 64, 32, 8, 128, true), 3000.0, 760.0));
  EXPECT_FALSE(is_memory_bound(extend_case(16, 4096, 128, 32, 8, 128, true), 3000.0, 760.0));
}

TEST(BenchFormulas, RatesRotationAndMedian) {
  EXPECT_DOUBLE_EQ(gb_per_s(1e9, 1000.0), 1.0);
  EXPECT_DOUBLE_EQ(tflop_per_s(2e12, 500.0), 4.0);
  const BenchCase c = decode_case(1, 1, 1, 1, 8, DType::kBF16);
  const double bytes = attention_bytes(c);  // 32 + 16 + 16 = 64
  EXPECT_DOUBLE_EQ(bytes, 64.0);
  EXPECT_EQ(rotation_copies(c, 10 * bytes, 100), 10);
  EXPECT_EQ(rotation_copies(c, 10.5 * bytes, 100), 11);
  EXPECT_EQ(rotation_copies(c, 1e12, 100), 100);
  EXPECT_EQ(rotation_copies(c, 1.0, 100), 1);
  EXPECT_DOUBLE_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
}

// ---- case files ----

TEST(BenchCaseFile, SweepIsACartesianProductInFileOrder) {
  const std::string text = R"({
    "kind": "decode",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128},
    "sweep": {"batch": [1, 4], "kv_len": [512, 2048, 4096], "kv_dtype": ["auto"]},
    "cases": [{"batch": 2, "kv_len": 7, "heads": [16, 16], "v_head_dim": 64, "dtype": "f16"}]
  })";
  Result<CaseFile> f = parse_case_file_text(text, "t.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 7u);
  EXPECT_EQ(f->cases[0].batch, 1);
  EXPECT_EQ(f->cases[0].kv_len, 512);
  EXPECT_EQ(f->cases[1].kv_len, 2048);
  EXPECT_EQ(f->cases[3].batch, 4);
  EXPECT_EQ(f->cases[5].kv_len, 4096);
  EXPECT_EQ(f->cases[0].v_head_dim, 128);
  EXPECT_EQ(f->cases[0].kv_dtype, DType::kBF16);
  EXPECT_EQ(f->cases[0].name, "decode_b1_kv512_p1_h32x8_d128_kvbf16");
  const BenchCase& x = f->cases[6];
  EXPECT_EQ(x.q_heads, 16);
  EXPECT_EQ(x.kv_heads, 16);
  EXPECT_EQ(x.v_head_dim, 64);
  EXPECT_EQ(x.dtype, DType::kF16);
  EXPECT_EQ(filter_cases(f->cases, "kv2048").size(), 2u);
  EXPECT_EQ(filter_cases(f->cases, "").size(), 7u);
}

TEST(BenchCaseFile, SharedPrefixReachesTheCaseSpec) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "decode",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16},
    "cases": [{"batch": 16, "kv_len": 4352, "shared_prefix": 4096}]})",
                                            "s.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 1u);
  EXPECT_EQ(f->cases[0].shared_prefix, 4096);
  EXPECT_EQ(f->cases[0].name, "decode_b16_kv4352_p16_h32x8_d128_kvbf16_shared4096");
  EXPECT_FALSE(parse_case_file_text(R"({"kind": "mla_decode", "fixed": {"q_heads": 16},
    "cases": [{"batch": 1, "kv_len": 64, "shared_prefix": 32}]})",
                                    "m.json")
                   .is_ok());
}

TEST(BenchCaseFile, ShufflePagesParsedAndNamed) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "decode",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "batch": 16, "kv_len": 4096},
    "cases": [{"page_size": 1}, {"page_size": 1, "shuffle_pages": false}]})",
                                            "p.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 2u);
  EXPECT_TRUE(f->cases[0].shuffle_pages);
  EXPECT_FALSE(f->cases[1].shuffle_pages);
  EXPECT_EQ(f->cases[0].name, "decode_b16_kv4096_p1_h32x8_d128_kvbf16");
  EXPECT_EQ(f->cases[1].name, "decode_b16_kv4096_p1_h32x8_d128_kvbf16_inorder");
  Result<CaseFile> bad = parse_case_file_text(R"({"kind": "decode",
    "cases": [{"batch": 1, "kv_len": 64, "shuffle_pages": 0}]})",
                                              "b.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("shuffle_pages"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("true or false"), std::string::npos)
      << bad.status().message();
}

// fp8_q (extend only): q handed over in e4m3, named "_qfp8", q counted at one byte per element.
TEST(BenchCaseFile, Fp8QParsedNamedAndCounted) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"q_heads": 2, "kv_heads": 1, "head_dim": 8, "batch": 2, "page_size": 1,
              "prefix_len": 3, "new_tokens": 4, "kv_dtype": "fp8_e4m3"},
    "cases": [{}, {"fp8_q": true}]})",
                                            "q.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 2u);
  EXPECT_FALSE(f->cases[0].fp8_q);
  EXPECT_TRUE(f->cases[1].fp8_q);
  EXPECT_EQ(f->cases[1].name, f->cases[0].name + "_qfp8");
  // 8 tokens x 2 heads x 8 q elements: 256 bytes in bf16, 128 in e4m3; the rest is equal.
  EXPECT_DOUBLE_EQ(attention_bytes(f->cases[0]) - attention_bytes(f->cases[1]), 128.0);
  EXPECT_DOUBLE_EQ(attention_flops(f->cases[0]), attention_flops(f->cases[1]));
  Result<CaseFile> bad = parse_case_file_text(R"({"kind": "decode",
    "cases": [{"batch": 1, "kv_len": 64, "fp8_q": true}]})",
                                              "d.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("fp8_q"), std::string::npos) << bad.status().message();
}

TEST(BenchCaseFile, WindowSoftcapSinksParsedNamedAndPassed) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"q_heads": 2, "kv_heads": 1, "head_dim": 8, "batch": 2, "page_size": 1,
              "prefix_len": 3, "new_tokens": 4},
    "cases": [{}, {"sliding_window": 2, "logit_cap": 50, "sinks": true}]})",
                                            "w.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 2u);
  const BenchCase& w = f->cases[1];
  EXPECT_EQ(w.sliding_window, 2);
  EXPECT_EQ(w.logit_cap, 50.f);
  EXPECT_TRUE(w.sinks);
  EXPECT_EQ(w.name, f->cases[0].name + "_win2_cap50_sinks");
  // The new tokens at 3..6 see 3 keys each (q - 2 .. q): 12 pairs of the 22.
  EXPECT_EQ(attended_pairs_per_request(w), 12);
  for (const char* bad_case : {R"({"sliding_window": -2})", R"({"logit_cap": -1})",
                               R"({"logit_cap": 1e-50})", R"({"sinks": 1})"}) {
    Result<CaseFile> bad = parse_case_file_text(
        std::string(R"({"kind": "extend", "fixed": {"q_heads": 2, "kv_heads": 1, "head_dim": 8,
          "new_tokens": 4}, "cases": [)") +
            bad_case + "]}",
        "b.json");
    EXPECT_FALSE(bad.is_ok()) << bad_case;
  }
  Result<CaseFile> decode = parse_case_file_text(R"({"kind": "decode",
    "cases": [{"batch": 1, "kv_len": 64, "q_heads": 2, "kv_heads": 1, "head_dim": 8,
               "sliding_window": 4}]})",
                                                 "d.json");
  ASSERT_FALSE(decode.is_ok());
  EXPECT_NE(decode.status().message().find("sliding_window"), std::string::npos)
      << decode.status().message();
}

TEST(BenchCaseFile, MlaDerivesHeadDims) {
  Result<CaseFile> f = parse_case_file_text(
      R"({"kind": "mla_decode", "sweep": {"q_heads": [16], "batch": [8], "kv_len": [100]}})",
      "mla.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 1u);
  EXPECT_EQ(f->cases[0].kv_heads, 1);
  EXPECT_EQ(f->cases[0].head_dim, 576);
  EXPECT_EQ(f->cases[0].v_head_dim, 512);
}

// An extend point with "mla": the non-absorbed prefill layer (kv heads = q heads, its latent
// pool 512 + 64 by default), named "_mla", counted as K / V of 192 + 128 per head and token, and
// passed to the harness as an MLA case of those dims.
TEST(BenchCaseFile, MlaPrefillExtendParsedNamedAndCounted) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"mla": true, "head_dim": 192, "v_head_dim": 128, "page_size": 64},
    "cases": [{"batch": 2, "new_tokens": 4, "q_heads": 16}]})",
                                            "m.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 1u);
  const BenchCase& c = f->cases[0];
  EXPECT_TRUE(c.mla_prefill);
  EXPECT_EQ(c.kv_heads, 16);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_NE(c.name.find("_d192v128_mla"), std::string::npos) << c.name;
  // Causal over 4 new tokens: 10 pairs per request; FLOPs 2 x (192 + 128) x 16 heads x 20.
  EXPECT_DOUBLE_EQ(attention_flops(c), 2.0 * 320 * 16 * 20);
  // K / V: 8 tokens x 16 heads x (192 + 128) x 2 bytes; q 8 x 16 x 192 x 2, out 8 x 16 x 128 x 2.
  EXPECT_DOUBLE_EQ(attention_bytes(c),
                   8.0 * 16 * 320 * 2 + 8.0 * 16 * 192 * 2 + 8.0 * 16 * 128 * 2);
  const harness::CaseSpec spec = to_case_spec(c);
  EXPECT_TRUE(spec.mla);
  EXPECT_FALSE(spec.mla_absorbed());
  EXPECT_EQ(spec.num_kv_heads, 16);
  EXPECT_EQ(spec.head_dim, 192);
  EXPECT_EQ(spec.v_head_dim, 128);
  EXPECT_TRUE(harness::validate_case(spec).is_ok()) << harness::validate_case(spec).to_string();
  for (const char* bad_case :
       {R"({"kv_heads": 1})", R"({"prefix_len": 8})", R"({"kv_dtype": "fp8_e4m3"})",
        R"({"sliding_window": 4})", R"({"logit_cap": 30})", R"({"sinks": true})"}) {
    Result<CaseFile> bad = parse_case_file_text(
        std::string(R"({"kind": "extend", "fixed": {"mla": true, "head_dim": 192,
          "v_head_dim": 128, "q_heads": 16, "new_tokens": 4}, "cases": [)") +
            bad_case + "]}",
        "b.json");
    ASSERT_FALSE(bad.is_ok()) << bad_case;
    EXPECT_NE(bad.status().message().find("mla"), std::string::npos) << bad.status().message();
  }
  // An f16 layer needs no kv_dtype: k / v are activations of its dtype.
  Result<CaseFile> f16 = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"mla": true, "head_dim": 192, "v_head_dim": 128, "q_heads": 16, "new_tokens": 4,
              "dtype": "f16"}, "cases": [{}]})",
                                              "f.json");
  ASSERT_TRUE(f16.is_ok()) << f16.status().to_string();
  EXPECT_EQ(f16->cases[0].kv_dtype, DType::kF16);
  Result<CaseFile> rank_alone = parse_case_file_text(R"({"kind": "extend",
    "cases": [{"q_heads": 2, "kv_heads": 1, "head_dim": 8, "new_tokens": 4, "kv_lora_rank": 8}]})",
                                                     "r.json");
  ASSERT_FALSE(rank_alone.is_ok());
  EXPECT_NE(rank_alone.status().message().find("\"mla\""), std::string::npos)
      << rank_alone.status().message();
}

// An MLA extend point with a cached prefix through the chunked prefix cache: "mla_prefix_chunk"
// (named "_pc<n>") goes to the harness as the case's chunk budget; a prefix needs it and it needs
// both "mla" and a prefix.
TEST(BenchCaseFile, MlaPrefillPrefixCacheParsedNamedAndCounted) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"mla": true, "head_dim": 192, "v_head_dim": 128, "page_size": 64},
    "cases": [{"batch": 2, "prefix_len": 6, "new_tokens": 4, "q_heads": 16,
               "mla_prefix_chunk": 8}]})",
                                            "m.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const BenchCase& c = f->cases[0];
  EXPECT_EQ(c.mla_prefix_chunk, 8);
  EXPECT_NE(c.name.find("_pre6_new4"), std::string::npos) << c.name;
  EXPECT_NE(c.name.find("_mla_pc8"), std::string::npos) << c.name;
  // Per request 4 x 6 prefix pairs + 10 causal pairs of the new tokens.
  EXPECT_DOUBLE_EQ(attention_flops(c), 2.0 * 320 * 16 * 2 * (24 + 10));
  const harness::CaseSpec spec = to_case_spec(c);
  EXPECT_EQ(spec.mla_prefix_chunk, 8);
  EXPECT_EQ(spec.prefix_lens, (std::vector<int>{6, 6}));
  EXPECT_TRUE(harness::validate_case(spec).is_ok()) << harness::validate_case(spec).to_string();
  for (const char* bad_case :
       {R"({"mla": true, "prefix_len": 8})", R"({"mla": true, "mla_prefix_chunk": 8})",
        R"({"head_dim": 128, "v_head_dim": 128, "prefix_len": 8,
                                   "mla_prefix_chunk": 8})"}) {
    Result<CaseFile> bad = parse_case_file_text(
        std::string(R"({"kind": "extend", "fixed": {"head_dim": 192, "v_head_dim": 128,
          "q_heads": 16, "new_tokens": 4}, "cases": [)") +
            bad_case + "]}",
        "b.json");
    ASSERT_FALSE(bad.is_ok()) << bad_case;
    EXPECT_NE(bad.status().message().find("mla_prefix_chunk"), std::string::npos)
        << bad.status().message();
  }
}

// Uneven extends (prefix_lens): each request's own cached prefix, counted per request and named by
// the range, total and hash of the list; exclusive with prefix_len, checked against batch; with a
// window each request reads its own keys.
TEST(BenchCaseFile, UnevenExtendFromPrefixLens) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16, "new_tokens": 4},
    "cases": [{"prefix_lens": [100, 0, 6]}, {"prefix_lens": [6, 100, 0], "batch": 3},
              {"prefix_lens": [100, 0], "sliding_window": 10}]})",
                                            "e.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const BenchCase& a = f->cases[0];
  EXPECT_EQ(a.batch, 3);
  EXPECT_EQ(a.prefix_len, 100);
  EXPECT_EQ(a.name.rfind("extend_b3_pre0-100_sum106_", 0), 0u) << a.name;
  EXPECT_NE(a.name.find("_new4_"), std::string::npos) << a.name;
  EXPECT_NE(f->cases[1].name, a.name);  // same lengths in another order
  // Causal: 4 x prefix + 10 pairs per request; KV: every prefix + 4 new tokens per request.
  EXPECT_EQ(attended_pairs_total(a), 4 * 106 + 3 * 10);
  EXPECT_EQ(kv_tokens_total(a), 106 + 3 * 4);
  EXPECT_DOUBLE_EQ(attention_flops(a), 2.0 * 256 * 32 * (4 * 106 + 3 * 10));
  // KV 118 tokens x 8 heads x 128 x 2 (K, V) x 2 bytes; q / out 12 tokens x 32 x 128 x 2 each.
  EXPECT_DOUBLE_EQ(attention_bytes(a), 118.0 * 4096 + 2 * 12 * 32 * 128 * 2);
  const harness::CaseSpec spec = to_case_spec(a);
  EXPECT_EQ(spec.prefix_lens, (std::vector<int>{100, 0, 6}));
  EXPECT_EQ(spec.new_lens, (std::vector<int>{4, 4, 4}));
  EXPECT_TRUE(harness::validate_case(spec).is_ok()) << harness::validate_case(spec).to_string();
  // Window 10: request 0 reads keys 90..103 and its rows see 11 keys each; request 1 keys 0..3
  // (1 + 2 + 3 + 4 pairs).
  EXPECT_EQ(kv_tokens_read(f->cases[2]), 14 + 4);
  EXPECT_EQ(attended_pairs_total(f->cases[2]), 44 + 10);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"prefix_lens": [4, 5], "prefix_len": 5})", "exclusive"},
      {R"({"prefix_lens": [4, 5], "batch": 3})", "does not match"},
      {R"({"prefix_lens": []})", "non-empty"},
      {R"({"prefix_lens": [4, -1]})", "prefix_lens[1]"}};
  for (const auto& [point, message] : bad) {
    Result<CaseFile> r = parse_case_file_text(
        std::string(R"({"kind": "extend", "fixed": {"q_heads": 32, "kv_heads": 8,
          "head_dim": 128, "new_tokens": 4}, "cases": [)") +
            point + "]}",
        "b.json");
    ASSERT_FALSE(r.is_ok()) << point;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
  Result<CaseFile> decode = parse_case_file_text(
      R"({"kind": "decode", "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128},
          "cases": [{"prefix_lens": [4, 5]}]})",
      "d.json");
  ASSERT_FALSE(decode.is_ok());
  EXPECT_NE(decode.status().message().find("prefix_lens"), std::string::npos)
      << decode.status().message();
}

// new_lens: one new-token count per request (a chunked prefill beside decode rows), with
// prefix_lens or a uniform prefix_len; "mixed" runs the batch as ForwardMode::kMixed.
TEST(BenchCaseFile, UnevenNewLensAndMixed) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "extend",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16},
    "cases": [{"prefix_lens": [0, 4095, 100], "new_lens": [2048, 1, 1], "mixed": true},
              {"prefix_len": 10, "new_lens": [1, 3]},
              {"prefix_len": 10, "new_lens": [3, 1]},
              {"prefix_len": 10, "new_tokens": 3, "batch": 2}]})",
                                            "m.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const BenchCase& a = f->cases[0];
  EXPECT_EQ(a.batch, 3);
  EXPECT_EQ(a.new_tokens, 2048);
  EXPECT_EQ(a.prefix_len, 4095);
  EXPECT_TRUE(a.mixed);
  EXPECT_NE(a.name.find("_new1-2048_sum2050_"), std::string::npos) << a.name;
  EXPECT_NE(a.name.find("_mixed"), std::string::npos) << a.name;
  // Causal: the chunk's rows see 1 .. 2048 keys, the two decode rows 4096 and 101.
  EXPECT_EQ(attended_pairs_total(a), int64_t{2048} * 2049 / 2 + 4096 + 101);
  EXPECT_EQ(kv_tokens_total(a), 2048 + 4096 + 101);
  EXPECT_EQ(a.num_tokens(), 2050);
  // KV (2048 + 4096 + 101) tokens x 4096 bytes; q / out 2050 tokens x 32 x 128 x 2 each.
  EXPECT_DOUBLE_EQ(attention_bytes(a), (2048.0 + 4096 + 101) * 4096 + 2 * 2050.0 * 32 * 128 * 2);
  const harness::CaseSpec spec = to_case_spec(a);
  EXPECT_EQ(spec.mode, ForwardMode::kMixed);
  EXPECT_EQ(spec.prefix_lens, (std::vector<int>{0, 4095, 100}));
  EXPECT_EQ(spec.new_lens, (std::vector<int>{2048, 1, 1}));
  EXPECT_TRUE(harness::validate_case(spec).is_ok()) << harness::validate_case(spec).to_string();
  const BenchCase& b = f->cases[1];
  EXPECT_FALSE(b.mixed);
  EXPECT_EQ(b.name.find("_mixed"), std::string::npos) << b.name;
  EXPECT_NE(f->cases[2].name, b.name);  // the same counts in another order
  EXPECT_EQ(attended_pairs_total(b), 11 + (3 * 10 + 6));
  const harness::CaseSpec b_spec = to_case_spec(b);
  EXPECT_EQ(b_spec.mode, ForwardMode::kExtend);
  EXPECT_EQ(b_spec.prefix_lens, (std::vector<int>{10, 10}));
  EXPECT_EQ(b_spec.new_lens, (std::vector<int>{1, 3}));
  // new_lens all equal count as new_tokens does.
  const BenchCase& u = f->cases[3];
  BenchCase same = u;
  same.new_lens = {3, 3};
  EXPECT_EQ(attended_pairs_total(same), attended_pairs_total(u));
  EXPECT_DOUBLE_EQ(attention_bytes(same), attention_bytes(u));
  const std::pair<const char*, const char*> bad[] = {
      {R"({"new_lens": [4, 5], "new_tokens": 5})", "exclusive"},
      {R"({"new_lens": [4, 5], "batch": 3})", "does not match"},
      {R"({"new_lens": [4, 5], "prefix_lens": [1, 2, 3]})", "one of each per request"},
      {R"({"new_lens": []})", "non-empty"},
      {R"({"new_lens": [4, 0]})", "new_lens[1]"},
      {R"({"new_tokens": 4, "mixed": 1})", "mixed"},
      {R"({"new_tokens": 4, "mla": true, "mixed": true})", "mixed false"}};
  for (const auto& [point, message] : bad) {
    Result<CaseFile> r = parse_case_file_text(
        std::string(R"({"kind": "extend", "fixed": {"q_heads": 32, "kv_heads": 32,
          "head_dim": 128}, "cases": [)") +
            point + "]}",
        "b.json");
    ASSERT_FALSE(r.is_ok()) << point;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
  for (const char* key : {R"("new_lens": [1, 2])", R"("mixed": true)"}) {
    Result<CaseFile> decode = parse_case_file_text(
        std::string(R"({"kind": "decode", "fixed": {"q_heads": 32, "kv_heads": 8,
          "head_dim": 128, "kv_len": 64}, "cases": [{)") +
            key + "}]}",
        "d.json");
    ASSERT_FALSE(decode.is_ok()) << key;
    EXPECT_NE(decode.status().message().find(std::string(key).substr(1, 5)), std::string::npos)
        << decode.status().message();
  }
}

TEST(BenchCaseFile, UnevenBatchFromKvLens) {
  Result<CaseFile> f = parse_case_file_text(R"({"kind": "decode",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16},
    "sweep": {"kv_lens": [[4096, 128, 1], [4096, 129, 0]]},
    "cases": [{"kv_lens": [100, 300], "batch": 2}, {"kv_lens": [128, 1, 4096]}]})",
                                            "u.json");
  ASSERT_FALSE(f.is_ok()) << "kv_lens[1] = 0 is below 1";
  EXPECT_NE(f.status().message().find("sweep.kv_lens[1][2]"), std::string::npos)
      << f.status().message();
  f = parse_case_file_text(R"({"kind": "decode",
    "fixed": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16},
    "sweep": {"kv_lens": [[4096, 128, 1]]},
    "cases": [{"kv_lens": [100, 300], "batch": 2}, {"kv_lens": [128, 1, 4096]}]})",
                           "u.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 3u);
  const BenchCase& a = f->cases[0];
  EXPECT_EQ(a.batch, 3);
  EXPECT_EQ(a.kv_len, 4096);
  EXPECT_EQ(a.kv_lens, (std::vector<int>{4096, 128, 1}));
  EXPECT_EQ(a.name.rfind("decode_b3_kv1-4096_sum4225_", 0), 0u) << a.name;
  // Same lengths in another order: another name (the hash), same formulas.
  EXPECT_NE(f->cases[2].name, a.name);
  EXPECT_DOUBLE_EQ(attention_bytes(f->cases[2]), attention_bytes(a));
  // KV 4225 tokens x 8 heads x 128 x 2 (K, V) x 2 bytes; q / out 3 x 32 x 128 x 2 bytes each.
  EXPECT_DOUBLE_EQ(attention_bytes(a), 4225.0 * 4096 + 2 * 3 * 32 * 128 * 2);
  EXPECT_DOUBLE_EQ(attention_flops(a), 2.0 * 256 * 32 * 4225);
  EXPECT_EQ(f->cases[1].batch, 2);
  EXPECT_EQ(f->cases[1].kv_len, 300);
  // MLA verify chains: each request's pairs are s_q * len - s_q (s_q - 1) / 2.
  f = parse_case_file_text(
      R"({"kind": "mla_decode", "cases": [{"q_heads": 16, "kv_lens": [64, 10], "s_q": 2}]})",
      "m.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(attended_pairs_total(f->cases[0]), (2 * 64 - 1) + (2 * 10 - 1));
}

struct BadFile {
  const char* text;
  const char* expected_in_message;
};

// A point listed twice (an explicit case equal to a sweep point, or two equal cases) would run
// twice and collide in the JSON / CSV rows; a key twice in one object kept only its last value;
// 1e999 escaped as a json::out_of_range exception.
TEST(BenchCaseFile, DuplicatesAndOverflowAreRefused) {
  const std::string fixed =
      R"("kind": "decode", "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64, "page_size": 16})";
  const std::vector<BadFile> bad = {
      {R"({KIND, "sweep": {"kv_len": [64]}, "cases": [{"batch": 1, "kv_len": 64}]})",
       "f.json: cases[0] repeats case decode_b1_kv64_p16_h4x2_d64_kvbf16 of sweep point "
       "{kv_len=64}"},
      {R"({KIND, "cases": [{"kv_len": 64}, {"kv_len": 32}, {"batch": 1, "kv_len": 64}]})",
       "f.json: cases[2] repeats case decode_b1_kv64_p16_h4x2_d64_kvbf16 of cases[0]"},
      {R"({KIND, "sweep": {"kv_len": [64, 64]}})", "repeats case"},
      {R"({KIND, "cases": [{"kv_len": 64, "kv_len": 128}]})",
       "f.json: key \"kv_len\" is given twice in one object"},
      {R"({KIND, "cases": [{"kv_len": 1e999}]})",
       "f.json: not valid JSON: number overflow parsing '1e999'"},
      {R"({"kind": "mla_decode", "fixed": {"q_heads": 16, "qk_rope_head_dim": 0},
           "cases": [{"kv_len": 64}]})",
       "f.json: fixed.qk_rope_head_dim: 0 is out of range (accepted: 1 to"},
  };
  for (const BadFile& b : bad) {
    std::string text = b.text;
    if (const size_t at = text.find("KIND"); at != std::string::npos) text.replace(at, 4, fixed);
    Result<CaseFile> f = parse_case_file_text(text, "f.json");
    ASSERT_FALSE(f.is_ok()) << text;
    EXPECT_NE(f.status().message().find(b.expected_in_message), std::string::npos)
        << f.status().message();
  }
  // Equal parameters in different objects are fine; so are points that differ.
  Result<CaseFile> ok = parse_case_file_text(
      "{" + fixed + R"(, "sweep": {"kv_len": [64]}, "cases": [{"kv_len": 64, "batch": 2}]})",
      "f.json");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->cases.size(), 2u);
}

TEST(BenchCaseFile, ErrorsNameTheProblem) {
  const std::vector<BadFile> bad = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"sweep": {"batch": [1]}})", "\"kind\""},
      {R"({"kind": "prefill", "sweep": {}})", "prefill"},
      {R"({"kind": "decode", "sweeps": {}})", "sweeps"},
      {R"({"kind": "decode"})", "needs \"sweep\" or \"cases\""},
      {R"({"kind": "decode", "sweep": {"prefix_len": [1]}})", "prefix_len"},
      {R"({"kind": "decode", "sweep": {"batch": 4}})", "sweep.batch"},
      {R"({"kind": "decode", "sweep": {"batch": []}})", "non-empty array"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64},
           "sweep": {"kv_len": [16, -3]}})",
       "sweep.kv_len[1]"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 3, "head_dim": 64},
           "sweep": {"kv_len": [16]}})",
       "not a multiple of kv_heads"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64},
           "sweep": {"batch": [1]}})",
       "\"kv_len\" is required"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64, "kv_len": 4},
           "sweep": {"kv_dtype": ["int8"]}})",
       "not a KV dtype"},
      {R"({"kind": "decode", "fixed": {"dtype": "fp8_e4m3"}, "sweep": {}})",
       "not an activation dtype"},
      {R"({"kind": "decode", "sweep": {"heads": [[32]]}})", "[q_heads, kv_heads] pair"},
      {R"({"kind": "extend", "sweep": {"causal": ["yes"]}})", "true or false"},
      {R"({"kind": "mla_decode", "sweep": {"head_dim": [576]}})", "unknown parameter"},
      {R"({"kind": "extend", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64},
           "cases": [{"prefix_len": 4}]})",
       "\"new_tokens\" is required"},
      {R"({"kind": "extend", "cases": {"new_tokens": 4}})", "array of objects"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64},
           "cases": [{"kv_lens": [4, 5], "kv_len": 5}]})",
       "exclusive"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64},
           "cases": [{"kv_lens": [4, 5], "batch": 3}]})",
       "does not match the 2 lengths"},
      {R"({"kind": "decode", "fixed": {"q_heads": 8, "kv_heads": 8, "head_dim": 64},
           "cases": [{"kv_lens": []}]})",
       "non-empty list of sequence lengths"},
      {R"({"kind": "mla_decode", "cases": [{"q_heads": 16, "kv_lens": [64, 1], "s_q": 2}]})",
       "shortest of kv_lens"},
      {R"({"kind": "extend", "cases": [{"kv_lens": [4]}]})", "unknown parameter"},
  };
  for (const BadFile& b : bad) {
    Result<CaseFile> f = parse_case_file_text(b.text, "bad.json");
    ASSERT_FALSE(f.is_ok()) << b.text;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << b.text;
    EXPECT_NE(f.status().message().find(b.expected_in_message), std::string::npos)
        << "message: " << f.status().message()
        << "\nexpected to contain: " << b.expected_in_message;
    EXPECT_EQ(f.status().message().rfind("bad.json", 0), 0u) << f.status().message();
  }
}

TEST(BenchCaseFile, MissingFileIsNotFound) {
  Result<CaseFile> f = load_case_file("/nonexistent/attnkit/cases.json");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
}

TEST(BenchCaseFile, ShippedCaseFilesParse) {
  const std::string dir = std::string(ATTNKIT_SOURCE_DIR) + "/bench/cases/";
  for (const char* name : {"decode.json", "extend.json", "mla_decode.json", "cpu_decode.json",
                           "cpu_prefill.json", "cascade.json", "verify.json", "fa3_prefill.json",
                           "mla_prefill.json", "mla_prefill_prefix.json", "small_extend.json",
                           "mixed_extend.json", "mixed_extend_fp8.json"}) {
    Result<CaseFile> f = load_case_file(dir + name);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_FALSE(f->cases.empty()) << name;
    for (size_t i = 0; i < f->cases.size(); ++i) {
      for (size_t j = i + 1; j < f->cases.size(); ++j) {
        EXPECT_NE(f->cases[i].name, f->cases[j].name) << name << ": duplicate case name";
      }
    }
  }
}

}  // namespace
}  // namespace attnkit::bench

namespace attnkit::bench {
namespace {

TEST(BenchFormulas, MlaDecodeVerifyChainCountsEveryDraft) {
  Result<CaseFile> f = parse_case_file_text(
      R"({"kind": "mla_decode", "sweep": {"q_heads": [128], "batch": [2], "kv_len": [100],
          "s_q": [1, 2]}})",
      "<inline>");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 2u);
  const BenchCase& one = f->cases[0];
  const BenchCase& two = f->cases[1];
  EXPECT_EQ(two.name, "mla_decode_b2_kv100_sq2_p1_h128_d576v512_kvbf16");
  EXPECT_EQ(attended_pairs_per_request(one), 100);
  EXPECT_EQ(attended_pairs_per_request(two), 2 * 100 - 1);  // drafts see 99 and 100 keys
  EXPECT_EQ(two.num_tokens(), 4);
  EXPECT_DOUBLE_EQ(attention_flops(two), 2.0 * (576 + 512) * 128 * 2 * 199);
  EXPECT_FALSE(parse_case_file_text(
                   R"({"kind": "mla_decode", "cases": [{"q_heads": 16, "kv_len": 1, "s_q": 2}]})",
                   "<inline>")
                   .is_ok());
}

}  // namespace
}  // namespace attnkit::bench

namespace attnkit::bench {
namespace {

// A decode point with s_q > 1 is a verify step: s_q drafts per request at the end of kv_len, a
// chain (topk 1) or a tree (topk > 1), named and counted as such; topk without drafts and drafts
// longer than a request are refused with the key and the values.
TEST(BenchFormulas, DecodeVerifyStepCountsEveryDraft) {
  Result<CaseFile> f = parse_case_file_text(
      R"({"kind": "decode", "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64,
          "page_size": 16, "batch": 2, "kv_len": 100}, "sweep": {"s_q": [1, 4], "topk": [1, 3]},
          "cases": []})",
      "<inline>");
  // topk 3 at s_q 1 is part of the sweep: the file is refused, naming it.
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("topk 3 needs s_q > 1"), std::string::npos)
      << f.status().to_string();
  f = parse_case_file_text(
      R"({"kind": "decode", "fixed": {"q_heads": 4, "kv_heads": 2, "head_dim": 64,
          "page_size": 16, "batch": 2, "kv_len": 100, "s_q": 4}, "sweep": {"topk": [1, 3]}})",
      "<inline>");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->cases.size(), 2u);
  const BenchCase& chain = f->cases[0];
  const BenchCase& tree = f->cases[1];
  EXPECT_EQ(chain.name, "decode_b2_kv100_sq4_p16_h4x2_d64_kvbf16");
  EXPECT_EQ(tree.name, "decode_b2_kv100_sq4_topk3_p16_h4x2_d64_kvbf16");
  EXPECT_EQ(chain.num_tokens(), 8);
  // Drafts see 97, 98, 99 and 100 keys (the tree's count is that bound).
  EXPECT_EQ(attended_pairs_per_request(chain), 97 + 98 + 99 + 100);
  EXPECT_EQ(attended_pairs_per_request(tree), attended_pairs_per_request(chain));
  EXPECT_DOUBLE_EQ(attention_flops(chain), 2.0 * 128 * 4 * 2 * 394);
  // K + V of 100 tokens x 2 heads x 64 x 2 bytes per request; q / out 8 x 4 x 64 x 2 bytes each.
  EXPECT_DOUBLE_EQ(attention_bytes(chain), 2.0 * 100 * 2 * 2 * 64 * 2 + 2.0 * 8 * 4 * 64 * 2);
  // The CaseSpec: TARGET_VERIFY over the kv_len - s_q cached tokens, the drafts and the tree.
  const harness::CaseSpec spec = to_case_spec(tree);
  EXPECT_EQ(spec.mode, ForwardMode::kTargetVerify);
  EXPECT_EQ(spec.prefix_lens, std::vector<int>({96, 96}));
  EXPECT_TRUE(spec.new_lens.empty());
  EXPECT_EQ(spec.spec_draft_tokens, 4);
  EXPECT_EQ(spec.spec_topk, 3);
  EXPECT_EQ(to_case_spec(chain).spec_topk, 1);
  // Uneven batches: each request's own prefix.
  f = parse_case_file_text(
      R"({"kind": "decode", "cases": [{"q_heads": 4, "kv_heads": 2, "head_dim": 64,
          "kv_lens": [50, 9], "s_q": 3, "topk": 2}]})",
      "<inline>");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(to_case_spec(f->cases[0]).prefix_lens, std::vector<int>({47, 6}));
  EXPECT_EQ(attended_pairs_total(f->cases[0]), (3 * 50 - 3) + (3 * 9 - 3));
  for (const BadFile& b : std::vector<BadFile>{
           {R"({"kind": "decode", "cases": [{"q_heads": 4, "kv_heads": 2, "head_dim": 64,
                "kv_len": 3, "s_q": 4}]})",
            "s_q 4 exceeds kv_len 3"},
           {R"({"kind": "decode", "cases": [{"q_heads": 4, "kv_heads": 2, "head_dim": 64,
                "kv_lens": [64, 3], "s_q": 4}]})",
            "s_q 4 exceeds the shortest of kv_lens (3)"},
           {R"({"kind": "decode", "cases": [{"q_heads": 4, "kv_heads": 2, "head_dim": 64,
                "kv_len": 64, "topk": 0}]})",
            "out of range"},
           {R"({"kind": "extend", "cases": [{"q_heads": 4, "kv_heads": 2, "head_dim": 64,
                "new_tokens": 64, "s_q": 2}]})",
            "unknown parameter for kind extend"}}) {
    Result<CaseFile> bad = parse_case_file_text(b.text, "v.json");
    ASSERT_FALSE(bad.is_ok()) << b.text;
    EXPECT_NE(bad.status().message().find(b.expected_in_message), std::string::npos)
        << bad.status().to_string();
  }
}

}  // namespace
}  // namespace attnkit::bench
