// HybridAttnBackend (DESIGN.md section 6) with two recording fake backends: phase dispatch for
// every ForwardMode under both --speculative-attention-mode values, which CUDA-graph state is
// initialised, capture/replay routing, and the shared page size / KV dtype checks.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/hybrid_backend.h"
#include "attnkit/registry.h"

namespace attnkit {
namespace {

using Log = std::vector<std::string>;

BackendDescriptor fake_descriptor(const std::string& name, PageRule pages, bool fp8, bool fp4,
                                  bool mla) {
  BackendDescriptor d;
  d.name = name;
  d.implementation = "recording fake";
  d.platforms = {Platform::kCPU};
  FeatureRow row;
  row.pages = std::move(pages);
  row.fp8_kv = fp8;
  row.fp4_kv = fp4;
  if (mla) {
    d.mla = row;
  } else {
    d.mha = row;
  }
  d.cuda_graph = true;
  d.built = true;
  return d;
}

// Records "<name>.<call>[:<mode>]" for every call it receives.
class RecordingBackend final : public AttentionBackend {
 public:
  RecordingBackend(BackendDescriptor d, Log* log, int fill_value = 1,
                   std::optional<Device> device = std::nullopt)
      : d_(std::move(d)), log_(log), fill_value_(fill_value), device_(device) {}
  const BackendDescriptor& descriptor() const override { return d_; }
  std::optional<Device> device() const override { return device_; }
  Status init_forward_metadata(const ForwardBatch& batch) override {
    return record("init_forward_metadata", batch.mode);
  }
  Status forward_extend(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const AttentionLayer&, const ForwardBatch& batch, bool,
                        const TensorView&) override {
    return record("forward_extend", batch.mode);
  }
  Status forward_decode(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const AttentionLayer&, const ForwardBatch& batch, bool,
                        const TensorView&) override {
    return record("forward_decode", batch.mode);
  }
  Status init_cuda_graph_state(int max_bs, int max_num_tokens) override {
    log_->push_back(d_.name + ".init_cuda_graph_state:" + std::to_string(max_bs) + "," +
                    std::to_string(max_num_tokens));
    return max_bs >= 1 ? Status::ok() : Status::invalid_argument("max_bs must be >= 1");
  }
  Status init_forward_metadata_capture_cuda_graph(int, int, const TensorView&, const TensorView&,
                                                  const TensorView&, ForwardMode mode,
                                                  const SpecInfo*) override {
    return record("capture", mode);
  }
  Status init_forward_metadata_replay_cuda_graph(int, const TensorView&, const TensorView&, int64_t,
                                                 const TensorView&, ForwardMode mode,
                                                 const SpecInfo*, const int32_t*) override {
    return record("replay", mode);
  }
  int cuda_graph_seq_len_fill_value() const override { return fill_value_; }

 private:
  Status record(const char* call, ForwardMode mode) {
    log_->push_back(d_.name + "." + call + ":" + forward_mode_name(mode));
    return Status::ok();
  }
  BackendDescriptor d_;
  Log* log_;
  int fill_value_;
  std::optional<Device> device_;
};

PageRule any() { return PageRule{PageRule::Kind::kAny, {}}; }

struct Pair {
  Log log;
  std::unique_ptr<HybridAttnBackend> hybrid;
};

std::unique_ptr<Pair> make(HybridOptions options, int prefill_fill = 1, int decode_fill = 1) {
  auto p = std::make_unique<Pair>();
  auto prefill = std::make_unique<RecordingBackend>(fake_descriptor("P", any(), true, true, false),
                                                    &p->log, prefill_fill);
  auto decode = std::make_unique<RecordingBackend>(fake_descriptor("D", any(), true, true, false),
                                                   &p->log, decode_fill);
  Result<std::unique_ptr<HybridAttnBackend>> h =
      HybridAttnBackend::create(std::move(prefill), std::move(decode), options);
  EXPECT_TRUE(h.is_ok()) << h.status().to_string();
  if (h.is_ok()) p->hybrid = std::move(h).value();
  return p;
}

HybridOptions opts(bool spec, SpeculativeAttentionMode mode) {
  HybridOptions o;
  o.speculative_enabled = spec;
  o.speculative_attention_mode = mode;
  return o;
}

// Expected backend per mode: DECODE/IDLE -> D; verify/draft-extend -> by mode; rest -> P.
struct DispatchCase {
  ForwardMode mode;
  const char* with_prefill_mode;
  const char* with_decode_mode;
};
constexpr DispatchCase kDispatch[] = {
    {ForwardMode::kExtend, "P", "P"},       {ForwardMode::kMixed, "P", "P"},
    {ForwardMode::kDecode, "D", "D"},       {ForwardMode::kIdle, "D", "D"},
    {ForwardMode::kTargetVerify, "P", "D"}, {ForwardMode::kDraftExtend, "P", "D"},
};

TEST(HybridAttnBackend, InitForwardMetadataDispatchesByPhase) {
  for (SpeculativeAttentionMode m :
       {SpeculativeAttentionMode::kPrefill, SpeculativeAttentionMode::kDecode}) {
    auto p = make(opts(true, m));
    ASSERT_NE(p->hybrid, nullptr);
    for (const DispatchCase& c : kDispatch) {
      p->log.clear();
      ForwardBatch batch;
      batch.mode = c.mode;
      ASSERT_TRUE(p->hybrid->init_forward_metadata(batch).is_ok());
      const std::string who =
          m == SpeculativeAttentionMode::kPrefill ? c.with_prefill_mode : c.with_decode_mode;
      ASSERT_EQ(p->log.size(), 1u);
      EXPECT_EQ(p->log[0], who + ".init_forward_metadata:" + forward_mode_name(c.mode))
          << "spec mode " << speculative_attention_mode_name(m);
      EXPECT_EQ(&p->hybrid->backend_for(c.mode),
                who[0] == 'P' ? &p->hybrid->prefill_backend() : &p->hybrid->decode_backend());
    }
  }
}

TEST(HybridAttnBackend, ForwardRunsTheRightKernelOnTheRightBackend) {
  for (SpeculativeAttentionMode m :
       {SpeculativeAttentionMode::kPrefill, SpeculativeAttentionMode::kDecode}) {
    auto p = make(opts(true, m));
    ASSERT_NE(p->hybrid, nullptr);
    for (const DispatchCase& c : kDispatch) {
      p->log.clear();
      ForwardBatch batch;
      batch.mode = c.mode;
      AttentionLayer layer;
      ASSERT_TRUE(p->hybrid->forward({}, {}, {}, {}, layer, batch).is_ok());
      if (c.mode == ForwardMode::kIdle) {
        EXPECT_TRUE(p->log.empty()) << "IDLE must run nothing";
        continue;
      }
      const std::string who =
          m == SpeculativeAttentionMode::kPrefill ? c.with_prefill_mode : c.with_decode_mode;
      const char* kernel = c.mode == ForwardMode::kDecode ? "forward_decode" : "forward_extend";
      ASSERT_EQ(p->log.size(), 1u);
      EXPECT_EQ(p->log[0], who + "." + kernel + ":" + forward_mode_name(c.mode));
    }
  }
}

TEST(HybridAttnBackend, GraphStateDecodeAlwaysPrefillOnlyForSpecPrefillMode) {
  struct GraphCase {
    bool spec;
    SpeculativeAttentionMode mode;
    bool prefill_initialised;
  };
  const GraphCase graph_cases[] = {
      {false, SpeculativeAttentionMode::kPrefill, false},
      {false, SpeculativeAttentionMode::kDecode, false},
      {true, SpeculativeAttentionMode::kPrefill, true},
      {true, SpeculativeAttentionMode::kDecode, false},
  };
  constexpr int kMaxBs = 8;
  constexpr int kMaxTokens = 32;
  for (const GraphCase& g : graph_cases) {
    auto p = make(opts(g.spec, g.mode));
    ASSERT_NE(p->hybrid, nullptr);
    EXPECT_EQ(p->hybrid->prefill_graph_state_needed(), g.prefill_initialised);
    ASSERT_TRUE(p->hybrid->init_cuda_graph_state(kMaxBs, kMaxTokens).is_ok());
    Log expected = {"D.init_cuda_graph_state:8,32"};
    if (g.prefill_initialised) expected.push_back("P.init_cuda_graph_state:8,32");
    EXPECT_EQ(p->log, expected) << "spec " << g.spec << " mode "
                                << speculative_attention_mode_name(g.mode);
  }
}

TEST(HybridAttnBackend, CaptureAndReplayRouteAndRequireGraphState) {
  auto p = make(opts(true, SpeculativeAttentionMode::kPrefill));
  ASSERT_NE(p->hybrid, nullptr);
  const Status before = p->hybrid->init_forward_metadata_capture_cuda_graph(
      1, 1, {}, {}, {}, ForwardMode::kDecode, nullptr);
  EXPECT_FALSE(before.is_ok()) << "capture before init_cuda_graph_state must fail";
  ASSERT_TRUE(p->hybrid->init_cuda_graph_state(4, 16).is_ok());
  p->log.clear();
  ASSERT_TRUE(p->hybrid
                  ->init_forward_metadata_capture_cuda_graph(4, 4, {}, {}, {}, ForwardMode::kDecode,
                                                             nullptr)
                  .is_ok());
  ASSERT_TRUE(p->hybrid
                  ->init_forward_metadata_capture_cuda_graph(4, 16, {}, {}, {},
                                                             ForwardMode::kTargetVerify, nullptr)
                  .is_ok());
  ASSERT_TRUE(p->hybrid
                  ->init_forward_metadata_replay_cuda_graph(
                      4, {}, {}, 64, {}, ForwardMode::kTargetVerify, nullptr, nullptr)
                  .is_ok());
  const Log expected = {"D.capture:decode", "P.capture:target_verify", "P.replay:target_verify"};
  EXPECT_EQ(p->log, expected);
}

// A failed re-initialisation leaves no graph state behind: captures are refused until an
// init_cuda_graph_state succeeds again (they went ahead on the backends' mixed workspaces).
TEST(HybridAttnBackend, FailedReinitialisationRefusesCaptures) {
  auto p = make(opts(true, SpeculativeAttentionMode::kPrefill));
  ASSERT_NE(p->hybrid, nullptr);
  ASSERT_TRUE(p->hybrid->init_cuda_graph_state(4, 16).is_ok());
  EXPECT_FALSE(p->hybrid->init_cuda_graph_state(0, 16).is_ok());
  const Status s = p->hybrid->init_forward_metadata_capture_cuda_graph(
      4, 4, {}, {}, {}, ForwardMode::kDecode, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("init_cuda_graph_state must run"), std::string::npos) << s.message();
  ASSERT_TRUE(p->hybrid->init_cuda_graph_state(4, 16).is_ok());
  EXPECT_TRUE(p->hybrid
                  ->init_forward_metadata_capture_cuda_graph(4, 4, {}, {}, {}, ForwardMode::kDecode,
                                                             nullptr)
                  .is_ok());
}

TEST(HybridAttnBackend, CaptureOnUninitialisedPrefillBackendIsAnError) {
  auto p = make(opts(true, SpeculativeAttentionMode::kDecode));
  ASSERT_NE(p->hybrid, nullptr);
  ASSERT_TRUE(p->hybrid->init_cuda_graph_state(4, 16).is_ok());
  p->log.clear();
  // Verify runs on the decode backend in mode decode: fine.
  EXPECT_TRUE(p->hybrid
                  ->init_forward_metadata_capture_cuda_graph(4, 16, {}, {}, {},
                                                             ForwardMode::kTargetVerify, nullptr)
                  .is_ok());
  // EXTEND runs on the prefill backend, whose graph state was never initialised.
  const Status s = p->hybrid->init_forward_metadata_capture_cuda_graph(
      4, 16, {}, {}, {}, ForwardMode::kExtend, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("prefill backend P"), std::string::npos) << s.message();
  EXPECT_EQ(p->log, Log{"D.capture:target_verify"});
}

TEST(HybridAttnBackend, FillValuesMustAgreeWhenBothAreCaptured) {
  auto p = make(opts(true, SpeculativeAttentionMode::kPrefill), /*prefill_fill=*/0,
                /*decode_fill=*/1);
  ASSERT_NE(p->hybrid, nullptr);
  const Status s = p->hybrid->init_cuda_graph_state(4, 16);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("pads CUDA-graph rows"), std::string::npos) << s.message();
  EXPECT_EQ(p->hybrid->cuda_graph_seq_len_fill_value(), 1);
}

TEST(HybridAttnBackend, DescriptorNamesBothBackends) {
  auto p = make(opts(false, SpeculativeAttentionMode::kPrefill));
  ASSERT_NE(p->hybrid, nullptr);
  EXPECT_EQ(p->hybrid->descriptor().name, "hybrid(prefill=P, decode=D)");
  EXPECT_TRUE(p->hybrid->descriptor().cuda_graph);
}

// The message of HybridAttnBackend::create over backends with these descriptors ("" = it
// succeeded, which the callers below count as a failure).
std::string create_error(BackendDescriptor prefill, BackendDescriptor decode,
                         const HybridOptions& o) {
  Log log;
  auto h =
      HybridAttnBackend::create(std::make_unique<RecordingBackend>(std::move(prefill), &log),
                                std::make_unique<RecordingBackend>(std::move(decode), &log), o);
  return h.is_ok() ? std::string() : h.status().message();
}

TEST(HybridAttnBackend, SharedPageSizeMustFitBoth) {
  HybridOptions o;
  o.page_size = 16;
  const std::string err = create_error(
      fake_descriptor("P", any(), true, true, false),
      fake_descriptor("D", PageRule{PageRule::Kind::kFixed, {32, 64}}, true, true, false), o);
  EXPECT_NE(err.find("shared page_size 16 is not supported by decode backend D"), std::string::npos)
      << err;
}

TEST(HybridAttnBackend, SharedKvDtypeMustFitBoth) {
  HybridOptions o;
  o.kv_dtype = DType::kFP8E4M3;
  const std::string err = create_error(fake_descriptor("P", any(), false, true, false),
                                       fake_descriptor("D", any(), true, true, false), o);
  EXPECT_NE(err.find("fp8_e4m3 is not supported by prefill backend P"), std::string::npos) << err;
}

// A dtype no KV pool stores (an index dtype) is refused by name.
TEST(HybridAttnBackend, KvDtypeMustBeAStorageDtype) {
  HybridOptions o;
  o.kv_dtype = DType::kI32;
  const std::string err = create_error(fake_descriptor("P", any(), true, true, false),
                                       fake_descriptor("D", any(), true, true, false), o);
  EXPECT_NE(err.find("kv_dtype int32 is not a KV storage dtype (bf16, f16, f32, fp8_e4m3"),
            std::string::npos)
      << err;
}

TEST(HybridAttnBackend, AttentionKindMustBeSupported) {
  HybridOptions o;
  o.is_mla = true;
  const std::string err = create_error(fake_descriptor("P", any(), true, true, true),
                                       fake_descriptor("D", any(), true, true, false), o);
  EXPECT_NE(err.find("decode backend D does not support MLA"), std::string::npos) << err;
}

// Both parts serve one KV pool: parts made for different devices are refused by name; parts that
// name no device (backends outside attnkit) are taken as they are.
TEST(HybridAttnBackend, PartsOnDifferentDevicesAreRefused) {
  Log log;
  const auto part = [&](const char* name, std::optional<Device> device) {
    return std::make_unique<RecordingBackend>(fake_descriptor(name, any(), true, true, false), &log,
                                              1, device);
  };
  auto h = HybridAttnBackend::create(part("P", Device::cuda(1)), part("D", Device::cuda(0)),
                                     HybridOptions{});
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("prefill backend P runs on cuda:1, decode backend D on "
                                      "cuda:0"),
            std::string::npos)
      << h.status().message();
  auto same = HybridAttnBackend::create(part("P", Device::cuda(1)), part("D", Device::cuda(1)),
                                        HybridOptions{});
  ASSERT_TRUE(same.is_ok()) << same.status().to_string();
  EXPECT_EQ((*same)->device(), Device::cuda(1));
  auto unsaid =
      HybridAttnBackend::create(part("P", std::nullopt), part("D", Device::cpu()), HybridOptions{});
  ASSERT_TRUE(unsaid.is_ok()) << unsaid.status().to_string();
  EXPECT_EQ((*unsaid)->device(), Device::cpu());
}

TEST(HybridAttnBackend, NullBackendsRejected) {
  Log log;
  auto decode =
      std::make_unique<RecordingBackend>(fake_descriptor("D", any(), true, true, false), &log);
  auto h = HybridAttnBackend::create(nullptr, std::move(decode), HybridOptions{});
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
}

TEST(HybridAttnBackend, ParseSpeculativeAttentionMode) {
  EXPECT_EQ(*parse_speculative_attention_mode("prefill"), SpeculativeAttentionMode::kPrefill);
  EXPECT_EQ(*parse_speculative_attention_mode("decode"), SpeculativeAttentionMode::kDecode);
  Result<SpeculativeAttentionMode> bad = parse_speculative_attention_mode("verify");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("valid values: prefill, decode"), std::string::npos);
}

}  // namespace
}  // namespace attnkit
