// RadixCache: page-granular prefix tree over token ids, with LRU eviction into the PageAllocator.
#include "attnkit/radix_cache.h"

#include <algorithm>
#include <map>
#include <queue>
#include <string>
#include <unordered_set>

namespace attnkit {

struct RadixNode {
  std::vector<int32_t> key;    // token ids, a multiple of page_size (empty for the root)
  std::vector<int64_t> slots;  // pool slots of key, whole pages
  RadixNode* parent = nullptr;
  // Children keyed by their first page of tokens (distinct children differ in the first page).
  std::map<std::vector<int32_t>, std::unique_ptr<RadixNode>> children;
  int64_t lock_ref = 0;
  uint64_t last_access = 0;
  uint64_t id = 0;  // creation order; breaks LRU ties deterministically
};

namespace {

std::vector<int32_t> first_page(std::span<const int32_t> tokens, int64_t page_size) {
  return std::vector<int32_t>(tokens.begin(), tokens.begin() + page_size);
}

// Number of whole pages on which node->key and tokens (a multiple of page_size long) agree.
int64_t matching_pages(const RadixNode& node, std::span<const int32_t> tokens, int64_t page_size) {
  const int64_t limit =
      std::min<int64_t>(static_cast<int64_t>(node.key.size()), static_cast<int64_t>(tokens.size()));
  int64_t i = 0;
  while (i < limit && node.key[static_cast<size_t>(i)] == tokens[static_cast<size_t>(i)]) ++i;
  return i / page_size;
}

// Destroys a subtree without recursion (token-level trees can be very deep).
void destroy_subtree(std::unique_ptr<RadixNode> root) {
  std::vector<std::unique_ptr<RadixNode>> stack;
  stack.push_back(std::move(root));
  while (!stack.empty()) {
    std::unique_ptr<RadixNode> node = std::move(stack.back());
    stack.pop_back();
    for (auto& entry : node->children) stack.push_back(std::move(entry.second));
  }
}

}  // namespace

Result<std::unique_ptr<RadixCache>> RadixCache::create(PageAllocator* allocator) {
  if (allocator == nullptr) {
    return Status::invalid_argument("RadixCache::create: allocator is null");
  }
  return std::unique_ptr<RadixCache>(new RadixCache(allocator, allocator->page_size()));
}

RadixCache::RadixCache(PageAllocator* allocator, int page_size)
    : allocator_(allocator), page_size_(page_size), root_(std::make_unique<RadixNode>()) {
  root_->lock_ref = 1;  // the root is never evicted
  root_->id = next_id_++;
}

RadixCache::~RadixCache() { destroy_subtree(std::move(root_)); }

void RadixCache::touch(RadixNode* node) {
  ++clock_;
  for (RadixNode* n = node; n != nullptr; n = n->parent) n->last_access = clock_;
}

RadixNode* RadixCache::split(RadixNode* node, int64_t pages) {
  const auto cut = static_cast<size_t>(pages * page_size_);
  RadixNode* parent = node->parent;
  auto head = std::make_unique<RadixNode>();
  head->key.assign(node->key.begin(), node->key.begin() + static_cast<std::ptrdiff_t>(cut));
  head->slots.assign(node->slots.begin(), node->slots.begin() + static_cast<std::ptrdiff_t>(cut));
  head->parent = parent;
  head->lock_ref = node->lock_ref;  // every lock on node also covers its ancestors
  head->last_access = node->last_access;
  head->id = next_id_++;
  node->key.erase(node->key.begin(), node->key.begin() + static_cast<std::ptrdiff_t>(cut));
  node->slots.erase(node->slots.begin(), node->slots.begin() + static_cast<std::ptrdiff_t>(cut));

  auto it = parent->children.find(first_page(head->key, page_size_));
  std::unique_ptr<RadixNode> tail = std::move(it->second);
  tail->parent = head.get();
  RadixNode* head_ptr = head.get();
  head->children.emplace(first_page(tail->key, page_size_), std::move(tail));
  it->second = std::move(head);
  return head_ptr;
}

PrefixMatch RadixCache::match_prefix(std::span<const int32_t> tokens) {
  PrefixMatch match;
  const int64_t ps = page_size_;
  const int64_t aligned = static_cast<int64_t>(tokens.size()) / ps * ps;
  RadixNode* node = root_.get();
  int64_t pos = 0;
  while (pos < aligned) {
    const std::span<const int32_t> rest =
        tokens.subspan(static_cast<size_t>(pos), static_cast<size_t>(aligned - pos));
    auto it = node->children.find(first_page(rest, ps));
    if (it == node->children.end()) break;
    RadixNode* child = it->second.get();
    const int64_t pages = matching_pages(*child, rest, ps);
    const bool partial = pages * ps < static_cast<int64_t>(child->key.size());
    if (partial) child = split(child, pages);
    match.slots.insert(match.slots.end(), child->slots.begin(), child->slots.end());
    pos += pages * ps;
    node = child;
    if (partial) break;
  }
  match.length = pos;
  match.last_node = node;
  touch(node);
  return match;
}

Result<InsertResult> RadixCache::insert(std::span<const int32_t> tokens,
                                        std::span<const int64_t> slots) {
  constexpr const char* kFn = "RadixCache::insert";
  if (tokens.size() != slots.size()) {
    return Status::invalid_argument(std::string(kFn) + ": tokens (" +
                                    std::to_string(tokens.size()) + ") and slots (" +
                                    std::to_string(slots.size()) + ") must have the same length");
  }
  const int64_t ps = page_size_;
  const int64_t aligned = static_cast<int64_t>(tokens.size()) / ps * ps;
  // Every whole page must be one allocated pool page, in order.
  for (int64_t p = 0; p < aligned / ps; ++p) {
    const int64_t base = slots[static_cast<size_t>(p * ps)];
    const int64_t page = base / ps;
    if (base < ps || base % ps != 0 || !allocator_->is_allocated(page)) {
      return Status::invalid_argument(
          std::string(kFn) + ": slots[" + std::to_string(p * ps) + "] = " + std::to_string(base) +
          " is not the first slot of an allocated page (page_size " + std::to_string(ps) + ")");
    }
    for (int64_t i = 1; i < ps; ++i) {
      const int64_t slot = slots[static_cast<size_t>(p * ps + i)];
      if (slot != base + i) {
        return Status::invalid_argument(std::string(kFn) + ": slots[" + std::to_string(p * ps + i) +
                                        "] = " + std::to_string(slot) + " should be " +
                                        std::to_string(base + i) + " (a page holds consecutive " +
                                        "slots)");
      }
    }
  }
  // Read-only walk: which caller pages coincide with the tree's, which are new or duplicates.
  int64_t prefix = 0;
  std::vector<int64_t> tree_slots;
  {
    const RadixNode* node = root_.get();
    while (prefix < aligned) {
      const std::span<const int32_t> rest =
          tokens.subspan(static_cast<size_t>(prefix), static_cast<size_t>(aligned - prefix));
      auto it = node->children.find(first_page(rest, ps));
      if (it == node->children.end()) break;
      const int64_t pages = matching_pages(*it->second, rest, ps);
      tree_slots.insert(tree_slots.end(), it->second->slots.begin(),
                        it->second->slots.begin() + static_cast<std::ptrdiff_t>(pages * ps));
      prefix += pages * ps;
      if (pages * ps < static_cast<int64_t>(it->second->key.size())) break;
      node = it->second.get();
    }
  }
  // Caller pages that the tree does not already hold at this position (new pages past the
  // prefix, or duplicates inside it) must not be held by the tree anywhere else (the allocator
  // marks the pages a cache holds).
  std::unordered_set<int64_t> caller_pages;
  std::vector<int64_t> new_pages;
  for (int64_t p = 0; p < aligned / ps; ++p) {
    const int64_t page = slots[static_cast<size_t>(p * ps)] / ps;
    const bool in_prefix = p * ps < prefix;
    if (in_prefix && tree_slots[static_cast<size_t>(p * ps)] / ps == page) continue;
    if (!in_prefix) new_pages.push_back(page);
    if (allocator_->is_cached(page) || !caller_pages.insert(page).second) {
      return Status::invalid_argument(std::string(kFn) + ": page " + std::to_string(page) +
                                      " (slots[" + std::to_string(p * ps) +
                                      "]) is already held by the cache or repeated in slots");
    }
  }
  // The tail (the partial last page, slots[aligned:]) stays the caller's, who frees it after the
  // insert: a tail slot in a page the cache holds or is given here would free that page under the
  // cache, and its KV would be overwritten later.
  for (int64_t i = aligned; i < static_cast<int64_t>(slots.size()); ++i) {
    const int64_t page = slots[static_cast<size_t>(i)] / ps;
    if (allocator_->is_cached(page) || caller_pages.count(page) != 0) {
      return Status::invalid_argument(
          std::string(kFn) + ": tail slots[" + std::to_string(i) + "] = " +
          std::to_string(slots[static_cast<size_t>(i)]) + " lies in page " + std::to_string(page) +
          ", which the cache holds or this insert gives it (the tail's page stays the caller's)");
    }
  }

  InsertResult result;
  result.aligned_len = aligned;
  result.prefix_len = prefix;
  result.inserted_len = aligned - prefix;
  for (int64_t pos = 0; pos < prefix; pos += ps) {
    if (tree_slots[static_cast<size_t>(pos)] != slots[static_cast<size_t>(pos)]) {
      result.duplicate_slots.insert(result.duplicate_slots.end(), slots.begin() + pos,
                                    slots.begin() + pos + ps);
    }
  }
  // The new pages become the cache's in the allocator (nothing else can free them now); they were
  // checked above (allocated, held by no cache), so this does not fail.
  ATTNKIT_RETURN_IF_ERROR(allocator_->hold_for_cache(new_pages));
  // Mutating walk: split where the match ends inside a node, then hang the new pages below.
  RadixNode* node = root_.get();
  int64_t pos = 0;
  while (pos < prefix) {
    const std::span<const int32_t> rest =
        tokens.subspan(static_cast<size_t>(pos), static_cast<size_t>(aligned - pos));
    RadixNode* child = node->children.find(first_page(rest, ps))->second.get();
    const int64_t pages = std::min<int64_t>(matching_pages(*child, rest, ps), (prefix - pos) / ps);
    if (pages * ps < static_cast<int64_t>(child->key.size())) child = split(child, pages);
    pos += pages * ps;
    node = child;
  }
  if (prefix < aligned) {
    auto leaf = std::make_unique<RadixNode>();
    leaf->key.assign(tokens.begin() + prefix, tokens.begin() + aligned);
    leaf->slots.assign(slots.begin() + prefix, slots.begin() + aligned);
    leaf->parent = node;
    leaf->id = next_id_++;
    RadixNode* leaf_ptr = leaf.get();
    node->children.emplace(first_page(leaf->key, ps), std::move(leaf));
    evictable_size_ += aligned - prefix;
    node = leaf_ptr;
  }
  touch(node);
  result.last_node = node;
  return result;
}

// Whether node's parent chain ends at root (the node is a node of this cache, or root itself).
bool RadixCache::owns(const RadixNode* node) const {
  const RadixNode* n = node;
  while (n != nullptr && n != root_.get()) n = n->parent;
  return n == root_.get();
}

Status RadixCache::inc_lock_ref(RadixNode* node) {
  if (!owns(node)) {
    return Status::invalid_argument(
        "RadixCache::inc_lock_ref: the node is not one of this cache's (a match of another "
        "RadixCache, or null)");
  }
  for (RadixNode* n = node; n != nullptr && n != root_.get(); n = n->parent) {
    if (n->lock_ref == 0) {
      evictable_size_ -= static_cast<int64_t>(n->key.size());
      protected_size_ += static_cast<int64_t>(n->key.size());
    }
    ++n->lock_ref;
  }
  return Status::ok();
}

Status RadixCache::dec_lock_ref(RadixNode* node) {
  if (!owns(node)) {
    return Status::invalid_argument(
        "RadixCache::dec_lock_ref: the node is not one of this cache's (a match of another "
        "RadixCache, or null)");
  }
  if (node != root_.get()) {
    // A lock ends at node only if its count exceeds what the locks of longer matches through it
    // (its children's counts) account for.
    int64_t below = 0;
    for (const auto& entry : node->children) below += entry.second->lock_ref;
    if (node->lock_ref <= below) {
      return Status::invalid_argument(
          "RadixCache::dec_lock_ref: no lock ends at this node (its locks belong to longer "
          "matches below it; unlock the node that inc_lock_ref was given)");
    }
  }
  for (RadixNode* n = node; n != nullptr && n != root_.get(); n = n->parent) {
    if (n->lock_ref < 1) {
      return Status::invalid_argument(
          "RadixCache::dec_lock_ref: a node on the path is not locked (unbalanced unlock)");
    }
  }
  for (RadixNode* n = node; n != nullptr && n != root_.get(); n = n->parent) {
    if (--n->lock_ref == 0) {
      evictable_size_ += static_cast<int64_t>(n->key.size());
      protected_size_ -= static_cast<int64_t>(n->key.size());
    }
  }
  return Status::ok();
}

Result<int64_t> RadixCache::evict(int64_t num_tokens) {
  if (num_tokens < 0) {
    return Status::invalid_argument("RadixCache::evict: num_tokens " + std::to_string(num_tokens) +
                                    " must be >= 0");
  }
  const int64_t ps = page_size_;
  auto older = [](const RadixNode* a, const RadixNode* b) {
    return a->last_access != b->last_access ? a->last_access > b->last_access : a->id > b->id;
  };
  std::priority_queue<RadixNode*, std::vector<RadixNode*>, decltype(older)> leaves(older);
  std::vector<RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    for (auto& entry : n->children) stack.push_back(entry.second.get());
    if (n != root_.get() && n->children.empty() && n->lock_ref == 0) leaves.push(n);
  }
  int64_t freed = 0;
  while (freed < num_tokens && !leaves.empty()) {
    RadixNode* leaf = leaves.top();
    leaves.pop();
    const int64_t leaf_pages = static_cast<int64_t>(leaf->key.size()) / ps;
    // Pages covering the tokens still wanted, rounded up without overflow (evict(INT64_MAX),
    // "everything evictable", wrapped negative and aborted in a vector reserve).
    const int64_t still = num_tokens - freed;
    const int64_t wanted_pages = still / ps + (still % ps != 0 ? 1 : 0);
    const int64_t take = std::min(leaf_pages, wanted_pages);
    const auto keep = static_cast<size_t>((leaf_pages - take) * ps);
    const std::span<const int64_t> gone(leaf->slots.data() + keep, leaf->slots.size() - keep);
    Status st = allocator_->free_cached_slots(gone);
    if (!st.is_ok()) {
      return Status::internal("RadixCache::evict: the allocator refused cached pages: " +
                              st.message());
    }
    freed += take * ps;
    evictable_size_ -= take * ps;
    if (take < leaf_pages) {
      leaf->key.resize(keep);
      leaf->slots.resize(keep);
      continue;
    }
    RadixNode* parent = leaf->parent;
    auto it = parent->children.find(first_page(leaf->key, ps));
    destroy_subtree(std::move(it->second));
    parent->children.erase(it);
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0) {
      leaves.push(parent);
    }
  }
  return freed;
}

int64_t RadixCache::node_count() const {
  int64_t count = 0;
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    for (const auto& entry : n->children) stack.push_back(entry.second.get());
    if (n != root_.get()) ++count;
  }
  return count;
}

Status RadixCache::reset() {
  if (protected_size_ > 0) {
    return Status::invalid_argument("RadixCache::reset: " + std::to_string(protected_size_) +
                                    " cached tokens are still locked");
  }
  ATTNKIT_RETURN_IF_ERROR(evict(evictable_size_).status());
  if (total_size() != 0 || node_count() != 0) {
    return Status::internal("RadixCache::reset: " + std::to_string(total_size()) +
                            " tokens remain after evicting everything");
  }
  return Status::ok();
}

}  // namespace attnkit
