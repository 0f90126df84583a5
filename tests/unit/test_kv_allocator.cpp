// PageAllocator, ReqToTokenPool and the host view helpers (page table, token indices, last_loc).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "attnkit/kv_cache.h"

namespace attnkit {
namespace {

using Slots = std::vector<int64_t>;

// Pages touched by a list of slots, in order of first appearance.
std::vector<int64_t> pages_of(const Slots& slots, int page_size) {
  std::vector<int64_t> pages;
  for (int64_t s : slots) {
    if (pages.empty() || pages.back() != s / page_size) pages.push_back(s / page_size);
  }
  return pages;
}

class AllocatorPageSize : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(PageSizes, AllocatorPageSize, ::testing::Values(1, 16, 24, 64, 128),
                         [](const auto& info) { return "ps" + std::to_string(info.param); });

TEST_P(AllocatorPageSize, FreshExtendUsesWholePagesThenAPartialPage) {
  const int ps = GetParam();
  PageAllocator alloc(8, ps);
  const int32_t len = 2 * ps + (ps + 1) / 2;  // 2.5 pages (3 pages for ps 1: 3 tokens)
  const std::vector<int32_t> prefix{0}, seq{len};
  const Slots last{-1};
  auto r = alloc.alloc_extend(prefix, seq, last);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const Slots& slots = *r;
  ASSERT_EQ(static_cast<int32_t>(slots.size()), len);
  const int64_t expected_pages = (len + ps - 1) / ps;
  EXPECT_EQ(alloc.available_pages(), 8 - expected_pages);
  for (int32_t i = 0; i < len; ++i) {
    EXPECT_GE(slots[i], ps) << "slot in reserved page 0 at token " << i;
    EXPECT_EQ(slots[i] % ps, i % ps) << "token " << i << " is not at its page offset";
    if (i % ps != 0) EXPECT_EQ(slots[i], slots[i - 1] + 1) << "token " << i;
  }
  // Lowest page ids first.
  const auto pages = pages_of(slots, ps);
  for (size_t p = 0; p < pages.size(); ++p) EXPECT_EQ(pages[p], static_cast<int64_t>(p) + 1);
}

TEST_P(AllocatorPageSize, ExtendFillsThePartialLastPageFirst) {
  const int ps = GetParam();
  PageAllocator alloc(16, ps);
  const int32_t first_len = ps + std::max(1, ps / 3);  // ends inside page 2 (ps > 1)
  auto first =
      alloc.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{first_len}, Slots{-1});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const int64_t last_loc = first->back();
  const int64_t pages_before = alloc.available_pages();

  const int32_t grow = 2 * ps + 3;
  auto second = alloc.alloc_extend(std::vector<int32_t>{first_len},
                                   std::vector<int32_t>{first_len + grow}, Slots{last_loc});
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  ASSERT_EQ(static_cast<int32_t>(second->size()), grow);
  const int64_t room = (first_len % ps == 0) ? 0 : ps - first_len % ps;
  for (int64_t i = 0; i < room; ++i) EXPECT_EQ((*second)[i], last_loc + 1 + i) << "fill " << i;
  for (int32_t i = 0; i < grow; ++i) {
    EXPECT_EQ((*second)[i] % ps, (first_len + i) % ps) << "token " << first_len + i;
  }
  const int64_t new_pages = (grow - room + ps - 1) / ps;
  EXPECT_EQ(alloc.available_pages(), pages_before - new_pages);
}

TEST_P(AllocatorPageSize, DecodeCrossesPageBoundaries) {
  const int ps = GetParam();
  PageAllocator alloc(64, ps);
  Slots all;
  int64_t last = -1;
  const int total = 3 * ps + 2;
  for (int32_t len = 1; len <= total; ++len) {
    auto r = alloc.alloc_decode(std::vector<int32_t>{len}, Slots{last});
    ASSERT_TRUE(r.is_ok()) << "len " << len << ": " << r.status().to_string();
    ASSERT_EQ(r->size(), 1u);
    last = r->front();
    all.push_back(last);
    EXPECT_EQ(last % ps, (len - 1) % ps) << "len " << len;
  }
  EXPECT_EQ(alloc.available_pages(), 64 - (total + ps - 1) / ps);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), all.size()) << "slot reused";
}

TEST_P(AllocatorPageSize, RequestsNeverSharePages) {
  const int ps = GetParam();
  PageAllocator alloc(4096 / ps + 64, ps);
  std::mt19937 rng(1234 + ps);
  std::uniform_int_distribution<int32_t> len_dist(1, 3 * ps + 5);
  const int bs = 7;
  std::vector<int32_t> prefix(bs), seq(bs);
  Slots last(bs, -1);
  std::vector<Slots> owned(bs);
  // Several rounds of extends and decodes for the whole batch, all in one call each round.
  for (int round = 0; round < 6; ++round) {
    for (int b = 0; b < bs; ++b) {
      prefix[b] = seq[b];
      seq[b] = prefix[b] + (round % 2 == 0 ? len_dist(rng) : 1);
    }
    auto r = alloc.alloc_extend(prefix, seq, last);
    ASSERT_TRUE(r.is_ok()) << "round " << round << ": " << r.status().to_string();
    size_t pos = 0;
    for (int b = 0; b < bs; ++b) {
      for (int32_t i = prefix[b]; i < seq[b]; ++i) owned[b].push_back((*r)[pos++]);
      last[b] = owned[b].back();
    }
    ASSERT_EQ(pos, r->size());
  }
  std::map<int64_t, int> page_owner;
  for (int b = 0; b < bs; ++b) {
    for (size_t i = 0; i < owned[b].size(); ++i) {
      const int64_t page = owned[b][i] / ps;
      EXPECT_NE(page, 0) << "request " << b << " got page 0";
      EXPECT_EQ(owned[b][i] % ps, static_cast<int64_t>(i % ps))
          << "request " << b << " token " << i;
      auto [it, inserted] = page_owner.emplace(page, b);
      if (!inserted) EXPECT_EQ(it->second, b) << "page " << page << " shared";
    }
  }
}

TEST_P(AllocatorPageSize, OutOfPagesNamesCountsAndAllocatesNothing) {
  const int ps = GetParam();
  PageAllocator alloc(5, ps);
  ASSERT_TRUE(alloc.alloc_pages(2).is_ok());
  // 3 pages free; ask for 2 requests x 2 pages.
  auto r = alloc.alloc_extend(std::vector<int32_t>{0, 0}, std::vector<int32_t>{2 * ps, 2 * ps},
                              Slots{-1, -1});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(r.status().message().find("4 new pages"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("only 3"), std::string::npos) << r.status().message();
  EXPECT_EQ(alloc.available_pages(), 3);
  for (int64_t page = 3; page <= 5; ++page) EXPECT_FALSE(alloc.is_allocated(page));
  auto pages = alloc.alloc_pages(4);
  ASSERT_FALSE(pages.is_ok());
  EXPECT_EQ(pages.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(alloc.available_pages(), 3);
}

TEST_P(AllocatorPageSize, PageZeroIsNeverHandedOut) {
  const int ps = GetParam();
  const int64_t num_pages = 9;
  PageAllocator alloc(num_pages, ps);
  auto r = alloc.alloc_extend(std::vector<int32_t>{0},
                              std::vector<int32_t>{int32_t(num_pages) * ps}, Slots{-1});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::set<int64_t> pages;
  for (int64_t s : *r) pages.insert(s / ps);
  EXPECT_EQ(static_cast<int64_t>(pages.size()), num_pages);
  EXPECT_EQ(*pages.begin(), 1);
  EXPECT_EQ(*pages.rbegin(), num_pages);
  EXPECT_FALSE(alloc.is_allocated(0));
  EXPECT_EQ(alloc.available_slots(), 0);
  auto more = alloc.alloc_decode(std::vector<int32_t>{1}, Slots{-1});
  EXPECT_EQ(more.status().code(), StatusCode::kOutOfMemory);
}

TEST_P(AllocatorPageSize, FreeSlotsFreesEachPageOnceAndDetectsDoubleFree) {
  const int ps = GetParam();
  PageAllocator alloc(6, ps);
  auto r = alloc.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{3 * ps}, Slots{-1});
  ASSERT_TRUE(r.is_ok());
  const Slots first_page(r->begin(), r->begin() + ps);
  ASSERT_TRUE(alloc.free_slots(first_page).is_ok());
  EXPECT_EQ(alloc.available_pages(), 4);
  EXPECT_FALSE(alloc.is_allocated(1));
  // Second free of the same page, mixed with a live page: error, and the live page stays.
  Slots mixed = first_page;
  mixed.push_back((*r)[2 * ps]);
  Status st = alloc.free_slots(mixed);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("page 1"), std::string::npos) << st.message();
  EXPECT_TRUE(alloc.is_allocated(3));
  EXPECT_EQ(alloc.available_pages(), 4);
  // Freed page is handed out again first (lowest id).
  auto again = alloc.alloc_pages(1);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->front(), 1);
  // Page 0 and out-of-range pages are errors.
  EXPECT_FALSE(alloc.free_pages(std::vector<int64_t>{0}).is_ok());
  EXPECT_FALSE(alloc.free_pages(std::vector<int64_t>{7}).is_ok());
  EXPECT_FALSE(alloc.free_slots(Slots{ps - 1}).is_ok());
  EXPECT_FALSE(alloc.free_pages(std::vector<int64_t>{2, 2}).is_ok());
  EXPECT_TRUE(alloc.is_allocated(2));
}

TEST(PageAllocator, ValidatesInputs) {
  const int ps = 16;
  PageAllocator alloc(8, ps);
  auto base = alloc.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{20}, Slots{-1});
  ASSERT_TRUE(base.is_ok());
  const int64_t last = base->back();  // token 19 -> page offset 3
  const int64_t avail = alloc.available_pages();
  auto expect_invalid = [&](Result<Slots> r, const std::string& needle) {
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(alloc.available_pages(), avail);
  };
  expect_invalid(
      alloc.alloc_extend(std::vector<int32_t>{0, 0}, std::vector<int32_t>{1}, Slots{-1, -1}),
      "same length");
  expect_invalid(
      alloc.alloc_extend(std::vector<int32_t>{20}, std::vector<int32_t>{19}, Slots{last}),
      "seq_len 19");
  expect_invalid(
      alloc.alloc_extend(std::vector<int32_t>{21}, std::vector<int32_t>{30}, Slots{last}),
      "offset");
  expect_invalid(alloc.alloc_extend(std::vector<int32_t>{4}, std::vector<int32_t>{30}, Slots{3}),
                 "last_loc 3");
  expect_invalid(
      alloc.alloc_extend(std::vector<int32_t>{4}, std::vector<int32_t>{30}, Slots{5 * ps + 3}),
      "not allocated");
  expect_invalid(alloc.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{3}, Slots{7}),
                 "must be -1");
  expect_invalid(alloc.alloc_extend(std::vector<int32_t>{-1}, std::vector<int32_t>{3}, Slots{-1}),
                 "prefix_len -1");
  expect_invalid(alloc.alloc_extend(std::vector<int32_t>{20, 20}, std::vector<int32_t>{22, 22},
                                    Slots{last, last}),
                 "both fill page");
  expect_invalid(alloc.alloc_decode(std::vector<int32_t>{0}, Slots{-1}), "seq_len 0");
  EXPECT_EQ(alloc.alloc_pages(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(PageAllocator::create(-1, 16).is_ok());
  EXPECT_FALSE(PageAllocator::create(4, 0).is_ok());
  // Past the int32 slots: refused by name (it threw std::length_error / std::bad_alloc).
  for (const int64_t pages : {std::numeric_limits<int64_t>::max(), int64_t{1} << 40}) {
    const Status st = PageAllocator::create(pages, 16).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("KV slots are int32"), std::string::npos) << st.to_string();
  }
  EXPECT_TRUE(PageAllocator::create(1000, 16).is_ok());
  auto ok = PageAllocator::create(4, 24);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->available_slots(), 4 * 24);
}

// Errors name the call the user made, not the one it goes through (free_slots said "free_pages",
// alloc_decode "alloc_extend").
TEST(PageAllocator, ErrorsNameTheCallMade) {
  PageAllocator alloc(8, 16);
  const Status freed = alloc.free_slots(Slots{16 * 3});
  ASSERT_FALSE(freed.is_ok());
  EXPECT_EQ(freed.message().rfind("free_slots: page 3 is not allocated", 0), 0u) << freed.message();
  const auto decoded = alloc.alloc_decode(std::vector<int32_t>{5}, Slots{7});
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_EQ(decoded.status().message().rfind("alloc_decode", 0), 0u) << decoded.status().message();
}

TEST(PageAllocator, ExtendOfZeroNewTokensAllocatesNothing) {
  PageAllocator alloc(4, 16);
  auto base = alloc.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{16}, Slots{-1});
  ASSERT_TRUE(base.is_ok());
  auto r = alloc.alloc_extend(std::vector<int32_t>{16, 0}, std::vector<int32_t>{16, 0},
                              Slots{base->back(), -1});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(alloc.available_pages(), 3);
}

// ---- ReqToTokenPool ----

TEST(ReqToTokenPool, AllocFreeAndRowZeroReserved) {
  auto pool = ReqToTokenPool::create(3, 32, Device::cpu());
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  ReqToTokenPool& p = **pool;
  EXPECT_EQ(p.available(), 3);
  std::set<int> rows;
  for (int i = 0; i < 3; ++i) {
    auto r = p.alloc();
    ASSERT_TRUE(r.is_ok());
    EXPECT_GE(*r, 1);
    EXPECT_LE(*r, 3);
    rows.insert(*r);
  }
  EXPECT_EQ(rows.size(), 3u);
  EXPECT_EQ(p.alloc().status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(p.free(2).is_ok());
  Status twice = p.free(2);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("row 2"), std::string::npos) << twice.message();
  EXPECT_FALSE(p.free(0).is_ok());
  EXPECT_FALSE(p.free(4).is_ok());
  EXPECT_EQ(p.available(), 1);
  EXPECT_EQ(*p.alloc(), 2);

  const TensorView table = p.table();
  EXPECT_EQ(table.dtype, DType::kI32);
  EXPECT_EQ(table.size(0), 4);
  EXPECT_EQ(table.size(1), 32);
  EXPECT_FALSE(ReqToTokenPool::create(0, 32, Device::cpu()).is_ok());
  EXPECT_FALSE(ReqToTokenPool::create(2, 0, Device::cpu()).is_ok());
}

TEST(ReqToTokenPool, WriteChecksBoundsAndWritesNothingOnError) {
  auto pool = ReqToTokenPool::create(2, 8, Device::cpu()).value();
  const int row = pool->alloc().value();
  ASSERT_TRUE(pool->write(row, 2, Slots{40, 41, 42}).is_ok());
  const int32_t* host = pool->host_row(row);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host[2], 40);
  EXPECT_EQ(host[4], 42);
  // The device table (host memory here) sees the same values.
  const TensorView table = pool->table();
  EXPECT_EQ(table.data_as<int32_t>()[row * 8 + 3], 41);

  const std::vector<int32_t> before(host, host + 8);
  Status past_end = pool->write(row, 6, Slots{1, 2, 3});
  EXPECT_EQ(past_end.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past_end.message().find("max_context_len 8"), std::string::npos);
  Status too_big = pool->write(row, 0, Slots{5, int64_t{1} << 32});
  EXPECT_NE(too_big.message().find("slots[1]"), std::string::npos) << too_big.message();
  EXPECT_FALSE(pool->write(row, 0, Slots{-3}).is_ok());
  EXPECT_FALSE(pool->write(row, -1, Slots{3}).is_ok());
  EXPECT_FALSE(pool->write(0, 0, Slots{3}).is_ok());
  EXPECT_FALSE(pool->write(3, 0, Slots{3}).is_ok());
  EXPECT_EQ(std::vector<int32_t>(host, host + 8), before);
  const int32_t* row0 = pool->host_row(0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(row0[i], 0);
  EXPECT_EQ(pool->host_row(3), nullptr);
}

// A row that alloc() never handed out, or one already freed, belongs to no request: a write into
// it was accepted and left slots that no free() would ever clear.
TEST(ReqToTokenPool, WriteRefusesARowThatIsNotAllocated) {
  auto pool = ReqToTokenPool::create(3, 8, Device::cpu()).value();
  const int row = pool->alloc().value();
  const int never = row + 1;  // in range, never allocated
  const Status st = pool->write(never, 0, Slots{16, 17});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("row " + std::to_string(never) + " is not allocated"),
            std::string::npos)
      << st.message();
  const int32_t* never_row = pool->host_row(never);
  EXPECT_EQ(std::vector<int32_t>(never_row, never_row + 8), std::vector<int32_t>(8, 0));

  ASSERT_TRUE(pool->write(row, 0, Slots{16, 17}).is_ok());
  ASSERT_TRUE(pool->free(row).is_ok());
  const Status freed = pool->write(row, 2, Slots{18});
  EXPECT_EQ(freed.code(), StatusCode::kInvalidArgument) << freed.to_string();
  EXPECT_NE(freed.message().find("row " + std::to_string(row) + " is not allocated"),
            std::string::npos)
      << freed.message();
  EXPECT_EQ(pool->host_row(row)[2], 0);
}

// free() zeroes the row (page 0, the dummy page), so the next request on that row, or a reader
// of a stale req_pool_index, never sees the previous request's slots.
TEST(ReqToTokenPool, FreeZeroesTheRow) {
  auto pool = ReqToTokenPool::create(2, 8, Device::cpu()).value();
  const int row = pool->alloc().value();
  ASSERT_TRUE(pool->write(row, 1, Slots{32, 33, 34}).is_ok());
  ASSERT_TRUE(pool->free(row).is_ok());
  const std::vector<int32_t> zeros(8, 0);
  const int32_t* host = pool->host_row(row);
  EXPECT_EQ(std::vector<int32_t>(host, host + 8), zeros);
  const int32_t* table = pool->table().data_as<int32_t>() + row * 8;
  EXPECT_EQ(std::vector<int32_t>(table, table + 8), zeros);
  ASSERT_EQ(pool->alloc().value(), row);  // handed out again: starts empty
  EXPECT_EQ(std::vector<int32_t>(host, host + 8), zeros);
}

// A host copy of a table (what a backend staging a device table to the CPU keeps) takes rows with
// their allocation, since write() refuses rows the copy never allocated itself.
TEST(ReqToTokenPool, CopyRowsFromMirrorsEntriesAndAllocation) {
  auto src = ReqToTokenPool::create(3, 4, Device::cpu()).value();
  auto copy = ReqToTokenPool::create(3, 4, Device::cpu()).value();
  const int a = src->alloc().value();
  const int b = src->alloc().value();
  ASSERT_TRUE(src->write(a, 0, Slots{8, 9, 10}).is_ok());
  ASSERT_TRUE(src->write(b, 0, Slots{12}).is_ok());
  const std::vector<int32_t> rows{b, 0, a};
  ASSERT_TRUE(copy->copy_rows_from(*src, rows).is_ok());
  for (const int r : {a, b}) {
    EXPECT_TRUE(copy->is_allocated(r)) << r;
    EXPECT_EQ(std::vector<int32_t>(copy->host_row(r), copy->host_row(r) + 4),
              std::vector<int32_t>(src->host_row(r), src->host_row(r) + 4))
        << r;
  }
  EXPECT_EQ(copy->available(), 1);
  EXPECT_TRUE(copy->write(a, 3, Slots{11}).is_ok());
  // Freed in src: freed and zeroed in the copy.
  ASSERT_TRUE(src->free(b).is_ok());
  ASSERT_TRUE(copy->copy_rows_from(*src, std::vector<int32_t>{b}).is_ok());
  EXPECT_FALSE(copy->is_allocated(b));
  EXPECT_EQ(copy->host_row(b)[0], 0);
  EXPECT_EQ(copy->available(), 2);

  auto other = ReqToTokenPool::create(3, 8, Device::cpu()).value();
  const Status shape = copy->copy_rows_from(*other, rows);
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("src is [3 + 1, 8] but this pool is [3 + 1, 4]"),
            std::string::npos)
      << shape.message();
  const Status range = copy->copy_rows_from(*src, std::vector<int32_t>{a, 4});
  EXPECT_NE(range.message().find("rows[1] = 4 is outside [0, 3]"), std::string::npos)
      << range.message();
  EXPECT_EQ(copy->host_row(a)[3], 11);  // a bad argument changed nothing
}

// max_slot bounds every entry written: it rises with write() and copy_rows_from(), drops back when
// the row that held the largest slot is freed or overwritten whole by a copy, and never sits
// below an entry that is still in the table (the backends take it as the table's bound).
TEST(ReqToTokenPool, MaxSlotBoundsEveryEntryWritten) {
  auto pool = ReqToTokenPool::create(3, 8, Device::cpu()).value();
  EXPECT_EQ(pool->max_slot(), 0);
  const int a = pool->alloc().value();
  const int b = pool->alloc().value();
  ASSERT_TRUE(pool->write(a, 0, Slots{40, 7, 41}).is_ok());
  EXPECT_EQ(pool->max_slot(), 41);
  ASSERT_TRUE(pool->write(b, 2, Slots{900}).is_ok());
  EXPECT_EQ(pool->max_slot(), 900);
  // Overwriting 900 with a small slot keeps the bound (a row's bound only drops when zeroed).
  ASSERT_TRUE(pool->write(b, 2, Slots{5}).is_ok());
  EXPECT_EQ(pool->max_slot(), 900);
  // A refused write changes nothing.
  EXPECT_FALSE(pool->write(a, 7, Slots{5000, 1}).is_ok());
  EXPECT_EQ(pool->max_slot(), 900);
  ASSERT_TRUE(pool->free(b).is_ok());
  EXPECT_EQ(pool->max_slot(), 41);
  ASSERT_TRUE(pool->free(a).is_ok());
  EXPECT_EQ(pool->max_slot(), 0);

  // copy_rows_from: the copied rows take src's bound, higher or lower than theirs was.
  auto src = ReqToTokenPool::create(3, 8, Device::cpu()).value();
  auto copy = ReqToTokenPool::create(3, 8, Device::cpu()).value();
  const int r = src->alloc().value();
  ASSERT_TRUE(src->write(r, 0, Slots{3000}).is_ok());
  ASSERT_TRUE(copy->copy_rows_from(*src, std::vector<int32_t>{r}).is_ok());
  EXPECT_EQ(copy->max_slot(), 3000);
  ASSERT_TRUE(src->free(r).is_ok());
  const int r2 = src->alloc().value();
  ASSERT_EQ(r2, r);
  ASSERT_TRUE(src->write(r2, 0, Slots{12}).is_ok());
  ASSERT_TRUE(copy->copy_rows_from(*src, std::vector<int32_t>{r2}).is_ok());
  EXPECT_EQ(copy->max_slot(), 12);
  for (int row = 0; row <= 3; ++row) {
    for (int i = 0; i < 8; ++i) EXPECT_LE(copy->host_row(row)[i], copy->max_slot());
  }
}

// ---- host views, driven by a small scheduler simulation ----

class ViewsPageSize : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(PageSizes, ViewsPageSize, ::testing::Values(1, 16, 24, 64),
                         [](const auto& info) { return "ps" + std::to_string(info.param); });

TEST_P(ViewsPageSize, PageTableAndTokenIndicesMatchReqToToken) {
  const int ps = GetParam();
  const int ctx = 6 * ps + 7;
  auto pool = ReqToTokenPool::create(4, ctx, Device::cpu()).value();
  PageAllocator alloc(64, ps);
  std::mt19937 rng(99 + ps);
  const int bs = 3;
  std::vector<int32_t> rows(bs), lens(bs, 0);
  for (int b = 0; b < bs; ++b) rows[b] = pool->alloc().value();
  // Extend each request twice (second time after a prefix), then decode a few steps.
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> prefix = lens, seq(bs);
    for (int b = 0; b < bs; ++b) {
      const int32_t grow =
          step < 2 ? std::uniform_int_distribution<int32_t>(1, 2 * ps + 3)(rng) : 1;
      seq[b] = prefix[b] + grow;
    }
    auto last = last_locs_host(*pool, rows, prefix);
    ASSERT_TRUE(last.is_ok()) << last.status().to_string();
    auto slots = alloc.alloc_extend(prefix, seq, *last);
    ASSERT_TRUE(slots.is_ok()) << slots.status().to_string();
    size_t pos = 0;
    for (int b = 0; b < bs; ++b) {
      const size_t n = static_cast<size_t>(seq[b] - prefix[b]);
      ASSERT_TRUE(pool->write(rows[b], prefix[b], std::span<const int64_t>(slots->data() + pos, n))
                      .is_ok());
      pos += n;
    }
    lens = seq;
  }
  // Pad the batch with a CUDA-graph style row 0 of length 1.
  std::vector<int32_t> rows_padded = rows, lens_padded = lens;
  rows_padded.push_back(0);
  lens_padded.push_back(1);
  int max_pages = -1;
  auto table = build_page_table_host(*pool, rows_padded, lens_padded, ps, &max_pages);
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  const int32_t longest = *std::max_element(lens.begin(), lens.end());
  EXPECT_EQ(max_pages, (longest + ps - 1) / ps);
  for (int b = 0; b < bs; ++b) {
    const int32_t* row = pool->host_row(rows[b]);
    for (int32_t i = 0; i < lens[b]; ++i) {
      const int32_t page = (*table)[b * max_pages + i / ps];
      EXPECT_EQ(row[i], page * ps + i % ps) << "request " << b << " token " << i;
    }
    for (int p = (lens[b] + ps - 1) / ps; p < max_pages; ++p) {
      EXPECT_EQ((*table)[b * max_pages + p], 0) << "padding of request " << b;
    }
  }
  EXPECT_EQ((*table)[bs * max_pages], 0);

  std::vector<int32_t> start{0, 3, lens[2]};
  auto idx = build_token_indices_host(*pool, rows, lens, start);
  ASSERT_TRUE(idx.is_ok()) << idx.status().to_string();
  ASSERT_EQ(idx->kv_indptr.size(), static_cast<size_t>(bs + 1));
  for (int b = 0; b < bs; ++b) {
    ASSERT_EQ(idx->kv_indptr[b + 1] - idx->kv_indptr[b], lens[b] - start[b]);
    const int32_t* row = pool->host_row(rows[b]);
    for (int32_t i = start[b]; i < lens[b]; ++i) {
      EXPECT_EQ(idx->kv_indices[idx->kv_indptr[b] + i - start[b]], row[i]);
    }
  }
  EXPECT_EQ(static_cast<int32_t>(idx->kv_indices.size()), idx->kv_indptr[bs]);
}

TEST(ReqToTokenPool, OverflowingSizeIsNamed) {
  const Status st = ReqToTokenPool::create(std::numeric_limits<int>::max(),
                                           std::numeric_limits<int>::max(), Device::cpu())
                        .status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("max_context_len 2147483647"), std::string::npos) << st.to_string();
}

TEST(KVViews, ValidateInputs) {
  auto pool = ReqToTokenPool::create(2, 32, Device::cpu()).value();
  const int row = pool->alloc().value();
  ASSERT_TRUE(pool->write(row, 0, Slots{17, 18, 19}).is_ok());  // not page aligned for ps 16
  int max_pages = 0;
  auto misaligned = build_page_table_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{3},
                                          16, &max_pages);
  ASSERT_FALSE(misaligned.is_ok());
  EXPECT_NE(misaligned.status().message().find("= 17"), std::string::npos)
      << misaligned.status().message();
  EXPECT_FALSE(
      build_page_table_host(*pool, std::vector<int32_t>{3}, std::vector<int32_t>{3}, 1, &max_pages)
          .is_ok());
  EXPECT_FALSE(build_page_table_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{33}, 1,
                                     &max_pages)
                   .is_ok());
  EXPECT_FALSE(build_page_table_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{3}, 0,
                                     &max_pages)
                   .is_ok());
  // A page size near INT32_MAX: len + page_size - 1 overflowed to no page at all (table [0]);
  // the row's first slot 17 is not a page start, as at page size 16.
  auto huge = build_page_table_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{3},
                                    std::numeric_limits<int>::max() - 2, &max_pages);
  ASSERT_FALSE(huge.is_ok());
  EXPECT_NE(huge.status().message().find("= 17"), std::string::npos) << huge.status().message();
  EXPECT_FALSE(build_token_indices_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{3},
                                        std::vector<int32_t>{4})
                   .is_ok());
  EXPECT_FALSE(
      build_token_indices_host(*pool, std::vector<int32_t>{row, row}, std::vector<int32_t>{3})
          .is_ok());
  auto last = last_locs_host(*pool, std::vector<int32_t>{row, row}, std::vector<int32_t>{3, 0});
  ASSERT_TRUE(last.is_ok());
  EXPECT_EQ((*last)[0], 19);
  EXPECT_EQ((*last)[1], -1);
}

// A page's later entries must be its next slots: the kernels read key begin + i of a page at its
// page-start slot + i, so a row whose page holds other slots would read the wrong rows silently.
TEST(KVViews, PageEntriesOutOfOrderAreRefused) {
  constexpr int kPs = 4;
  auto pool = ReqToTokenPool::create(2, 16, Device::cpu()).value();
  const int row = pool->alloc().value();
  ASSERT_TRUE(pool->write(row, 0, Slots{8, 9, 11, 10, 20}).is_ok());
  int max_pages = 0;
  auto swapped = build_page_table_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{5},
                                       kPs, &max_pages);
  ASSERT_FALSE(swapped.is_ok());
  EXPECT_EQ(swapped.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(swapped.status().message().find("req_to_token[" + std::to_string(row) +
                                            ", 2] = 11 is not slot 10 of the page starting at "
                                            "slot 8"),
            std::string::npos)
      << swapped.status().message();
  // Only the keys below seq_len count: the first two keys of the page are in order.
  auto two = build_page_table_host(*pool, std::vector<int32_t>{row}, std::vector<int32_t>{2}, kPs,
                                   &max_pages);
  ASSERT_TRUE(two.is_ok()) << two.status().to_string();
  EXPECT_EQ(*two, (std::vector<int32_t>{2}));
}

// Entries below a request's seq_len that were never written read as slot 0, which is in the
// reserved page 0: the page table gave the request the dummy page (and the token indices slot 0)
// instead of refusing. Padding past a request's pages, and the padding row 0, stay page 0.
TEST(KVViews, UnwrittenEntriesInsideSeqLenAreRefused) {
  constexpr int kPs = 4;
  auto pool = ReqToTokenPool::create(2, 16, Device::cpu()).value();
  const int row = pool->alloc().value();
  ASSERT_TRUE(pool->write(row, 0, Slots{8, 9, 10, 11, 20}).is_ok());  // pages 2 and 5 (1 token)
  const std::vector<int32_t> rows{row};
  int max_pages = 0;

  // Written tokens only: fine, and the table is padded with page 0 for a longer request.
  auto ok = build_page_table_host(*pool, std::vector<int32_t>{row, 0}, std::vector<int32_t>{5, 1},
                                  kPs, &max_pages);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, (std::vector<int32_t>{2, 5, 0, 0}));

  const std::string where = "req_to_token[" + std::to_string(row) + ", ";
  // Token 5 shares page 5's first entry but was never written.
  auto partial = build_page_table_host(*pool, rows, std::vector<int32_t>{6}, kPs, &max_pages);
  ASSERT_FALSE(partial.is_ok());
  EXPECT_EQ(partial.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(partial.status().message().find(where + "5] = 0"), std::string::npos)
      << partial.status().message();
  EXPECT_NE(partial.status().message().find("page 0"), std::string::npos)
      << partial.status().message();
  // A whole page never written: its page-start entry 0 passed the alignment check.
  const int other = pool->alloc().value();
  ASSERT_TRUE(pool->write(other, 0, Slots{12, 13, 14, 15}).is_ok());
  auto whole = build_page_table_host(*pool, std::vector<int32_t>{row, other},
                                     std::vector<int32_t>{5, 6}, kPs, &max_pages);
  ASSERT_FALSE(whole.is_ok());
  EXPECT_NE(whole.status().message().find("req_to_token[" + std::to_string(other) + ", 4] = 0"),
            std::string::npos)
      << whole.status().message();
  // A slot inside page 0 that is not 0 is refused as well.
  ASSERT_TRUE(pool->write(row, 5, Slots{21, 22, 2}).is_ok());
  auto dummy = build_page_table_host(*pool, rows, std::vector<int32_t>{8}, kPs, &max_pages);
  ASSERT_FALSE(dummy.is_ok());
  EXPECT_NE(dummy.status().message().find(where + "7] = 2"), std::string::npos)
      << dummy.status().message();

  // Token indices: slot 0 inside [kv_start, seq_len) was never written.
  auto unwritten = build_token_indices_host(*pool, rows, std::vector<int32_t>{10});
  ASSERT_FALSE(unwritten.is_ok());
  EXPECT_NE(unwritten.status().message().find(where + "8] = 0"), std::string::npos)
      << unwritten.status().message();
  auto windowed =
      build_token_indices_host(*pool, rows, std::vector<int32_t>{10}, std::vector<int32_t>{9});
  ASSERT_FALSE(windowed.is_ok());
  EXPECT_NE(windowed.status().message().find(where + "9] = 0"), std::string::npos)
      << windowed.status().message();
  EXPECT_TRUE(build_token_indices_host(*pool, rows, std::vector<int32_t>{8}).is_ok());
  // The padding row 0 reads slot 0 by design.
  EXPECT_TRUE(
      build_token_indices_host(*pool, std::vector<int32_t>{0}, std::vector<int32_t>{1}).is_ok());
}

}  // namespace
}  // namespace attnkit
