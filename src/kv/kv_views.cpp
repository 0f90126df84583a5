// Host helpers that turn req_to_token rows into what backends consume: page tables (natively paged
// backends), flattened token indices (token-level backends) and last_loc for the allocator.
#include <algorithm>
#include <string>

#include "attnkit/kv_cache.h"

namespace attnkit {

namespace {

Status check_rows_and_lens(const char* fn, const ReqToTokenPool& pool,
                           std::span<const int32_t> req_pool_indices, std::span<const int32_t> lens,
                           const char* lens_name) {
  if (req_pool_indices.size() != lens.size()) {
    return Status::invalid_argument(
        std::string(fn) + ": req_pool_indices (" + std::to_string(req_pool_indices.size()) +
        ") and " + lens_name + " (" + std::to_string(lens.size()) + ") must have the same length");
  }
  for (size_t b = 0; b < lens.size(); ++b) {
    if (req_pool_indices[b] < 0 || req_pool_indices[b] > pool.max_reqs()) {
      return Status::invalid_argument(std::string(fn) + ": req_pool_indices[" + std::to_string(b) +
                                      "] = " + std::to_string(req_pool_indices[b]) +
                                      " is outside [0, " + std::to_string(pool.max_reqs()) + "]");
    }
    if (lens[b] < 0 || lens[b] > pool.max_context_len()) {
      return Status::invalid_argument(std::string(fn) + ": " + lens_name + "[" + std::to_string(b) +
                                      "] = " + std::to_string(lens[b]) +
                                      " is outside [0, max_context_len " +
                                      std::to_string(pool.max_context_len()) + "]");
    }
  }
  return Status::ok();
}

// Entries [begin, end) of request row `row` must have been written: a slot in page 0 (unwritten
// and freed entries read 0) would send a backend to the dummy page instead of the request's keys.
// page_size 0 = unknown (token-level views): then only slot 0, in page 0 at any page size, is
// caught. The padding row 0 points at page 0 by design.
Status check_written(const char* fn, const int32_t* entries, int32_t row, int32_t begin,
                     int32_t end, int page_size) {
  if (row == 0) return Status::ok();
  const int32_t first_usable = std::max(page_size, 1);
  for (int32_t i = begin; i < end; ++i) {
    if (entries[i] < first_usable) {
      return Status::invalid_argument(
          std::string(fn) + ": req_to_token[" + std::to_string(row) + ", " + std::to_string(i) +
          "] = " + std::to_string(entries[i]) + " is in the reserved page 0" +
          (page_size > 0 ? " (page_size " + std::to_string(page_size) + ")" : "") +
          ": the entry below seq_len was never written, or its row was freed");
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<int32_t>> build_page_table_host(const ReqToTokenPool& pool,
                                                   std::span<const int32_t> req_pool_indices,
                                                   std::span<const int32_t> seq_lens, int page_size,
                                                   int* max_pages_out) {
  constexpr const char* kFn = "build_page_table_host";
  if (page_size < 1) {
    return Status::invalid_argument(std::string(kFn) + ": page_size " + std::to_string(page_size) +
                                    " must be >= 1");
  }
  ATTNKIT_RETURN_IF_ERROR(check_rows_and_lens(kFn, pool, req_pool_indices, seq_lens, "seq_lens"));
  // Pages of a length, in 64 bits (len + page_size - 1 overflows int32 near INT32_MAX).
  const auto pages_of = [page_size](int32_t len) {
    return static_cast<int>((int64_t{len} + page_size - 1) / page_size);
  };
  int max_pages = 1;  // never zero-width; padding entries are page 0
  for (const int32_t len : seq_lens) max_pages = std::max(max_pages, pages_of(len));
  const size_t bs = seq_lens.size();
  std::vector<int32_t> table(bs * static_cast<size_t>(max_pages), 0);
  for (size_t b = 0; b < bs; ++b) {
    const int32_t* row = pool.host_row(req_pool_indices[b]);
    const int pages = pages_of(seq_lens[b]);
    for (int p = 0; p < pages; ++p) {
      const int64_t begin = int64_t{p} * page_size;
      const int64_t end = std::min<int64_t>(begin + page_size, seq_lens[b]);
      ATTNKIT_RETURN_IF_ERROR(check_written(kFn, row, req_pool_indices[b],
                                            static_cast<int32_t>(begin), static_cast<int32_t>(end),
                                            page_size));
      const int32_t slot = row[begin];
      if (slot % page_size != 0) {
        return Status::invalid_argument(
            std::string(kFn) + ": req_to_token[" + std::to_string(req_pool_indices[b]) + ", " +
            std::to_string(begin) + "] = " + std::to_string(slot) +
            " is not at a page start (page_size " + std::to_string(page_size) + ")");
      }
      // The page table names whole pages: a kernel reads key begin + i at slot + i, so the later
      // entries of the page must be exactly its next slots.
      for (int64_t k = begin + 1; k < end; ++k) {
        if (int64_t{row[k]} != int64_t{slot} + (k - begin)) {
          return Status::invalid_argument(
              std::string(kFn) + ": req_to_token[" + std::to_string(req_pool_indices[b]) + ", " +
              std::to_string(k) + "] = " + std::to_string(row[k]) + " is not slot " +
              std::to_string(int64_t{slot} + (k - begin)) + " of the page starting at slot " +
              std::to_string(slot) + " (page_size " + std::to_string(page_size) +
              "; a page's tokens fill its slots in order)");
        }
      }
      table[b * static_cast<size_t>(max_pages) + static_cast<size_t>(p)] = slot / page_size;
    }
  }
  if (max_pages_out != nullptr) *max_pages_out = max_pages;
  return table;
}

Result<TokenIndices> build_token_indices_host(const ReqToTokenPool& pool,
                                              std::span<const int32_t> req_pool_indices,
                                              std::span<const int32_t> seq_lens,
                                              std::span<const int32_t> kv_start) {
  constexpr const char* kFn = "build_token_indices_host";
  ATTNKIT_RETURN_IF_ERROR(check_rows_and_lens(kFn, pool, req_pool_indices, seq_lens, "seq_lens"));
  if (!kv_start.empty() && kv_start.size() != seq_lens.size()) {
    return Status::invalid_argument(std::string(kFn) + ": kv_start (" +
                                    std::to_string(kv_start.size()) + ") must be empty or match " +
                                    "seq_lens (" + std::to_string(seq_lens.size()) + ")");
  }
  TokenIndices out;
  out.kv_indptr.assign(seq_lens.size() + 1, 0);
  int64_t total = 0;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    const int32_t start = kv_start.empty() ? 0 : kv_start[b];
    if (start < 0 || start > seq_lens[b]) {
      return Status::invalid_argument(std::string(kFn) + ": kv_start[" + std::to_string(b) +
                                      "] = " + std::to_string(start) + " is outside [0, seq_len " +
                                      std::to_string(seq_lens[b]) + "]");
    }
    ATTNKIT_RETURN_IF_ERROR(check_written(kFn, pool.host_row(req_pool_indices[b]),
                                          req_pool_indices[b], start, seq_lens[b], 0));
    total += seq_lens[b] - start;
    if (total > INT32_MAX) {
      return Status::invalid_argument(std::string(kFn) + ": " + std::to_string(total) +
                                      " indices overflow int32 kv_indptr");
    }
    out.kv_indptr[b + 1] = static_cast<int32_t>(total);
  }
  out.kv_indices.reserve(static_cast<size_t>(total));
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    const int32_t* row = pool.host_row(req_pool_indices[b]);
    const int32_t start = kv_start.empty() ? 0 : kv_start[b];
    out.kv_indices.insert(out.kv_indices.end(), row + start, row + seq_lens[b]);
  }
  return out;
}

Result<std::vector<int64_t>> last_locs_host(const ReqToTokenPool& pool,
                                            std::span<const int32_t> req_pool_indices,
                                            std::span<const int32_t> prefix_lens) {
  ATTNKIT_RETURN_IF_ERROR(
      check_rows_and_lens("last_locs_host", pool, req_pool_indices, prefix_lens, "prefix_lens"));
  std::vector<int64_t> out(prefix_lens.size(), -1);
  for (size_t b = 0; b < prefix_lens.size(); ++b) {
    if (prefix_lens[b] > 0) out[b] = pool.host_row(req_pool_indices[b])[prefix_lens[b] - 1];
  }
  return out;
}

}  // namespace attnkit
