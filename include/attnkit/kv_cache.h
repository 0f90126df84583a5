// Paged KV cache: request->token table, page allocator, MHA and MLA pools.
//
// Layout (token-major, one buffer per layer): slot t lives in page t / page_size at offset
// t % page_size. Page 0 (slots 0..page_size-1) is reserved for dummy writes (padded CUDA-graph
// rows), so every per-layer buffer holds size + page_size rows and usable pages are 1..num_pages.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

// int32 [max_reqs + 1, max_context_len]; entry [r, i] = pool slot of token i of request r.
// Row 0 is reserved (padded CUDA-graph rows point at it) and is never handed out.
class ReqToTokenPool {
 public:
  static Result<std::unique_ptr<ReqToTokenPool>> create(int max_reqs, int max_context_len,
                                                        Device device);
  Result<int> alloc();  // a free request row in [1, max_reqs]
  // Error on row 0, out of range or double free. Zeroes the row (every entry slot 0, in the
  // reserved page 0) in the table and its host mirror (CUDA pools: a synchronous host->device
  // copy) before the row can be handed out again, so nobody reads the freed request's slots.
  // Nothing changes on error.
  Status free(int row);
  bool is_allocated(int row) const;  // handed out by alloc() and not freed since
  int available() const;
  int max_reqs() const { return max_reqs_; }
  int max_context_len() const { return max_context_len_; }
  Device device() const { return buffer_.device(); }
  TensorView table() const;  // int32 [max_reqs + 1, max_context_len] on device()
  // Writes slots[0..n) into row `row` (in [1, max_reqs] and allocated: a row alloc() never
  // handed out or one already freed is refused; row 0 stays all zeros) at columns
  // [start, start + n); checks bounds and that each slot is in [0, INT32_MAX]. Nothing is written
  // on error. Synchronous host->device copy of the written range for CUDA pools.
  Status write(int row, int start, std::span<const int64_t> slots);
  // For host copies of a table (a backend staging a device table to the CPU, a test harness):
  // makes rows `rows` (each in [0, max_reqs]; row 0 is a no-op) of this pool equal to those of
  // `src` (same max_reqs and max_context_len, any device): all entries, from src's host mirror,
  // and whether the row is allocated. Bad arguments change nothing; a failed host->device copy
  // leaves the rows before it copied (each one whole).
  Status copy_rows_from(const ReqToTokenPool& src, std::span<const int32_t> rows);
  // Host mirror of row `row` (max_context_len entries, always equal to the table row); for CPU
  // pools this is the table itself. nullptr when row is outside [0, max_reqs].
  const int32_t* host_row(int row) const;
  // A bound on every entry of the table: the largest slot write() or copy_rows_from() stored in a
  // row since the row was last zeroed (0 for a table that holds none). ForwardBatch::validate and
  // the backends' CUDA-graph replays compare it with the KV pool's rows, so that a forward whose
  // table holds only slots of the pool costs one compare, and any other is looked at row by row
  // (the kernels read these entries as pool rows). Entries stored into table() by other means
  // (the device view written directly) are not seen here.
  int32_t max_slot() const { return max_slot_; }

 private:
  size_t row_offset(int row) const;             // of entry [row, 0]
  void note_row_max(int row, int32_t largest);  // row_max_[row] and the table's bound take it
  void recompute_max_slot();                    // after a row's bound dropped (free, copy)
  // Stores values at entries [offset, offset + n): the table, and for CUDA pools first the device
  // (synchronous copy) and then, once that succeeded, the host mirror.
  Status store(size_t offset, std::span<const int32_t> values);
  int max_reqs_ = 0;
  int max_context_len_ = 0;
  Buffer buffer_;
  std::vector<int32_t> host_;
  std::vector<int> free_rows_;
  std::vector<int32_t> written_end_;  // per row: columns at or past it were never written (zero)
  std::vector<int32_t> row_max_;      // per row: the largest slot stored since it was zeroed
  int32_t max_slot_ = 0;              // the max of row_max_ (kept current: max_slot() only reads)
  std::vector<uint8_t> in_use_;
};

// Free list of page ids 1..num_pages (page 0 reserved). Slots are int64.
class PageAllocator {
 public:
  // Validating factory: num_pages >= 0 and page_size >= 1, else kInvalidArgument.
  static Result<PageAllocator> create(int64_t num_pages, int page_size);
  // Clamps num_pages to >= 0 and page_size to >= 1; prefer create() for untrusted input.
  PageAllocator(int64_t num_pages, int page_size);
  int page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t available_pages() const { return static_cast<int64_t>(free_pages_.size()); }
  int64_t available_slots() const { return available_pages() * page_size_; }

  // For each request r with prefix_lens[r] cached tokens growing to seq_lens[r] tokens, returns the
  // slots of the new tokens (concatenated in request order). last_loc[r] is the slot of the last
  // cached token (-1 when prefix_lens[r] == 0). The partial last page is filled first, then whole
  // new pages, then a new partial page. Running out is kOutOfMemory naming the counts; on error
  // nothing is allocated. The allocator keeps no fill mark inside a page: the slots after
  // last_loc in its page are handed out again on every call (what a caller rolling back rejected
  // draft tokens relies on), so last_loc must be the request's current last token: a stale one
  // from before an earlier call gives two requests, or two tokens, one slot (ForwardBatch::validate
  // refuses that inside one batch on CPU pools).
  Result<std::vector<int64_t>> alloc_extend(std::span<const int32_t> prefix_lens,
                                            std::span<const int32_t> seq_lens,
                                            std::span<const int64_t> last_loc);
  // Validation (kInvalidArgument naming the request): equal span lengths, 0 <= prefix_len <=
  // seq_len; prefix_len == 0 needs last_loc == -1; prefix_len > 0 needs last_loc >= page_size, its
  // page allocated and last_loc % page_size == (prefix_len - 1) % page_size.
  // One new token per request; seq_lens are the lengths including the new token.
  Result<std::vector<int64_t>> alloc_decode(std::span<const int32_t> seq_lens,
                                            std::span<const int64_t> last_loc);
  Result<std::vector<int64_t>> alloc_pages(int64_t n);  // whole pages (page ids)
  // Frees the pages that hold these slots (each page once). Error on a page that is not allocated
  // (double free), a page held by a RadixCache (its eviction frees it) or page 0; on error nothing
  // is freed.
  Status free_slots(std::span<const int64_t> slots);
  Status free_pages(std::span<const int64_t> pages);
  bool is_allocated(int64_t page) const;  // allocated, held by a RadixCache or not
  bool is_cached(int64_t page) const;     // held by a RadixCache

 private:
  // Only a RadixCache calls these (friend): allocated pages handed to the cache, which alone frees
  // them (through free_cached_slots on eviction), so a request freeing its whole row cannot free a
  // cached prefix page that the cache would go on serving. Errors (a page not allocated, already
  // held) change nothing. (Public before session 45: a caller's free_cached_slots let the
  // allocator hand out a page match_prefix still served.)
  friend class RadixCache;
  Status hold_for_cache(std::span<const int64_t> pages);
  Status free_cached_slots(std::span<const int64_t> slots);

  enum PageState : uint8_t { kFree = 0, kAllocated = 1, kCached = 2 };
  // The distinct pages of `slots` (sorted), or an error naming `fn` and the slot outside the pool.
  Result<std::vector<int64_t>> pages_of(const char* fn, std::span<const int64_t> slots) const;
  // alloc_extend / free_pages with their errors naming `fn`, the public call the user made
  // (alloc_decode, free_slots, free_cached_slots go through them).
  Result<std::vector<int64_t>> alloc_extend_as(const char* fn, std::span<const int32_t> prefix_lens,
                                               std::span<const int32_t> seq_lens,
                                               std::span<const int64_t> last_loc);
  Status free_pages_as(const char* fn, std::span<const int64_t> pages);
  int64_t num_pages_ = 0;
  int page_size_ = 1;
  std::vector<int64_t> free_pages_;  // stack; lowest ids handed out first
  std::vector<uint8_t> allocated_;   // [num_pages + 1] PageState
};

// The most layers a KV pool holds (KVPoolConfig::num_layers): far above any model's layer count, so
// that a garbage value fails by name instead of in the per-layer buffer vectors.
inline constexpr int kMaxPoolLayers = 65536;

struct KVPoolConfig {
  int num_layers = 0;
  int64_t size = 0;  // usable token slots (a multiple of page_size); buffers hold size + page_size
  int page_size = 1;
  DType dtype = DType::kBF16;  // storage dtype: bf16, f16, f32, fp8_e4m3, fp8_e5m2, fp4_e2m1
  Device device;
  // MHA
  int num_kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;
  // MLA (num_kv_heads = 1, row = kv_lora_rank + qk_rope_head_dim)
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
};

class KVPool {
 public:
  virtual ~KVPool() = default;
  const KVPoolConfig& config() const { return config_; }
  int64_t rows() const { return config_.size + config_.page_size; }
  int page_size() const { return config_.page_size; }
  DType dtype() const { return config_.dtype; }
  Device device() const { return config_.device; }
  virtual bool is_mla() const = 0;
  // Scatter new k/v rows ([T, heads, dim] in f32, f16 or bf16, innermost stride 1) into slots loc
  // (contiguous int64 [T]) of `layer`, quantising to the pool dtype (bf16/f16/f32: RNE, scale not
  // applied; fp8: RNE(x / scale); fp4: per-16 block scales, see fp4_block_scale_code). Checks
  // layer, shapes, dtypes, devices and scales (finite, > 0) before writing anything; CPU pools also
  // check that every slot is in [page_size, rows) and none repeats first. CUDA pools accept page-0
  // dummy slots and do not look at the slots on the host (they live on the device); instead the
  // scatter kernel skips every write whose slot is outside [0, rows) (nothing outside the pool is
  // touched) and records the first such (layer, token, slot) in the pool's device error word, which
  // check_device_errors() reports. With ATTNKIT_CHECK_INDICES=1 CUDA pools also check the slots
  // synchronously before writing and return kInvalidArgument at once. A `stream` of another device
  // than the pool's is refused by name before anything is written (CUDA 12.8+). CUDA pools in a
  // build without CUDA return kNotBuilt.
  virtual Status set_kv(int layer, const TensorView& loc, const TensorView& k, const TensorView& v,
                        float k_scale, float v_scale, StreamHandle stream) = 0;
  // Device slot guard (CUDA pools): returns kInvalidArgument naming the layer, token and slot of
  // the first out-of-range write that set_kv skipped since the last call, and the pool's rows, then
  // clears the record; ok when there was none. Costs a 24-byte device->host copy and a
  // synchronisation of `stream` (nullptr = default stream), so a serving engine calls it when it
  // wants (e.g. every N steps, or after a step that looked wrong); the harness calls it after every
  // run_backend. The kernels only record (no allocation, graph-capturable), so a write recorded
  // inside a replayed CUDA graph is reported here too. CPU pools (which check slots before writing)
  // always return ok. A `stream` of another device than the pool's is refused by name.
  Status check_device_errors(StreamHandle stream = nullptr);
  // The pool buffer that bytes [begin, begin + bytes) overlap, named as "k[3]" (buffer and layer);
  // empty when none does. For the backends' check that out / lse do not alias the cache (a forward
  // would overwrite cached k / v). O(log of the buffer count).
  std::string storage_overlapping(const void* begin, int64_t bytes) const;

 protected:
  explicit KVPool(KVPoolConfig config) : config_(std::move(config)) {}
  // Allocates and zeroes the device error word (CUDA pools; no-op on CPU). Called by create/wrap.
  Status init_device_guard();
  void* device_guard() const { return guard_.data(); }
  // Records the pool's buffers for storage_overlapping: `groups` pairs a name with one buffer per
  // layer. Called by create/wrap once the buffers exist.
  void index_storage(
      std::initializer_list<std::pair<const char*, const std::vector<Buffer>*>> groups);
  KVPoolConfig config_;
  Buffer guard_;  // detail::KVGuardRecord on the device (CUDA pools only)

 private:
  struct StorageSpan {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    const char* name = "";
    int layer = 0;
  };
  std::vector<StorageSpan> storage_;  // sorted by begin
};

class MHAKVPool final : public KVPool {
 public:
  static Result<std::unique_ptr<MHAKVPool>> create(const KVPoolConfig& config);
  // A pool over caller-owned per-layer buffers (src/kv/kv_pool_external.cpp): k[l] / v[l] are
  // contiguous [size + page_size, num_kv_heads, head_dim / v_head_dim] views of config.dtype on
  // config.device (one per layer); fp4 also needs k_scales / v_scales ([rows, H, D / 16]
  // fp8_e4m3), other dtypes leave them empty. Nothing is copied or zeroed; the pool never frees the
  // memory, which must outlive it. Errors name the layer, the view and what was expected. For a
  // CUDA pool each view's memory must really be device (or managed) memory of config.device: CUDA
  // is asked, and host memory or another GPU's memory is refused by name.
  static Result<std::unique_ptr<MHAKVPool>> wrap(const KVPoolConfig& config,
                                                 std::span<const TensorView> k,
                                                 std::span<const TensorView> v,
                                                 std::span<const TensorView> k_scales = {},
                                                 std::span<const TensorView> v_scales = {});
  bool is_mla() const override { return false; }
  TensorView k_buffer(int layer) const;  // [rows, num_kv_heads, head_dim] (fp4: logical dims)
  TensorView v_buffer(int layer) const;  // [rows, num_kv_heads, v_head_dim]
  // fp4 only: fp8_e4m3 block scales [rows, num_kv_heads, head_dim / 16]; empty otherwise.
  // Dequantised value = fp4 code * block scale * k_scale.
  TensorView k_scale_buffer(int layer) const;
  TensorView v_scale_buffer(int layer) const;
  Status set_kv(int layer, const TensorView& loc, const TensorView& k, const TensorView& v,
                float k_scale, float v_scale, StreamHandle stream) override;

 private:
  explicit MHAKVPool(KVPoolConfig config) : KVPool(std::move(config)) {}
  void index_buffers();  // index_storage over k_, v_ and the fp4 scales (create and wrap)
  std::vector<Buffer> k_, v_, k_scales_, v_scales_;
};

class MLAKVPool final : public KVPool {
 public:
  static Result<std::unique_ptr<MLAKVPool>> create(const KVPoolConfig& config);
  // A pool over caller-owned per-layer buffers: kv[l] is a contiguous [size + page_size, 1,
  // kv_lora_rank + qk_rope_head_dim] view of config.dtype on config.device; fp4 also needs
  // scales[l] ([rows, 1, row_dim / 16] fp8_e4m3). The pool never frees the memory. The views'
  // memory is checked as MHAKVPool::wrap checks it.
  static Result<std::unique_ptr<MLAKVPool>> wrap(const KVPoolConfig& config,
                                                 std::span<const TensorView> kv,
                                                 std::span<const TensorView> scales = {});
  bool is_mla() const override { return true; }
  int row_dim() const { return config_.kv_lora_rank + config_.qk_rope_head_dim; }
  TensorView kv_buffer(int layer) const;  // [rows, 1, kv_lora_rank + qk_rope_head_dim]
  // V is a view of the first kv_lora_rank columns of kv_buffer (strided; no extra memory).
  TensorView v_view(int layer) const;        // [rows, 1, kv_lora_rank], row stride = row_dim()
  TensorView scale_buffer(int layer) const;  // fp4 only: [rows, 1, row_dim / 16] fp8_e4m3
  // k: [T, 1, row_dim]; v is ignored (may be empty) since V lives inside the K row.
  Status set_kv(int layer, const TensorView& loc, const TensorView& k, const TensorView& v,
                float k_scale, float v_scale, StreamHandle stream) override;

 private:
  explicit MLAKVPool(KVPoolConfig config) : KVPool(std::move(config)) {}
  void index_buffers();  // index_storage over kv_ and the fp4 scales (create and wrap)
  std::vector<Buffer> kv_, scales_;
};

// ---- fp4 KV helpers (shared by the CPU pool, the CUDA kernel's tests and CPU backends) ----
// The fp8_e4m3 block scale of a group of 16 values with max |x| = amax under layer scale
// `layer_scale`: the smallest e4m3 value >= (amax / 6) / layer_scale (rounded up so that no code
// saturates), clamped to 448; 0 when amax == 0 or not finite-positive.
uint8_t fp4_block_scale_code(float amax, float layer_scale);
// Dequantised value of element [slot, head, d] of a host KV buffer ([rows, H, D], any KV dtype,
// any strides) with its fp4 block scales ([rows, H, D / 16] fp8_e4m3; ignored for other dtypes):
// bf16/f16/f32 -> the value; fp8 -> value * layer_scale; fp4 -> code * block * layer_scale.
float load_kv_value_host(const TensorView& buffer, const TensorView& scales, int64_t slot,
                         int64_t head, int64_t d, float layer_scale);

// Views for backends.
// Token indices of request r: req_to_token[r, 0:len] (backends without native paging).
// Page table of request r: req_to_token[r, ::page_size] / page_size (natively paged backends).
// Host helper: builds the page table [bs, max_pages] (int32) from the host mirror. Entries past a
// request's pages are padding: page 0, the reserved dummy page (as is the whole table row of a
// request on the padding row 0).
Result<std::vector<int32_t>> build_page_table_host(const ReqToTokenPool& pool,
                                                   std::span<const int32_t> req_pool_indices,
                                                   std::span<const int32_t> seq_lens, int page_size,
                                                   int* max_pages_out);
// Validation for build_page_table_host: equal span lengths, page_size >= 1, rows in
// [0, max_reqs], seq_lens in [0, max_context_len], every page-start entry a multiple of
// page_size, and (rows >= 1) no entry below seq_len in page 0: such an entry was never written
// (or was freed), and a backend would read the dummy page as the request's keys. The error names
// the row, the position and the value. max_pages is at least 1 so the table is never zero-width.

// Token-level indices (backends without native paging): request b covers
// req_to_token[req_pool_indices[b], kv_start[b] : seq_lens[b]] (kv_start empty = all zero; used
// for encoder prefixes and sliding windows). kv_indptr has bs + 1 entries; kv_indices holds the
// slots of all requests back to back. An entry 0 in a covered range of a row >= 1 (never written,
// or freed) is refused naming the row, the position and the value; the padding row 0 reads 0.
struct TokenIndices {
  std::vector<int32_t> kv_indptr;   // [bs + 1]
  std::vector<int32_t> kv_indices;  // [kv_indptr[bs]]
};
Result<TokenIndices> build_token_indices_host(const ReqToTokenPool& pool,
                                              std::span<const int32_t> req_pool_indices,
                                              std::span<const int32_t> seq_lens,
                                              std::span<const int32_t> kv_start = {});

// last_loc for PageAllocator::alloc_extend from the host mirror: req_to_token[r, prefix_len - 1],
// or -1 when prefix_len == 0.
Result<std::vector<int64_t>> last_locs_host(const ReqToTokenPool& pool,
                                            std::span<const int32_t> req_pool_indices,
                                            std::span<const int32_t> prefix_lens);

}  // namespace attnkit
