// torch_native over the whole shared case table, plus checks of the reference that do not go
// through its own paged code path: a dense contiguous-KV computation, page-table invariance and
// GQA == MHA with replicated KV heads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/torch_native/torch_native_backend.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

PreparedCase prepare_or_die(const CaseSpec& spec) {
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
  EXPECT_TRUE(pc.is_ok()) << pc.status().to_string();
  return std::move(pc).value();
}

std::unique_ptr<AttentionBackend> torch_native(const PreparedCase& pc) {
  Result<std::unique_ptr<AttentionBackend>> b = create_torch_native_backend(pc.context());
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return std::move(b).value();
}

std::vector<float> read_all(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = load_as_float(t.data, t.dtype, i);
  return v;
}

class TorchNativeTable : public ::testing::TestWithParam<CaseSpec> {};

// Every case, both cache-write paths: outputs fully written (no NaN left from the poison), pool
// writes only at out_cache_loc, result equal to the fp64 reference up to the output rounding.
TEST_P(TorchNativeTable, MatchesReferenceAndWritesEverything) {
  for (bool save_kv : {true, false}) {
    PreparedCase pc = prepare_or_die(GetParam());
    auto backend = torch_native(pc);
    const Status s = harness::run_backend(*backend, pc, save_kv);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    Result<harness::Comparison> c = harness::compare_with_reference(pc);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->nan_inf_count, 0) << c->summary();
    EXPECT_TRUE(c->passed()) << GetParam().describe() << " save_kv " << save_kv << "\n"
                             << c->summary();
    // torch_native rounds an fp64 result once: far inside the dtype tolerance.
    EXPECT_LT(c->rel_l2, c->tolerance / 2) << c->summary();
  }
}

// The paged computation against a dense one on a contiguous copy of the (dequantised) KV, for the
// cases a plain causal / bidirectional varlen attention can express.
TEST_P(TorchNativeTable, MatchesDenseContiguousAttention) {
  const CaseSpec& spec = GetParam();
  if (spec.mode == ForwardMode::kTargetVerify || spec.cross_attention || spec.sliding_window >= 0 ||
      spec.sinks || spec.mla_prefill()) {
    GTEST_SKIP() << "not expressible as plain varlen attention (covered by hand tests)";
  }
  PreparedCase pc = prepare_or_die(spec);
  auto backend = torch_native(pc);
  ASSERT_TRUE(harness::run_backend(*backend, pc, true).is_ok());
  std::vector<int32_t> cu_q = {0};
  for (int r = 0; r < spec.batch_size(); ++r) {
    cu_q.push_back(cu_q.back() + spec.new_lens[static_cast<size_t>(r)]);
  }
  for (int l = 0; l < static_cast<int>(pc.layers.size()); ++l) {
    Result<harness::ContiguousKV> kv =
        harness::make_contiguous_kv(pc, l, DType::kF32, Device::cpu());
    ASSERT_TRUE(kv.is_ok()) << kv.status().to_string();
    TensorView k = kv->k, v = kv->v;
    const AttentionLayer& layer = pc.layers[static_cast<size_t>(l)].layer;
    std::vector<double> out, lse;
    const Status s = reference::mha_varlen_fp64(
        pc.layers[static_cast<size_t>(l)].q, k, v, cu_q, kv->cu_seqlens_host,
        spec.type == AttentionType::kDecoder, layer.scaling, layer.logit_cap, &out, &lse);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    Result<harness::ReferenceResult> ref = harness::reference_for_layer(pc, l);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    ASSERT_EQ(ref->out.size(), out.size());
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < out.size(); ++i) {
      err += (out[i] - ref->out[i]) * (out[i] - ref->out[i]);
      norm += out[i] * out[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-12) << spec.describe() << " layer " << l;
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref->lse[i], 1e-9) << i;
  }
}

// Shuffled (non-contiguous) page tables and request rows give bit-identical results to
// contiguous ones: the page translation is exact.
TEST_P(TorchNativeTable, PageTableInvariance) {
  CaseSpec contiguous = GetParam();
  contiguous.shuffle_pages = !contiguous.shuffle_pages;
  PreparedCase a = prepare_or_die(GetParam());
  PreparedCase b = prepare_or_die(contiguous);
  ASSERT_TRUE(harness::run_backend(*torch_native(a), a, true).is_ok());
  ASSERT_TRUE(harness::run_backend(*torch_native(b), b, true).is_ok());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(read_all(a.layers[l].out), read_all(b.layers[l].out)) << "layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, TorchNativeTable, ::testing::ValuesIn(harness::shared_case_table()),
                         test_support::case_param_name);

// The shared fixture as other backends use it: skips come from the registry's descriptor.
ATTNKIT_BACKEND_CASE_TESTS(TorchNativeRegistryCases, "torch_native", Device::cpu());

// A non-absorbed MLA prefill layer (192/128 over the new tokens' own k / v) attends causally
// within each request, and bidirectionally when the layer is encoder-only: the reference every
// backend is compared with against a dense varlen computation of each mask (the reference once
// ran such layers causal whatever their type, which failed the backends that honour it).
TEST(TorchNativeMlaPrefill, FollowsTheLayerType) {
  for (const AttentionType type : {AttentionType::kDecoder, AttentionType::kEncoderOnly}) {
    CaseSpec c = *harness::find_case("mla_prefill_192_128");  // no prefix: the new tokens only
    c.type = type;
    PreparedCase pc = prepare_or_die(c);
    ASSERT_TRUE(harness::run_backend(*torch_native(pc), pc, true).is_ok());
    std::vector<int32_t> cu = {0};
    for (const int n : c.new_lens) cu.push_back(cu.back() + n);
    for (size_t l = 0; l < pc.layers.size(); ++l) {
      const harness::LayerData& ld = pc.layers[l];
      std::vector<double> want[2], lse;  // [0]: bidirectional, [1]: causal
      for (int causal = 0; causal < 2; ++causal) {
        ASSERT_TRUE(reference::mha_varlen_fp64(ld.q, ld.k, ld.v, cu, cu, causal == 1,
                                               ld.layer.scaling, 0.0, &want[causal], &lse)
                        .is_ok());
      }
      const std::vector<float> got = read_all(ld.out);
      ASSERT_EQ(got.size(), want[0].size());
      double err[2] = {0.0, 0.0}, norm = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        for (int m = 0; m < 2; ++m) err[m] += (got[i] - want[m][i]) * (got[i] - want[m][i]);
        norm += want[0][i] * want[0][i];
      }
      const int match = type == AttentionType::kDecoder ? 1 : 0;
      EXPECT_LT(std::sqrt(err[match] / norm), 1e-2) << c.describe() << " layer " << l;
      EXPECT_GT(std::sqrt(err[1 - match] / norm), 1e-1) << c.describe() << " layer " << l;
    }
  }
}

// GQA with 4 q heads per KV head equals MHA whose KV heads are copies of the shared head.
TEST(TorchNativeGqa, EqualsMhaWithReplicatedHeads) {
  CaseSpec gqa = *harness::find_case("extend_page16_ragged");
  gqa.q_dtype = gqa.kv_dtype = DType::kF32;
  CaseSpec mha = gqa;
  mha.num_kv_heads = gqa.num_q_heads;
  const int group = gqa.num_q_heads / gqa.num_kv_heads;
  ASSERT_GT(group, 1);
  PreparedCase a = prepare_or_die(gqa);
  PreparedCase b = prepare_or_die(mha);
  ASSERT_TRUE(harness::run_backend(*torch_native(a), a, true).is_ok());
  const auto& pool_a = static_cast<const MHAKVPool&>(*a.kv_pool);
  const int64_t d = gqa.head_dim;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    // Copy every token of every request, head h of b <- head h / group of a.
    const TensorView ka = pool_a.k_buffer(static_cast<int>(l)),
                     va = pool_a.v_buffer(static_cast<int>(l));
    for (int r = 0; r < gqa.batch_size(); ++r) {
      const int32_t* row_a = a.req_to_token->host_row(a.rows[static_cast<size_t>(r)]);
      const int32_t* row_b = b.req_to_token->host_row(b.rows[static_cast<size_t>(r)]);
      for (int j = 0; j < a.kv_lens[static_cast<size_t>(r)]; ++j) {
        std::vector<float> k, v;
        for (int h = 0; h < mha.num_kv_heads; ++h) {
          for (int64_t x = 0; x < d; ++x) {
            const int64_t at = row_a[j] * ka.stride(0) + (h / group) * ka.stride(1) + x;
            k.push_back(load_as_float(ka.data, ka.dtype, at));
            v.push_back(load_as_float(va.data, va.dtype, at));
          }
        }
        int64_t slot = row_b[j];
        const Status s = b.kv_pool->set_kv(
            static_cast<int>(l), TensorView(&slot, DType::kI64, Device::cpu(), {1}),
            TensorView(k.data(), DType::kF32, Device::cpu(), {1, mha.num_kv_heads, d}),
            TensorView(v.data(), DType::kF32, Device::cpu(), {1, mha.num_kv_heads, d}), 1.f, 1.f,
            nullptr);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
      }
    }
    const TensorView& qa = a.layers[l].q;
    ASSERT_TRUE(copy_tensor(b.layers[l].q, qa).is_ok());
    auto backend = torch_native(b);
    ASSERT_TRUE(backend->init_forward_metadata(b.batch).is_ok());
    const Status s = backend->forward(b.layers[l].q, TensorView(), TensorView(), b.layers[l].out,
                                      b.layers[l].layer, b.batch, false, b.layers[l].lse);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    const std::vector<float> out_a = read_all(a.layers[l].out), out_b = read_all(b.layers[l].out);
    ASSERT_EQ(out_a.size(), out_b.size());
    for (size_t i = 0; i < out_a.size(); ++i) ASSERT_NEAR(out_a[i], out_b[i], 1e-6) << i;
  }
}

// A req_to_token entry in the reserved page 0 is refused by name before the cache write: the call
// leaves the pool as it was (the check ran after set_kv, so the refused call had written the new
// tokens' k / v).
TEST(TorchNativeRejects, BadTableEntryLeavesThePoolAlone) {
  CaseSpec spec;
  spec.name = "page0_entry";
  spec.mode = ForwardMode::kExtend;
  spec.page_size = 16;
  spec.prefix_lens = {30, 5};
  spec.new_lens = {9, 20};
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.v_head_dim = 64;
  PreparedCase pc = prepare_or_die(spec);
  // Request 1's second prefix key now names slot 0.
  auto* row = const_cast<int32_t*>(pc.req_to_token->host_row(pc.rows[1]));
  ASSERT_NE(row, nullptr);
  row[1] = 0;
  auto backend = torch_native(pc);
  const Status st = harness::run_backend(*backend, pc, /*save_kv=*/true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("req_to_token[" + std::to_string(pc.rows[1]) + ", 1] = 0"),
            std::string::npos)
      << st.message();
  const auto* pool = dynamic_cast<const MHAKVPool*>(pc.kv_pool.get());
  ASSERT_NE(pool, nullptr);
  std::vector<uint8_t> bytes;
  for (const TensorView& b : {pool->k_buffer(0), pool->v_buffer(0)}) {
    const auto* p = static_cast<const uint8_t*>(b.data);
    bytes.insert(bytes.end(), p, p + b.storage_bytes());
  }
  EXPECT_EQ(bytes, pc.pool_snapshot.at(0)) << "the refused forward wrote the cache";
}

}  // namespace
}  // namespace attnkit
