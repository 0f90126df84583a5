// req_to_token entries outside the KV pool (kv/table_slots.h): the CUDA kernels read every entry
// of a request's row as a pool row unchecked, so a forward or a CUDA-graph replay whose rows hold
// a slot past the pool must be refused on the host, before any launch, naming the entry, with the
// CUDA context, the output and the pool untouched; a slot past the pool beyond a request's length
// is not read and not an error; once the entry is mended the forward is the clean one, bit for
// bit. No kernel reads out_cache_loc (nothing checks it before a launch; set_kv only skips a bad
// write): an extend's new keys come through req_to_token too, so a bad out_cache_loc leaves a
// forward without save_kv bit-identical to the clean one. Each test's clean forward (every key,
// the new tokens' included, in the pool) is first checked against the fp64 reference, so the
// bit-for-bit comparisons are between finite outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attnkit/registry.h"
#include "backends/mla/mla_decode_engine.h"
#include "backends/mla/mla_paged_backend.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"
#include "support/on_backend.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;

struct SlotCase {
  std::string name;
  ForwardMode mode;
  int page_size;
  bool mla;
  DType kv_dtype = DType::kBF16;
  // Non-empty: an encoder-decoder batch (request r's row holds encoder_lens[r] encoder tokens
  // before its decoder tokens); layer 0 is a self-attention layer over the decoder tokens.
  std::vector<int> encoder_lens = {};
};

// Two requests; request 1's cached prefix holds the bad entry at kBadKey (a page start at every
// page size used here, so a paged kernel would read it as a page-table entry).
constexpr int kBadKey = 64;

CaseSpec slot_spec(const SlotCase& sc) {
  const bool decode = sc.mode == ForwardMode::kDecode;
  const bool verify = sc.mode == ForwardMode::kTargetVerify;
  CaseSpec c = test_support::plan_check_case("table_slots_" + sc.name, sc.mode, {300, 200},
                                             decode   ? std::vector<int>{1, 1}
                                             : verify ? std::vector<int>{}
                                                      : std::vector<int>{9, 5},
                                             sc.mla, 11);
  c.page_size = sc.page_size;
  c.kv_dtype = sc.kv_dtype;
  if (!sc.encoder_lens.empty()) {
    c.cross_attention = true;
    c.encoder_lens = sc.encoder_lens;
  }
  return c;
}

// Test names: backend_case.
const auto param_name = test_support::backend_case_name<SlotCase>;
const auto kMhaBackends = ::testing::Values("triton", "flashinfer", "fa3");
const auto kMlaBackends = ::testing::Values("triton", "flashinfer", "flashmla", "cutlass_mla");

// The (backend, case) parameter prepared on the GPU in SetUp (support/on_backend.h).
class TableSlots : public test_support::OnBackend<SlotCase, slot_spec> {
 protected:
  void SetUp() override {
    OnBackend::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // Layer 0's new tokens into the pool at out_cache_loc, as run_backend does before a forward
    // without save_kv. prepare_case leaves their slots NaN-poisoned: every query sees its own
    // token's key, so each forward here gave an all-NaN out, equal bit for bit to any other.
    harness::PreparedCase& pc = made_->pc;
    const harness::LayerData& ld = pc.layers[0];
    STATUS_OK(pc.kv_pool->set_kv(ld.layer.layer_id, pc.batch.out_cache_loc, ld.k, ld.v,
                                 ld.layer.k_scale, ld.layer.v_scale, nullptr));
    STATUS_OK(pc.kv_pool->check_device_errors());
  }

  // One planned forward of layer 0 (the pool already holds every key); out's bytes after it.
  std::vector<uint8_t> forward_layer0(Status* st) {
    harness::PreparedCase& pc = made_->pc;
    const harness::LayerData& ld = pc.layers[0];
    *st = made_->backend->init_forward_metadata(pc.batch);
    if (st->is_ok()) {
      *st = made_->backend->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                                    /*save_kv=*/false, ld.lse);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the CUDA context must stay usable";
    return test_support::to_host_bytes(ld.out);
  }

  // Request r's req_to_token entry at key position `key`, written through the table's write().
  void set_entry(int r, int key, int64_t value) {
    harness::PreparedCase& pc = made_->pc;
    STATUS_OK(
        pc.req_to_token->write(pc.rows[static_cast<size_t>(r)], key, std::vector<int64_t>{value}));
  }
  int32_t get_entry(int r, int key) const {
    const harness::PreparedCase& pc = made_->pc;
    return pc.req_to_token->host_row(pc.rows[static_cast<size_t>(r)])[key];
  }
  // The key positions request r's kernels read: its row up to its length (verify: + the drafts).
  int64_t row_len(int r) const {
    const ForwardBatch& b = made_->pc.batch;
    return b.seq_lens_host[static_cast<size_t>(r)] +
           (b.mode == ForwardMode::kTargetVerify ? b.spec.draft_token_num : 0);
  }
  // Layer 0's out and lse bytes.
  std::vector<std::vector<uint8_t>> outputs_layer0() const {
    const harness::LayerData& ld = made_->pc.layers[0];
    return {test_support::to_host_bytes(ld.out),
            ld.lse.defined() ? test_support::to_host_bytes(ld.lse) : std::vector<uint8_t>{}};
  }
  std::vector<uint8_t> pool_layer0() const {
    KVPool& pool = *made_->pc.kv_pool;
    return test_support::to_host_bytes(pool.is_mla() ? dynamic_cast<MLAKVPool&>(pool).kv_buffer(0)
                                                     : dynamic_cast<MHAKVPool&>(pool).k_buffer(0));
  }
};

TEST_P(TableSlots, EntryPastThePoolIsRefusedBeforeAnyLaunch) {
  harness::PreparedCase& pc = made_->pc;
  KVPool& pool = *pc.kv_pool;
  Status st;
  const std::vector<uint8_t> clean = forward_layer0(&st);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  test_support::expect_layer_matches_reference(pc, 0);
  STATUS_OK(pool.check_device_errors());
  const std::vector<uint8_t> pool_before = pool_layer0();
  const TensorView out = pc.layers[0].out;

  const int32_t good = get_entry(1, kBadKey);
  for (const int64_t bad : {pool.rows(), pool.rows() + 5 * pc.spec.page_size,
                            int64_t{std::numeric_limits<int32_t>::max()} - 2}) {
    SCOPED_TRACE("bad entry " + std::to_string(bad));
    set_entry(1, kBadKey, bad);
    STATUS_OK(fill_float(out, std::numeric_limits<float>::quiet_NaN()));
    const std::vector<uint8_t> poisoned = test_support::to_host_bytes(out);
    const std::vector<uint8_t> after = forward_layer0(&st);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("req_to_token[" + std::to_string(pc.rows[1]) + ", " +
                                std::to_string(kBadKey) + "] = " + std::to_string(bad) +
                                " (request 1) is outside the KV pool slots [0, " +
                                std::to_string(pool.rows()) + ")"),
              std::string::npos)
        << st.to_string();
    EXPECT_TRUE(after == poisoned) << "a refused forward wrote out";
    STATUS_OK(pool.check_device_errors());
  }

  // Past request 1's length the same slot is never read: not an error, and the output is clean.
  set_entry(1, kBadKey, good);
  if (row_len(1) < pc.req_to_token->max_context_len()) {
    set_entry(1, static_cast<int>(row_len(1)), pool.rows() + 7);
    ASSERT_GE(pc.req_to_token->max_slot(), pool.rows());
  }
  const std::vector<uint8_t> again = forward_layer0(&st);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  STATUS_OK(pool.check_device_errors());
  EXPECT_TRUE(again == clean) << "the mended forward differs from the clean one";
  EXPECT_TRUE(pool_layer0() == pool_before) << "the pool was written";
}

INSTANTIATE_TEST_SUITE_P(
    Mha, TableSlots,
    ::testing::Combine(kMhaBackends,
                       ::testing::Values(SlotCase{"decode_p1", ForwardMode::kDecode, 1, false},
                                         SlotCase{"decode_p16", ForwardMode::kDecode, 16, false},
                                         SlotCase{"extend_p16", ForwardMode::kExtend, 16, false},
                                         SlotCase{"extend_p64", ForwardMode::kExtend, 64, false},
                                         SlotCase{"verify_p16", ForwardMode::kTargetVerify, 16,
                                                  false})),
    param_name);

INSTANTIATE_TEST_SUITE_P(
    Mla, TableSlots,
    ::testing::Combine(kMlaBackends,
                       ::testing::Values(SlotCase{"mla_decode_p64", ForwardMode::kDecode, 64, true},
                                         SlotCase{"mla_verify_p64", ForwardMode::kTargetVerify, 64,
                                                  true})),
    param_name);

// The same at CUDA-graph replay, which has no ForwardBatch: the replay refresh looks the replayed
// rows up (ReqToTokenPool::max_slot first) and refuses, so the caller does not launch the graph.
class TableSlotsGraph : public TableSlots {};

TEST_P(TableSlotsGraph, ReplayRefreshRefusesTheEntry) {
  const auto& [backend_name, sc] = GetParam();
  harness::PreparedCase& pc = made_->pc;
  KVPool& pool = *pc.kv_pool;
  const harness::LayerData& ld = pc.layers[0];
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  BackendContext ctx = pc.context();
  ctx.stream = stream;
  pc.batch.stream = stream;
  const BackendDescriptor* descriptor = builtin_registry().find(backend_name);
  ASSERT_NE(descriptor, nullptr);
  Result<std::unique_ptr<AttentionBackend>> made = descriptor->create(ctx);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  AttentionBackend& backend = **made;

  const ForwardBatch& b = pc.batch;
  // The eager forward of the same batch on this backend and stream, before the graph state (as
  // test_support::expect_graph_replay_matches_eager runs it): decode and verify replays are
  // bit-identical to it.
  STATUS_OK(backend.init_forward_metadata(b));
  STATUS_OK(backend.forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, b,
                            /*save_kv=*/false, ld.lse));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  test_support::expect_layer_matches_reference(pc, 0);
  const std::vector<std::vector<uint8_t>> eager = outputs_layer0();

  const int bs = b.batch_size;
  const SpecInfo* spec = sc.mode == ForwardMode::kTargetVerify ? &b.spec : nullptr;
  STATUS_OK(backend.init_cuda_graph_state(bs, b.num_tokens));
  STATUS_OK(backend.init_forward_metadata_capture_cuda_graph(
      bs, b.num_tokens, b.req_pool_indices, b.seq_lens, TensorView(), sc.mode, spec));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status fwd = backend.forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, b,
                                     /*save_kv=*/false, ld.lse);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(fwd.is_ok()) << fwd.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const auto refresh = [&]() {
    return backend.init_forward_metadata_replay_cuda_graph(bs, b.req_pool_indices, b.seq_lens,
                                                           b.seq_lens_sum, TensorView(), sc.mode,
                                                           spec, b.seq_lens_host.data());
  };
  // NaN-poisoned first, so a replay that wrote nothing cannot pass for the run before it.
  const auto replay = [&]() {
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(fill_float(ld.out, kNaN).is_ok());
    if (ld.lse.defined()) {
      EXPECT_TRUE(fill_float(ld.lse, kNaN).is_ok());
    }
    const Status refreshed = refresh();
    EXPECT_TRUE(refreshed.is_ok()) << refreshed.to_string();
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "the CUDA context must stay usable";
    return outputs_layer0();
  };
  const std::vector<std::vector<uint8_t>> clean = replay();
  STATUS_OK(pool.check_device_errors(stream));

  const int32_t good = get_entry(1, kBadKey);
  const int64_t bad = pool.rows() + 3 * pc.spec.page_size;
  set_entry(1, kBadKey, bad);
  const Status refused = refresh();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find(": replay: req_to_token[" + std::to_string(pc.rows[1]) + ", " +
                                   std::to_string(kBadKey) + "] = " + std::to_string(bad) +
                                   " (request 1) is outside the KV pool slots"),
            std::string::npos)
      << refused.to_string();

  set_entry(1, kBadKey, good);  // the row's bound stays high: the mended replay takes the scan
  const std::vector<std::vector<uint8_t>> mended = replay();
  EXPECT_TRUE(mended == clean) << "the mended replay differs from the clean one";
  EXPECT_TRUE(mended[0] == eager[0]) << "the mended replay's out differs from the eager forward";
  EXPECT_TRUE(mended[1] == eager[1]) << "the mended replay's lse differs from the eager forward";
  STATUS_OK(pool.check_device_errors(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  pc.batch.stream = nullptr;
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Graphs, TableSlotsGraph,
    ::testing::Combine(kMhaBackends,
                       ::testing::Values(SlotCase{"decode_p1", ForwardMode::kDecode, 1, false},
                                         SlotCase{"decode_p16", ForwardMode::kDecode, 16, false},
                                         SlotCase{"verify_p16", ForwardMode::kTargetVerify, 16,
                                                  false})),
    param_name);

INSTANTIATE_TEST_SUITE_P(MlaGraphs, TableSlotsGraph,
                         ::testing::Combine(kMlaBackends,
                                            ::testing::Values(SlotCase{
                                                "mla_decode_p64", ForwardMode::kDecode, 64, true})),
                         param_name);

// out_cache_loc is not read by the attention kernels: with save_kv off (the pool already holds
// the new tokens) a forward over an out_cache_loc entry outside the pool, negative or past it, is
// the clean forward bit for bit, records nothing and writes nothing to the pool.
class OutCacheLocNotRead : public TableSlots {};

TEST_P(OutCacheLocNotRead, BadEntryChangesNothing) {
  harness::PreparedCase& pc = made_->pc;
  KVPool& pool = *pc.kv_pool;
  Status st;
  const std::vector<uint8_t> clean = forward_layer0(&st);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  STATUS_OK(pool.check_device_errors());
  test_support::expect_layer_matches_reference(pc, 0);
  const std::vector<uint8_t> pool_before = pool_layer0();
  const int64_t tokens = pc.num_tokens;
  std::vector<int64_t> loc(static_cast<size_t>(tokens));
  int64_t* device_loc = pc.batch.out_cache_loc.data_as<int64_t>();
  const size_t bytes = loc.size() * sizeof(int64_t);
  ASSERT_EQ(cudaMemcpy(loc.data(), device_loc, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (const int64_t bad : {pool.rows() + 2, int64_t{-5}}) {
    SCOPED_TRACE("every out_cache_loc entry " + std::to_string(bad));
    const std::vector<int64_t> bad_loc(loc.size(), bad);
    ASSERT_EQ(cudaMemcpy(device_loc, bad_loc.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    const std::vector<uint8_t> out = forward_layer0(&st);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    STATUS_OK(pool.check_device_errors());
    EXPECT_TRUE(out == clean) << "the forward read out_cache_loc";
  }
  ASSERT_EQ(cudaMemcpy(device_loc, loc.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_TRUE(pool_layer0() == pool_before) << "the pool was written";
}

INSTANTIATE_TEST_SUITE_P(
    Mha, OutCacheLocNotRead,
    ::testing::Combine(
        kMhaBackends,
        ::testing::Values(
            SlotCase{"extend_p1", ForwardMode::kExtend, 1, false},
            SlotCase{"extend_p16", ForwardMode::kExtend, 16, false},
            SlotCase{"verify_p16", ForwardMode::kTargetVerify, 16, false},
            // The self-attention layer of an encoder-decoder batch:
            // its new keys are the columns after encoder + prefix
            // (build_new_token_slots' start_plus), checked against
            // the reference.
            SlotCase{
                "encdec_extend_p16", ForwardMode::kExtend, 16, false, DType::kBF16, {13, 30}})),
    param_name);

INSTANTIATE_TEST_SUITE_P(
    Mla, OutCacheLocNotRead,
    ::testing::Combine(::testing::Values("triton", "flashinfer", "flashmla"),
                       ::testing::Values(SlotCase{"mla_extend_p64", ForwardMode::kExtend, 64, true},
                                         SlotCase{"mla_verify_p64", ForwardMode::kTargetVerify, 64,
                                                  true})),
    param_name);

// An absorbed MLA extend over an fp8_e4m3 latent pool. flashinfer's descriptor does not claim MLA
// over fp8 (its MLA row: fp4 only), so on "flashinfer" the case would only be skipped; flashmla,
// which claims it at page 64, sends every extend to the flashinfer backend it holds
// (mla_paged_backend.h), whose plan_mla_quantized reads the new keys through new_slots.
const SlotCase kMlaExtendFp8{"mla_extend_fp8_p64", ForwardMode::kExtend, 64, true, DType::kFP8E4M3};

INSTANTIATE_TEST_SUITE_P(MlaFp8, OutCacheLocNotRead,
                         ::testing::Combine(::testing::Values("flashmla"),
                                            ::testing::Values(kMlaExtendFp8)),
                         param_name);

// The case above runs, rather than skips, on an SM90 device, and it runs flashinfer's MLA path:
// flashmla's own decode engine takes no layer of the extend.
TEST(OutCacheLocNotReadFp8, FlashmlaRunsTheExtendOnFlashinfersPath) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const BackendDescriptor* flashmla = builtin_registry().find("flashmla");
  ASSERT_NE(flashmla, nullptr);
  const DeviceInfo device = test_support::device_info_for(Device::cuda(0));
  if (device.compute_capability < flashmla->min_compute_capability) {
    GTEST_SKIP() << "flashmla needs compute capability >= " << flashmla->min_compute_capability;
  }
  std::string skip;
  Result<test_support::CaseOnBackend> made =
      test_support::case_on_backend("flashmla", slot_spec(kMlaExtendFp8), Device::cuda(0), &skip);
  ASSERT_TRUE(made.is_ok()) << "MlaFp8/OutCacheLocNotRead would skip: " << skip << " "
                            << made.status().to_string();
  const mla::MlaDecodeStats* stats = mla_paged_stats(*made->backend);
  ASSERT_NE(stats, nullptr);
  STATUS_OK(harness::run_backend(*made->backend, made->pc, /*save_kv=*/false));
  EXPECT_EQ(stats->runs, 0) << "flashmla's decode engine ran layers of the fp8 extend";
}

}  // namespace
}  // namespace attnkit
