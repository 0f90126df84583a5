// GPU set_kv quantisation (bit-identical to the CPU pool for every KV dtype) and the GPU metadata
// kernels (token indices, page tables, draft multi-step indices) against host builds.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"
#include "cuda/common/metadata_kernels.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

using test_support::has_cuda;
using test_support::to_host_bytes;
using test_support::upload_bytes;

struct SetKvCase {
  DType pool_dtype;
  DType src_dtype;
  float scale;
};

class CudaSetKvTest : public ::testing::TestWithParam<SetKvCase> {};

// The CUDA scatter must write exactly the bytes the CPU scatter writes (values and fp4 scales).
TEST_P(CudaSetKvTest, MatchesCpuPoolBitForBit) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  const SetKvCase c = GetParam();
  constexpr int kTokens = 37, kHeads = 3, kDim = 64, kPage = 16, kSlots = 256;
  KVPoolConfig cfg;
  cfg.num_layers = 1;
  cfg.size = kSlots;
  cfg.page_size = kPage;
  cfg.dtype = c.pool_dtype;
  cfg.num_kv_heads = kHeads;
  cfg.head_dim = kDim;
  cfg.v_head_dim = kDim;
  cfg.device = Device::cpu();
  auto cpu = MHAKVPool::create(cfg);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  cfg.device = Device::cuda(0);
  auto gpu = MHAKVPool::create(cfg);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();

  // Random values over a wide range (saturation of fp8/fp4 included), distinct random slots.
  std::mt19937 rng(static_cast<uint32_t>(c.pool_dtype) * 31 + static_cast<uint32_t>(c.src_dtype));
  std::uniform_real_distribution<float> mag(-600.f, 600.f);
  std::uniform_real_distribution<float> small(-2.f, 2.f);
  const int64_t n = static_cast<int64_t>(kTokens) * kHeads * kDim;
  std::vector<uint8_t> k_host(static_cast<size_t>(dtype_storage_bytes(c.src_dtype, n)));
  std::vector<uint8_t> v_host(k_host.size());
  const TensorView kh(k_host.data(), c.src_dtype, Device::cpu(), {kTokens, kHeads, kDim});
  const TensorView vh(v_host.data(), c.src_dtype, Device::cpu(), {kTokens, kHeads, kDim});
  for (int64_t i = 0; i < n; ++i) {
    store_from_float(k_host.data(), c.src_dtype, i, (i % 7 == 0) ? mag(rng) : small(rng));
    store_from_float(v_host.data(), c.src_dtype, i, small(rng));
  }
  std::vector<int64_t> slots(kSlots);
  std::iota(slots.begin(), slots.end(), kPage);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(kTokens);
  const TensorView loc_h(slots.data(), DType::kI64, Device::cpu(), {kTokens});
  STATUS_OK(cpu.value()->set_kv(0, loc_h, kh, vh, c.scale, c.scale * 0.5f, nullptr));

  Buffer kd = upload_bytes(k_host.data(), static_cast<int64_t>(k_host.size()));
  Buffer vd = upload_bytes(v_host.data(), static_cast<int64_t>(v_host.size()));
  Buffer ld = upload_bytes(slots.data(), kTokens * static_cast<int64_t>(sizeof(int64_t)));
  STATUS_OK(gpu.value()->set_kv(
      0, ld.view(DType::kI64, {kTokens}), kd.view(c.src_dtype, {kTokens, kHeads, kDim}),
      vd.view(c.src_dtype, {kTokens, kHeads, kDim}), c.scale, c.scale * 0.5f, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto compare_rows = [&](const TensorView& cpu_buf, const TensorView& gpu_buf, const char* what) {
    if (!cpu_buf.defined()) return;
    const std::vector<uint8_t> g = to_host_bytes(gpu_buf);
    const auto* cbytes = static_cast<const uint8_t*>(cpu_buf.data);
    const int64_t row_bytes = cpu_buf.storage_bytes() / cpu_buf.size(0);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t off = slots[t] * row_bytes;
      ASSERT_EQ(std::memcmp(cbytes + off, g.data() + off, static_cast<size_t>(row_bytes)), 0)
          << what << " token " << t << " slot " << slots[t];
    }
  };
  compare_rows(cpu.value()->k_buffer(0), gpu.value()->k_buffer(0), "k");
  compare_rows(cpu.value()->v_buffer(0), gpu.value()->v_buffer(0), "v");
  compare_rows(cpu.value()->k_scale_buffer(0), gpu.value()->k_scale_buffer(0), "k scales");
  compare_rows(cpu.value()->v_scale_buffer(0), gpu.value()->v_scale_buffer(0), "v scales");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaSetKvTest,
                         ::testing::Values(SetKvCase{DType::kBF16, DType::kF32, 1.f},
                                           SetKvCase{DType::kF16, DType::kBF16, 1.f},
                                           SetKvCase{DType::kF32, DType::kF16, 1.f},
                                           SetKvCase{DType::kFP8E4M3, DType::kBF16, 1.f},
                                           SetKvCase{DType::kFP8E4M3, DType::kF32, 0.37f},
                                           SetKvCase{DType::kFP8E5M2, DType::kF16, 2.5f},
                                           SetKvCase{DType::kFP4E2M1, DType::kBF16, 1.f},
                                           SetKvCase{DType::kFP4E2M1, DType::kF32, 0.21f}),
                         [](const ::testing::TestParamInfo<SetKvCase>& info) {
                           std::string s = std::string(dtype_name(info.param.pool_dtype)) +
                                           "_from_" + dtype_name(info.param.src_dtype) + "_" +
                                           std::to_string(info.index);
                           return s;
                         });

// A req_to_token pool with shuffled slots and random lengths, shared by the metadata tests.
struct MetaFixture {
  static constexpr int kReqs = 6;
  static constexpr int kCtx = 300;
  std::unique_ptr<ReqToTokenPool> host_pool, dev_pool;
  std::vector<int32_t> rows, lens, starts;

  void build(int page_size, std::mt19937& rng) {
    host_pool = std::move(ReqToTokenPool::create(kReqs, kCtx, Device::cpu())).value();
    dev_pool = std::move(ReqToTokenPool::create(kReqs, kCtx, Device::cuda(0))).value();
    std::vector<int64_t> pages(kReqs * kCtx / page_size + 8);
    std::iota(pages.begin(), pages.end(), 1);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::uniform_int_distribution<int> len(0, kCtx);
    size_t next_page = 0;
    for (int r = 0; r < kReqs; ++r) {
      const int row = host_pool->alloc().value();
      ASSERT_EQ(dev_pool->alloc().value(), row);
      const int n = r == 0 ? 0 : len(rng);
      std::vector<int64_t> slots;
      for (int i = 0; i < n; ++i) {
        if (i % page_size == 0) ++next_page;
        slots.push_back(pages[next_page - 1] * page_size + i % page_size);
      }
      ASSERT_TRUE(host_pool->write(row, 0, slots).is_ok());
      ASSERT_TRUE(dev_pool->write(row, 0, slots).is_ok());
      rows.push_back(row);
      lens.push_back(n);
      starts.push_back(n > 3 ? n / 3 : 0);
    }
  }
};

// MHAKVPool::wrap / MLAKVPool::wrap take the views' device from the caller; CUDA is asked where
// the memory is, so host memory labelled cuda:0 is refused by name instead of faulting in a
// kernel, while device and managed memory are taken.
TEST(CudaWrapTest, HostMemoryLabelledCudaIsRefused) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  KVPoolConfig c = test_support::small_bf16_mha_pool_config(32, Device::cuda(0));
  const int64_t rows = c.size + c.page_size;
  const int64_t bytes = rows * c.num_kv_heads * c.head_dim * 2;
  std::vector<uint16_t> pageable(static_cast<size_t>(bytes / 2), 0);
  void* pinned_raw = nullptr;
  void* managed_raw = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned_raw, static_cast<size_t>(bytes)), cudaSuccess);
  const std::unique_ptr<void, cudaError_t (*)(void*)> pinned(pinned_raw, cudaFreeHost);
  ASSERT_EQ(cudaMallocManaged(&managed_raw, static_cast<size_t>(bytes)), cudaSuccess);
  const std::unique_ptr<void, cudaError_t (*)(void*)> managed(managed_raw, cudaFree);
  Result<Buffer> dk = Buffer::allocate(Device::cuda(0), bytes);
  Result<Buffer> dv = Buffer::allocate(Device::cuda(0), bytes);
  ASSERT_TRUE(dk.is_ok() && dv.is_ok());
  const auto view = [&](void* p) {
    return TensorView(p, DType::kBF16, Device::cuda(0), {rows, c.num_kv_heads, c.head_dim});
  };
  const std::vector<TensorView> on_device = {view(dv->data())};
  for (const auto& [data, what] :
       {std::pair<void*, const char*>{pageable.data(),
                                      "is memory CUDA neither allocated nor "
                                      "registered (pageable host memory, say)"},
        {pinned.get(), "is pinned host memory"}}) {
    const std::vector<TensorView> k = {view(data)};
    const Status st = MHAKVPool::wrap(c, k, on_device).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("k[0]: address "), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("not device memory of cuda:0"), std::string::npos)
        << st.to_string();
  }
  for (void* ok_memory : {dk->data(), managed.get()}) {
    const std::vector<TensorView> k = {view(ok_memory)};
    Result<std::unique_ptr<MHAKVPool>> ok = MHAKVPool::wrap(c, k, on_device);
    EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();
  }

  KVPoolConfig m;
  m.num_layers = 1;
  m.size = 32;
  m.page_size = 16;
  m.dtype = DType::kBF16;
  m.device = Device::cuda(0);
  m.kv_lora_rank = 64;
  m.qk_rope_head_dim = 64;  // a row of 128 bf16: fits the pageable buffer
  const std::vector<TensorView> latent = {
      TensorView(pageable.data(), DType::kBF16, Device::cuda(0), {rows, 1, 128})};
  const Status mla = MLAKVPool::wrap(m, latent).status();
  EXPECT_EQ(mla.code(), StatusCode::kInvalidArgument) << mla.to_string();
  EXPECT_NE(mla.message().find("kv[0]: address "), std::string::npos) << mla.to_string();
  EXPECT_NE(mla.message().find("pageable host memory"), std::string::npos) << mla.to_string();
}

TEST(CudaMetadataTest, TokenIndicesMatchHost) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  MetaFixture f;
  f.build(16, rng);
  const int bs = MetaFixture::kReqs;
  // Covers [start, len) of each row: lengths relative to the start.
  std::vector<int32_t> rel(bs);
  for (int r = 0; r < bs; ++r) rel[r] = f.lens[r] - f.starts[r];
  auto host = build_token_indices_host(*f.host_pool, f.rows, f.lens, f.starts);
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  Buffer rows = upload_bytes(f.rows.data(), bs * 4);
  Buffer starts = upload_bytes(f.starts.data(), bs * 4);
  Buffer lens = upload_bytes(rel.data(), bs * 4);
  const int64_t total = host->kv_indptr.back();
  auto indptr = Buffer::allocate(Device::cuda(0), (bs + 1) * 4);
  auto indices = Buffer::allocate(Device::cuda(0), std::max<int64_t>(total, 1) * 4);
  ASSERT_TRUE(indptr.is_ok() && indices.is_ok());
  ASSERT_TRUE(fill_float(indptr->view(DType::kF32, {bs + 1}), -1.f).is_ok());
  cuda::TokenIndexArgs a;
  a.req_to_token = f.dev_pool->table().data_as<const int32_t>();
  a.req_to_token_stride = f.dev_pool->table().stride(0);
  a.req_pool_indices = static_cast<const int32_t*>(rows.data());
  a.start = static_cast<const int32_t*>(starts.data());
  a.len = static_cast<const int32_t*>(lens.data());
  a.bs = bs;
  a.kv_indptr = static_cast<int32_t*>(indptr->data());
  a.kv_indices = static_cast<int32_t*>(indices->data());
  STATUS_OK(cuda::build_token_indices(a, nullptr));
  std::vector<int32_t> got_indptr(bs + 1), got_indices(total);
  STATUS_OK(
      copy_bytes(got_indptr.data(), Device::cpu(), indptr->data(), Device::cuda(0), (bs + 1) * 4));
  STATUS_OK(
      copy_bytes(got_indices.data(), Device::cpu(), indices->data(), Device::cuda(0), total * 4));
  EXPECT_EQ(got_indptr, host->kv_indptr);
  EXPECT_EQ(got_indices, host->kv_indices);
}

TEST(CudaMetadataTest, PageTableMatchesHost) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  for (int page : {1, 16, 24, 64}) {
    SCOPED_TRACE("page " + std::to_string(page));
    std::mt19937 rng(page);
    MetaFixture f;
    f.build(page, rng);
    const int bs = MetaFixture::kReqs;
    int max_pages = 0;
    auto host = build_page_table_host(*f.host_pool, f.rows, f.lens, page, &max_pages);
    ASSERT_TRUE(host.is_ok()) << host.status().to_string();
    Buffer rows = upload_bytes(f.rows.data(), bs * 4);
    Buffer lens = upload_bytes(f.lens.data(), bs * 4);
    auto table = Buffer::allocate(Device::cuda(0), static_cast<int64_t>(bs) * max_pages * 4);
    ASSERT_TRUE(table.is_ok());
    ASSERT_TRUE(fill_float(table->view(DType::kF32, {bs, max_pages}), -1.f).is_ok());
    cuda::PageTableArgs a;
    a.req_to_token = f.dev_pool->table().data_as<const int32_t>();
    a.req_to_token_stride = f.dev_pool->table().stride(0);
    a.req_pool_indices = static_cast<const int32_t*>(rows.data());
    a.seq_lens = static_cast<const int32_t*>(lens.data());
    a.bs = bs;
    a.page_size = page;
    a.max_pages = max_pages;
    a.page_table = static_cast<int32_t*>(table->data());
    STATUS_OK(cuda::build_page_table(a, nullptr));
    std::vector<int32_t> got(static_cast<size_t>(bs) * max_pages);
    STATUS_OK(copy_bytes(got.data(), Device::cpu(), table->data(), Device::cuda(0),
                         static_cast<int64_t>(got.size()) * 4));
    EXPECT_EQ(got, host.value());
  }
}

TEST(CudaMetadataTest, DraftDecodeIndicesFollowTheirBranch) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  MetaFixture f;
  f.build(1, rng);
  constexpr int kTopk = 3, kSteps = 4;
  const int bs = MetaFixture::kReqs;
  std::vector<int64_t> drafts(static_cast<size_t>(bs) * kTopk * kSteps);
  std::uniform_int_distribution<int64_t> slot(1, 100000);
  for (int64_t& d : drafts) d = slot(rng);
  // Expected: for each step s, row (b, j): committed slots then drafts[b, j, 0..s].
  std::vector<std::vector<int32_t>> want_indptr(kSteps), want_indices(kSteps);
  int64_t stride = 0;
  for (int s = 0; s < kSteps; ++s) {
    want_indptr[s].push_back(0);
    for (int b = 0; b < bs; ++b) {
      const int32_t* row = f.host_pool->host_row(f.rows[b]);
      for (int j = 0; j < kTopk; ++j) {
        for (int i = 0; i < f.lens[b]; ++i) want_indices[s].push_back(row[i]);
        for (int i = 0; i <= s; ++i) {
          want_indices[s].push_back(static_cast<int32_t>(drafts[(b * kTopk + j) * kSteps + i]));
        }
        want_indptr[s].push_back(static_cast<int32_t>(want_indices[s].size()));
      }
    }
    stride = std::max<int64_t>(stride, static_cast<int64_t>(want_indices[s].size()));
  }
  Buffer rows = upload_bytes(f.rows.data(), bs * 4);
  Buffer lens = upload_bytes(f.lens.data(), bs * 4);
  Buffer dd = upload_bytes(drafts.data(), static_cast<int64_t>(drafts.size()) * 8);
  const int64_t indptr_n = static_cast<int64_t>(kSteps) * (bs * kTopk + 1);
  auto indptr = Buffer::allocate(Device::cuda(0), indptr_n * 4);
  auto indices = Buffer::allocate(Device::cuda(0), kSteps * stride * 4);
  ASSERT_TRUE(indptr.is_ok() && indices.is_ok());
  cuda::DraftIndexArgs a;
  a.req_to_token = f.dev_pool->table().data_as<const int32_t>();
  a.req_to_token_stride = f.dev_pool->table().stride(0);
  a.req_pool_indices = static_cast<const int32_t*>(rows.data());
  a.seq_lens = static_cast<const int32_t*>(lens.data());
  a.out_cache_loc = static_cast<const int64_t*>(dd.data());
  a.bs = bs;
  a.topk = kTopk;
  a.num_steps = kSteps;
  a.kv_indptr = static_cast<int32_t*>(indptr->data());
  a.kv_indices = static_cast<int32_t*>(indices->data());
  a.indices_stride = stride;
  STATUS_OK(cuda::build_draft_decode_indices(a, nullptr));
  std::vector<int32_t> got_indptr(indptr_n), got_indices(kSteps * stride);
  STATUS_OK(
      copy_bytes(got_indptr.data(), Device::cpu(), indptr->data(), Device::cuda(0), indptr_n * 4));
  STATUS_OK(copy_bytes(got_indices.data(), Device::cpu(), indices->data(), Device::cuda(0),
                       kSteps * stride * 4));
  for (int s = 0; s < kSteps; ++s) {
    const std::vector<int32_t> ip(got_indptr.begin() + s * (bs * kTopk + 1),
                                  got_indptr.begin() + (s + 1) * (bs * kTopk + 1));
    EXPECT_EQ(ip, want_indptr[s]) << "step " << s;
    const std::vector<int32_t> ix(got_indices.begin() + s * stride,
                                  got_indices.begin() + s * stride + want_indices[s].size());
    EXPECT_EQ(ix, want_indices[s]) << "step " << s;
  }
  // Bad arguments are rejected before any launch.
  a.topk = 0;
  EXPECT_EQ(cuda::build_draft_decode_indices(a, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnkit
