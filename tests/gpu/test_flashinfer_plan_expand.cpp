// The flashinfer replay refresh's GPU plan expansion
// (src/backends/flashinfer/kernels/plan_expand.h): from WorkPlan::serialize's words the kernel
// writes, word for word, what BalancedPlan::serialize writes for balanced_from_work_plan's plan,
// for random batches (uniform and uneven, split and not, 1-8 kv heads, groups 1-20, fewer CTAs than
// slots, exactly as many and more); the output buffer is poisoned first, so a word the kernel skips
// fails. Bad parameters are refused by name.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/flashinfer/kernels/balanced_plan.h"
#include "backends/flashinfer/kernels/plan_expand.h"
#include "support/flashinfer_plan_requests.h"
#include "support/gpu_test_helpers.h"

namespace attnkit::flashinfer {
namespace {

using attnkit::test_support::has_cuda;
using test_support::decode_requests;

// The backend's planner configs for a decode batch of bs requests on an H200-sized grid (132 SMs;
// granule 16, the ring's sub-tile).
struct Configs {
  PlanConfig plan;
  BalanceConfig balance;
};
Configs configs_for(int bs, int heads, int group) {
  Configs c;
  c.plan.num_kv_heads = c.balance.num_kv_heads = heads;
  c.plan.group = c.balance.group = group;
  c.plan.target_ctas = 132;
  c.balance.slots = balanced_kernel_slots(bs, c.plan);
  c.balance.granule = 16;
  return c;
}

// The launch parameters of the plans from lengths (4 KB: on the heap).
std::unique_ptr<PlanFromLengthsParams> lengths_params(const std::vector<int>& lens,
                                                      const BalanceConfig& bc, int32_t* d_out) {
  auto p = std::make_unique<PlanFromLengthsParams>();
  p->bs = static_cast<int>(lens.size());
  p->heads = bc.num_kv_heads;
  p->q_tiles = (bc.group + kDecodeTileRows - 1) / kDecodeTileRows;
  p->slots = bc.slots;
  p->granule = bc.granule;
  p->out = d_out;
  std::copy(lens.begin(), lens.end(), p->kv_len);
  return p;
}

// Poisons d_out ([cap] words), runs `launch` (a plan kernel writing d_out) and checks that the
// words are `want` and that nothing past them was written.
void expect_plan_words(const std::vector<int32_t>& want, int32_t* d_out, size_t cap,
                       const std::function<Status()>& launch) {
  ASSERT_LE(want.size() + 8, cap);
  CUDA_OK(cudaMemset(d_out, 0x7f, cap * sizeof(int32_t)));
  const Status st = launch();
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  std::vector<int32_t> got(want.size() + 8);
  CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (size_t w = 0; w < want.size(); ++w) {
    ASSERT_EQ(got[w], want[w]) << "word " << w << " of " << want.size();
  }
  for (size_t w = want.size(); w < got.size(); ++w) {
    ASSERT_EQ(got[w], 0x7f7f7f7f) << "word " << w << " past the plan was written";
  }
}

TEST(FlashInferPlanExpand, MatchesTheHostEncoderWordForWord) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20261126);
  int32_t* d_work = nullptr;
  int32_t* d_out = nullptr;
  const size_t cap = size_t{1} << 20;  // words
  CUDA_OK(cudaMalloc(&d_work, cap * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(&d_out, cap * sizeof(int32_t)));
  int checked = 0, split_plans = 0, empty_slots = 0, several_per_slot = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int heads = std::vector<int>{1, 2, 8}[static_cast<size_t>(trial % 3)];
    const int group = std::vector<int>{1, 4, 20}[static_cast<size_t>((trial / 3) % 3)];
    const int bs = std::uniform_int_distribution<int>(1, 300)(rng);
    std::vector<int> lens(static_cast<size_t>(bs));
    const int common = std::uniform_int_distribution<int>(1, 40000)(rng);
    for (int& l : lens) {
      l = trial % 2 == 0 ? common : std::uniform_int_distribution<int>(1, 20000)(rng);
    }
    const Configs cfg = configs_for(bs, heads, group);
    const PlanConfig& pc = cfg.plan;
    const BalanceConfig& bc = cfg.balance;
    Result<WorkPlan> wp = build_work_plan(decode_requests(lens), pc);
    ASSERT_TRUE(wp.is_ok()) << wp.status().to_string();
    const int64_t ctas = static_cast<int64_t>(wp->items.size()) * heads;
    SCOPED_TRACE("trial " + std::to_string(trial) + " bs " + std::to_string(bs) + " heads " +
                 std::to_string(heads) + " group " + std::to_string(group) + " slots " +
                 std::to_string(bc.slots) + " ctas " + std::to_string(ctas));
    Result<BalancedPlan> bp = balanced_from_work_plan(*wp, bc);
    ASSERT_TRUE(bp.is_ok()) << bp.status().to_string();
    std::vector<int32_t> want;
    bp->serialize(&want);
    std::vector<int32_t> work;
    wp->serialize(&work);
    ASSERT_LE(work.size(), cap);
    CUDA_OK(cudaMemcpy(d_work, work.data(), work.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    PlanExpandParams p;
    p.work_words = d_work;
    p.bs = bs;
    p.items = static_cast<int>(wp->items.size());
    p.heads = heads;
    p.q_tiles = (group + kDecodeTileRows - 1) / kDecodeTileRows;
    p.slots = bc.slots;
    p.out = d_out;
    expect_plan_words(want, d_out, cap, [&] { return expand_encoded_plan(p, nullptr); });
    if (HasFatalFailure()) break;
    ++checked;
    split_plans += wp->any_split ? 1 : 0;
    empty_slots += ctas < bc.slots ? 1 : 0;
    several_per_slot += ctas > bc.slots ? 1 : 0;
  }
  // The random batches covered split plans, grids with empty slots and slots of several CTAs.
  EXPECT_GT(checked, 150);
  EXPECT_GT(split_plans, 5);
  EXPECT_GT(empty_slots, 5);
  EXPECT_GT(several_per_slot, 5);
  cudaFree(d_work);
  cudaFree(d_out);
}

// expand_plan_from_lengths: for decode batches that build_work_plan does not split (enough
// requests for the per-head target, or none longer than kMinSplitChunk), the plan from the lengths
// alone is word for word the host encoder's plan of the host work plan (q tiles 1 and 2, fewer
// CTAs than slots, exactly as many and more, up to kPlanLengthsMax requests).
TEST(FlashInferPlanExpand, FromLengthsMatchesTheHostEncoder) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20261127);
  int32_t* d_out = nullptr;
  const size_t cap = size_t{1} << 21;  // words
  CUDA_OK(cudaMalloc(&d_out, cap * sizeof(int32_t)));
  int checked = 0, empty_slots = 0, several_per_slot = 0, two_tiles = 0, short_batches = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int heads = std::vector<int>{1, 2, 8}[static_cast<size_t>(trial % 3)];
    const int group = std::vector<int>{1, 4, 20}[static_cast<size_t>((trial / 3) % 3)];
    const bool short_only = trial % 5 == 0;  // any bs, no request longer than kMinSplitChunk
    const int bs = trial == 1 ? kPlanLengthsMax
                              : std::uniform_int_distribution<int>(short_only ? 1 : 140,
                                                                   short_only ? 100 : 700)(rng);
    const int max_len = short_only ? kMinSplitChunk : 30000;
    std::vector<int> lens(static_cast<size_t>(bs));
    const int common = std::uniform_int_distribution<int>(1, max_len)(rng);
    for (int& l : lens) {
      l = trial % 2 == 0 ? common : std::uniform_int_distribution<int>(1, max_len)(rng);
    }
    const Configs cfg = configs_for(bs, heads, group);
    const PlanConfig& pc = cfg.plan;
    const BalanceConfig& bc = cfg.balance;
    const int q_tiles = (group + kDecodeTileRows - 1) / kDecodeTileRows;
    Result<WorkPlan> wp = build_work_plan(decode_requests(lens), pc);
    ASSERT_TRUE(wp.is_ok()) << wp.status().to_string();
    ASSERT_FALSE(wp->any_split) << "the batch was meant not to split";
    ASSERT_EQ(static_cast<int64_t>(wp->items.size()), int64_t{bs} * q_tiles);
    const int64_t ctas = int64_t{bs} * q_tiles * heads;
    SCOPED_TRACE("trial " + std::to_string(trial) + " bs " + std::to_string(bs) + " heads " +
                 std::to_string(heads) + " group " + std::to_string(group) + " slots " +
                 std::to_string(bc.slots));
    Result<BalancedPlan> bp = balanced_from_work_plan(*wp, bc);
    ASSERT_TRUE(bp.is_ok()) << bp.status().to_string();
    std::vector<int32_t> want;
    bp->serialize(&want);
    const auto p = lengths_params(lens, bc, d_out);
    expect_plan_words(want, d_out, cap, [&] { return expand_plan_from_lengths(*p, nullptr); });
    if (HasFatalFailure()) break;
    ++checked;
    empty_slots += ctas < bc.slots ? 1 : 0;
    several_per_slot += ctas > bc.slots ? 1 : 0;
    two_tiles += q_tiles > 1 ? 1 : 0;
    short_batches += short_only ? 1 : 0;
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(several_per_slot, 5);
  EXPECT_GT(empty_slots, 5);
  EXPECT_GT(two_tiles, 5);
  EXPECT_GT(short_batches, 5);
  cudaFree(d_out);
}

// cut_plan_from_lengths: the cut plan written by one CTA is word for word build_balanced_plan's
// (serialised) for random decode batches: uniform, uneven and one long request among short ones;
// 1-8 kv heads, groups 1-20 (two q tiles), the backend's slots and arbitrary ones, granules 1 /
// 16 / 64; chunks down to the granule, items cut into many parts, chunks over many items (1-64
// slots), and plans whose search arrays need more than the 48 KB a launch gets without opting in
// (bs up to 1000 at 8 kv heads).
TEST(FlashInferPlanExpand, CutPlanFromLengthsMatchesTheHostPlanner) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20261128);
  int32_t* d_out = nullptr;
  const size_t cap = size_t{1} << 21;  // words
  CUDA_OK(cudaMalloc(&d_out, cap * sizeof(int32_t)));
  int checked = 0, many_parts = 0, many_items = 0, two_tiles = 0, opted_in = 0;
  const int64_t max_smem = cut_plan_max_smem();
  for (int trial = 0; trial < 300; ++trial) {
    const int heads = std::vector<int>{1, 2, 8}[static_cast<size_t>(trial % 3)];
    const int group = std::vector<int>{1, 4, 20}[static_cast<size_t>((trial / 3) % 3)];
    const int bs = trial == 7 || trial % 10 == 8
                       ? std::uniform_int_distribution<int>(600, kPlanLengthsMax)(rng)
                       : std::uniform_int_distribution<int>(1, 400)(rng);
    const int shape = trial % 4;  // uniform, uneven, one long, tiny
    std::vector<int> lens(static_cast<size_t>(bs));
    const int common = std::uniform_int_distribution<int>(1, 20000)(rng);
    for (int& l : lens) {
      l = shape == 0   ? common
          : shape == 1 ? std::uniform_int_distribution<int>(1, 20000)(rng)
          : shape == 2 ? std::uniform_int_distribution<int>(1, 2000)(rng)
                       : std::uniform_int_distribution<int>(1, 40)(rng);
    }
    if (shape == 2) lens[0] = 131072;
    BalanceConfig bc = configs_for(bs, heads, group).balance;
    if (trial % 5 == 4) bc.slots = std::uniform_int_distribution<int>(1, 64)(rng);
    bc.granule = std::vector<int>{16, 1, 64}[static_cast<size_t>((trial / 2) % 3)];
    const int q_tiles = (group + kDecodeTileRows - 1) / kDecodeTileRows;
    int64_t keys = 0;
    for (int l : lens) keys += l;
    if (keys * q_tiles * heads / bc.slots < bc.granule ||
        cut_plan_smem_bytes(bs, heads, q_tiles, bc.slots) > max_smem) {
      continue;  // the host planner's cases
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + " bs " + std::to_string(bs) + " heads " +
                 std::to_string(heads) + " group " + std::to_string(group) + " slots " +
                 std::to_string(bc.slots) + " granule " + std::to_string(bc.granule));
    Result<BalancedPlan> bp = build_balanced_plan(decode_requests(lens), bc);
    ASSERT_TRUE(bp.is_ok()) << bp.status().to_string();
    std::vector<int32_t> want;
    bp->serialize(&want);
    const auto p = lengths_params(lens, bc, d_out);
    expect_plan_words(want, d_out, cap, [&] { return cut_plan_from_lengths(*p, nullptr); });
    if (HasFatalFailure()) break;
    ++checked;
    int max_parts = 0;
    for (const Segment& seg : bp->segments) max_parts = std::max<int>(max_parts, seg.parts);
    many_parts += max_parts > 8 ? 1 : 0;
    int max_segments = 0;
    for (int c = 0; c < bp->slots(); ++c) {
      max_segments = std::max(max_segments, bp->cta_begin[c + 1] - bp->cta_begin[c]);
    }
    many_items += max_segments > 8 ? 1 : 0;
    two_tiles += q_tiles > 1 ? 1 : 0;
    opted_in += cut_plan_smem_bytes(bs, heads, q_tiles, bc.slots) > 47 * 1024 ? 1 : 0;
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(opted_in, 5);
  EXPECT_GT(many_parts, 10);
  EXPECT_GT(many_items, 10);
  EXPECT_GT(two_tiles, 10);
  cudaFree(d_out);
}

TEST(FlashInferPlanExpand, BadParametersAreRefusedByName) {
  PlanExpandParams p;
  int32_t dummy = 0;
  p.work_words = &dummy;
  p.out = &dummy;
  p.items = 1 << 22;
  p.heads = 8;
  p.slots = 128;  // 2^25 CTAs: past the 32-bit segment indices' bound of 2^24
  Status st = expand_encoded_plan(p, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("items x heads <= 16777216"), std::string::npos) << st.to_string();
  p.items = 1;
  p.work_words = nullptr;
  st = expand_encoded_plan(p, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("work_words"), std::string::npos) << st.to_string();

  auto l = std::make_unique<PlanFromLengthsParams>();
  l->out = &dummy;
  l->bs = kPlanLengthsMax + 1;
  st = expand_plan_from_lengths(*l, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("bs " + std::to_string(kPlanLengthsMax + 1)), std::string::npos)
      << st.to_string();
  l->bs = 3;
  l->heads = 8;
  l->slots = 24;
  l->q_tiles = 1 << 22;  // 3 x 2^25 CTAs
  st = expand_plan_from_lengths(*l, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("<= 16777216"), std::string::npos) << st.to_string();
  l->q_tiles = 1;
  l->kv_len[0] = l->kv_len[2] = 5;  // request 1 has no key
  st = expand_plan_from_lengths(*l, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("request 1 has kv_len 0"), std::string::npos) << st.to_string();

  l->kv_len[1] = 5;  // 15 x 8 keys on 24 slots: chunks of 5 keys, below a granule of 16
  l->granule = 16;
  st = cut_plan_from_lengths(*l, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("below the granule of 16"), std::string::npos) << st.to_string();
  l->granule = 1;
  std::fill(l->kv_len, l->kv_len + kPlanLengthsMax, 100);
  l->bs = kPlanLengthsMax;  // 1000 requests x 8 heads on 32767 slots: 433 KB, past every GPU's
  l->slots = 32767;
  st = cut_plan_from_lengths(*l, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("shared memory"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace attnkit::flashinfer
