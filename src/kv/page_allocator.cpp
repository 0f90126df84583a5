// PageAllocator: free list of page ids 1..num_pages; slot s lives in page s / page_size.
#include <algorithm>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "attnkit/kv_cache.h"

namespace attnkit {

namespace {

std::string req_prefix(const char* fn, size_t r) {
  return std::string(fn) + ": request " + std::to_string(r) + ": ";
}

}  // namespace

Result<PageAllocator> PageAllocator::create(int64_t num_pages, int page_size) {
  if (num_pages < 0) {
    return Status::invalid_argument("num_pages " + std::to_string(num_pages) + " must be >= 0");
  }
  if (page_size < 1) {
    return Status::invalid_argument("page_size " + std::to_string(page_size) + " must be >= 1");
  }
  // Slots (page x page_size + offset, page 0 reserved) are int32 in req_to_token.
  const int64_t max_pages = std::numeric_limits<int32_t>::max() / page_size - 1;
  if (num_pages > max_pages) {
    return Status::invalid_argument(
        "num_pages " + std::to_string(num_pages) + " at page_size " + std::to_string(page_size) +
        " must be <= " + std::to_string(max_pages) + " (KV slots are int32)");
  }
  try {
    return PageAllocator(num_pages, page_size);
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory("PageAllocator: no host memory for the free list of " +
                                 std::to_string(num_pages) + " pages");
  }
}

PageAllocator::PageAllocator(int64_t num_pages, int page_size)
    : num_pages_(std::max<int64_t>(num_pages, 0)), page_size_(std::max(page_size, 1)) {
  allocated_.assign(static_cast<size_t>(num_pages_) + 1, 0);
  free_pages_.reserve(static_cast<size_t>(num_pages_));
  for (int64_t page = num_pages_; page >= 1; --page) free_pages_.push_back(page);
}

bool PageAllocator::is_allocated(int64_t page) const {
  if (page < 1 || page > num_pages_) return false;
  return allocated_[static_cast<size_t>(page)] != 0;
}

Result<std::vector<int64_t>> PageAllocator::alloc_extend(std::span<const int32_t> prefix_lens,
                                                         std::span<const int32_t> seq_lens,
                                                         std::span<const int64_t> last_loc) {
  return alloc_extend_as("alloc_extend", prefix_lens, seq_lens, last_loc);
}

Result<std::vector<int64_t>> PageAllocator::alloc_extend_as(const char* kFn,
                                                            std::span<const int32_t> prefix_lens,
                                                            std::span<const int32_t> seq_lens,
                                                            std::span<const int64_t> last_loc) {
  if (prefix_lens.size() != seq_lens.size() || prefix_lens.size() != last_loc.size()) {
    return Status::invalid_argument(
        std::string(kFn) + ": prefix_lens (" + std::to_string(prefix_lens.size()) +
        "), seq_lens (" + std::to_string(seq_lens.size()) + ") and last_loc (" +
        std::to_string(last_loc.size()) + ") must have the same length");
  }
  const int64_t ps = page_size_;
  const int64_t slot_end = (num_pages_ + 1) * ps;
  // Pass 1: validate and count the pages needed, touching nothing.
  std::vector<std::pair<int64_t, size_t>> partial_pages;  // (page, request) filled in place
  int64_t pages_needed = 0;
  int64_t tokens_needed = 0;
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    const int64_t prefix = prefix_lens[r];
    const int64_t seq = seq_lens[r];
    const int64_t last = last_loc[r];
    if (prefix < 0) {
      return Status::invalid_argument(req_prefix(kFn, r) + "prefix_len " + std::to_string(prefix) +
                                      " must be >= 0");
    }
    if (seq < prefix) {
      return Status::invalid_argument(req_prefix(kFn, r) + "seq_len " + std::to_string(seq) +
                                      " is smaller than prefix_len " + std::to_string(prefix));
    }
    if (prefix == 0) {
      if (last != -1) {
        return Status::invalid_argument(req_prefix(kFn, r) + "last_loc " + std::to_string(last) +
                                        " must be -1 when prefix_len is 0");
      }
    } else {
      if (last < ps || last >= slot_end) {
        return Status::invalid_argument(req_prefix(kFn, r) + "last_loc " + std::to_string(last) +
                                        " is outside the usable slots [" + std::to_string(ps) +
                                        ", " + std::to_string(slot_end) + ") (prefix_len " +
                                        std::to_string(prefix) + ")");
      }
      if (!is_allocated(last / ps)) {
        return Status::invalid_argument(req_prefix(kFn, r) + "last_loc " + std::to_string(last) +
                                        " is in page " + std::to_string(last / ps) +
                                        ", which is not allocated");
      }
      if (last % ps != (prefix - 1) % ps) {
        return Status::invalid_argument(
            req_prefix(kFn, r) + "last_loc " + std::to_string(last) + " is at page offset " +
            std::to_string(last % ps) + " but prefix_len " + std::to_string(prefix) +
            " puts the last cached token at offset " + std::to_string((prefix - 1) % ps) +
            " (page_size " + std::to_string(ps) + ")");
      }
    }
    const int64_t extend = seq - prefix;
    const int64_t room_in_last_page = (prefix % ps == 0) ? 0 : ps - prefix % ps;
    const int64_t rest = std::max<int64_t>(extend - room_in_last_page, 0);
    pages_needed += (rest + ps - 1) / ps;
    tokens_needed += extend;
    if (room_in_last_page > 0 && extend > 0) {
      // The partial page must be the request's own: a page the radix cache holds is shared (its
      // slots past last_loc may be another prefix's cached tokens, which match_prefix still
      // serves), so filling it would hand those slots out a second time.
      if (allocated_[static_cast<size_t>(last / ps)] == kCached) {
        return Status::invalid_argument(
            req_prefix(kFn, r) + "last_loc " + std::to_string(last) + " is in page " +
            std::to_string(last / ps) +
            ", which the radix cache holds: only a request's own partial page can be extended "
            "(a prefix matched from the cache ends at a page boundary; round prefix_len down to " +
            std::to_string(prefix / ps * ps) +
            (prefix < ps ? ", with last_loc -1,"
                         : " (last_loc then the slot of token " +
                               std::to_string(prefix / ps * ps - 1) + ")") +
            " and allocate from there)");
      }
      partial_pages.emplace_back(last / ps, r);
    }
  }
  std::sort(partial_pages.begin(), partial_pages.end());
  for (size_t i = 1; i < partial_pages.size(); ++i) {
    if (partial_pages[i].first == partial_pages[i - 1].first) {
      return Status::invalid_argument(
          std::string(kFn) + ": requests " + std::to_string(partial_pages[i - 1].second) + " and " +
          std::to_string(partial_pages[i].second) + " would both fill page " +
          std::to_string(partial_pages[i].first) + " (a page belongs to one request)");
    }
  }
  if (pages_needed > available_pages()) {
    return Status::out_of_memory(std::string(kFn) + ": " + std::to_string(tokens_needed) +
                                 " new tokens need " + std::to_string(pages_needed) +
                                 " new pages but only " + std::to_string(available_pages()) +
                                 " of " + std::to_string(num_pages_) + " pages (page_size " +
                                 std::to_string(ps) + ") are free");
  }
  // Pass 2: hand out slots.
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(tokens_needed));
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    const int64_t prefix = prefix_lens[r];
    int64_t remaining = static_cast<int64_t>(seq_lens[r]) - prefix;
    // 1) the partial last page: slots last_loc + 1 .. up to the page end.
    if (prefix % ps != 0) {
      const int64_t take = std::min(remaining, ps - prefix % ps);
      for (int64_t i = 1; i <= take; ++i) out.push_back(last_loc[r] + i);
      remaining -= take;
    }
    // 2) whole new pages, then 3) a new partial page.
    while (remaining > 0) {
      const int64_t page = free_pages_.back();
      free_pages_.pop_back();
      allocated_[static_cast<size_t>(page)] = kAllocated;
      const int64_t take = std::min(remaining, ps);
      for (int64_t i = 0; i < take; ++i) out.push_back(page * ps + i);
      remaining -= take;
    }
  }
  return out;
}

Result<std::vector<int64_t>> PageAllocator::alloc_decode(std::span<const int32_t> seq_lens,
                                                         std::span<const int64_t> last_loc) {
  std::vector<int32_t> prefix_lens(seq_lens.size());
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    if (seq_lens[r] < 1) {
      return Status::invalid_argument(req_prefix("alloc_decode", r) + "seq_len " +
                                      std::to_string(seq_lens[r]) +
                                      " must be >= 1 (it includes the new token)");
    }
    prefix_lens[r] = seq_lens[r] - 1;
  }
  return alloc_extend_as("alloc_decode", prefix_lens, seq_lens, last_loc);
}

Result<std::vector<int64_t>> PageAllocator::alloc_pages(int64_t n) {
  if (n < 0) {
    return Status::invalid_argument("alloc_pages: n " + std::to_string(n) + " must be >= 0");
  }
  if (n > available_pages()) {
    return Status::out_of_memory("alloc_pages: requested " + std::to_string(n) +
                                 " pages but only " + std::to_string(available_pages()) + " of " +
                                 std::to_string(num_pages_) + " pages are free");
  }
  std::vector<int64_t> pages;
  pages.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t page = free_pages_.back();
    free_pages_.pop_back();
    allocated_[static_cast<size_t>(page)] = kAllocated;
    pages.push_back(page);
  }
  return pages;
}

Result<std::vector<int64_t>> PageAllocator::pages_of(const char* fn,
                                                     std::span<const int64_t> slots) const {
  const int64_t ps = page_size_;
  std::vector<int64_t> pages;
  pages.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t slot = slots[i];
    if (slot < ps || slot >= (num_pages_ + 1) * ps) {
      return Status::invalid_argument(
          std::string(fn) + ": slots[" + std::to_string(i) + "] = " + std::to_string(slot) +
          " is outside the usable slots [" + std::to_string(ps) + ", " +
          std::to_string((num_pages_ + 1) * ps) + ") (page 0 is reserved)");
    }
    const int64_t page = slot / ps;
    if (pages.empty() || pages.back() != page) pages.push_back(page);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return pages;
}

Status PageAllocator::free_slots(std::span<const int64_t> slots) {
  ATTNKIT_ASSIGN_OR_RETURN(std::vector<int64_t> pages, pages_of("free_slots", slots));
  return free_pages_as("free_slots", pages);
}

bool PageAllocator::is_cached(int64_t page) const {
  if (page < 1 || page > num_pages_) return false;
  return allocated_[static_cast<size_t>(page)] == kCached;
}

Status PageAllocator::hold_for_cache(std::span<const int64_t> pages) {
  for (const int64_t page : pages) {
    if (page < 1 || page > num_pages_ || allocated_[static_cast<size_t>(page)] != kAllocated) {
      return Status::invalid_argument(
          "hold_for_cache: page " + std::to_string(page) + " is " +
          (page < 1 || page > num_pages_ ? "outside [1, " + std::to_string(num_pages_) + "]"
           : allocated_[static_cast<size_t>(page)] == kCached ? std::string("already cached")
                                                              : std::string("not allocated")));
    }
  }
  for (const int64_t page : pages) allocated_[static_cast<size_t>(page)] = kCached;
  return Status::ok();
}

Status PageAllocator::free_cached_slots(std::span<const int64_t> slots) {
  ATTNKIT_ASSIGN_OR_RETURN(std::vector<int64_t> pages, pages_of("free_cached_slots", slots));
  for (const int64_t page : pages) {
    if (allocated_[static_cast<size_t>(page)] != kCached) {
      return Status::invalid_argument("free_cached_slots: page " + std::to_string(page) +
                                      " is not held by the cache");
    }
  }
  for (const int64_t page : pages) allocated_[static_cast<size_t>(page)] = kAllocated;
  return free_pages_as("free_cached_slots", pages);
}

Status PageAllocator::free_pages(std::span<const int64_t> pages) {
  return free_pages_as("free_pages", pages);
}

Status PageAllocator::free_pages_as(const char* fn, std::span<const int64_t> pages) {
  const std::string at = std::string(fn) + ": page ";
  std::vector<int64_t> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int64_t page = sorted[i];
    if (page < 1 || page > num_pages_) {
      return Status::invalid_argument(at + std::to_string(page) + " is outside [1, " +
                                      std::to_string(num_pages_) + "] (page 0 is reserved)");
    }
    if (i > 0 && sorted[i - 1] == page) {
      return Status::invalid_argument(at + std::to_string(page) + " appears more than once");
    }
    if (allocated_[static_cast<size_t>(page)] == kFree) {
      return Status::invalid_argument(at + std::to_string(page) +
                                      " is not allocated (double free?)");
    }
    if (allocated_[static_cast<size_t>(page)] == kCached) {
      return Status::invalid_argument(at + std::to_string(page) +
                                      " is held by the radix cache (its eviction frees it; free "
                                      "only a request's pages past its cached prefix)");
    }
  }
  for (const int64_t page : sorted) allocated_[static_cast<size_t>(page)] = kFree;
  // Keep the free list sorted descending so the lowest ids are handed out first.
  const auto old_size = static_cast<std::ptrdiff_t>(free_pages_.size());
  free_pages_.insert(free_pages_.end(), sorted.rbegin(), sorted.rend());
  std::inplace_merge(free_pages_.begin(), free_pages_.begin() + old_size, free_pages_.end(),
                     std::greater<int64_t>());
  return Status::ok();
}

}  // namespace attnkit
