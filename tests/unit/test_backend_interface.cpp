// AttentionBackend routing and defaults, validate_forward_inputs, ForwardBatch::validate, and
// torch_native's handling of bad input: every error names the argument and the value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/registry.h"
#include "backend/validate.h"
#include "backends/torch_native/torch_native_backend.h"
#include "core/str_cat.h"
#include "harness/case_runner.h"
#include "support/batch_mutations.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

using harness::PreparedCase;

// Asserts `s` failed with kInvalidArgument (or `code`) and its message contains `needle`.
void expect_error(const Status& s, const std::string& needle,
                  StatusCode code = StatusCode::kInvalidArgument) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
}

class RecordingBackend final : public AttentionBackend {
 public:
  const BackendDescriptor& descriptor() const override {
    static const BackendDescriptor d = [] {
      BackendDescriptor x;
      x.name = "recording";
      return x;
    }();
    return d;
  }
  Status init_forward_metadata(const ForwardBatch&) override { return Status::ok(); }
  Status forward_extend(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const AttentionLayer&, const ForwardBatch&, bool,
                        const TensorView&) override {
    ++extend_calls;
    return Status::ok();
  }
  Status forward_decode(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const AttentionLayer&, const ForwardBatch&, bool,
                        const TensorView&) override {
    ++decode_calls;
    return Status::ok();
  }
  int extend_calls = 0;
  int decode_calls = 0;
};

TEST(BackendInterface, ForwardRoutesByMode) {
  const struct {
    ForwardMode mode;
    int extend, decode;
  } expected[] = {{ForwardMode::kIdle, 0, 0},         {ForwardMode::kDecode, 0, 1},
                  {ForwardMode::kExtend, 1, 0},       {ForwardMode::kMixed, 1, 0},
                  {ForwardMode::kTargetVerify, 1, 0}, {ForwardMode::kDraftExtend, 1, 0}};
  for (const auto& e : expected) {
    RecordingBackend b;
    ForwardBatch batch;
    batch.mode = e.mode;
    ASSERT_TRUE(b.forward({}, {}, {}, {}, AttentionLayer(), batch).is_ok());
    EXPECT_EQ(b.extend_calls, e.extend) << forward_mode_name(e.mode);
    EXPECT_EQ(b.decode_calls, e.decode) << forward_mode_name(e.mode);
  }
}

TEST(BackendInterface, DefaultCudaGraphMethodsAreUnsupported) {
  RecordingBackend b;
  const std::string msg = "recording does not support CUDA graphs";
  expect_error(b.init_cuda_graph_state(8, 8), msg, StatusCode::kUnsupported);
  expect_error(
      b.init_forward_metadata_capture_cuda_graph(1, 1, {}, {}, {}, ForwardMode::kDecode, nullptr),
      msg, StatusCode::kUnsupported);
  expect_error(b.init_forward_metadata_replay_cuda_graph(1, {}, {}, 0, {}, ForwardMode::kDecode,
                                                         nullptr, nullptr),
               msg, StatusCode::kUnsupported);
  EXPECT_EQ(b.cuda_graph_seq_len_fill_value(), 1);

  BackendContext ctx;
  Result<std::unique_ptr<AttentionBackend>> tn = create_torch_native_backend(ctx);
  ASSERT_TRUE(tn.is_ok());
  expect_error((*tn)->init_cuda_graph_state(8, 8), "torch_native does not support CUDA graphs",
               StatusCode::kUnsupported);
}

TEST(BackendInterface, ForwardModeNames) {
  EXPECT_STREQ(forward_mode_name(ForwardMode::kExtend), "extend");
  EXPECT_STREQ(forward_mode_name(ForwardMode::kDecode), "decode");
  EXPECT_STREQ(forward_mode_name(ForwardMode::kMixed), "mixed");
  EXPECT_STREQ(forward_mode_name(ForwardMode::kIdle), "idle");
  EXPECT_STREQ(forward_mode_name(ForwardMode::kTargetVerify), "target_verify");
  EXPECT_STREQ(forward_mode_name(ForwardMode::kDraftExtend), "draft_extend");
}

#ifdef ATTNKIT_WITH_CUDA
// CUDA builds stage through a host mirror of the pool, which needs the pool to mirror.
TEST(BackendInterface, TorchNativeCudaContextNeedsThePool) {
  BackendContext ctx;
  ctx.device = Device::cuda(0);
  expect_error(create_torch_native_backend(ctx).status(), "ctx.kv_pool",
               StatusCode::kInvalidArgument);
}
#else
TEST(BackendInterface, TorchNativeRejectsCudaContext) {
  BackendContext ctx;
  ctx.device = Device::cuda(0);
  expect_error(create_torch_native_backend(ctx).status(), "CPU only", StatusCode::kUnsupported);
}
#endif

// ---- validate_forward_inputs on a real prepared batch (8 q heads / 2 kv heads, d 128) ----

class ValidateInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<PreparedCase> pc =
        harness::prepare_case(*harness::find_case("extend_page16_ragged"), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    pc_ = std::make_unique<PreparedCase>(std::move(pc).value());
  }
  Status validate(bool save_kv = true) const {
    const harness::LayerData& l = pc_->layers[0];
    return validate_forward_inputs(q_ ? *q_ : l.q, l.k, l.v, out_ ? *out_ : l.out, layer(),
                                   pc_->batch, save_kv, lse_ ? *lse_ : l.lse, Device::cpu());
  }
  AttentionLayer& layer() const { return pc_->layers[0].layer; }
  std::unique_ptr<PreparedCase> pc_;
  std::optional<TensorView> q_, out_, lse_;
};

TEST_F(ValidateInputs, AcceptsThePreparedCase) { EXPECT_TRUE(validate().is_ok()); }

TEST_F(ValidateInputs, HeadCountsMustDivide) {
  layer().num_q_heads = 6;
  layer().num_kv_heads = 4;
  expect_error(validate(), "layer.num_q_heads 6 is not divisible by layer.num_kv_heads 4");
}

// out (or lse) laid over the cache: the forward wrote its results into cached k / v.
TEST_F(ValidateInputs, OutMustNotOverlapThePool) {
  const auto& pool = static_cast<const MHAKVPool&>(*pc_->batch.kv_pool);
  TensorView over_k = pc_->layers[0].out;
  over_k.data = static_cast<char*>(pool.k_buffer(1).data) + 64;
  out_ = over_k;
  expect_error(validate(), " overlaps the KV pool's k[1] buffer");
  out_.reset();
  TensorView over_v = pc_->layers[0].lse;
  ASSERT_TRUE(over_v.defined());
  over_v.data = pool.v_buffer(0).data;
  lse_ = over_v;
  expect_error(validate(), "lse f32[");
  expect_error(validate(), " overlaps the KV pool's v[0] buffer");
  lse_.reset();
  EXPECT_TRUE(validate().is_ok());
}

// The bytes an out spans run from its lowest element: a view walking backwards from just past
// the pool's highest buffer was taken (the check looked above data only, where no buffer is) and
// overwrote cached k / v.
TEST_F(ValidateInputs, NegativeStrideOutOverThePoolIsRefused) {
  const auto& pool = static_cast<const MHAKVPool&>(*pc_->batch.kv_pool);
  TensorView top;  // the highest-addressed buffer of the pool
  for (int l = 0; l < pool.config().num_layers; ++l) {
    for (const TensorView& b : {pool.k_buffer(l), pool.v_buffer(l)}) {
      if (!top.defined() || b.data > top.data) top = b;
    }
  }
  const TensorView& l_out = pc_->layers[0].out;  // bf16 [T, 8, 128]
  TensorView back = l_out;
  back.strides[0] = -l_out.strides[0];
  back.data = static_cast<char*>(top.data) + top.storage_bytes();  // one past its end
  // The old check, [data, data + bytes), sees no buffer of the pool: only the walk down does.
  ASSERT_EQ(pool.storage_overlapping(back.data, back.storage_bytes()), "");
  out_ = back;
  expect_error(validate(), " overlaps the KV pool's ");
}

// Results laid over each other or over the batch's index arrays (which later layers read).
TEST_F(ValidateInputs, OutAndLseApartFromEachOtherAndTheBatch) {
  TensorView lse_in_out = pc_->layers[0].lse;
  lse_in_out.data = pc_->layers[0].out.data;
  lse_ = lse_in_out;
  expect_error(validate(), " overlaps out bf16[");
  lse_.reset();
  // out_cache_loc moved into a buffer large enough to hold all of lse (and nothing of the pool).
  const TensorView loc = pc_->batch.out_cache_loc;
  std::vector<int64_t> roomy(static_cast<size_t>(pc_->layers[0].lse.storage_bytes() / 8 + 8));
  std::memcpy(roomy.data(), loc.data, static_cast<size_t>(loc.storage_bytes()));
  pc_->batch.out_cache_loc.data = roomy.data();
  TensorView over_loc = pc_->layers[0].lse;
  over_loc.data = roomy.data();
  lse_ = over_loc;
  expect_error(validate(), " overlaps batch.out_cache_loc: the forward would overwrite");
  lse_.reset();
  EXPECT_TRUE(validate().is_ok());
  pc_->batch.out_cache_loc = loc;
}

// Results written over the forward's own inputs: out over q (in place), lse inside k / v.
TEST_F(ValidateInputs, OutAndLseApartFromTheInputs) {
  const harness::LayerData& l = pc_->layers[0];
  ASSERT_EQ(l.out.dtype, l.q.dtype);
  ASSERT_EQ(l.out.storage_bytes(), l.q.storage_bytes());
  TensorView in_place = l.out;
  in_place.data = l.q.data;
  out_ = in_place;
  expect_error(validate(), " overlaps q bf16[");
  expect_error(validate(), "in place is not supported");
  out_.reset();
  for (const TensorView* input : {&l.k, &l.v}) {
    ASSERT_GE(input->storage_bytes(), l.lse.storage_bytes());
    TensorView over = l.lse;
    over.data = input->data;
    lse_ = over;
    expect_error(validate(), input == &l.k ? " overlaps k bf16[" : " overlaps v bf16[");
  }
  lse_.reset();
  EXPECT_TRUE(validate().is_ok());
}

// A strided out whose elements are distinct passes: heads-major storage viewed as [T, H, D].
TEST_F(ValidateInputs, HeadsMajorOutIsAccepted) {
  const TensorView& l_out = pc_->layers[0].out;
  const int64_t t = l_out.size(0), h = l_out.size(1), d = l_out.size(2);
  std::vector<uint16_t> storage(static_cast<size_t>(t * h * d));
  TensorView heads_major(storage.data(), DType::kBF16, Device::cpu(), {t, h, d});
  heads_major.strides = {d, t * d, 1, 0, 0, 0};
  ASSERT_FALSE(heads_major.may_self_overlap());
  out_ = heads_major;
  EXPECT_TRUE(validate().is_ok()) << validate().to_string();
}

// out laid over the request table: the forward wrote results into its slots (a CPU kernel then
// read the pool at garbage rows and crashed).
TEST_F(ValidateInputs, OutOverTheRequestTableIsRefused) {
  // A table larger than out, so that out lies inside it and nowhere else.
  Result<std::unique_ptr<ReqToTokenPool>> big = ReqToTokenPool::create(256, 1 << 14, Device::cpu());
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  ASSERT_GT((*big)->table().storage_bytes(), pc_->layers[0].out.storage_bytes() + 4);
  // The batch's rows, copied (big hands rows out in order 1, 2, ...).
  const ReqToTokenPool& table = *pc_->req_to_token;
  for (const int32_t row : pc_->batch.req_pool_indices_host) {
    while (!(*big)->is_allocated(row)) ASSERT_TRUE((*big)->alloc().is_ok());
    const int32_t* src = table.host_row(row);
    const std::vector<int64_t> slots(src, src + table.max_context_len());
    ASSERT_TRUE((*big)->write(row, 0, slots).is_ok());
  }
  pc_->batch.req_to_token_pool = big->get();
  TensorView over = pc_->layers[0].out;
  over.data = static_cast<char*>((*big)->table().data) + 4;
  out_ = over;
  expect_error(validate(), " overlaps the request table (req_to_token_pool.table())");
}

// Elements of out sharing memory: every head's result overwrote the last one.
TEST_F(ValidateInputs, OutWhoseElementsShareMemoryIsRefused) {
  TensorView shared = pc_->layers[0].out;
  shared.strides[1] = 0;  // every head of a token at one address
  out_ = shared;
  expect_error(validate(), "has elements that share memory");
  TensorView interleaved = pc_->layers[0].out;
  interleaved.strides[1] = 64;  // head h + 1 starts halfway through head h's 128 values
  out_ = interleaved;
  expect_error(validate(), "has elements that share memory");
  TensorView transposed = pc_->layers[0].out;  // disjoint, just not row-major: fine
  std::swap(transposed.strides[0], transposed.strides[1]);
  std::swap(transposed.shape[0], transposed.shape[1]);
  EXPECT_FALSE(transposed.may_self_overlap());
}

TEST_F(ValidateInputs, WrongQShape) {
  TensorView q = pc_->layers[0].q;
  q.shape[2] = 64;
  q_ = q;
  expect_error(validate(), "q: expected shape [");
  expect_error(validate(), "128]");
}

TEST_F(ValidateInputs, OutDtypeMustMatchQ) {
  TensorView out = pc_->layers[0].out;
  out.dtype = DType::kF32;
  out_ = out;
  expect_error(validate(), "out: dtype f32 must equal q's dtype bf16");
}

TEST_F(ValidateInputs, LseMustBeF32) {
  TensorView lse = pc_->layers[0].lse;
  lse.dtype = DType::kBF16;
  lse_ = lse;
  expect_error(validate(), "lse: dtype bf16 must be f32");
}

TEST_F(ValidateInputs, SaveKvNeedsK) {
  const harness::LayerData& l = pc_->layers[0];
  expect_error(validate_forward_inputs(l.q, TensorView(), l.v, l.out, layer(), pc_->batch, true,
                                       l.lse, Device::cpu()),
               "save_kv is true but k is missing");
  EXPECT_TRUE(validate_forward_inputs(l.q, TensorView(), TensorView(), l.out, layer(), pc_->batch,
                                      false, l.lse, Device::cpu())
                  .is_ok());
}

TEST_F(ValidateInputs, DeviceMismatch) {
  TensorView q = pc_->layers[0].q;
  q.device = Device::cuda(0);
  q_ = q;
  expect_error(validate(), "q is on cuda:0 but the backend runs on cpu");
}

TEST_F(ValidateInputs, LayerMustMatchPool) {
  layer().layer_id = 5;
  expect_error(validate(), "layer.layer_id 5 is outside the KV pool's layers [0, 2)");
  layer().layer_id = 0;
  layer().v_head_dim = 64;
  TensorView out = pc_->layers[0].out;
  out.shape[2] = 64;
  out_ = out;
  const harness::LayerData& l = pc_->layers[0];
  expect_error(validate_forward_inputs(l.q, TensorView(), TensorView(), out, layer(), pc_->batch,
                                       false, l.lse, Device::cpu()),
               "does not match the KV pool");
}

TEST_F(ValidateInputs, CrossAttentionCannotSaveKv) {
  layer().is_cross_attention = true;
  pc_->batch.encoder_lens_host.assign(static_cast<size_t>(pc_->batch.batch_size), 0);
  expect_error(validate(), "save_kv is true for a cross-attention layer");
}

TEST_F(ValidateInputs, TokenCountMustMatchBatch) {
  ForwardBatch& b = pc_->batch;
  b.num_tokens += 1;
  expect_error(validate(),
               "ForwardBatch.out_cache_loc: expected int64[" + std::to_string(b.num_tokens) + "]");
  b.num_tokens -= 1;
  b.extend_seq_lens_host[0] += 1;
  b.extend_prefix_lens_host[0] -= 1;
  b.extend_start_loc_host.clear();
  expect_error(validate(), "ForwardBatch.num_tokens " + std::to_string(b.num_tokens) +
                               " does not match the sum of extend_seq_lens " +
                               std::to_string(b.num_tokens + 1));
}

TEST_F(ValidateInputs, RequestRowOutOfRange) {
  pc_->batch.req_pool_indices_host[0] = 99;
  pc_->batch.req_pool_indices.data_as<int32_t>()[0] = 99;  // the array agrees with its copy
  expect_error(validate(), "req_pool_indices_host[0] = 99 is outside the request table rows [1, ");
}

// A review helper's findings (2026-11-30): an out_cache_loc entry that is not the slot the
// request's row holds for that new token was accepted, and save_kv overwrote another request's
// cached token while the attention read the row's stale slot; a request row listed twice had the
// second request attend the first's keys. Every mode's layout of the new tokens' columns (decode,
// extend, mixed, draft extend, verify drafts, the encoder tokens before a cross-attention row).
// q inside the pool's k buffer: save_kv would write the new k / v there before the attention read
// q (a review helper's finding, 2026-11-30); without save_kv it is only read.
TEST(ValidateQ, QOverThePoolIsRefusedWithSaveKv) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("decode_page16"), Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  const harness::LayerData& l = pc->layers[0];
  const auto& pool = static_cast<const MHAKVPool&>(*pc->kv_pool);
  TensorView q = l.q;
  ASSERT_LT(q.storage_bytes(), pool.k_buffer(0).storage_bytes());
  q.data = pool.k_buffer(0).data;
  expect_error(validate_forward_inputs(q, l.k, l.v, l.out, l.layer, pc->batch, /*save_kv=*/true,
                                       l.lse, Device::cpu()),
               "q bf16[4, 8, 128] cpu overlaps the KV pool's k[0] buffer: save_kv writes the new "
               "k / v there");
  const Status read_only = validate_forward_inputs(q, l.k, l.v, l.out, l.layer, pc->batch,
                                                   /*save_kv=*/false, l.lse, Device::cpu());
  EXPECT_TRUE(read_only.is_ok()) << read_only.to_string();
}

TEST(ForwardBatchSlots, NewTokenSlotsMustBeTheRowsOwnAndRowsUnique) {
  for (const char* name : {"extend_page16_ragged", "mixed_page16", "draft_extend_page16",
                           "decode_page16", "decode_cross_attention", "extend_cross_attention",
                           "verify_topk4_page16", "mla_prefill_192_128"}) {
    SCOPED_TRACE(name);
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    ForwardBatch& b = pc->batch;
    ASSERT_TRUE(b.validate().is_ok()) << b.validate().to_string();
    ASSERT_GE(b.num_tokens, 2);
    int64_t* loc = b.out_cache_loc.data_as<int64_t>();
    const int64_t last = loc[b.num_tokens - 1];
    loc[b.num_tokens - 1] = loc[0];  // another request's (or token's) slot
    expect_error(b.validate(), "ForwardBatch.out_cache_loc[" + std::to_string(b.num_tokens - 1) +
                                   "] = " + std::to_string(loc[0]) + " (request " +
                                   std::to_string(b.batch_size - 1) + ", new token ");
    expect_error(b.validate(), "the row must hold the new tokens' slots after its prefix");
    loc[b.num_tokens - 1] = last;
    ASSERT_TRUE(b.validate().is_ok());
    if (b.batch_size >= 2) {
      const int32_t row = b.req_pool_indices_host[1];
      int32_t* rows = b.req_pool_indices.data_as<int32_t>();  // the array agrees with its copy
      b.req_pool_indices_host[1] = rows[1] = b.req_pool_indices_host[0];
      expect_error(b.validate(), "ForwardBatch.req_pool_indices_host[1] = " +
                                     std::to_string(b.req_pool_indices_host[0]) +
                                     " is an earlier request's row (one row per request)");
      b.req_pool_indices_host[1] = rows[1] = row;
    }
  }
}

// A new token given a slot that a request of the batch reads as a cached key (its row and
// out_cache_loc agreeing, so the check above passes): save_kv would overwrite that key and the
// forward read the new k / v in its place. Refused on CPU pools, naming both requests.
TEST(ForwardBatchSlots, NewTokenSlotMustNotBeACachedKeyOfTheBatch) {
  int checked = 0;
  for (const char* name : {"extend_page16_ragged", "mixed_page16", "decode_page16",
                           "verify_topk4_page16", "decode_cross_attention"}) {
    SCOPED_TRACE(name);
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    ForwardBatch& b = pc->batch;
    ASSERT_TRUE(b.validate().is_ok()) << b.validate().to_string();
    int p = -1;  // a request with a cached column
    for (int i = 0; i < static_cast<int>(pc->rows.size()); ++i)
      if (test_support::committed_columns(b, i) >= 1) p = i;
    if (p < 0) continue;
    ++checked;
    const int32_t cached = pc->req_to_token->host_row(pc->rows[static_cast<size_t>(p)])[0];
    // The batch's last new token (the last request's): its row column and out_cache_loc entry.
    const int r = static_cast<int>(pc->rows.size()) - 1;
    const int row = pc->rows[static_cast<size_t>(r)];
    int64_t* loc = b.out_cache_loc.data_as<int64_t>();
    const int64_t own = loc[b.num_tokens - 1];
    const int32_t* host = pc->req_to_token->host_row(row);
    int col = 0;
    while (host[col] != own) ++col;
    const auto put = [&](int64_t v) {
      ASSERT_TRUE(pc->req_to_token->write(row, col, std::span<const int64_t>(&v, 1)).is_ok());
      loc[b.num_tokens - 1] = v;
    };
    put(cached);
    expect_error(b.validate(), "ForwardBatch: slot " + std::to_string(cached) +
                                   " is a cached key of request " + std::to_string(p));
    expect_error(b.validate(), "also a new token's slot of request " + std::to_string(r));
    put(own);
    EXPECT_TRUE(b.validate().is_ok()) << b.validate().to_string();
  }
  EXPECT_GE(checked, 4);
}

// ATTNKIT_CHECK_INDICES=1: every entry the batch reads is a pool slot outside page 0 and keeps
// its page whole (slot t at offset t % page_size; natively paged backends read only a page's first
// entry). Every table the harness builds passes; a stray entry in a page and a page starting
// mid-page are refused naming the entry. Off (the default) neither is looked at.
TEST(ForwardBatchCheckIndices, PagesMustStayWhole) {
  int checked = 0;
  for (const char* name :
       {"extend_page16_ragged", "draft_extend_page16", "decode_page16", "decode_cross_attention",
        "extend_cross_attention", "verify_topk4_page16", "extend_window8_page16", "decode_page1"}) {
    SCOPED_TRACE(name);
    test_support::ScopedEnv knob("ATTNKIT_CHECK_INDICES", "1");
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    ForwardBatch& b = pc->batch;
    ASSERT_TRUE(b.validate().is_ok()) << b.validate().to_string();
    const int ps = pc->kv_pool->page_size();
    if (ps == 1) continue;
    // A request whose second page is cached (columns before its new tokens: on the CPU a new
    // token's column is also checked against out_cache_loc, which would answer first).
    int r = -1;
    for (int i = 0; i < static_cast<int>(pc->rows.size()); ++i)
      if (test_support::committed_columns(b, i) >= ps + 2) r = i;
    if (r < 0) continue;
    ++checked;
    const int row = pc->rows[static_cast<size_t>(r)];
    const int32_t* host = pc->req_to_token->host_row(row);
    const int32_t first = host[ps];
    const int32_t mid = host[ps + 1];
    const auto put = [&](int col, int64_t v) {
      ASSERT_TRUE(pc->req_to_token->write(row, col, std::span<const int64_t>(&v, 1)).is_ok());
    };
    // Column ps + 1 moved to the next slot of its page: its own offset is broken.
    put(ps + 1, mid + 1);
    expect_error(b.validate(),
                 "req_to_token[" + std::to_string(row) + ", " + std::to_string(ps + 1) +
                     "] = " + std::to_string(mid + 1) + " (request " + std::to_string(r) +
                     ") breaks its page: with page_size " + std::to_string(ps) + " column " +
                     std::to_string(ps + 1) + " must hold slot " + std::to_string(mid));
    {
      test_support::ScopedEnv off("ATTNKIT_CHECK_INDICES", "0");
      EXPECT_TRUE(b.validate().is_ok()) << "the page check is behind ATTNKIT_CHECK_INDICES";
    }
    put(ps + 1, mid);
    ASSERT_TRUE(b.validate().is_ok());
    // The page's first entry one slot on: not a page start.
    put(ps, first + 1);
    expect_error(b.validate(), "(a page's first slot is a multiple of page_size)");
    put(ps, first);
    ASSERT_TRUE(b.validate().is_ok());
  }
  EXPECT_GE(checked, 3) << "cases with a cached second page";
}

// An encoder-only layer in a speculative batch is refused by every backend and the reference
// alike (some kernels order the drafts causally whatever the type); extend and decode take it.
TEST(ValidateEncoderOnly, RefusedInSpeculativeBatches) {
  for (const char* name :
       {"verify_topk4_page16", "draft_extend_page16", "extend_page16_ragged", "decode_page16"}) {
    SCOPED_TRACE(name);
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    harness::LayerData& l = pc->layers[0];
    l.layer.type = AttentionType::kEncoderOnly;
    const Status st = validate_forward_inputs(l.q, l.k, l.v, l.out, l.layer, pc->batch, true, l.lse,
                                              Device::cpu());
    const bool speculative =
        pc->batch.mode == ForwardMode::kTargetVerify || pc->batch.mode == ForwardMode::kDraftExtend;
    if (speculative) {
      expect_error(st, std::string("layer.type encoder-only (bidirectional) in a ") +
                           forward_mode_name(pc->batch.mode) +
                           " batch: speculative batches are causal");
    } else {
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
  }
}

TEST_F(ValidateInputs, SequencePastContextCapacity) {
  ForwardBatch& b = pc_->batch;
  const int grow = pc_->req_to_token->max_context_len();
  b.seq_lens_host[1] += grow;
  b.extend_prefix_lens_host[1] += grow;
  b.seq_lens.data_as<int32_t>()[1] += grow;  // the arrays agree with their copies
  b.extend_prefix_lens.data_as<int32_t>()[1] += grow;
  b.seq_lens_sum += grow;
  expect_error(validate(), "exceeds max_context_len");
}

TEST_F(ValidateInputs, InconsistentExtendArrays) {
  pc_->batch.extend_start_loc_host[1] += 1;
  expect_error(validate(), "ForwardBatch.extend_start_loc_host[1] = ");
  pc_->batch.extend_start_loc_host[1] -= 1;
  pc_->batch.seq_lens_host[0] += 1;
  pc_->batch.seq_lens_sum += 1;
  expect_error(validate(), "must equal extend_prefix_len");
  pc_->batch.seq_lens_sum += 5;
  expect_error(validate(), "ForwardBatch.seq_lens_sum");
}

// On CPU the arrays and their host copies are both readable: a copy that contradicts its array
// (the backends compute from the copies) is refused, naming both values.
TEST_F(ValidateInputs, HostCopiesMustHoldTheirArraysValues) {
  for (auto [array, name] : {std::pair{&pc_->batch.seq_lens, "seq_lens"},
                             {&pc_->batch.req_pool_indices, "req_pool_indices"},
                             {&pc_->batch.extend_seq_lens, "extend_seq_lens"},
                             {&pc_->batch.extend_prefix_lens, "extend_prefix_lens"}}) {
    int32_t* values = array->data_as<int32_t>();
    values[1] += 1;
    expect_error(validate(),
                 cat("ForwardBatch.", name, "_host[1] = ", values[1] - 1, " but ", name,
                     "[1] = ", values[1], ": a host copy must hold its array's values"));
    values[1] -= 1;
    EXPECT_TRUE(validate().is_ok()) << name;
  }
}

// The batch's index arrays are read as plain contiguous arrays on the pool's device: a strided
// view (e.g. a column of a framework tensor) or an array on another device is refused by name
// (before, a strided seq_lens was read as contiguous and a host array handed to a CUDA backend
// was dereferenced by its kernels).
TEST_F(ValidateInputs, BatchArraysMustBeContiguousOnThePoolDevice) {
  ForwardBatch& b = pc_->batch;
  const int64_t bs = b.batch_size;
  std::vector<int32_t> every_other(static_cast<size_t>(2 * bs));
  for (int64_t r = 0; r < bs; ++r) every_other[static_cast<size_t>(2 * r)] = b.seq_lens_host[r];
  TensorView strided(every_other.data(), DType::kI32, Device::cpu(), {bs});
  strided.strides[0] = 2;
  b.seq_lens = strided;
  expect_error(validate(), "ForwardBatch.seq_lens: expected a contiguous array");
  TensorView elsewhere(every_other.data(), DType::kI32, Device::cuda(0), {bs});
  b.seq_lens = elsewhere;
  expect_error(validate(),
               "ForwardBatch.seq_lens is on cuda:0, the KV pool on cpu: the batch's arrays must be "
               "on the pool's device");
  b.seq_lens = TensorView(every_other.data(), DType::kI32, Device::cpu(), {bs});
  TensorView loc = b.out_cache_loc;
  loc.device = Device::cuda(0);
  b.out_cache_loc = loc;
  expect_error(validate(), "ForwardBatch.out_cache_loc is on cuda:0");
}

// Host sinks are read: +inf and NaN are refused naming the head and the value (they made every
// row of the head NaN); finite values and -inf (no sink) pass.
// Sinks inside out's or lse's bytes: a kernel read sinks it had already overwritten (a wrong
// answer with no error), so the overlap is refused by name.
TEST_F(ValidateInputs, SinksApartFromOutAndLse) {
  const harness::LayerData& l = pc_->layers[0];
  const int heads = layer().num_q_heads;
  for (const TensorView* t : {&l.out, &l.lse}) {
    ASSERT_GE(t->storage_bytes(), static_cast<int64_t>(heads * sizeof(float)));
    auto* values = static_cast<float*>(t->data);
    for (int h = 0; h < heads; ++h) values[h] = 0.5f;
    layer().sinks = TensorView(t->data, DType::kF32, Device::cpu(), {heads});
    expect_error(validate(), std::string(t == &l.out ? "out " : "lse ") + t->describe() +
                                 " overlaps layer.sinks f32[");
  }
  std::vector<float> apart(static_cast<size_t>(heads), 0.5f);
  layer().sinks = TensorView(apart.data(), DType::kF32, Device::cpu(), {heads});
  EXPECT_TRUE(validate().is_ok()) << validate().to_string();
}

TEST_F(ValidateInputs, SinksMustBeFiniteOrMinusInf) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> sinks(static_cast<size_t>(layer().num_q_heads), 0.5f);
  layer().sinks = TensorView(sinks.data(), DType::kF32, Device::cpu(), {layer().num_q_heads});
  EXPECT_TRUE(validate().is_ok());
  sinks[2] = -inf;
  EXPECT_TRUE(validate().is_ok()) << "-inf is no sink";
  sinks[5] = inf;
  expect_error(validate(),
               "layer.sinks[5] (q head 5) is inf: a sink must be finite, or -inf for no sink");
  sinks[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error(validate(), "layer.sinks[5] (q head 5) is nan");
}

// ---- torch_native on bad input: errors, never a crash ----

TEST(TorchNativeBadInput, PlusInfSinkIsRefused) {
  harness::CaseSpec spec = *harness::find_case("decode_page16");
  spec.sinks = true;
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  for (harness::LayerData& ld : pc->layers) {
    ld.layer.sinks.data_as<float>()[1] = std::numeric_limits<float>::infinity();
  }
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  expect_error(harness::run_backend(*b, *pc, /*save_kv=*/true), "layer.sinks[1] (q head 1) is inf");
}

// A NaN in q makes its rows NaN (out and lse), as softmax attention does: the reference kept -inf
// as the row's max when every logit was NaN, read the row as "no visible key" and wrote 0 / -inf.
TEST(TorchNativeBadInput, NanQueryGivesNanRows) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("decode_page16"), Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  harness::LayerData& ld = pc->layers[0];
  ASSERT_EQ(ld.q.dtype, DType::kBF16);
  const int64_t dim = ld.q.size(2);
  ld.q.data_as<uint16_t>()[2 * dim + 5] = 0x7fc0;  // token 0, q head 2: a bf16 quiet NaN
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  ASSERT_TRUE(b->init_forward_metadata(pc->batch).is_ok());
  ASSERT_TRUE(
      b->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc->batch, /*save_kv=*/true, ld.lse).is_ok());
  const auto bf16_at = [&](int64_t head, int64_t d) {
    const uint32_t bits = uint32_t{ld.out.data_as<uint16_t>()[head * ld.out.size(2) + d]} << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  };
  for (int64_t d = 0; d < ld.out.size(2); ++d) {
    EXPECT_TRUE(std::isnan(bf16_at(2, d))) << d;
    EXPECT_TRUE(std::isfinite(bf16_at(1, d))) << d;
  }
  ASSERT_TRUE(ld.lse.defined());
  EXPECT_TRUE(std::isnan(ld.lse.data_as<float>()[2]));
  EXPECT_TRUE(std::isfinite(ld.lse.data_as<float>()[1]));
}

TEST(TorchNativeBadInput, OutOfRangeSlotViaSetKv) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("decode_page16"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  const int64_t bad = pc->kv_pool->rows() + 3;
  // set_kv itself refuses the slot past the pool ...
  std::vector<int64_t> one = {bad};
  const TensorView loc(one.data(), DType::kI64, Device::cpu(), {1});
  const harness::LayerData& ld = pc->layers[0];
  expect_error(pc->kv_pool->set_kv(0, loc, ld.k.slice0(0, 1), ld.v.slice0(0, 1), 1.f, 1.f, nullptr),
               "loc[0] = " + std::to_string(bad) + " is outside the usable slots");
  // ... and a batch whose out_cache_loc says so is refused before it: the slot is not the one
  // the request's row holds for its new token.
  pc->batch.out_cache_loc.data_as<int64_t>()[0] = bad;
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  const Status s = harness::run_backend(*b, *pc, /*save_kv=*/true);
  expect_error(s, "ForwardBatch.out_cache_loc[0] = " + std::to_string(bad) + " (request 0");
}

TEST(TorchNativeBadInput, PageTablePastThePool) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("extend_page16_ragged"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  const int64_t bad = pc->kv_pool->rows() + 16;
  const int32_t row = pc->rows[0];
  ASSERT_TRUE(pc->req_to_token->write(row, 2, std::vector<int64_t>{bad}).is_ok());
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  const Status s = harness::run_backend(*b, *pc, /*save_kv=*/false);
  expect_error(s, "req_to_token[" + std::to_string(row) + ", 2] = " + std::to_string(bad) +
                      " (request 0) is outside the KV pool slots");
}

// ForwardBatch::validate reads ReqToTokenPool::max_slot as the table's bound: a slot past the pool
// beyond every request's length (a row the batch does not use: GraphCaptures'
// ReplayTableSlotsAreRowsOfThePool) leaves the forward alone; the same slot inside a request's
// row is named (PageTablePastThePool).
TEST(TorchNativeBadInput, PoolPastSlotBeyondTheRequestLengthsIsNotAnError) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("extend_page16_ragged"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  const int64_t bad = pc->kv_pool->rows() + 16;
  for (size_t r = 0; r < pc->rows.size(); ++r) {
    const int32_t past = pc->batch.seq_lens_host[r];
    ASSERT_LT(past, pc->req_to_token->max_context_len());
    ASSERT_TRUE(pc->req_to_token->write(pc->rows[r], past, std::vector<int64_t>{bad}).is_ok());
  }
  ASSERT_GE(pc->req_to_token->max_slot(), pc->kv_pool->rows());
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  const Status s = harness::run_backend(*b, *pc, /*save_kv=*/false);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// The shared entry-point check of the CUDA backends (triton, flashinfer, fa3, the MLA backends):
// forward_decode takes decode batches, forward_extend every other mode.
TEST(CheckEntryPoint, NamesTheEntryPointAndTheMode) {
  ForwardBatch b;
  b.mode = ForwardMode::kDecode;
  EXPECT_TRUE(check_entry_point("x", true, b).is_ok());
  Status st = check_entry_point("triton", false, b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("triton: forward_extend called with a decode batch"),
            std::string::npos)
      << st.message();
  for (ForwardMode m : {ForwardMode::kExtend, ForwardMode::kMixed, ForwardMode::kTargetVerify,
                        ForwardMode::kDraftExtend}) {
    b.mode = m;
    EXPECT_TRUE(check_entry_point("x", false, b).is_ok()) << forward_mode_name(m);
    st = check_entry_point("fa3", true, b);
    EXPECT_NE(st.message().find(std::string("fa3: forward_decode called with ") +
                                (m == ForwardMode::kExtend ? "an " : "a ") + forward_mode_name(m)),
              std::string::npos)
        << st.message();
  }
}

TEST(TorchNativeBadInput, WrongEntryPointForMode) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("extend_page1_gqa4"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  const harness::LayerData& l = pc->layers[0];
  expect_error(b->forward_decode(l.q, l.k, l.v, l.out, l.layer, pc->batch, true, l.lse),
               "forward_decode called with a extend batch");
}

TEST(TorchNativeBadInput, VerifyNeedsConsistentMask) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("verify_topk4_page1"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  pc->batch.spec.mask_indptr_host[1] += 1;
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  expect_error(harness::run_backend(*b, *pc, true),
               "ForwardBatch.spec.mask_indptr_host: request 0");
  pc->batch.spec.mask_indptr_host[1] -= 1;
  pc->batch.spec.custom_mask = TensorView();
  expect_error(harness::run_backend(*b, *pc, true), "spec.topk 4 > 1 needs the tree mask");
}

// A draft_extend batch carries a SpecInfo too: its counts are checked in every mode (topk -3 and
// draft_token_num -7 passed in draft_extend).
TEST(ForwardBatchSpec, CountsAreCheckedInDraftExtend) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("draft_extend_page16"), Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  ASSERT_TRUE(pc->batch.has_spec);
  EXPECT_TRUE(pc->batch.validate().is_ok());
  pc->batch.spec.topk = -3;
  expect_error(pc->batch.validate(), "ForwardBatch.spec: topk -3, draft_token_num 4");
  pc->batch.spec.topk = 1;
  pc->batch.spec.draft_token_num = -7;
  expect_error(pc->batch.validate(), "(topk must be >= 1, the counts >= 0)");
  pc->batch.spec.draft_token_num = 4;
  pc->batch.spec.num_steps = -1;
  expect_error(pc->batch.validate(), "num_steps -1");
}

// A tree mask laid out with a stride (the bits of every other byte) was read as contiguous: the
// verify step attended with the wrong bits (max |diff| 2.5 against the contiguous mask).
TEST(TorchNativeBadInput, VerifyMaskMustBeContiguous) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("verify_topk4_page1"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  const TensorView mask = pc->batch.spec.custom_mask;
  const int64_t n = mask.numel();
  std::vector<uint8_t> spread(static_cast<size_t>(2 * n), 1);
  for (int64_t i = 0; i < n; ++i) {
    spread[static_cast<size_t>(2 * i)] = static_cast<const uint8_t*>(mask.data)[i];
  }
  TensorView strided(spread.data(), DType::kU8, Device::cpu(), {n});
  strided.strides[0] = 2;
  pc->batch.spec.custom_mask = strided;
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  expect_error(harness::run_backend(*b, *pc, true),
               "ForwardBatch.spec.custom_mask: expected a contiguous array");
}

TEST(TorchNativeBadInput, MlaPrefillCannotSaveKv) {
  Result<PreparedCase> pc =
      harness::prepare_case(*harness::find_case("mla_prefill_192_128"), Device::cpu());
  ASSERT_TRUE(pc.is_ok());
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  ASSERT_TRUE(b->init_forward_metadata(pc->batch).is_ok());
  const harness::LayerData& l = pc->layers[0];
  expect_error(b->forward(l.q, l.k, l.v, l.out, l.layer, pc->batch, true, l.lse),
               "save_kv is true for an MLA non-absorbed layer");
  expect_error(b->forward(l.q, TensorView(), TensorView(), l.out, l.layer, pc->batch, false, l.lse),
               "k and v of the new tokens are required");
}

// Each factor finite and > 0, their product (the softmax scale a quantized pool's kernels use, in
// log2 units) inf or below the normal range: every score became NaN or 0. Pools of the
// activation dtype fold no scale, so the same factors pass there.
TEST(ValidateFoldedScale, QuantizedPoolNeedsANormalProduct) {
  for (const char* name : {"extend_fp8_e4m3_kv", "extend_page16_ragged"}) {
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << name;
    const bool quantized = pc->spec.kv_dtype == DType::kFP8E4M3;
    const harness::LayerData& l = pc->layers[0];
    AttentionLayer layer = l.layer;
    const auto validate = [&] {
      return validate_forward_inputs(l.q, l.k, l.v, l.out, layer, pc->batch, true, l.lse,
                                     Device::cpu());
    };
    layer.scaling = 1.0f;
    layer.k_scale = 3e38f;
    if (quantized) {
      expect_error(validate(), "layer.scaling 1 x layer.k_scale 3e+38");
    } else {
      EXPECT_TRUE(validate().is_ok()) << name;
    }
    layer.scaling = 1e-20f;
    layer.k_scale = 1e-20f;
    if (quantized) {
      expect_error(validate(), "pool, x log2(e)) must be a finite normal float");
    } else {
      EXPECT_TRUE(validate().is_ok()) << name;
    }
    layer.k_scale = 1.0f;
    layer.scaling = l.layer.scaling;
    EXPECT_TRUE(validate().is_ok()) << name;
  }
}

// Values each check above accepted (finite, >= 0) but the kernels' log2-unit arithmetic did not:
// a softmax scale or soft-cap near FLT_MAX (inf / NaN scores), a cap past ~1e37 (scale / cap
// subnormal: the CPU kernels flushed it, uniform rows), a sink near FLT_MAX (inf - inf rows), an
// fp8 v_scale with no room for the kernels' 2^8, and a layer.type outside the enum (one backend ran
// it bidirectional, another causal). Each is refused by name; values beside them pass.
TEST(ValidateFoldedScale, KernelRangesAndLayerType) {
  for (const char* name : {"extend_fp8_e4m3_kv", "extend_page16_ragged"}) {
    SCOPED_TRACE(name);
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << name;
    const bool quantized = pc->spec.kv_dtype == DType::kFP8E4M3;
    const harness::LayerData& l = pc->layers[0];
    const AttentionLayer good = l.layer;
    AttentionLayer layer = good;
    const auto validate = [&] {
      return validate_forward_inputs(l.q, l.k, l.v, l.out, layer, pc->batch, true, l.lse,
                                     Device::cpu());
    };
    ASSERT_TRUE(validate().is_ok());
    layer.scaling = 3e38f;
    expect_error(validate(),
                 "x log2(e)) must be a finite normal float, with room for the "
                 "kernels' 2^8");
    layer.scaling = 1.5e36f / (quantized ? good.k_scale : 1.f);  // x log2(e) finite, x 2^8 not
    expect_error(validate(), "with room for the kernels' 2^8");
    layer = good;
    layer.logit_cap = 3e38f;
    expect_error(validate(), "layer.logit_cap 3e+38 with the softmax scale");
    layer.logit_cap = 1e37f;
    expect_error(validate(), "scale / cap a normal float");
    // A subnormal cap under which scale / cap overflows (the scale as validate folds it).
    const float folded = good.scaling * 1.4426950f * (quantized ? good.k_scale : 1.f);
    layer.logit_cap = folded / 3e38f / 4.f;
    ASSERT_GT(layer.logit_cap, 0.f);
    expect_error(validate(), "scale / cap a normal float");
    layer.logit_cap = 1e-39f;  // ln 2 / cap overflows (the FP8 kernel's factor) for any scale
    expect_error(validate(), "scale / cap a normal float");
    for (float cap : {1e30f, 50.f, 1e-3f}) {
      layer.logit_cap = cap;
      EXPECT_TRUE(validate().is_ok()) << cap;
    }
    layer = good;
    layer.v_scale = 1e37f;
    if (quantized) {
      expect_error(validate(), "layer.v_scale 1e+37 over the fp8_e4m3 pool");
    } else {
      EXPECT_TRUE(validate().is_ok());
    }
    layer = good;
    layer.type = static_cast<AttentionType>(7);
    expect_error(validate(), "layer.type 7 is not an AttentionType");
  }
  // A windowed layer over a request past 2^30 - 2^16 keys (int32 key positions in the kernels).
  {
    Result<PreparedCase> pc =
        harness::prepare_case(*harness::find_case("extend_page16_ragged"), Device::cpu());
    ASSERT_TRUE(pc.is_ok());
    const harness::LayerData& l = pc->layers[0];
    AttentionLayer layer = l.layer;
    layer.sliding_window = 100;
    ASSERT_TRUE(check_windowed_lengths(layer, pc->batch).is_ok());
    // (ForwardBatch::validate bounds each length by the table's width first: a table this wide
    // takes gigabytes, so the length check runs alone here.)
    ForwardBatch batch = pc->batch;
    batch.seq_lens_host[0] = (1 << 30) - (1 << 16) + 1;
    expect_error(check_windowed_lengths(layer, batch),
                 "layer.sliding_window 100 over request 0 of 1073676289 keys: windowed layers "
                 "take requests of at most 1073676288 keys");
    batch.seq_lens_host[0] -= 1;
    EXPECT_TRUE(check_windowed_lengths(layer, batch).is_ok());
    layer.sliding_window = -1;
    batch.seq_lens_host[0] = std::numeric_limits<int32_t>::max();
    EXPECT_TRUE(check_windowed_lengths(layer, batch).is_ok());
  }
  // Sinks: 3e38 is refused, 1e37 and a very negative one (no weight) pass.
  std::vector<float> sinks = {0.5f, 3e38f};
  const TensorView view(sinks.data(), DType::kF32, Device::cpu(), {2});
  expect_error(check_sink_values(view), "layer.sinks[1] (q head 1) is 3e+38: sink x 2 log2(e)");
  sinks[1] = 1e37f;
  EXPECT_TRUE(check_sink_values(view).is_ok());
  sinks[1] = -3e38f;
  EXPECT_TRUE(check_sink_values(view).is_ok());
}

// The shared table's fp8_e4m3-pool extend with q given in e4m3 (CaseSpec::fp8_q), on the host.
Result<PreparedCase> prepare_fp8_q_case() {
  harness::CaseSpec spec = *harness::find_case("extend_fp8_e4m3_kv");
  spec.fp8_q = true;
  return harness::prepare_case(spec, Device::cpu());
}

// An e4m3 q (AttentionLayer::q_scale): refused by name unless the caller passes allow_fp8_q (fa3's
// FP8 prefill); with it, out / k / v must share out's activation dtype and q_scale must be finite
// and > 0. torch_native takes no e4m3 q.
TEST(ValidateFp8Q, RefusedUnlessAllowed) {
  Result<PreparedCase> pc = prepare_fp8_q_case();
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  const harness::LayerData& l = pc->layers[0];
  ASSERT_EQ(l.q.dtype, DType::kFP8E4M3);
  AttentionLayer layer = l.layer;
  const auto validate = [&](bool allow, const TensorView& out) {
    return validate_forward_inputs(l.q, l.k, l.v, out, layer, pc->batch, true, l.lse, Device::cpu(),
                                   allow);
  };
  expect_error(validate(false, l.out),
               "q: dtype fp8_e4m3 is not supported (expected f32, f16 or bf16)");
  EXPECT_TRUE(validate(true, l.out).is_ok()) << validate(true, l.out).to_string();
  // out in another activation dtype than k / v.
  std::vector<float> out_f32(static_cast<size_t>(l.out.numel()));
  TensorView out32(out_f32.data(), DType::kF32, Device::cpu(),
                   {l.out.size(0), l.out.size(1), l.out.size(2)});
  expect_error(validate(true, out32), "k: dtype bf16 must equal out's dtype f32");
  // out in e4m3: no activation dtype.
  std::vector<uint8_t> out_e4m3(static_cast<size_t>(l.out.numel()));
  TensorView out8(out_e4m3.data(), DType::kFP8E4M3, Device::cpu(),
                  {l.out.size(0), l.out.size(1), l.out.size(2)});
  expect_error(validate(true, out8), "q: dtype fp8_e4m3 needs out / k / v in f32, f16 or bf16");
  for (float bad : {0.f, -1.f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    layer.q_scale = bad;
    expect_error(validate(true, l.out), "layer.q_scale ");
  }
  // Finite and > 0, but folded into the softmax scale (x log2(e) x k_scale) below the normal
  // range: uniform rows had followed; refused only for an e4m3 q, which folds it.
  layer.q_scale = 1e-38f;
  expect_error(validate(true, l.out), "x layer.q_scale 1e-38 (the softmax scale of an fp8_e4m3 q");
  layer.q_scale = l.layer.q_scale;
  auto b = std::move(create_torch_native_backend(pc->context())).value();
  expect_error(harness::run_backend(*b, *pc, true), "q: dtype fp8_e4m3 is not supported");
}

// The fp64 reference reads an e4m3 q times q_scale: the same logits as the f32 q holding those
// values (a check of the harness's fp8_q cases, whose reference the GPU tests compare against).
TEST(ValidateFp8Q, ReferenceDequantisesQ) {
  Result<PreparedCase> pc = prepare_fp8_q_case();
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  const harness::LayerData& l = pc->layers[0];
  ASSERT_GT(l.layer.q_scale, 0.f);
  ASSERT_NE(l.layer.q_scale, 1.f);
  // The new tokens' K / V (a backend's save_kv; until then their pool rows hold the NaN poison).
  ASSERT_TRUE(pc->kv_pool
                  ->set_kv(l.layer.layer_id, pc->batch.out_cache_loc, l.k, l.v, l.layer.k_scale,
                           l.layer.v_scale, nullptr)
                  .is_ok());
  std::vector<float> qf(static_cast<size_t>(l.q.numel()));
  for (size_t i = 0; i < qf.size(); ++i) {
    qf[i] = load_as_float(l.q.data, DType::kFP8E4M3, static_cast<int64_t>(i)) * l.layer.q_scale;
  }
  const TensorView q32(qf.data(), DType::kF32, Device::cpu(),
                       {l.q.size(0), l.q.size(1), l.q.size(2)});
  AttentionLayer plain = l.layer;
  plain.q_scale = 7.f;  // ignored for an f32 q
  Result<reference::ReferenceOutput> a =
      reference::compute_attention_fp64(l.q, TensorView(), TensorView(), l.layer, pc->batch);
  Result<reference::ReferenceOutput> b =
      reference::compute_attention_fp64(q32, TensorView(), TensorView(), plain, pc->batch);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_EQ(a->out.size(), b->out.size());
  double worst = 0.0, peak = 0.0;
  int64_t non_finite = 0;
  for (size_t i = 0; i < a->out.size(); ++i) {
    non_finite += std::isfinite(a->out[i]) && std::isfinite(b->out[i]) ? 0 : 1;
    worst = std::max(worst, std::fabs(a->out[i] - b->out[i]));
    peak = std::max(peak, std::fabs(b->out[i]));
  }
  EXPECT_EQ(non_finite, 0);
  EXPECT_GT(peak, 0.1);
  // The f32 q rounds code x q_scale to 24 bits; the reference multiplies in fp64.
  EXPECT_LT(worst, 1e-5 * std::max(1.0, peak));
  ASSERT_EQ(a->lse.size(), b->lse.size());
  for (size_t i = 0; i < a->lse.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a->lse[i])) << "row " << i;
    EXPECT_NEAR(a->lse[i], b->lse[i], 1e-5);
  }
}

// A non-absorbed MLA layer (192 / 128) reads only the new tokens' k / v: over a decode or verify
// batch it returned ok with the cached history left out of every output row.
TEST(TorchNativeBadInput, MlaNonAbsorbedLayerRefusedInDecodeAndVerify) {
  for (const char* name : {"mla_decode_page1", "mla_verify_topk1_page1"}) {
    Result<PreparedCase> pc = harness::prepare_case(*harness::find_case(name), Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << name;
    auto b = std::move(create_torch_native_backend(pc->context())).value();
    ASSERT_TRUE(b->init_forward_metadata(pc->batch).is_ok()) << name;
    const harness::LayerData& l = pc->layers[0];
    AttentionLayer layer = l.layer;
    layer.qk_head_dim = 192;
    layer.v_head_dim = 128;
    layer.num_kv_heads = layer.num_q_heads;
    expect_error(b->forward(l.q, l.k, l.v, l.out, layer, pc->batch, false, l.lse),
                 std::string("MLA non-absorbed layer (qk_head_dim 192 != kv_lora_rank + "
                             "qk_rope_head_dim 576) in a ") +
                     forward_mode_name(pc->batch.mode) + " batch");
  }
}

}  // namespace
}  // namespace attnkit
