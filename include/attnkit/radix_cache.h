// Prefix cache: a radix tree over token-id sequences whose values are KV pool slots.
//
// Everything is page-granular: keys are cut to a multiple of page_size, nodes hold whole pages and
// split only at page boundaries, so a cached prefix is always a run of whole pages that the caller
// can point req_to_token at. A prompt shorter than one page never hits; with 65 tokens and page 64
// the match is 64 tokens; page_size 1 is token-level reuse.
//
// Ownership: pages stored by insert() belong to the cache until evict() frees them back to the
// PageAllocator. Nodes on a path locked with inc_lock_ref() are never evicted. A RadixNode* stays
// valid while it is locked (splits keep the node that a handle points at and put a new parent
// above it); an unlocked handle may be invalidated by evict().
//
// Typical request life cycle (as in SGLang's scheduler):
//   m = match_prefix(prompt); inc_lock_ref(m.last_node);  // (a Status) reuse m.slots, allocate the
//   rest
//   ... run ...
//   r = insert(prompt + output, slots);  free r.duplicate_slots and the tail slots[r.aligned_len:]
//   dec_lock_ref(m.last_node);
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/status.h"

namespace attnkit {

struct RadixNode;  // opaque

struct PrefixMatch {
  int64_t length = 0;              // matched tokens (a multiple of page_size)
  std::vector<int64_t> slots;      // [length] pool slots of the matched tokens
  RadixNode* last_node = nullptr;  // node ending at the match (the root when length == 0)
};

struct InsertResult {
  int64_t aligned_len = 0;   // tokens.size() cut to a multiple of page_size; slots past it are the
                             // caller's (the partial tail page), never touched by the cache
  int64_t prefix_len = 0;    // tokens already cached before this insert (multiple of page_size)
  int64_t inserted_len = 0;  // aligned_len - prefix_len: new tokens now owned by the cache
  // Caller slots of already-cached pages that hold different slots in the tree: the caller still
  // owns these pages and should free them (the tree keeps its own copy).
  std::vector<int64_t> duplicate_slots;
  RadixNode* last_node = nullptr;  // node ending at aligned_len
};

class RadixCache {
 public:
  // The allocator (not owned) must outlive the cache; its page_size is the cache's page size.
  static Result<std::unique_ptr<RadixCache>> create(PageAllocator* allocator);
  // Does not touch the allocator: call reset() first to give the cached pages back.
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  int page_size() const { return page_size_; }
  // Longest cached whole-page prefix of tokens; refreshes the LRU time of the matched path.
  // May split a node at the page boundary where the match ends.
  PrefixMatch match_prefix(std::span<const int32_t> tokens);
  // Stores the whole pages of (tokens, slots). slots must have tokens.size() entries and every
  // whole page must be one pool page in order (slots[p * page_size + i] == page * page_size + i,
  // page >= 1); otherwise kInvalidArgument and nothing changes.
  Result<InsertResult> insert(std::span<const int32_t> tokens, std::span<const int64_t> slots);

  // Reference counts on the path root..node: locked nodes are protected from eviction. Error (and
  // no change) for a node that is not this cache's (its path does not end at this root).
  Status inc_lock_ref(RadixNode* node);
  // Error (and no change) for a node that is not this cache's, or when no lock ends at `node`: some
  // node on the path is not locked, or every lock through `node` belongs to a longer match below
  // it (undoing one of those here would leave its own unlock unbalanced).
  Status dec_lock_ref(RadixNode* node);

  // Frees at least num_tokens tokens (rounded up to whole pages) when possible, least recently
  // used unlocked leaves first, trimming a leaf page by page from its end. Returns the number of
  // tokens freed (less than asked when not enough is evictable).
  Result<int64_t> evict(int64_t num_tokens);

  int64_t evictable_size() const { return evictable_size_; }  // tokens in unlocked nodes
  int64_t protected_size() const { return protected_size_; }  // tokens in locked nodes
  int64_t total_size() const { return evictable_size_ + protected_size_; }
  int64_t node_count() const;  // nodes excluding the root
  // Frees every cached page back to the allocator. Error when some node is still locked.
  Status reset();

 private:
  RadixCache(PageAllocator* allocator, int page_size);
  // Splits `node` after `pages` pages; returns the new parent holding the first part.
  RadixNode* split(RadixNode* node, int64_t pages);
  void touch(RadixNode* node);
  bool owns(const RadixNode* node) const;

  PageAllocator* allocator_ = nullptr;
  int page_size_ = 1;
  std::unique_ptr<RadixNode> root_;
  uint64_t clock_ = 0;    // logical LRU time
  uint64_t next_id_ = 0;  // node creation counter
  int64_t evictable_size_ = 0;
  int64_t protected_size_ = 0;
};

}  // namespace attnkit
