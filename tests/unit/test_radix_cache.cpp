// RadixCache: page-granular matching and insertion, locking, LRU eviction into the allocator.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "attnkit/radix_cache.h"

namespace attnkit {
namespace {

using Tokens = std::vector<int32_t>;
using Slots = std::vector<int64_t>;

// Random token ids from a small alphabet so that prefixes collide often.
Tokens random_tokens(size_t n, std::mt19937& rng, int32_t alphabet = 1000) {
  std::uniform_int_distribution<int32_t> dist(1, alphabet);
  Tokens t(n);
  for (auto& x : t) x = dist(rng);
  return t;
}

// Allocates fresh pages for tokens.size() tokens (a request with no cached prefix).
Slots alloc_slots(PageAllocator& alloc, size_t n) {
  auto r = alloc.alloc_extend(std::vector<int32_t>{0},
                              std::vector<int32_t>{static_cast<int32_t>(n)}, Slots{-1});
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : Slots{};
}

struct Fixture {
  explicit Fixture(int page_size, int64_t pages = 256)
      : alloc(pages, page_size), cache(RadixCache::create(&alloc).value()) {}
  // Inserts tokens with freshly allocated slots, then frees the caller-owned tail page.
  InsertResult insert_fresh(const Tokens& tokens, Slots* slots_out = nullptr) {
    const Slots slots = alloc_slots(alloc, tokens.size());
    auto r = cache->insert(tokens, slots);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) return {};
    Slots tail(slots.begin() + r->aligned_len, slots.end());
    if (!tail.empty()) EXPECT_TRUE(alloc.free_slots(tail).is_ok());
    if (!r->duplicate_slots.empty()) EXPECT_TRUE(alloc.free_slots(r->duplicate_slots).is_ok());
    if (slots_out != nullptr) *slots_out = slots;
    return *r;
  }
  PageAllocator alloc;
  std::unique_ptr<RadixCache> cache;
};

TEST(RadixCache, PromptShorterThanOnePageNeverHits) {
  Fixture f(64);
  std::mt19937 rng(1);
  const Tokens prompt = random_tokens(32, rng);
  const InsertResult r = f.insert_fresh(prompt);
  EXPECT_EQ(r.aligned_len, 0);
  EXPECT_EQ(r.inserted_len, 0);
  EXPECT_EQ(f.cache->total_size(), 0);
  EXPECT_EQ(f.alloc.available_pages(), 256);  // the tail page went back
  // Even with a long cached sequence starting with the same 32 tokens, 32 tokens never hit.
  Tokens longer = prompt;
  const Tokens more = random_tokens(100, rng);
  longer.insert(longer.end(), more.begin(), more.end());
  f.insert_fresh(longer);
  const PrefixMatch m = f.cache->match_prefix(prompt);
  EXPECT_EQ(m.length, 0);
  EXPECT_TRUE(m.slots.empty());
}

TEST(RadixCache, SixtyFiveTokensMatchSixtyFour) {
  Fixture f(64);
  std::mt19937 rng(2);
  const Tokens seq = random_tokens(130, rng);
  Slots slots;
  const InsertResult r = f.insert_fresh(seq, &slots);
  EXPECT_EQ(r.aligned_len, 128);
  EXPECT_EQ(r.inserted_len, 128);
  EXPECT_EQ(r.prefix_len, 0);
  EXPECT_EQ(f.cache->total_size(), 128);
  const Tokens prompt(seq.begin(), seq.begin() + 65);
  const PrefixMatch m = f.cache->match_prefix(prompt);
  ASSERT_EQ(m.length, 64);
  EXPECT_EQ(m.slots, Slots(slots.begin(), slots.begin() + 64));
  // The whole sequence matches its whole pages.
  EXPECT_EQ(f.cache->match_prefix(seq).length, 128);
}

TEST(RadixCache, PageSizeOneIsTokenLevel) {
  Fixture f(1);
  Slots slots;
  f.insert_fresh({1, 2, 3, 4, 5}, &slots);
  const PrefixMatch m = f.cache->match_prefix(Tokens{1, 2, 3, 9});
  ASSERT_EQ(m.length, 3);
  EXPECT_EQ(m.slots, Slots(slots.begin(), slots.begin() + 3));
  EXPECT_EQ(f.cache->match_prefix(Tokens{7}).length, 0);
  // Diverging inserts share the prefix; the node splits at token 3.
  const InsertResult r = f.insert_fresh({1, 2, 3, 8});
  EXPECT_EQ(r.prefix_len, 3);
  EXPECT_EQ(r.inserted_len, 1);
  EXPECT_EQ(f.cache->match_prefix(Tokens{1, 2, 3, 8, 8}).length, 4);
  EXPECT_EQ(f.cache->total_size(), 6);
}

TEST(RadixCache, SplitsOnlyAtPageBoundaries) {
  const int ps = 16;
  Fixture f(ps);
  std::mt19937 rng(3);
  const Tokens a = random_tokens(3 * ps, rng);
  Tokens b = a;
  b[20] += 1;  // diverges inside the second page
  Slots sa, sb;
  f.insert_fresh(a, &sa);
  const InsertResult rb = f.insert_fresh(b, &sb);
  EXPECT_EQ(rb.prefix_len, ps);  // not 20: the second page differs
  EXPECT_EQ(rb.inserted_len, 2 * ps);
  EXPECT_EQ(rb.duplicate_slots, Slots(sb.begin(), sb.begin() + ps));
  EXPECT_EQ(f.cache->node_count(), 3);  // shared page, a's rest, b's rest
  const PrefixMatch ma = f.cache->match_prefix(a);
  const PrefixMatch mb = f.cache->match_prefix(b);
  EXPECT_EQ(ma.length, 3 * ps);
  EXPECT_EQ(mb.length, 3 * ps);
  EXPECT_EQ(ma.slots, sa);
  // b's first page is a's (the tree kept its copy); the rest is b's own.
  Slots expect_b(sa.begin(), sa.begin() + ps);
  expect_b.insert(expect_b.end(), sb.begin() + ps, sb.end());
  EXPECT_EQ(mb.slots, expect_b);
  // A match ending inside a node splits it at the page boundary only.
  const Tokens a2(a.begin(), a.begin() + 2 * ps + 5);
  EXPECT_EQ(f.cache->match_prefix(a2).length, 2 * ps);
  EXPECT_EQ(f.cache->node_count(), 4);
  EXPECT_EQ(f.cache->total_size(), 5 * ps);
}

TEST(RadixCache, ReinsertingReportsDuplicatesAndKeepsTreeSlots) {
  const int ps = 8;
  Fixture f(ps);
  std::mt19937 rng(4);
  const Tokens t = random_tokens(4 * ps, rng);
  Slots first, second;
  f.insert_fresh(t, &first);
  const int64_t pages_after_first = f.alloc.available_pages();
  const InsertResult r = f.insert_fresh(t, &second);
  EXPECT_EQ(r.prefix_len, 4 * ps);
  EXPECT_EQ(r.inserted_len, 0);
  EXPECT_EQ(r.duplicate_slots, second);
  EXPECT_EQ(f.alloc.available_pages(), pages_after_first);  // duplicates were freed by the caller
  EXPECT_EQ(f.cache->match_prefix(t).slots, first);
  // Re-inserting with the tree's own slots (a request that reused the prefix) has no duplicates.
  auto again = f.cache->insert(t, first);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(again->duplicate_slots.empty());
}

TEST(RadixCache, InsertValidatesSlots) {
  const int ps = 4;
  Fixture f(ps);
  const Tokens t{1, 2, 3, 4, 5, 6, 7, 8};
  Slots s = alloc_slots(f.alloc, 8);
  Slots bad = s;
  std::swap(bad[1], bad[2]);
  auto r = f.cache->insert(t, bad);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("slots[1]"), std::string::npos) << r.status().message();
  EXPECT_EQ(f.cache->total_size(), 0);
  EXPECT_FALSE(f.cache->insert(t, Slots(s.begin(), s.begin() + 7)).is_ok());
  Slots unaligned = s;
  for (auto& x : unaligned) x += 1;
  EXPECT_FALSE(f.cache->insert(t, unaligned).is_ok());
  ASSERT_TRUE(f.cache->insert(t, s).is_ok());
  // The same pages under another key would be owned twice.
  const Tokens other{9, 9, 9, 9, 9, 9, 9, 9};
  auto twice = f.cache->insert(other, s);
  ASSERT_FALSE(twice.is_ok());
  EXPECT_NE(twice.status().message().find("already held"), std::string::npos);
  EXPECT_EQ(f.cache->total_size(), 8);
  // Pages not allocated in the allocator are rejected.
  EXPECT_FALSE(f.cache->insert(other, Slots{100, 101, 102, 103, 104, 105, 106, 107}).is_ok());
  // A tail slot (past the whole pages, freed by the caller afterwards) inside a page that this
  // insert gives the cache, or that the cache holds: freeing the tail would free it under the
  // cache.
  Slots fresh = alloc_slots(f.alloc, 8);
  const Tokens third{5, 5, 5, 5, 5, 5, 5, 5, 5};
  Slots tail_in_own_page = fresh;
  tail_in_own_page.push_back(fresh[2]);
  auto tail = f.cache->insert(third, tail_in_own_page);
  ASSERT_FALSE(tail.is_ok());
  EXPECT_NE(tail.status().message().find("tail slots[8]"), std::string::npos)
      << tail.status().message();
  Slots tail_in_cached_page = fresh;
  tail_in_cached_page.push_back(s[0]);
  EXPECT_FALSE(f.cache->insert(third, tail_in_cached_page).is_ok());
  EXPECT_EQ(f.cache->total_size(), 8);
}

TEST(RadixCache, EvictionFreesPagesBackToTheAllocator) {
  const int ps = 16;
  Fixture f(ps, 32);
  std::mt19937 rng(5);
  const Tokens a = random_tokens(4 * ps, rng);
  const Tokens b = random_tokens(2 * ps + 3, rng);
  f.insert_fresh(a);
  f.insert_fresh(b);
  EXPECT_EQ(f.alloc.available_pages(), 32 - 6);
  EXPECT_EQ(f.cache->evictable_size(), 6 * ps);
  // Ask for one token: a whole page goes (the LRU leaf, a, trimmed from its end).
  auto one = f.cache->evict(1);
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(*one, ps);
  EXPECT_EQ(f.alloc.available_pages(), 32 - 5);
  EXPECT_EQ(f.cache->match_prefix(a).length, 3 * ps);
  auto all = f.cache->evict(1000);
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(*all, 5 * ps);
  EXPECT_EQ(f.alloc.available_pages(), 32);
  EXPECT_EQ(f.cache->total_size(), 0);
  EXPECT_EQ(f.cache->node_count(), 0);
  EXPECT_EQ(f.cache->match_prefix(b).length, 0);
  EXPECT_FALSE(f.cache->evict(-1).is_ok());
}

// A request freeing its whole row (its cached prefix pages included) must not free the pages the
// cache holds: the allocator handed such a page to the next request while match_prefix went on
// serving it, and every later evict() failed on the page the allocator no longer had.
TEST(RadixCache, CachedPagesAreFreedOnlyByEviction) {
  const int ps = 4;
  Fixture f(ps, 8);
  std::mt19937 rng(9);
  const Tokens a = random_tokens(2 * ps + 1, rng);
  Slots a_slots;
  f.insert_fresh(a, &a_slots);  // pages of a's first 8 tokens cached, its tail page freed
  const Slots cached(a_slots.begin(), a_slots.begin() + 2 * ps);
  for (const int64_t page : {cached[0] / ps, cached[ps] / ps}) {
    EXPECT_TRUE(f.alloc.is_cached(page));
    EXPECT_TRUE(f.alloc.is_allocated(page));
  }
  const int64_t available = f.alloc.available_pages();
  const Status refused = f.alloc.free_slots(cached);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("is held by the radix cache"), std::string::npos)
      << refused.message();
  EXPECT_EQ(f.alloc.available_pages(), available);  // nothing freed
  EXPECT_FALSE(f.alloc.free_pages(Slots{cached[0] / ps}).is_ok());
  EXPECT_EQ(f.cache->match_prefix(a).length, 2 * ps);
  // Cached pages are freed only through eviction (free_cached_slots is the cache's own).
  auto all = f.cache->evict(1000);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(*all, 2 * ps);
  EXPECT_FALSE(f.alloc.is_cached(cached[0] / ps));
  EXPECT_FALSE(f.alloc.is_allocated(cached[0] / ps));
  EXPECT_TRUE(f.cache->reset().is_ok());
}

// A request may extend only its own partial page: a prefix trimmed inside a cached page (to
// recompute the last prompt token, say) had alloc_decode / alloc_extend hand out the cached page's
// later slots, which match_prefix still served (slot 11 twice at page size 4). A prefix matched up
// to a page boundary extends into fresh pages as before.
TEST(RadixCache, AllocationNeverFillsACachedPage) {
  const int ps = 4;
  Fixture f(ps, 8);
  std::mt19937 rng(21);
  const Tokens a = random_tokens(2 * ps, rng);
  Slots a_slots;
  f.insert_fresh(a, &a_slots);  // both pages cached
  ASSERT_TRUE(f.alloc.is_cached(a_slots[6] / ps));
  const int64_t available = f.alloc.available_pages();
  const auto decode = f.alloc.alloc_decode(std::vector<int32_t>{8}, Slots{a_slots[6]});
  ASSERT_FALSE(decode.is_ok());
  EXPECT_NE(decode.status().message().find("which the radix cache holds"), std::string::npos)
      << decode.status().message();
  const auto extend =
      f.alloc.alloc_extend(std::vector<int32_t>{6}, std::vector<int32_t>{8}, Slots{a_slots[5]});
  ASSERT_FALSE(extend.is_ok());
  EXPECT_NE(extend.status().message().find("round prefix_len down to 4"), std::string::npos)
      << extend.status().message();
  EXPECT_EQ(f.alloc.available_pages(), available);  // nothing allocated
  // From the page boundary: a fresh page.
  const auto fresh =
      f.alloc.alloc_extend(std::vector<int32_t>{8}, std::vector<int32_t>{10}, Slots{a_slots[7]});
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
  EXPECT_FALSE(f.alloc.is_cached((*fresh)[0] / ps));
  EXPECT_EQ(f.cache->match_prefix(a).length, 2 * ps);
}

// evict(INT64_MAX), "everything evictable": the page count wrapped negative and the process
// aborted in a vector reserve.
TEST(RadixCache, EvictingTheMostTokensFreesEverythingEvictable) {
  const int ps = 16;
  Fixture f(ps, 32);
  std::mt19937 rng(23);
  f.insert_fresh(random_tokens(3 * ps + 5, rng));
  auto all = f.cache->evict(std::numeric_limits<int64_t>::max());
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(*all, 3 * ps);
  EXPECT_EQ(f.alloc.available_pages(), 32);
  EXPECT_EQ(f.cache->total_size(), 0);
}

TEST(RadixCache, LockedNodesAreNeverEvicted) {
  const int ps = 16;
  Fixture f(ps, 64);
  std::mt19937 rng(6);
  const Tokens shared = random_tokens(2 * ps, rng);
  Tokens a = shared, b = shared;
  const Tokens ta = random_tokens(2 * ps, rng), tb = random_tokens(3 * ps, rng);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());
  f.insert_fresh(a);
  f.insert_fresh(b);
  EXPECT_EQ(f.cache->total_size(), 7 * ps);

  PrefixMatch m = f.cache->match_prefix(a);
  ASSERT_EQ(m.length, 4 * ps);
  ASSERT_TRUE(f.cache->inc_lock_ref(m.last_node).is_ok());
  EXPECT_EQ(f.cache->protected_size(), 4 * ps);  // a's own pages and the shared prefix
  EXPECT_EQ(f.cache->evictable_size(), 3 * ps);
  auto freed = f.cache->evict(1000);
  ASSERT_TRUE(freed.is_ok());
  EXPECT_EQ(*freed, 3 * ps);  // only b's own pages
  EXPECT_EQ(f.cache->match_prefix(a).length, 4 * ps);
  EXPECT_EQ(f.cache->match_prefix(b).length, 2 * ps);
  EXPECT_EQ(f.cache->protected_size(), 4 * ps);
  EXPECT_FALSE(f.cache->reset().is_ok());  // still locked

  // A second lock on the shared prefix keeps it after a is unlocked.
  PrefixMatch ms = f.cache->match_prefix(shared);
  // Unlocking the shared prefix, which only a's lock (a longer match) holds, is refused: it
  // would leave a's own unlock unbalanced (it was accepted, and a's unlock then failed).
  const Status stolen = f.cache->dec_lock_ref(ms.last_node);
  EXPECT_FALSE(stolen.is_ok());
  EXPECT_NE(stolen.message().find("no lock ends at this node"), std::string::npos)
      << stolen.message();
  EXPECT_EQ(f.cache->protected_size(), 4 * ps);  // nothing changed
  ASSERT_TRUE(f.cache->inc_lock_ref(ms.last_node).is_ok());
  ASSERT_TRUE(f.cache->dec_lock_ref(m.last_node).is_ok());
  EXPECT_EQ(f.cache->protected_size(), 2 * ps);
  EXPECT_EQ(f.cache->evictable_size(), 2 * ps);
  EXPECT_EQ(*f.cache->evict(1000), 2 * ps);
  EXPECT_EQ(f.cache->match_prefix(a).length, 2 * ps);
  ASSERT_TRUE(f.cache->dec_lock_ref(ms.last_node).is_ok());
  EXPECT_FALSE(f.cache->dec_lock_ref(ms.last_node).is_ok());  // unbalanced
  EXPECT_EQ(f.cache->evictable_size(), 2 * ps);
  ASSERT_TRUE(f.cache->reset().is_ok());
  EXPECT_EQ(f.alloc.available_pages(), 64);
}

// A node of another cache: locking it moved this cache's sizes (evictable_size -2).
TEST(RadixCache, LocksRefuseANodeOfAnotherCache) {
  const int ps = 4;
  Fixture f(ps, 16), g(ps, 16);
  std::mt19937 rng(29);
  const Tokens a = random_tokens(2 * ps, rng);
  f.insert_fresh(a);
  g.insert_fresh(a);
  const PrefixMatch other = g.cache->match_prefix(a);
  const int64_t evictable = f.cache->evictable_size();
  EXPECT_FALSE(f.cache->inc_lock_ref(other.last_node).is_ok());
  EXPECT_FALSE(f.cache->dec_lock_ref(other.last_node).is_ok());
  EXPECT_FALSE(f.cache->inc_lock_ref(nullptr).is_ok());
  EXPECT_EQ(f.cache->evictable_size(), evictable);
  EXPECT_EQ(f.cache->protected_size(), 0);
}

TEST(RadixCache, EvictsLeastRecentlyUsedFirst) {
  const int ps = 8;
  Fixture f(ps, 64);
  std::mt19937 rng(7);
  const Tokens a = random_tokens(2 * ps, rng);
  const Tokens b = random_tokens(2 * ps, rng);
  const Tokens c = random_tokens(2 * ps, rng);
  f.insert_fresh(a);
  f.insert_fresh(b);
  f.insert_fresh(c);
  EXPECT_EQ(f.cache->match_prefix(a).length, 2 * ps);  // a is now the most recent
  ASSERT_EQ(*f.cache->evict(2 * ps), 2 * ps);
  EXPECT_EQ(f.cache->match_prefix(b).length, 0) << "b was least recently used";
  EXPECT_EQ(f.cache->match_prefix(c).length, 2 * ps);  // touches c: a is now the oldest
  ASSERT_EQ(*f.cache->evict(2 * ps), 2 * ps);
  EXPECT_EQ(f.cache->match_prefix(a).length, 0);
  EXPECT_EQ(f.cache->match_prefix(c).length, 2 * ps);
}

class RadixRandom : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(PageSizes, RadixRandom, ::testing::Values(1, 4, 24),
                         [](const auto& info) { return "ps" + std::to_string(info.param); });

// Against a brute-force longest-common-prefix over everything inserted (no eviction), plus the
// size/page accounting after evicting everything.
TEST_P(RadixRandom, MatchesBruteForce) {
  const int ps = GetParam();
  Fixture f(ps, 4096);
  std::mt19937 rng(100 + ps);
  std::vector<Tokens> inserted;
  std::vector<Tokens> stems;
  for (int i = 0; i < 4; ++i) stems.push_back(random_tokens(3 * ps + 2, rng, 3));
  for (int i = 0; i < 60; ++i) {
    Tokens t = stems[rng() % stems.size()];
    t.resize(rng() % t.size() + 1);
    const Tokens tail = random_tokens(rng() % (2 * ps + 2), rng, 3);
    t.insert(t.end(), tail.begin(), tail.end());
    if (i % 2 == 0) {
      const PrefixMatch m = f.cache->match_prefix(t);
      int64_t best = 0;
      for (const Tokens& s : inserted) {
        int64_t common = 0;
        while (common < static_cast<int64_t>(std::min(s.size(), t.size())) &&
               s[common] == t[common]) {
          ++common;
        }
        best = std::max(best, common / ps * ps);
      }
      ASSERT_EQ(m.length, best) << "query " << i;
      ASSERT_EQ(static_cast<int64_t>(m.slots.size()), m.length);
    }
    f.insert_fresh(t);
    inserted.push_back(Tokens(t.begin(), t.begin() + t.size() / ps * ps));
  }
  const int64_t held_pages = 4096 - f.alloc.available_pages();
  EXPECT_EQ(held_pages * ps, f.cache->total_size());
  EXPECT_EQ(f.cache->protected_size(), 0);
  ASSERT_TRUE(f.cache->reset().is_ok());
  EXPECT_EQ(f.alloc.available_pages(), 4096);
}

// Random inserts, locks, unlocks and evictions: locked prefixes always survive, and the tree holds
// exactly the pages the allocator has handed out.
TEST_P(RadixRandom, EvictionKeepsLockedPrefixesAndAccounting) {
  const int ps = GetParam();
  const int64_t num_pages = 4096;
  Fixture f(ps, num_pages);
  std::mt19937 rng(200 + ps);
  struct Held {
    Tokens tokens;
    PrefixMatch match;
  };
  std::vector<Held> held;
  std::vector<Tokens> stems;
  for (int i = 0; i < 3; ++i) stems.push_back(random_tokens(4 * ps + 1, rng, 4));
  for (int step = 0; step < 300; ++step) {
    const unsigned op = rng() % 4;
    if (op == 0 || op == 1) {
      Tokens t = stems[rng() % stems.size()];
      t.resize(rng() % t.size() + 1);
      const Tokens tail = random_tokens(rng() % (3 * ps), rng, 4);
      t.insert(t.end(), tail.begin(), tail.end());
      f.insert_fresh(t);
      if (op == 1) {
        PrefixMatch m = f.cache->match_prefix(t);
        ASSERT_TRUE(f.cache->inc_lock_ref(m.last_node).is_ok());
        held.push_back({t, m});
      }
    } else if (op == 2 && !held.empty()) {
      const size_t i = rng() % held.size();
      ASSERT_TRUE(f.cache->dec_lock_ref(held[i].match.last_node).is_ok()) << "step " << step;
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const int64_t want = static_cast<int64_t>(rng() % (6 * ps));
      const int64_t evictable = f.cache->evictable_size();
      auto freed = f.cache->evict(want);
      ASSERT_TRUE(freed.is_ok()) << freed.status().to_string();
      EXPECT_EQ(*freed % ps, 0);
      EXPECT_EQ(*freed, std::min(evictable, (want + ps - 1) / ps * ps)) << "step " << step;
    }
    for (const Held& h : held) {
      const PrefixMatch m = f.cache->match_prefix(h.tokens);
      ASSERT_GE(m.length, h.match.length) << "locked prefix evicted at step " << step;
      ASSERT_TRUE(std::equal(h.match.slots.begin(), h.match.slots.end(), m.slots.begin()))
          << "locked slots changed at step " << step;
    }
    ASSERT_EQ((num_pages - f.alloc.available_pages()) * ps, f.cache->total_size())
        << "step " << step;
  }
  for (const Held& h : held) ASSERT_TRUE(f.cache->dec_lock_ref(h.match.last_node).is_ok());
  EXPECT_EQ(f.cache->protected_size(), 0);
  ASSERT_TRUE(f.cache->reset().is_ok());
  EXPECT_EQ(f.alloc.available_pages(), num_pages);
}

TEST(RadixCache, CreateRejectsNullAllocator) {
  EXPECT_EQ(RadixCache::create(nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnkit
