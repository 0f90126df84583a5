// ForwardMode names and ForwardBatch::validate.
#include "attnkit/forward_batch.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/env_knob.h"
#include "core/str_cat.h"
#include "kv/table_slots.h"

namespace attnkit {

const char* forward_mode_name(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kExtend:
      return "extend";
    case ForwardMode::kDecode:
      return "decode";
    case ForwardMode::kMixed:
      return "mixed";
    case ForwardMode::kIdle:
      return "idle";
    case ForwardMode::kTargetVerify:
      return "target_verify";
    case ForwardMode::kDraftExtend:
      return "draft_extend";
  }
  return "unknown";
}

namespace {

// The batch's arrays live where its KV pool does (the kernels and the planners index them as
// plain contiguous arrays of that device): contiguous, and on `device` when one is known (the
// pool's; a batch without a pool has no array a backend reads).
Status check_layout(const TensorView& t, const char* name, const std::optional<Device>& device) {
  if (!t.is_contiguous()) {
    return Status::invalid_argument(cat("ForwardBatch.", name,
                                        ": expected a contiguous array, got ", t.describe(),
                                        " with stride ", t.ndim > 0 ? t.strides[0] : 0));
  }
  if (device && t.device != *device && t.numel() > 0) {  // an empty array is never read
    return Status::invalid_argument(cat("ForwardBatch.", name, " is on ", t.device.to_string(),
                                        ", the KV pool on ", device->to_string(),
                                        ": the batch's arrays must be on the pool's device"));
  }
  return Status::ok();
}

// A device tensor mirrored by a host array: when defined it must be a contiguous 1-D `dtype` of n
// elements on `device`.
Status check_array(const TensorView& t, const char* name, DType dtype, int64_t n, bool required,
                   const std::optional<Device>& device) {
  if (!t.defined()) {
    if (required && n > 0) {
      return Status::invalid_argument(
          cat("ForwardBatch.", name, " is missing: expected ", dtype_name(dtype), "[", n, "]"));
    }
    return Status::ok();
  }
  if (t.dtype != dtype || t.ndim != 1 || t.shape[0] != n) {
    return Status::invalid_argument(cat("ForwardBatch.", name, ": expected ", dtype_name(dtype),
                                        "[", n, "], got ", t.describe()));
  }
  return check_layout(t, name, device);
}

Status check_host_size(size_t size, const char* name, int64_t n) {
  if (static_cast<int64_t>(size) != n) {
    return Status::invalid_argument(
        cat("ForwardBatch.", name, " has ", size, " entries, expected batch_size ", n));
  }
  return Status::ok();
}

bool check_indices_enabled() { return env_flag("ATTNKIT_CHECK_INDICES", false); }

// `host` against `array` where the array is in host memory and both hold one value per request
// (validate() checked the array's dtype and size where the mode uses it; anything else is left).
Status check_host_copy(const TensorView& array, const std::vector<int32_t>& host,
                       const char* name) {
  if (!array.defined() || !array.device.is_cpu() || array.dtype != DType::kI32 || array.ndim != 1 ||
      array.shape[0] != static_cast<int64_t>(host.size())) {
    return Status::ok();
  }
  const auto* values = array.data_as<const int32_t>();
  for (size_t i = 0; i < host.size(); ++i) {
    const int32_t value = values[static_cast<int64_t>(i) * array.stride(0)];
    if (value != host[i]) {
      return Status::invalid_argument(cat("ForwardBatch.", name, "_host[", i, "] = ", host[i],
                                          " but ", name, "[", i, "] = ", value,
                                          ": a host copy must hold its array's values"));
    }
  }
  return Status::ok();
}

}  // namespace

Status ForwardBatch::validate() const {
  if (batch_size < 0) {
    return Status::invalid_argument(cat("ForwardBatch.batch_size ", batch_size, " must be >= 0"));
  }
  if (num_tokens < 0) {
    return Status::invalid_argument(cat("ForwardBatch.num_tokens ", num_tokens, " must be >= 0"));
  }
  if (mode == ForwardMode::kIdle) {
    if (num_tokens != 0) {
      return Status::invalid_argument(
          cat("ForwardBatch.num_tokens ", num_tokens, " must be 0 in mode idle"));
    }
    return Status::ok();
  }
  const int64_t bs = batch_size;
  std::optional<Device> dev;
  if (kv_pool != nullptr) dev = kv_pool->device();
  if (dev && req_to_token_pool != nullptr && req_to_token_pool->device() != *dev) {
    return Status::invalid_argument(
        cat("ForwardBatch.req_to_token_pool is on ", req_to_token_pool->device().to_string(),
            ", the KV pool on ", dev->to_string(), ": both must be on one device"));
  }
  ATTNKIT_RETURN_IF_ERROR(
      check_host_size(req_pool_indices_host.size(), "req_pool_indices_host", bs));
  ATTNKIT_RETURN_IF_ERROR(check_host_size(seq_lens_host.size(), "seq_lens_host", bs));
  ATTNKIT_RETURN_IF_ERROR(
      check_array(req_pool_indices, "req_pool_indices", DType::kI32, bs, true, dev));
  ATTNKIT_RETURN_IF_ERROR(check_array(seq_lens, "seq_lens", DType::kI32, bs, true, dev));
  ATTNKIT_RETURN_IF_ERROR(
      check_array(out_cache_loc, "out_cache_loc", DType::kI64, num_tokens, true, dev));
  ATTNKIT_RETURN_IF_ERROR(check_array(positions, "positions", DType::kI64, num_tokens, false, dev));

  const bool verify = mode == ForwardMode::kTargetVerify;
  int draft = 0;
  if (verify) {
    if (!has_spec) {
      return Status::invalid_argument("ForwardBatch.has_spec is false in mode target_verify");
    }
    draft = spec.draft_token_num;
    if (draft <= 0) {
      return Status::invalid_argument(
          cat("ForwardBatch.spec.draft_token_num ", draft, " must be > 0 in mode target_verify"));
    }
    if (spec.topk < 1) {
      return Status::invalid_argument(cat("ForwardBatch.spec.topk ", spec.topk, " must be >= 1"));
    }
    if (static_cast<int64_t>(num_tokens) != bs * draft) {
      return Status::invalid_argument(cat("ForwardBatch.num_tokens ", num_tokens,
                                          " must equal batch_size * spec.draft_token_num = ",
                                          bs * draft, " in mode target_verify"));
    }
  }
  // A SpecInfo in any mode (draft_extend carries one too) holds counts: topk >= 1 (1 = chain), the
  // others >= 0.
  if (has_spec && (spec.topk < 1 || spec.draft_token_num < 0 || spec.num_steps < 0)) {
    return Status::invalid_argument(cat("ForwardBatch.spec: topk ", spec.topk, ", draft_token_num ",
                                        spec.draft_token_num, ", num_steps ", spec.num_steps,
                                        " (topk must be >= 1, the counts >= 0)"));
  }

  // Encoder lengths (optional).
  const bool has_encoder = !encoder_lens_host.empty();
  if (has_encoder) {
    ATTNKIT_RETURN_IF_ERROR(check_host_size(encoder_lens_host.size(), "encoder_lens_host", bs));
  }
  // The CUDA kernels read the encoder lengths from the device array (a CPU backend reads the host
  // copy): on a CUDA pool host lengths without the device array had reached the index kernel as
  // a null pointer.
  const bool on_cuda = dev && dev->is_cuda();
  if (has_encoder && on_cuda && !encoder_lens.defined()) {
    return Status::invalid_argument(
        cat("ForwardBatch.encoder_lens is missing: encoder_lens_host is given and the KV pool is "
            "on ",
            dev->to_string(), ", whose kernels read the device array (int32[", bs, "])"));
  }
  ATTNKIT_RETURN_IF_ERROR(check_array(encoder_lens, "encoder_lens", DType::kI32, bs, false, dev));
  if (encoder_lens.defined() && !has_encoder) {
    return Status::invalid_argument(
        "ForwardBatch.encoder_lens is set but encoder_lens_host is empty");
  }

  int64_t sum = 0;
  for (int64_t r = 0; r < bs; ++r) {
    if (seq_lens_host[r] < 0) {
      return Status::invalid_argument(
          cat("ForwardBatch.seq_lens_host[", r, "] = ", seq_lens_host[r], " must be >= 0"));
    }
    if (has_encoder && encoder_lens_host[r] < 0) {
      return Status::invalid_argument(
          cat("ForwardBatch.encoder_lens_host[", r, "] = ", encoder_lens_host[r], " must be >= 0"));
    }
    sum += seq_lens_host[r];
  }
  if (seq_lens_sum != sum) {
    return Status::invalid_argument(cat("ForwardBatch.seq_lens_sum ", seq_lens_sum,
                                        " does not match the sum of seq_lens_host ", sum));
  }
  // The CUDA index metadata (token-index prefix sums, kv_indptr) is int32: a larger total would
  // wrap into negative offsets and out-of-bounds writes.
  if (on_cuda) {
    int64_t total = sum;
    if (has_encoder) {
      for (int64_t r = 0; r < bs; ++r) total += encoder_lens_host[r];
    }
    constexpr int64_t kMaxIndexTotal = std::numeric_limits<int32_t>::max();
    if (total > kMaxIndexTotal) {
      return Status::invalid_argument(
          cat("ForwardBatch.seq_lens_sum ", sum, has_encoder ? " plus the encoder lengths" : "",
              " = ", total, " exceeds ", kMaxIndexTotal,
              " (the CUDA kernels' token indices are int32); split the batch"));
    }
  }

  if (mode == ForwardMode::kDecode) {
    if (num_tokens != batch_size) {
      return Status::invalid_argument(cat("ForwardBatch.num_tokens ", num_tokens,
                                          " must equal batch_size ", batch_size,
                                          " in mode decode"));
    }
    for (int64_t r = 0; r < bs; ++r) {
      if (seq_lens_host[r] < 1) {
        return Status::invalid_argument(
            cat("ForwardBatch.seq_lens_host[", r, "] = ", seq_lens_host[r],
                " must be >= 1 in mode decode (it counts the new token)"));
      }
    }
  } else if (!verify || !extend_seq_lens_host.empty() || !extend_prefix_lens_host.empty()) {
    // Extend modes: per-request prefix and new-token counts (optional for target_verify, where
    // seq_lens and spec.draft_token_num say the same).
    ATTNKIT_RETURN_IF_ERROR(
        check_host_size(extend_prefix_lens_host.size(), "extend_prefix_lens_host", bs));
    ATTNKIT_RETURN_IF_ERROR(
        check_host_size(extend_seq_lens_host.size(), "extend_seq_lens_host", bs));
    ATTNKIT_RETURN_IF_ERROR(
        check_array(extend_prefix_lens, "extend_prefix_lens", DType::kI32, bs, true, dev));
    ATTNKIT_RETURN_IF_ERROR(
        check_array(extend_seq_lens, "extend_seq_lens", DType::kI32, bs, true, dev));
    ATTNKIT_RETURN_IF_ERROR(
        check_array(extend_start_loc, "extend_start_loc", DType::kI32, bs, false, dev));
    if (!extend_start_loc_host.empty()) {
      ATTNKIT_RETURN_IF_ERROR(
          check_host_size(extend_start_loc_host.size(), "extend_start_loc_host", bs));
    }
    int64_t tokens = 0;
    for (int64_t r = 0; r < bs; ++r) {
      const int32_t prefix = extend_prefix_lens_host[r];
      const int32_t n = extend_seq_lens_host[r];
      if (prefix < 0 || n < 0) {
        return Status::invalid_argument(cat("ForwardBatch request ", r, ": extend_prefix_len ",
                                            prefix, " and extend_seq_len ", n, " must be >= 0"));
      }
      if (!extend_start_loc_host.empty() && extend_start_loc_host[r] != tokens) {
        return Status::invalid_argument(cat("ForwardBatch.extend_start_loc_host[", r,
                                            "] = ", extend_start_loc_host[r], " must be ", tokens,
                                            " (the sum of the earlier extend_seq_lens)"));
      }
      if (verify) {
        if (n != draft || prefix != seq_lens_host[r]) {
          return Status::invalid_argument(
              cat("ForwardBatch request ", r, " (target_verify): extend_seq_len ", n,
                  " must equal spec.draft_token_num ", draft, " and extend_prefix_len ", prefix,
                  " must equal seq_len ", seq_lens_host[r], " (the committed prefix)"));
        }
      } else if (seq_lens_host[r] != int64_t{prefix} + n) {
        return Status::invalid_argument(cat("ForwardBatch request ", r, ": seq_len ",
                                            seq_lens_host[r], " must equal extend_prefix_len ",
                                            prefix, " + extend_seq_len ", n));
      }
      tokens += n;
    }
    if (tokens != num_tokens) {
      return Status::invalid_argument(cat("ForwardBatch.num_tokens ", num_tokens,
                                          " does not match the sum of extend_seq_lens ", tokens));
    }
  }

  // An array in host memory and its host copy are both readable here: they must agree (CPU
  // backends plan and run from the host copies, so a copy that contradicted its array ran another
  // batch than the arrays describe, silently).
  for (const auto& [array, host, name] :
       {std::tuple{&req_pool_indices, &req_pool_indices_host, "req_pool_indices"},
        {&seq_lens, &seq_lens_host, "seq_lens"},
        {&extend_prefix_lens, &extend_prefix_lens_host, "extend_prefix_lens"},
        {&extend_seq_lens, &extend_seq_lens_host, "extend_seq_lens"},
        {&extend_start_loc, &extend_start_loc_host, "extend_start_loc"},
        {&encoder_lens, &encoder_lens_host, "encoder_lens"}}) {
    ATTNKIT_RETURN_IF_ERROR(check_host_copy(*array, *host, name));
  }
  // Speculative tree mask.
  if (has_spec && spec.custom_mask.defined()) {
    if (spec.custom_mask.dtype != DType::kU8) {
      return Status::invalid_argument(
          cat("ForwardBatch.spec.custom_mask: expected uint8, got ", spec.custom_mask.describe()));
    }
    // The kernels read request r's bits at custom_mask + mask_indptr[r] as one flat byte array.
    ATTNKIT_RETURN_IF_ERROR(check_layout(spec.custom_mask, "spec.custom_mask", dev));
    ATTNKIT_RETURN_IF_ERROR(
        check_host_size(spec.mask_indptr_host.size(), "spec.mask_indptr_host", bs + 1));
    ATTNKIT_RETURN_IF_ERROR(
        check_array(spec.mask_indptr, "spec.mask_indptr", DType::kI64, bs + 1, true, dev));
    if (verify) {
      for (int64_t r = 0; r < bs; ++r) {
        const int64_t expected = static_cast<int64_t>(draft) * (seq_lens_host[r] + draft);
        const int64_t got = spec.mask_indptr_host[r + 1] - spec.mask_indptr_host[r];
        if (spec.mask_indptr_host[r] < 0 || got != expected) {
          return Status::invalid_argument(cat("ForwardBatch.spec.mask_indptr_host: request ", r,
                                              " spans ", got, " mask bytes from ",
                                              spec.mask_indptr_host[r],
                                              ", expected N * (prefix + N) = ", expected, " (N ",
                                              draft, ", prefix ", seq_lens_host[r], ")"));
        }
      }
    }
    if (spec.mask_indptr_host[bs] > spec.custom_mask.numel()) {
      return Status::invalid_argument(
          cat("ForwardBatch.spec.mask_indptr_host[", bs, "] = ", spec.mask_indptr_host[bs],
              " is past the end of spec.custom_mask (", spec.custom_mask.numel(), " bytes)"));
    }
  } else if (verify && spec.topk > 1) {
    return Status::invalid_argument(cat("ForwardBatch.spec.custom_mask is missing: spec.topk ",
                                        spec.topk, " > 1 needs the tree mask"));
  }

  // Capacity of the request table and the KV pool.
  if (bs > 0 && req_to_token_pool == nullptr) {
    return Status::invalid_argument("ForwardBatch.req_to_token_pool is null");
  }
  if (bs > 0 && kv_pool == nullptr) {
    return Status::invalid_argument("ForwardBatch.kv_pool is null");
  }
  if (req_to_token_pool == nullptr) return Status::ok();
  const int max_reqs = req_to_token_pool->max_reqs();
  const int max_context = req_to_token_pool->max_context_len();
  // The req_to_token columns request r's kernels read: its encoder tokens, its sequence and, in
  // verify, the drafts after it.
  const auto encoder_of = [&](int64_t r) -> int64_t {
    return has_encoder ? encoder_lens_host[r] : 0;
  };
  const auto row_len_of = [&](int64_t r) -> int64_t {
    return encoder_of(r) + seq_lens_host[r] + (verify ? draft : 0);
  };
  for (int64_t r = 0; r < bs; ++r) {
    const int32_t row = req_pool_indices_host[r];
    if (row < 1 || row > max_reqs) {
      return Status::invalid_argument(cat("ForwardBatch.req_pool_indices_host[", r, "] = ", row,
                                          " is outside the request table rows [1, ", max_reqs,
                                          "]"));
    }
    const int64_t row_len = row_len_of(r);
    if (row_len > max_context) {
      return Status::invalid_argument(
          cat("ForwardBatch request ", r, ": encoder_len ", encoder_of(r), " + seq_len ",
              seq_lens_host[r], verify ? cat(" + draft_token_num ", draft) : std::string(), " = ",
              row_len, " exceeds max_context_len ", max_context, " of req_to_token_pool"));
    }
  }
  // The entries the kernels will read as pool rows (kv/table_slots.h): one compare while the
  // table holds only slots of this pool, the batch's rows scanned otherwise.
  if (kv_pool != nullptr && req_to_token_pool->max_slot() >= kv_pool->rows()) {
    std::vector<int64_t> lens(static_cast<size_t>(bs));
    for (int64_t r = 0; r < bs; ++r) lens[static_cast<size_t>(r)] = row_len_of(r);
    ATTNKIT_RETURN_IF_ERROR(detail::check_table_slots(
        "ForwardBatch", *req_to_token_pool, kv_pool->rows(), req_pool_indices_host, lens));
  }
  // One row per request: a row listed twice would have the second request attend the first's keys
  // and save its new k / v to slots no row holds. validate() runs per layer, so the marks live in a
  // per-thread scratch that allocates only when a larger table first comes by; the marks set here
  // are cleared again before returning.
  if (bs > 1) {
    thread_local std::vector<uint8_t> seen;
    if (seen.size() <= static_cast<size_t>(max_reqs))
      seen.resize(static_cast<size_t>(max_reqs) + 1);
    const auto row_of = [&](int64_t r) { return static_cast<size_t>(req_pool_indices_host[r]); };
    int64_t marked = 0;
    while (marked < bs && seen[row_of(marked)] == 0) seen[row_of(marked++)] = 1;
    for (int64_t r = 0; r < marked; ++r) seen[row_of(r)] = 0;
    if (marked < bs) {
      return Status::invalid_argument(cat("ForwardBatch.req_pool_indices_host[", marked,
                                          "] = ", req_pool_indices_host[marked],
                                          " is an earlier request's row (one row per request)"));
    }
  }
  // The new tokens' slots: save_kv writes their k / v at out_cache_loc, and the kernels read every
  // key through req_to_token, so each must be the slot the request's row holds after its prefix
  // (as SGLang's scheduler writes both from one allocation). Another slot would overwrite a cached
  // token of some request and leave the row's own slot stale. Checked where out_cache_loc is in
  // host memory (CPU pools); a CUDA out_cache_loc has no host copy to compare.
  // The row's columns of request r's new tokens: [first, first + n).
  const auto new_columns = [&](int64_t r) {
    int64_t first = encoder_of(r);
    int64_t n = 1;
    if (verify) {
      first += seq_lens_host[r];
      n = draft;
    } else if (mode == ForwardMode::kDecode) {
      first += seq_lens_host[r] - 1;
    } else {
      first += extend_prefix_lens_host[r];
      n = extend_seq_lens_host[r];
    }
    return std::pair{first, n};
  };
  if (out_cache_loc.defined() && out_cache_loc.device.is_cpu() && num_tokens > 0) {
    const int64_t* loc = out_cache_loc.data_as<int64_t>();
    const int64_t step = out_cache_loc.strides[0];
    int64_t t = 0;
    for (int64_t r = 0; r < bs; ++r) {
      const int32_t* row = req_to_token_pool->host_row(req_pool_indices_host[r]);
      const auto [first, n] = new_columns(r);
      for (int64_t i = 0; i < n; ++i, ++t) {
        const int64_t slot = loc[t * step];
        if (row != nullptr && slot != row[first + i]) {
          return Status::invalid_argument(
              cat("ForwardBatch.out_cache_loc[", t, "] = ", slot, " (request ", r, ", new token ",
                  i, ") is not req_to_token[", req_pool_indices_host[r], ", ", first + i, "] = ",
                  row[first + i], ": the row must hold the new tokens' slots after its prefix"));
        }
      }
    }
  }
  // No new token may take a slot that a request of the batch reads as a cached key: save_kv
  // would overwrite that key (a row listing another request's cached slot as its new token's, the
  // allocator given a stale last_loc) and the forward would read the new k / v in its place. One
  // mark per pool row over the batch's keys: on CPU pools always (a pass over the keys is small
  // beside the attention's work on them), on CUDA pools with ATTNKIT_CHECK_INDICES=1 (the host
  // would scan every key of every layer). A slot cached by a request outside the batch cannot be
  // seen here; the allocator's caller keeps those apart.
  if (kv_pool != nullptr && num_tokens > 0 &&
      (kv_pool->device().is_cpu() || check_indices_enabled())) {
    const int64_t rows = kv_pool->rows();
    thread_local std::vector<int32_t> taker;  // per pool row: 1 + the request whose new token
    if (taker.size() < static_cast<size_t>(rows)) taker.resize(static_cast<size_t>(rows));
    const auto in_pool = [rows](int64_t slot) { return slot >= 0 && slot < rows; };
    const auto set_marks = [&](bool on) {
      for (int64_t r = 0; r < bs; ++r) {
        const int32_t* row = req_to_token_pool->host_row(req_pool_indices_host[r]);
        const auto [first, n] = new_columns(r);
        for (int64_t i = 0; row != nullptr && i < n; ++i) {
          if (in_pool(row[first + i])) taker[static_cast<size_t>(row[first + i])] = on ? r + 1 : 0;
        }
      }
    };
    set_marks(true);
    Status found = Status::ok();
    for (int64_t r = 0; r < bs && found.is_ok(); ++r) {
      const int32_t* row = req_to_token_pool->host_row(req_pool_indices_host[r]);
      const int64_t cached = new_columns(r).first;
      for (int64_t c = 0; row != nullptr && c < cached; ++c) {
        if (!in_pool(row[c]) || taker[static_cast<size_t>(row[c])] == 0) continue;
        const int32_t by = taker[static_cast<size_t>(row[c])] - 1;
        found = Status::invalid_argument(
            cat("ForwardBatch: slot ", row[c], " is a cached key of request ", r, " (req_to_token[",
                req_pool_indices_host[r], ", ", c, "]) and also a new token's slot of request ", by,
                " (req_to_token[", req_pool_indices_host[by], ", ", new_columns(by).first,
                " + i]): "
                "save_kv would overwrite the cached key; give each new token a free slot"));
        break;
      }
    }
    set_marks(false);
    ATTNKIT_RETURN_IF_ERROR(found);
  }
  if (check_indices_enabled()) {
    if (kv_pool == nullptr) return Status::ok();
    const int64_t ps = kv_pool->page_size();
    const int64_t lo = ps;
    const int64_t hi = kv_pool->rows();
    for (int64_t r = 0; r < bs; ++r) {
      const int32_t* row = req_to_token_pool->host_row(req_pool_indices_host[r]);
      const int64_t row_len = row_len_of(r);
      for (int64_t i = 0; row != nullptr && i < row_len; ++i) {
        if (row[i] < lo || row[i] >= hi) {
          return Status::invalid_argument(
              cat("req_to_token[", req_pool_indices_host[r], ", ", i, "] = ", row[i], " (request ",
                  r, ") is outside the KV pool slots [", lo, ", ", hi, ")"));
        }
        // Whole pages (DESIGN.md: slot t at offset t % page_size, a request never shares a page
        // mid-page): natively paged backends read only each page's first entry, so an entry
        // that breaks its page would be read as the page's slot instead of its own.
        const int64_t offset = i % ps;
        const int64_t expected = offset == 0 ? row[i] - row[i] % ps : row[i - offset] + offset;
        if (row[i] != expected) {
          return Status::invalid_argument(cat(
              "req_to_token[", req_pool_indices_host[r], ", ", i, "] = ", row[i], " (request ", r,
              ") breaks its page: with page_size ", ps, " column ", i, " must hold slot ", expected,
              offset == 0 ? " (a page's first slot is a multiple of page_size)"
                          : cat(" (req_to_token[", req_pool_indices_host[r], ", ", i - offset,
                                "] + ", offset, ")")));
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace attnkit
