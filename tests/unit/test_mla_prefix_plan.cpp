// Host logic of the MLA chunked prefix cache runner (src/backends/mla/mla_prefix_cache.h): the
// chunk layout covers every prefix position exactly once within the chunk budget, and the
// three-slot merge ring always merges the running partial with the newest chunk, never writes a
// slot it reads, and ends with every part merged into the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "backends/mla/mla_prefix_cache.h"

namespace attnkit::mla {
namespace {

void expect_covers(const std::vector<int32_t>& prefix, int chunk_tokens, int want_chunks) {
  SCOPED_TRACE(chunk_tokens);
  const PrefixChunkLayout l = plan_prefix_chunks(prefix, chunk_tokens);
  const int bs = static_cast<int>(prefix.size());
  EXPECT_EQ(l.chunks, want_chunks);
  EXPECT_EQ(l.chunk_len, std::max(1, chunk_tokens / bs));
  ASSERT_EQ(l.indptr.size(), static_cast<size_t>(l.chunks) * (bs + 1));
  std::vector<std::vector<int>> seen(static_cast<size_t>(bs));
  for (int c = 0; c < l.chunks; ++c) {
    const int32_t* ip = &l.indptr[static_cast<size_t>(c) * (bs + 1)];
    EXPECT_EQ(ip[0], 0);
    EXPECT_EQ(ip[bs], l.tokens[static_cast<size_t>(c)]);
    EXPECT_LE(l.tokens[static_cast<size_t>(c)], std::max(chunk_tokens, bs));
    EXPECT_GT(l.tokens[static_cast<size_t>(c)], 0) << "empty chunk " << c;
    for (int r = 0; r < bs; ++r) {
      ASSERT_LE(ip[r], ip[r + 1]);
      for (int j = 0; j < ip[r + 1] - ip[r]; ++j) {
        seen[static_cast<size_t>(r)].push_back(c * l.chunk_len + j);  // the gather's position
      }
    }
  }
  for (int r = 0; r < bs; ++r) {
    std::vector<int> want(static_cast<size_t>(prefix[static_cast<size_t>(r)]));
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<int>(i);
    EXPECT_EQ(seen[static_cast<size_t>(r)], want) << "request " << r;
  }
}

TEST(MlaPrefixPlan, ChunksCoverEveryPrefixPositionOnce) {
  expect_covers({700, 0, 1500, 63}, 256, 24);  // the case table's page-1 case
  expect_covers({1000, 130}, 300, 7);
  expect_covers({900, 257, 0}, 4096, 1);
  expect_covers({130, 0, 77}, 1, 130);  // budget below bs: one key per request per chunk
  expect_covers({130, 0, 77}, 7, 65);
  expect_covers({0, 0}, 64, 0);  // no prefix: the new-token pass only
}

TEST(MlaPrefixPlan, MergeRingMergesEveryPartOnce) {
  for (int chunks = 1; chunks <= 7; ++chunks) {
    SCOPED_TRACE(chunks);
    std::vector<std::set<int>> slot(3);
    slot[0] = {-1};  // the new tokens' partial
    int acc = 0;
    std::set<int> final_parts;
    for (int c = 0; c < chunks; ++c) {
      ASSERT_NE(acc, 1) << "the running partial must never sit in the chunk slot";
      slot[1] = {c};
      const MergeStep m = merge_step(acc, c + 1 == chunks);
      const std::set<int> read = {m.first, m.first + 1};
      ASSERT_EQ(read, (std::set<int>{acc, 1}));
      std::set<int> merged = slot[static_cast<size_t>(m.first)];
      merged.insert(slot[static_cast<size_t>(m.first + 1)].begin(),
                    slot[static_cast<size_t>(m.first + 1)].end());
      if (c + 1 == chunks) {
        ASSERT_EQ(m.dst, -1);
        final_parts = merged;
      } else {
        ASSERT_GE(m.dst, 0);
        ASSERT_EQ(read.count(m.dst), 0u) << "a merge never writes a slot it reads";
        slot[static_cast<size_t>(m.dst)] = merged;
        acc = m.dst;
      }
    }
    std::set<int> want = {-1};
    for (int c = 0; c < chunks; ++c) want.insert(c);
    EXPECT_EQ(final_parts, want);
  }
}

}  // namespace
}  // namespace attnkit::mla
