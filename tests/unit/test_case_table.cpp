// The shared case table covers DESIGN.md section 8, prepare_case builds what it promises, the
// comparison catches broken backends, and skip_reason follows the descriptor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>

#include "attnkit/registry.h"
#include "backends/torch_native/torch_native_backend.h"
#include "harness/case_runner.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

const std::vector<CaseSpec>& table() { return harness::shared_case_table(); }

bool any(const std::function<bool(const CaseSpec&)>& pred) {
  return std::any_of(table().begin(), table().end(), pred);
}

std::vector<int> kv_lens(const CaseSpec& c) {
  std::vector<int> out;
  for (int r = 0; r < c.batch_size(); ++r) {
    const int fresh = c.mode == ForwardMode::kTargetVerify ? c.spec_draft_tokens
                                                           : c.new_lens[static_cast<size_t>(r)];
    out.push_back(c.prefix_lens[static_cast<size_t>(r)] + fresh);
  }
  return out;
}

TEST(CaseTable, NamesAreUniqueIdentifiers) {
  std::set<std::string> names;
  for (const CaseSpec& c : table()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate " << c.name;
    EXPECT_TRUE(std::all_of(c.name.begin(), c.name.end(), [](char ch) {
      return std::isalnum(ch) || ch == '_';
    })) << c.name;
    EXPECT_EQ(harness::find_case(c.name), &c);
    EXPECT_NE(c.describe().find(c.name), std::string::npos);
  }
  EXPECT_EQ(harness::find_case("no_such_case"), nullptr);
}

// validate_case (what `attnkit run --case` checks first) accepts every shared case, and names the
// field, its value and the rule for a bad one.
TEST(CaseTable, ValidateCaseAcceptsTheTableAndNamesBadFields) {
  for (const CaseSpec& c : table()) {
    EXPECT_TRUE(harness::validate_case(c).is_ok())
        << c.name << ": " << harness::validate_case(c).to_string();
  }
  const auto message = [](void (*edit)(CaseSpec&)) {
    CaseSpec c = table().front();
    edit(c);
    return harness::validate_case(c).message();
  };
  EXPECT_NE(message([](CaseSpec& c) { c.page_size = 0; }).find("page_size 0 must be in [1, 4096]"),
            std::string::npos);
  EXPECT_NE(
      message([](CaseSpec& c) { c.prefix_lens[1] = -3; }).find("prefix_lens[1] = -3 must be >= 0"),
      std::string::npos);
  EXPECT_NE(message([](CaseSpec& c) { c.new_lens[2] = -1; }).find("new_lens[2] = -1 must be >= 0"),
            std::string::npos);
  // Lengths whose sums overflow int32 are named before prepare_case adds them up (they used to
  // wrap to a negative max_context_len).
  EXPECT_NE(message([](CaseSpec& c) {
              c.prefix_lens[0] = 2000000000;
              c.new_lens[0] = 2000000000;
            }).find("request 0: encoder 0 + prefix 2000000000 + new 2000000000"),
            std::string::npos);
  EXPECT_NE(message([](CaseSpec& c) { c.page_size = 2000000000; }).find("page_size 2000000000"),
            std::string::npos);
  // Encoder-only layers run no speculative batch (validate_forward_inputs refuses them there).
  EXPECT_NE(message([](CaseSpec& c) {
              c.mode = ForwardMode::kDraftExtend;
              c.type = AttentionType::kEncoderOnly;
            }).find("type encoder_only in a draft_extend case: speculative batches are causal"),
            std::string::npos);
  EXPECT_NE(message([](CaseSpec& c) {
              c.new_lens = {INT32_MAX / 2, INT32_MAX / 2, 100};
              c.prefix_lens = {0, 0, 0};
            }).find("new tokens in all"),
            std::string::npos);
}

TEST(CaseTable, CoversDesignSection8) {
  for (int page : {1, 16, 64, 128, 24}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) { return c.page_size == page; })) << "page " << page;
  }
  EXPECT_TRUE(any([](const CaseSpec& c) {
    for (int len : kv_lens(c)) {
      if (c.page_size > 1 && len % c.page_size != 0) return true;
    }
    return false;
  })) << "kv_len % page_size != 0";
  EXPECT_TRUE(any([](const CaseSpec& c) {
    const auto& p = c.prefix_lens;
    return c.mode == ForwardMode::kMixed && std::count(p.begin(), p.end(), 0) > 0 &&
           std::count(p.begin(), p.end(), 1) > 0;
  })) << "kv_len 0 and 1 inside a mixed batch";
  for (int len : {17, 97, 1013}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) {
      const auto lens = kv_lens(c);
      return std::find(lens.begin(), lens.end(), len) != lens.end();
    })) << "kv_len "
        << len;
  }
  EXPECT_TRUE(any([](const CaseSpec& c) { return !c.shuffle_pages; }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.shuffle_pages; }));
  for (int group : {1, 4, 8}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) {
      return !c.mla && c.num_q_heads / c.num_kv_heads == group && c.num_kv_heads > 1;
    })) << "GQA group "
        << group;
  }
  EXPECT_TRUE(any([](const CaseSpec& c) { return !c.mla && c.num_kv_heads == 1; })) << "MQA";
  for (int d : {64, 128, 256}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) { return !c.mla && c.head_dim == d; })) << "d " << d;
  }
  EXPECT_TRUE(any([](const CaseSpec& c) {
    return c.mla_absorbed() && c.head_dim == 576 && c.v_head_dim == 512 &&
           c.mode == ForwardMode::kDecode;
  }));
  EXPECT_TRUE(any([](const CaseSpec& c) {
    return c.mla_prefill() && c.head_dim == 192 && c.v_head_dim == 128;
  }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.sliding_window >= 0; }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.logit_cap > 0.f; }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.sinks; }));
  for (DType kv : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kFP4E2M1}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) { return c.kv_dtype == kv; })) << dtype_name(kv);
  }
  EXPECT_TRUE(any(
      [](const CaseSpec& c) { return c.mode == ForwardMode::kTargetVerify && c.spec_topk == 1; }));
  EXPECT_TRUE(any(
      [](const CaseSpec& c) { return c.mode == ForwardMode::kTargetVerify && c.spec_topk > 1; }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.cross_attention; }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.type == AttentionType::kEncoderOnly; }));
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed,
                        ForwardMode::kDraftExtend}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) { return c.mode == m; })) << forward_mode_name(m);
  }
}

class PreparedCases : public ::testing::TestWithParam<CaseSpec> {};

// What every backend test relies on: valid batch, poisoned outputs, shuffled non-contiguous page
// tables, unused slots NaN, verify masks shaped [N, prefix + N].
TEST_P(PreparedCases, PrepareBuildsWhatItPromises) {
  const CaseSpec& spec = GetParam();
  Result<PreparedCase> r = harness::prepare_case(spec, Device::cpu());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const PreparedCase& pc = *r;
  EXPECT_TRUE(pc.batch.validate().is_ok());
  EXPECT_EQ(static_cast<int>(pc.layers.size()), 2);
  for (const harness::LayerData& ld : pc.layers) {
    for (int64_t i = 0; i < ld.out.numel(); ++i) {
      ASSERT_TRUE(std::isnan(load_as_float(ld.out.data, ld.out.dtype, i))) << "out not poisoned";
    }
    for (int64_t i = 0; i < ld.lse.numel(); ++i)
      ASSERT_TRUE(std::isnan(ld.lse.data_as<float>()[i]));
    for (int64_t i = 0; i < ld.q.numel(); ++i) {
      const float x = load_as_float(ld.q.data, ld.q.dtype, i);
      ASSERT_TRUE(std::isfinite(x) && x != 0.f) << "q must be random and non-zero";
    }
  }
  // Every token of every request has its own slot, outside page 0.
  std::set<int32_t> seen;
  bool non_contiguous = false;
  for (int r = 0; r < spec.batch_size(); ++r) {
    const int32_t* row = pc.req_to_token->host_row(pc.rows[static_cast<size_t>(r)]);
    const int enc = spec.cross_attention ? spec.encoder_lens[static_cast<size_t>(r)] : 0;
    const int len = enc + pc.kv_lens[static_cast<size_t>(r)];
    for (int j = 0; j < len; ++j) {
      ASSERT_GE(row[j], spec.page_size);
      ASSERT_LT(row[j], pc.kv_pool->rows());
      ASSERT_TRUE(seen.insert(row[j]).second) << "slot " << row[j] << " used twice";
      if (j > 0 && row[j] != row[j - 1] + 1) non_contiguous = true;
    }
  }
  const int64_t used = static_cast<int64_t>(seen.size());
  EXPECT_LT(used, pc.kv_pool->rows() - spec.page_size) << "spare slots must remain (poisoned)";
  if (spec.shuffle_pages && spec.page_size == 1) {
    EXPECT_TRUE(non_contiguous) << "page tables should be shuffled";
  }
  // An unused slot dequantises to NaN in every layer.
  int64_t unused = spec.page_size;
  while (seen.count(static_cast<int32_t>(unused))) ++unused;
  ASSERT_LT(unused, pc.kv_pool->rows());
  const TensorView buf = pc.kv_pool->is_mla()
                             ? static_cast<const MLAKVPool&>(*pc.kv_pool).kv_buffer(1)
                             : static_cast<const MHAKVPool&>(*pc.kv_pool).k_buffer(1);
  const TensorView scales = pc.kv_pool->is_mla()
                                ? static_cast<const MLAKVPool&>(*pc.kv_pool).scale_buffer(1)
                                : static_cast<const MHAKVPool&>(*pc.kv_pool).k_scale_buffer(1);
  EXPECT_TRUE(std::isnan(load_kv_value_host(buf, scales, unused, 0, 0, 1.f)));
  if (spec.mode == ForwardMode::kTargetVerify) {
    const auto& indptr = pc.batch.spec.mask_indptr_host;
    for (int r = 0; r < spec.batch_size(); ++r) {
      const int64_t n = spec.spec_draft_tokens;
      EXPECT_EQ(indptr[static_cast<size_t>(r) + 1] - indptr[static_cast<size_t>(r)],
                n * (spec.prefix_lens[static_cast<size_t>(r)] + n));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PreparedCases, ::testing::ValuesIn(harness::shared_case_table()),
                         [](const ::testing::TestParamInfo<CaseSpec>& i) { return i.param.name; });

// ---- the comparison can fail ----

// Wraps torch_native and breaks its result in one of several ways.
class BrokenBackend final : public AttentionBackend {
 public:
  static constexpr float kPerturbation = 1.03f;             // 3% relative error, above bf16's 1e-2
  static constexpr float kLastRequestPerturbation = 1.05f;  // above twice bf16's 1e-2
  enum class Bug {
    kSkipLastToken,
    kPerturbOutput,
    kStrayWrite,
    kWrongLse,
    kOverrun,
    kUnderrun,
    kBadNewRow,
    kPerturbLastRequest
  };
  BrokenBackend(std::unique_ptr<AttentionBackend> inner, Bug bug)
      : inner_(std::move(inner)), bug_(bug) {}
  const BackendDescriptor& descriptor() const override { return inner_->descriptor(); }
  Status init_forward_metadata(const ForwardBatch& b) override {
    return inner_->init_forward_metadata(b);
  }
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(inner_->forward_extend(q, k, v, out, layer, batch, save_kv, lse));
    return corrupt(out, layer, batch, lse);
  }
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ATTNKIT_RETURN_IF_ERROR(inner_->forward_decode(q, k, v, out, layer, batch, save_kv, lse));
    return corrupt(out, layer, batch, lse);
  }

 private:
  Status corrupt(const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                 const TensorView& lse) {
    switch (bug_) {
      case Bug::kSkipLastToken:
        return fill_float(out.slice0(out.size(0) - 1, out.size(0)), std::nanf(""));
      case Bug::kPerturbOutput:
        for (int64_t i = 0; i < out.numel(); ++i) {
          const float x = load_as_float(out.data, out.dtype, i);
          store_from_float(out.data, out.dtype, i, x * kPerturbation);
        }
        return Status::ok();
      case Bug::kPerturbLastRequest: {
        // 5% off on the last request's rows only (one token of 103 in extend_page16_ragged): the
        // layer's rel L2 stays under its bound, the request's does not.
        const int64_t per_token = out.numel() / out.size(0);
        const int64_t last = batch.extend_seq_lens_host.back();
        for (int64_t i = (out.size(0) - last) * per_token; i < out.numel(); ++i) {
          const float x = load_as_float(out.data, out.dtype, i);
          store_from_float(out.data, out.dtype, i, x * kLastRequestPerturbation);
        }
        return Status::ok();
      }
      case Bug::kWrongLse:
        lse.data_as<float>()[0] += 0.5f;
        return Status::ok();
      case Bug::kOverrun:  // one byte past the end of out (the harness's canary)
        static_cast<uint8_t*>(out.data)[out.storage_bytes()] = 0;
        return Status::ok();
      case Bug::kUnderrun:  // head 0, column 0 of the row before the first token
        static_cast<uint8_t*>(out.data)[-(out.storage_bytes() / out.size(0))] = 0;
        return Status::ok();
      case Bug::kStrayWrite: {
        // Overwrite the first cached token of request 0 (a history slot, not a new one).
        const int32_t slot = batch.req_to_token_pool->host_row(batch.req_pool_indices_host[0])[0];
        const auto& pool = static_cast<const MHAKVPool&>(*batch.kv_pool);
        const TensorView k = pool.k_buffer(layer.layer_id);
        store_from_float(k.data, k.dtype, slot * k.stride(0), 3.f);
        return Status::ok();
      }
      case Bug::kBadNewRow: {
        // save_kv wrote the new token's k, then this negates head 0 of the first new slot's row.
        const int64_t slot = batch.out_cache_loc.data_as<const int64_t>()[0];
        const auto& pool = static_cast<const MHAKVPool&>(*batch.kv_pool);
        const TensorView k = pool.k_buffer(layer.layer_id);
        for (int64_t d = 0; d < k.size(2); ++d) {
          const int64_t i = slot * k.stride(0) + d * k.stride(2);
          store_from_float(k.data, k.dtype, i, -load_as_float(k.data, k.dtype, i));
        }
        return Status::ok();
      }
    }
    return Status::ok();
  }
  std::unique_ptr<AttentionBackend> inner_;
  Bug bug_;
};

TEST(Comparison, CatchesBrokenBackends) {
  using Bug = BrokenBackend::Bug;
  for (Bug bug : {Bug::kSkipLastToken, Bug::kPerturbOutput, Bug::kStrayWrite, Bug::kWrongLse,
                  Bug::kOverrun, Bug::kUnderrun, Bug::kBadNewRow, Bug::kPerturbLastRequest}) {
    Result<PreparedCase> pc =
        harness::prepare_case(*harness::find_case("extend_page16_ragged"), Device::cpu());
    ASSERT_TRUE(pc.is_ok());
    BrokenBackend b(std::move(create_torch_native_backend(pc->context())).value(), bug);
    ASSERT_TRUE(harness::run_backend(b, *pc, true).is_ok());
    Result<harness::Comparison> c = harness::compare_with_reference(*pc);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_FALSE(c->passed()) << "bug " << static_cast<int>(bug) << ": " << c->summary();
    switch (bug) {
      case Bug::kSkipLastToken:
        EXPECT_GT(c->nan_inf_count, 0);
        break;
      case Bug::kPerturbOutput:
        EXPECT_GT(c->rel_l2, c->tolerance);
        break;
      case Bug::kPerturbLastRequest:
        EXPECT_LE(c->rel_l2, c->tolerance) << "the layer's rel L2 alone would have caught it";
        EXPECT_GT(c->request_rel_l2, harness::Comparison::kRequestFactor * c->tolerance);
        EXPECT_EQ(c->worst_request, 2);
        break;
      case Bug::kStrayWrite:
        EXPECT_GT(c->pool_stray_writes, 0);
        break;
      case Bug::kWrongLse:
        EXPECT_GT(c->lse_max_abs, c->lse_tolerance);
        break;
      case Bug::kOverrun:
      case Bug::kUnderrun:
        EXPECT_GT(c->canaries_damaged, 0);
        break;
      case Bug::kBadNewRow:  // a new slot: no stray write, but its value is wrong
        EXPECT_GT(c->pool_bad_new_values, 0);
        EXPECT_EQ(c->pool_stray_writes, 0);
        break;
    }
  }
}

TEST(Comparison, NotRunMeansNotPassed) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("decode_page16"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  Result<harness::Comparison> c = harness::compare_with_reference(*pc);
  ASSERT_TRUE(c.is_ok());
  EXPECT_FALSE(c->passed());
  EXPECT_EQ(c->nan_inf_count, c->elements * 2 + pc->num_tokens * 8 * 2);  // out + lse, 2 layers
  EXPECT_GT(c->pool_bad_new_values, 0) << "new tokens were never written";
}

TEST(Comparison, TolerancesFollowDtype) {
  EXPECT_DOUBLE_EQ(harness::tolerance_for(DType::kBF16), 1e-2);
  EXPECT_DOUBLE_EQ(harness::tolerance_for(DType::kF16), 3e-3);
  EXPECT_DOUBLE_EQ(harness::tolerance_for(DType::kF32), 1e-4);
}

// ---- skip_reason reads only the descriptor ----

BackendDescriptor runnable() {
  BackendDescriptor d;
  d.name = "fake";
  d.platforms = {Platform::kCPU};
  d.built = true;
  FeatureRow row;
  row.pages.kind = PageRule::Kind::kAny;
  d.mha = row;
  return d;
}

TEST(SkipReason, FollowsTheDescriptor) {
  const DeviceInfo cpu = detect_cpu();
  const CaseSpec& extend16 = *harness::find_case("extend_page16_ragged");
  EXPECT_EQ(harness::skip_reason(runnable(), extend16, cpu), "");

  BackendDescriptor d = runnable();
  d.built = false;
  d.not_built_reason = "needs ROCm";
  EXPECT_EQ(harness::skip_reason(d, extend16, cpu), "fake is not built: needs ROCm");

  d = runnable();
  d.platforms = {Platform::kCUDA};
  EXPECT_NE(harness::skip_reason(d, extend16, cpu).find("does not run on"), std::string::npos);

  d = runnable();
  d.mha->pages.kind = PageRule::Kind::kFixed;
  d.mha->pages.sizes = {64};
  EXPECT_NE(harness::skip_reason(d, extend16, cpu).find("does not support page_size 16"),
            std::string::npos);
  EXPECT_EQ(harness::skip_reason(d, *harness::find_case("decode_page64"), cpu), "");

  d = runnable();
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("decode_fp8_e4m3_kv"), cpu)
                .find("does not support fp8_e4m3 KV"),
            std::string::npos);
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("decode_fp4_kv"), cpu).find("fp4_e2m1"),
            std::string::npos);
  EXPECT_NE(
      harness::skip_reason(d, *harness::find_case("decode_window32"), cpu).find("sliding window"),
      std::string::npos);
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("extend_encoder_bidirectional"), cpu)
                .find("bidirectional"),
            std::string::npos);
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("verify_topk1_page1"), cpu)
                .find("speculative decoding (topk 1)"),
            std::string::npos);
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("mla_decode_page1"), cpu)
                .find("has no MLA support"),
            std::string::npos);

  d = runnable();
  d.mha->fp8_kv = true;
  d.mha->fp8_e4m3_only = true;
  EXPECT_EQ(harness::skip_reason(d, *harness::find_case("decode_fp8_e4m3_kv"), cpu), "");
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("decode_fp8_e5m2_kv"), cpu)
                .find("only as fp8_e4m3"),
            std::string::npos);
  d.mha->fp8_e4m3_only = false;
  EXPECT_EQ(harness::skip_reason(d, *harness::find_case("decode_fp8_e5m2_kv"), cpu), "");

  d = runnable();
  d.mha->spec_topk1 = d.mha->spec_topk_gt1 = true;
  d.mha->topk_gt1_needs_page1 = true;
  EXPECT_EQ(harness::skip_reason(d, *harness::find_case("verify_topk4_page1"), cpu), "");
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("verify_topk4_page16"), cpu)
                .find("only with page_size 1, not 16"),
            std::string::npos);

  d = runnable();
  d.mha->head_dims = {64, 128};
  EXPECT_NE(
      harness::skip_reason(d, *harness::find_case("decode_group8_d256"), cpu).find("head_dim 256"),
      std::string::npos);
  d.decode_role = false;
  EXPECT_NE(harness::skip_reason(d, *harness::find_case("decode_page16"), cpu)
                .find("cannot serve decode"),
            std::string::npos);
}

TEST(SkipReason, ComputeCapabilityBounds) {
  BackendDescriptor d = runnable();
  d.platforms = {Platform::kCUDA};
  d.min_compute_capability = 90;
  Result<DeviceInfo> sm80 = device_by_name("sm80");
  Result<DeviceInfo> sm90 = device_by_name("sm90");
  ASSERT_TRUE(sm80.is_ok() && sm90.is_ok());
  const CaseSpec& c = *harness::find_case("decode_page16");
  EXPECT_NE(harness::skip_reason(d, c, *sm80).find("needs compute capability >= 90"),
            std::string::npos);
  EXPECT_EQ(harness::skip_reason(d, c, *sm90), "");
}

// An e4m3 q (CaseSpec::fp8_q) with a window / sinks / soft-cap runs where fa3's FP8 plan for the
// case's requests has those variants (fa3::fp8_plan_takes_variants), and is skipped elsewhere:
// the default plans of a prefill-like forward (three warpgroups) and of a few queries over a long
// prefix (two warpgroups, V^T in the kernel) take them; the early promote order forced by
// ATTNKIT_FA3_FP8_PROMOTE=1 on the latter does not.
TEST(SkipReason, Fp8QVariantsFollowTheFp8Plan) {
  BackendDescriptor d = runnable();
  d.name = "fa3";
  d.platforms = {Platform::kCUDA};
  d.mha->fp8_kv = true;
  d.mha->sliding_window = true;
  Result<DeviceInfo> sm90 = device_by_name("sm90");
  Result<DeviceInfo> sm80 = device_by_name("sm80");
  ASSERT_TRUE(sm90.is_ok() && sm80.is_ok());
  auto fp8q = [](int prefix, int fresh) {
    CaseSpec c = harness::make_uniform_case("fp8q", ForwardMode::kExtend, 2, prefix, fresh, 16, 4,
                                            128, 16, DType::kBF16, DType::kFP8E4M3);
    c.fp8_q = true;
    return c;
  };
  const CaseSpec wide = fp8q(200, 1000);  // >= 1 query per 8 keys: three warpgroups
  const CaseSpec few = fp8q(2000, 100);   // < 1 query per 8 keys: two warpgroups
  EXPECT_EQ(harness::skip_reason(d, wide, *sm90), "");
  EXPECT_NE(harness::skip_reason(d, wide, *sm80).find("fp8_q"), std::string::npos);
  for (const CaseSpec& base : {wide, few}) {
    CaseSpec cap = base, window = base, sinks = base;
    cap.logit_cap = 30.f;
    window.sliding_window = 500;
    sinks.sinks = true;
    for (const CaseSpec* c : {&cap, &window, &sinks}) {
      EXPECT_EQ(harness::skip_reason(d, *c, *sm90), "") << c->prefix_lens[0];
    }
  }
  // Knob-forced plans without the variants, each with the plan that still has them: the request
  // list must carry the new tokens (2100 keys past 2048: promoted by default, FADD row sums
  // without promotion) and the query / key ratio (which plan a knob reaches).
  CaseSpec few_cap = few, wide_cap = wide;
  few_cap.logit_cap = wide_cap.logit_cap = 30.f;
  const auto skipped = [&](const CaseSpec& c) {
    return harness::skip_reason(d, c, *sm90).find("fp8_plan_takes_variants") != std::string::npos;
  };
  {
    const test_support::ScopedEnv early("ATTNKIT_FA3_FP8_PROMOTE", "1");
    EXPECT_TRUE(skipped(few_cap));
    EXPECT_FALSE(skipped(wide_cap));
    EXPECT_EQ(harness::skip_reason(d, few, *sm90), "");  // no variant: any FP8 plan takes it
  }
  {
    const test_support::ScopedEnv never("ATTNKIT_FA3_FP8_PROMOTE", "0");
    EXPECT_TRUE(skipped(few_cap));
    EXPECT_FALSE(skipped(wide_cap));  // 1200 keys: not past 2048, promotion or not
  }
  {
    const test_support::ScopedEnv two_wg("ATTNKIT_FA3_FP8_WG3", "0");
    EXPECT_TRUE(skipped(wide_cap));
    EXPECT_FALSE(skipped(few_cap));
  }
  {
    const test_support::ScopedEnv no_spec("ATTNKIT_FA3_FP8_SPEC", "0");
    EXPECT_TRUE(skipped(wide_cap));
  }
  {
    const test_support::ScopedEnv off("ATTNKIT_FA3_FP8", "0");
    EXPECT_NE(harness::skip_reason(d, wide, *sm90).find("ATTNKIT_FA3_FP8=0"), std::string::npos);
  }
  // Another forward mode with new tokens (mixed: the same request list).
  CaseSpec mixed_cap = few_cap;
  mixed_cap.mode = ForwardMode::kMixed;
  EXPECT_EQ(harness::skip_reason(d, mixed_cap, *sm90), "");
}

// ---- bench helpers ----

TEST(BenchHelpers, UniformCaseAndContiguousKv) {
  CaseSpec c = harness::make_uniform_case("uniform", ForwardMode::kDecode, 3, 20, 1, 4, 2, 64, 16,
                                          DType::kBF16, DType::kBF16);
  harness::PrepareOptions o;
  o.num_layers = 1;
  Result<PreparedCase> pc = harness::prepare_case(c, Device::cpu(), o);
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  ASSERT_TRUE(harness::run_backend(*b, *pc, true).is_ok());
  Result<harness::ContiguousKV> kv =
      harness::make_contiguous_kv(*pc, 0, DType::kBF16, Device::cpu());
  ASSERT_TRUE(kv.is_ok()) << kv.status().to_string();
  EXPECT_EQ(kv->cu_seqlens_host, (std::vector<int32_t>{0, 21, 42, 63}));
  EXPECT_EQ(kv->max_seqlen, 21);
  EXPECT_EQ(kv->k.size(0), 63);
  EXPECT_EQ(kv->k.size(1), 2);
  EXPECT_EQ(kv->v.size(2), 64);
  // Token 20 of request 1 (its new token) equals the pool row it was written to.
  const auto& pool = static_cast<const MHAKVPool&>(*pc->kv_pool);
  const int32_t slot = pc->req_to_token->host_row(pc->rows[1])[20];
  const TensorView kb = pool.k_buffer(0);
  for (int64_t d = 0; d < 64; ++d) {
    EXPECT_EQ(load_as_float(kv->k.data, DType::kBF16, (41 * 2 + 1) * 64 + d),
              load_as_float(kb.data, kb.dtype, slot * kb.stride(0) + kb.stride(1) + d));
  }
  EXPECT_EQ(harness::make_contiguous_kv(*pc, 3, DType::kBF16, Device::cpu()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PrepareCase, RejectsInconsistentSpecs) {
  CaseSpec c = *harness::find_case("extend_page1_gqa4");
  c.new_lens.pop_back();
  Result<PreparedCase> r = harness::prepare_case(c, Device::cpu());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("case extend_page1_gqa4: new_lens has 2 entries"),
            std::string::npos)
      << r.status().message();
  c = *harness::find_case("extend_page1_gqa4");
  c.num_kv_heads = 3;
  EXPECT_NE(harness::prepare_case(c, Device::cpu()).status().message().find("divisible"),
            std::string::npos);
}

// shared_prefix: requests 1.. read request 0's first pages (what the flashinfer cascade detects);
// the reference reads the same table, so any backend still has to match it.
TEST(PrepareCase, SharedPrefixPointsEveryRequestAtRequestZerosPages) {
  CaseSpec c = harness::make_uniform_case("shared", ForwardMode::kDecode, 3, 40, 1, 4, 2, 64, 8,
                                          DType::kF32, DType::kF32);
  c.shared_prefix = 32;
  Result<PreparedCase> pc = harness::prepare_case(c, Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  const int32_t* row0 = pc->req_to_token->host_row(pc->rows[0]);
  for (size_t r = 1; r < pc->rows.size(); ++r) {
    const int32_t* row = pc->req_to_token->host_row(pc->rows[r]);
    EXPECT_TRUE(std::equal(row0, row0 + 32, row)) << "request " << r;
    EXPECT_NE(row[32], row0[32]) << "request " << r << ": only the prefix is shared";
  }
  Result<std::unique_ptr<AttentionBackend>> b = create_torch_native_backend(pc->context());
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_TRUE(harness::run_backend(**b, *pc, true).is_ok());
  Result<harness::Comparison> cmp = harness::compare_with_reference(*pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_TRUE(cmp->passed()) << cmp->summary();
  for (int bad : {36, 48, -8}) {  // not a page multiple, beyond a prefix, negative
    c.shared_prefix = bad;
    Result<PreparedCase> r = harness::prepare_case(c, Device::cpu());
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("shared_prefix " + std::to_string(bad)), std::string::npos)
        << r.status().message();
  }
}

// v_mean: every V value of the case (the cached history in the pool and the new tokens' v) is
// drawn from N(v_mean, 1); the reference reads the same values, so a backend must still match it.
TEST(PrepareCase, VMeanShiftsEveryValue) {
  for (float mean : {0.f, 1.f}) {
    CaseSpec c = harness::make_uniform_case("v_mean", ForwardMode::kExtend, 2, 40, 30, 4, 2, 64, 8,
                                            DType::kF32, DType::kF32);
    c.v_mean = mean;
    Result<PreparedCase> pc = harness::prepare_case(c, Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    for (const harness::LayerData& ld : pc->layers) {
      double sum = 0.0;
      for (int64_t i = 0; i < ld.v.numel(); ++i) sum += load_as_float(ld.v.data, ld.v.dtype, i);
      // 2 x 30 tokens x 2 heads x 64: standard error of the mean 0.013.
      EXPECT_NEAR(sum / static_cast<double>(ld.v.numel()), mean, 0.08) << "new v, mean " << mean;
    }
    const auto* pool = dynamic_cast<const MHAKVPool*>(pc->kv_pool.get());
    ASSERT_NE(pool, nullptr);
    for (int l = 0; l < 2; ++l) {
      const TensorView vb = pool->v_buffer(l);
      const int64_t row_elems = vb.numel() / vb.shape[0];
      double sum = 0.0;
      int64_t n = 0;
      for (int r = 0; r < c.batch_size(); ++r) {
        const int32_t* row = pc->req_to_token->host_row(pc->rows[static_cast<size_t>(r)]);
        for (int j = 0; j < 40; ++j) {  // the cached history
          for (int64_t e = 0; e < row_elems; ++e) {
            sum += load_as_float(vb.data, vb.dtype, int64_t{row[j]} * row_elems + e);
            ++n;
          }
        }
      }
      EXPECT_NEAR(sum / static_cast<double>(n), mean, 0.08) << "history v, layer " << l;
    }
    Result<std::unique_ptr<AttentionBackend>> b = create_torch_native_backend(pc->context());
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    ASSERT_TRUE(harness::run_backend(**b, *pc, true).is_ok());
    Result<harness::Comparison> cmp = harness::compare_with_reference(*pc);
    ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
    EXPECT_TRUE(cmp->passed()) << cmp->summary();
  }
  CaseSpec c = *harness::find_case("extend_page1_gqa4");
  c.v_mean = std::nanf("");
  Result<PreparedCase> r = harness::prepare_case(c, Device::cpu());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("v_mean nan"), std::string::npos) << r.status().message();
  // MLA: absorbed (V in the key row) and not absorbed (the history's V comes from the latent
  // row, which v_mean does not move): rejected, not applied to the new tokens only.
  for (const char* name : {"mla_extend_absorbed_page1", "mla_prefill_prefix_chunks_page1"}) {
    CaseSpec m = *harness::find_case(name);
    m.v_mean = 1.f;
    Result<PreparedCase> rm = harness::prepare_case(m, Device::cpu());
    ASSERT_FALSE(rm.is_ok()) << name;
    EXPECT_NE(rm.status().message().find("v_mean 1 must be finite, and 0 for MLA"),
              std::string::npos)
        << rm.status().message();
  }
}

}  // namespace
}  // namespace attnkit
