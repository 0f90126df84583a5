// The built-in registry: every flag of DESIGN.md section 4 is registered with the rows the design
// tables give, registration is explicit, and the registry's checks and helpers behave.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnkit/registry.h"

namespace attnkit {
namespace {

// One MHA row of DESIGN.md section 4, as "pages/fp8/fp4/topk1/topk>1/window/multimodal".
struct MhaRow {
  const char* name;
  const char* pages;  // PageRule::to_string()
  bool fp8, fp4, topk1, topk_gt1, window, multimodal;
  bool cuda_graph;
};
constexpr MhaRow kMha[] = {
    {"torch_native", "no (token indices)", true, true, false, false, false, true, false},
    // Beyond SGLang's all-"no" row: fp8 KV, verify chains, window and encoder attention.
    {"intel_amx", "no (token indices)", true, false, true, false, true, true, false},
    {"triton", "no (token indices)", true, true, true, true, true, true, true},
    {"flashinfer", "any", true, false, true, true, true, false, true},
    {"fa3", "any", true, false, true, true, true, true, true},
    {"fa4", "128", false, true, true, true, false, true, true},
    {"flex_attention", "no (token indices)", false, true, false, false, false, false, false},
    {"trtllm_mha", "16,32,64", true, true, true, false, true, false, true},
    {"dual_chunk_flash_attn", "any", false, false, false, false, false, false, true},
};

// One MLA row: "pages/fp8/fp4/chunked prefix/topk1/topk>1", topk>1 page-1-only flag.
struct MlaRow {
  const char* name;
  const char* pages;
  bool fp8, fp4, chunked, topk1, topk_gt1, topk_gt1_page1;
};
// The chunked prefix cache column is DESIGN.md's: flashinfer / flashmla / cutlass_mla / fa3 run
// it (mla_prefix_cache.h; GPU case table: mla_prefill_prefix_*), triton does not.
constexpr MlaRow kMla[] = {
    {"flashinfer", "no (token indices)", false, true, true, true, false, false},
    {"flashmla", "64", true, true, true, true, false, false},
    {"cutlass_mla", "128", true, true, true, true, false, false},
    {"trtllm_mla", "32,64", true, true, true, true, false, false},
    {"fa3", "any", false, false, true, true, true, true},
    {"triton", "any", false, false, false, true, true, true},
    {"fa4", "no (token indices)", false, true, true, false, false, false},
};

TEST(Registry, EveryDesignFlagIsRegistered) {
  const std::vector<std::string> expected = {"torch_native",
                                             "intel_amx",
                                             "triton",
                                             "flashinfer",
                                             "fa3",
                                             "fa4",
                                             "flex_attention",
                                             "trtllm_mha",
                                             "dual_chunk_flash_attn",
                                             "flashmla",
                                             "cutlass_mla",
                                             "trtllm_mla",
                                             "nsa",
                                             "aiter",
                                             "wave",
                                             "ascend",
                                             "intel_xpu"};
  const std::vector<std::string> names = builtin_registry().names();
  for (const std::string& n : expected) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  EXPECT_EQ(names.size(), expected.size());
  EXPECT_EQ(builtin_registry().linear_names(), (std::vector<std::string>{"triton", "cutedsl"}));
}

TEST(Registry, MhaRowsMatchDesign) {
  for (const MhaRow& e : kMha) {
    const BackendDescriptor* d = builtin_registry().find(e.name);
    ASSERT_NE(d, nullptr) << e.name;
    ASSERT_TRUE(d->mha.has_value()) << e.name;
    const FeatureRow& r = *d->mha;
    EXPECT_EQ(r.pages.to_string(), e.pages) << e.name;
    EXPECT_EQ(r.fp8_kv, e.fp8) << e.name;
    EXPECT_EQ(r.fp4_kv, e.fp4) << e.name;
    EXPECT_EQ(r.spec_topk1, e.topk1) << e.name;
    EXPECT_EQ(r.spec_topk_gt1, e.topk_gt1) << e.name;
    EXPECT_EQ(r.sliding_window, e.window) << e.name;
    EXPECT_EQ(r.multimodal, e.multimodal) << e.name;
    EXPECT_EQ(d->cuda_graph, e.cuda_graph) << e.name;
  }
}

TEST(Registry, MlaRowsMatchDesign) {
  for (const MlaRow& e : kMla) {
    const BackendDescriptor* d = builtin_registry().find(e.name);
    ASSERT_NE(d, nullptr) << e.name;
    ASSERT_TRUE(d->mla.has_value()) << e.name;
    const FeatureRow& r = *d->mla;
    EXPECT_EQ(r.pages.to_string(), e.pages) << e.name;
    EXPECT_EQ(r.fp8_kv, e.fp8) << e.name;
    EXPECT_EQ(r.fp4_kv, e.fp4) << e.name;
    EXPECT_EQ(r.chunked_prefix_cache, e.chunked) << e.name;
    EXPECT_EQ(r.spec_topk1, e.topk1) << e.name;
    EXPECT_EQ(r.spec_topk_gt1, e.topk_gt1) << e.name;
    EXPECT_EQ(r.topk_gt1_needs_page1, e.topk_gt1_page1) << e.name;
  }
  // MHA-only and MLA-only backends.
  EXPECT_FALSE(builtin_registry().find("flashmla")->mha.has_value());
  EXPECT_FALSE(builtin_registry().find("torch_native")->mla.has_value());
}

TEST(Registry, BuildStateIsHonest) {
  for (const BackendDescriptor& d : builtin_registry().all()) {
    if (d.built) {
      EXPECT_TRUE(static_cast<bool>(d.create)) << d.name << " is built but has no factory";
    } else {
      EXPECT_FALSE(d.not_built_reason.empty()) << d.name;
    }
  }
  EXPECT_TRUE(builtin_registry().find("torch_native")->built);
  EXPECT_EQ(builtin_registry().find("aiter")->not_built_reason, "needs ROCm");
  EXPECT_EQ(builtin_registry().find("wave")->not_built_reason, "needs ROCm");
  EXPECT_EQ(builtin_registry().find("ascend")->not_built_reason, "needs an Ascend NPU");
  EXPECT_EQ(builtin_registry().find("intel_xpu")->not_built_reason, "needs an Intel XPU");
#ifdef ATTNKIT_WITH_CUDA
  EXPECT_TRUE(builtin_registry().find("triton")->built);
#else
  EXPECT_FALSE(builtin_registry().find("triton")->built);
  EXPECT_EQ(builtin_registry().find("triton")->not_built_reason, "built without CUDA");
#endif
}

TEST(Registry, BuiltinRegistryIsBuiltOnce) {
  EXPECT_EQ(&builtin_registry(), &builtin_registry());
  BackendRegistry fresh;
  ASSERT_TRUE(register_builtin_backends(fresh).is_ok());
  EXPECT_EQ(fresh.names(), builtin_registry().names());
  // Registering twice is a duplicate-name error, not a silent overwrite.
  const Status again = register_builtin_backends(fresh);
  EXPECT_FALSE(again.is_ok());
  EXPECT_NE(again.message().find("already registered"), std::string::npos) << again.message();
}

TEST(Registry, GetUnknownListsValidNames) {
  Result<const BackendDescriptor*> r = builtin_registry().get("flashattn");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("valid backends: torch_native, intel_amx, triton"),
            std::string::npos)
      << r.status().message();
  Result<const LinearAttnDescriptor*> l = builtin_registry().get_linear("fla");
  ASSERT_FALSE(l.is_ok());
  EXPECT_NE(l.status().message().find("triton, cutedsl"), std::string::npos);
}

TEST(Registry, AddRejectsIncompleteDescriptors) {
  BackendRegistry r;
  BackendDescriptor d;
  d.name = "x";
  EXPECT_FALSE(r.add(d).is_ok()) << "no feature row";
  d.mha = FeatureRow{};
  d.built = false;
  EXPECT_FALSE(r.add(d).is_ok()) << "not built without a reason";
  d.not_built_reason = "test";
  EXPECT_TRUE(r.add(d).is_ok());
  d.built = true;
  d.name = "y";
  EXPECT_FALSE(r.add(d).is_ok()) << "built without a factory";
}

TEST(Registry, CreateChecksBuildPlatformKindAndPage) {
  BackendContext ctx;
  ctx.device = Device::cpu();
  ctx.page_size = 1;
  Result<std::unique_ptr<AttentionBackend>> r = builtin_registry().create("trtllm_mla", ctx);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotBuilt);
  EXPECT_NE(r.status().message().find("not implemented yet"), std::string::npos);

  ctx.is_mla = true;
  r = builtin_registry().create("torch_native", ctx);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("torch_native does not support MLA"), std::string::npos)
      << r.status().message();

  r = builtin_registry().create("nope", ctx);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST(PageRule, AllowsAndPrints) {
  const PageRule any{PageRule::Kind::kAny, {}};
  const PageRule token{PageRule::Kind::kTokenOnly, {}};
  const PageRule fixed{PageRule::Kind::kFixed, {16, 32, 64}};
  for (int p : {1, 7, 16, 128}) {
    EXPECT_TRUE(any.allows(p));
    EXPECT_TRUE(token.allows(p));
  }
  EXPECT_FALSE(any.allows(0));
  EXPECT_TRUE(fixed.allows(32));
  EXPECT_FALSE(fixed.allows(1));
  EXPECT_FALSE(fixed.allows(128));
  EXPECT_EQ(any.to_string(), "any");
  EXPECT_EQ(token.to_string(), "no (token indices)");
  EXPECT_EQ(fixed.to_string(), "16,32,64");
}

TEST(KvCacheDType, ParseAndPrintRoundTrip) {
  for (KVCacheDType d : {KVCacheDType::kAuto, KVCacheDType::kBF16, KVCacheDType::kFP16,
                         KVCacheDType::kFP8E4M3, KVCacheDType::kFP8E5M2, KVCacheDType::kFP4E2M1}) {
    Result<KVCacheDType> back = parse_kv_cache_dtype(kv_cache_dtype_name(d));
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(*parse_kv_cache_dtype("bfloat16"), KVCacheDType::kBF16);
  EXPECT_EQ(*parse_kv_cache_dtype("float16"), KVCacheDType::kFP16);
  Result<KVCacheDType> bad = parse_kv_cache_dtype("fp8");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--kv-cache-dtype \"fp8\" is not valid"),
            std::string::npos);
  EXPECT_STREQ(attention_kind_name(AttentionKind::kMLA), "MLA");
}

}  // namespace
}  // namespace attnkit
