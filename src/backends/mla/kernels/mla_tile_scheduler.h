// The MLA decode tile scheduler: splits the KV of every request of a forward evenly over the
// CTA-parts (about one per SM for each query-row tile), so one long request and many short ones
// finish together. Computed once per forward on the device (from the device seq_lens, so a CUDA
// graph replay needs no host work) and on the host in unit tests: one function for both.
//
// Cost model: a request of n keys costs ceil(n / kBlockN) tiles + kFixedOverheadTiles. Every part
// gets payload = ceil(total / num_parts) + kFixedOverheadTiles; parts take requests in order,
// splitting a request where a part's budget ends (each segment pays the overhead again). The last
// part takes whatever is left, so every tile is covered whatever the rounding.
//
// Worked example (num_parts 2, lengths 640 and 64 keys: 10 and 1 tiles): total = 10 + 5 + 1 + 5
// = 21, payload = 11 + 5 = 16. Part 0: request 0 needs 10 + 5 <= 16, done (remain 1); request 1
// needs 1 + 5 > 1 and 1 - 5 <= 0, so part 0 ends at (1, 0). Part 1 takes request 1 whole.
// split_indptr = {0, 1, 2}: nothing is split and no combine runs.
// With lengths 2048 and 64 (32 and 1 tiles): total 43, payload 27; part 0 takes tiles [0, 22) of
// request 0 (segment 0), part 1 the rest of it (segment 1) and request 1: split_indptr {0, 2, 3}.
#pragma once

#include <cstdint>

#include "backends/mla/kernels/mla_decode_params.h"
#include "core/host_device.h"

namespace attnkit::mla {

ATTNKIT_HOST_DEVICE inline int num_tiles(int kv_len) {
  const int n = (kv_len + kBlockN - 1) / kBlockN;
  return n > 0 ? n : 1;  // an empty request still gets one (fully masked) tile: it writes zeros
}

// The walk of build_schedule over exactly num_parts parts: writes sched / split_indptr where they
// are not null (a dry run otherwise, which stops at the first split) and returns whether some
// request was split.
template <typename KvLen>
ATTNKIT_HOST_DEVICE bool walk_schedule(int bs, int num_parts, KvLen kv_len, int32_t* sched,
                                       int32_t* split_indptr) {
  int64_t total = 0;
  for (int b = 0; b < bs; ++b) total += num_tiles(kv_len(b)) + kFixedOverheadTiles;
  const int64_t payload = (total + num_parts - 1) / num_parts + kFixedOverheadTiles;
  int req = 0, tile = 0, split = 0, segments = 0;
  bool any_split = false;
  if (split_indptr != nullptr) split_indptr[0] = 0;
  for (int part = 0; part < num_parts; ++part) {
    int32_t* s = sched != nullptr ? sched + static_cast<int64_t>(part) * kSchedWords : nullptr;
    if (s != nullptr) {
      s[0] = req;
      s[1] = tile;
      s[4] = split;
    }
    const bool last = part == num_parts - 1;
    int64_t remain = payload;
    while (req < bs) {
      const int left = num_tiles(kv_len(req)) - tile;
      if (last || remain >= left + kFixedOverheadTiles) {
        remain -= left + kFixedOverheadTiles;
        segments += split + 1;
        if (split_indptr != nullptr) split_indptr[req + 1] = segments;
        ++req;
        tile = 0;
        split = 0;
      } else {
        const int64_t take = remain - kFixedOverheadTiles;
        if (take > 0) {
          tile += static_cast<int>(take);
          ++split;
          any_split = true;
          if (s == nullptr) return true;
        }
        break;
      }
    }
    if (s != nullptr) {
      s[2] = req;
      s[3] = tile;
    }
  }
  return any_split;
}

// kv_len(b) for b in [0, bs); sched: [num_parts, kSchedWords]; split_indptr: [bs + 1]. Uses the
// most parts n in [min_parts (schedule_min_parts, mla_decode.h), num_parts] whose schedule splits
// no request (num_parts when none does); parts n .. num_parts - 1 get no work (s[0] = s[2] = bs:
// their CTAs exit).
template <typename KvLen>
ATTNKIT_HOST_DEVICE void build_schedule(int bs, int num_parts, int min_parts, KvLen kv_len,
                                        int32_t* sched, int32_t* split_indptr) {
  int parts = num_parts;
  for (int n = num_parts; n >= min_parts && n >= 1; --n) {
    if (!walk_schedule(bs, n, kv_len, nullptr, nullptr)) {
      parts = n;
      break;
    }
  }
  walk_schedule(bs, parts, kv_len, sched, split_indptr);
  for (int part = parts; part < num_parts; ++part) {
    int32_t* s = sched + static_cast<int64_t>(part) * kSchedWords;
    s[0] = bs;
    s[1] = 0;
    s[2] = bs;
    s[3] = 0;
    s[4] = 0;
  }
}

// The tile range [*t0, *t1) of request b handled by the part whose schedule words are s, and the
// partial index of that segment; false when the part has no tiles of request b.
ATTNKIT_HOST_DEVICE inline bool segment_of(const int32_t* s, const int32_t* split_indptr, int b,
                                           int kv_len, int* t0, int* t1, int* partial) {
  const int n = num_tiles(kv_len);
  *t0 = b == s[0] ? s[1] : 0;
  *t1 = b == s[2] ? s[3] : n;
  *partial = split_indptr[b] + (b == s[0] ? s[4] : 0);
  return *t1 > *t0;
}

}  // namespace attnkit::mla
