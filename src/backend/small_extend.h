// Extend forwards with few new tokens per request (an EAGLE draft extend, a short turn or chunk
// over a long history): where the flashinfer and fa3 backends run them.
//
// The SM90 wgmma prefill's tiles hold 128 / 192 rows of one request and one q head, so a request
// with q_len new tokens fills q_len of them and its keys are read once per q head; flashinfer's
// mma.sync tiles pack the (new token, q head) rows of a kv-head group. H200 2026-11-30 14:41Z
// (scripts/device/small_q_extend_check.sh, GQA 32 / 8, d 128, page 16, 4096-token prefixes), ms:
//   b64 new 1 / 4 / 16:  wgmma 0.93 / 0.94 / 0.95,  mma.sync prefill tiles 0.85 / 0.80 / 0.58
//   b16 new 64 / 256:    wgmma 0.25 / 0.48,         mma.sync prefill tiles 0.31 / 1.18
// and the decode of b64 kv 4k streams its 1.07 GB in ~0.27 ms. So:
//  * up to extend_decode_rows packed rows per request (default 32: new tokens x group), the
//    forward runs on flashinfer's decode tiles: the target-verify kernel on the decode's
//    warps-along-keys ring, with the causal mask over the new tokens (a chain of drafts is the
//    same mask), per-request q_len, split-KV merged in the kernel;
//  * past that, up to kWgmmaMinQLen new tokens in the longest request, the mma.sync prefill tiles;
//  * longer requests, the wgmma kernel.
// The flashinfer backend decides its plan and the SM90 engine declines the forward by these
// functions, so fa3 (the engine + an inner flashinfer) and flashinfer agree. A forward that mixes
// such requests with longer ones is split between the two kernels (extend_partition, below). The
// decode-tile plan is target verify's: its tile rows and CTAs per SM follow the longest request
// (ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS / _VERIFY_CTAS_PER_SM shape these extends too), and the
// mask is the layer's (causal over the new tokens, or none for a bidirectional layer; a window).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/forward_batch.h"
#include "core/env_knob.h"

namespace attnkit::detail {

// Default packed rows per request for the decode tiles (their widest CTA: two 16-row M tiles).
inline constexpr int kExtendDecodeRows = 32;
// New tokens in the longest request up to which the SM90 wgmma prefill leaves the forward to the
// mma.sync prefill tiles (measured 1.6x at 16 new tokens x group 4 above).
inline constexpr int kWgmmaMinQLen = 16;

// ATTNKIT_EXTEND_DECODE_ROWS (0: never; read on each call, backends read it when created).
inline int extend_decode_rows_from_env() {
  return env_int_range("ATTNKIT_EXTEND_DECODE_ROWS", kExtendDecodeRows, 0, 1 << 20);
}
// ATTNKIT_FA3_MIN_Q_LEN (0: the wgmma kernel takes every extend it can).
inline int wgmma_min_q_len_from_env() {
  return env_int_range("ATTNKIT_FA3_MIN_Q_LEN", kWgmmaMinQLen, 0, 1 << 20);
}

// Whether the forward mode is one of the extends this rule covers (target verify has its own).
inline bool small_extend_mode(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kDraftExtend;
}

// The longest request's new tokens when every request has at least one and the longest packs at
// most max_rows (new tokens x group) rows; else 0 (also for other modes, encoder batches, no
// lengths and max_rows 0). q_lens: each request's new tokens (ForwardBatch::extend_seq_lens_host;
// the tests' CaseSpec::new_lens).
inline int extend_decode_q_len(ForwardMode mode, std::span<const int32_t> q_lens, bool encoder,
                               int group, int max_rows) {
  if (!small_extend_mode(mode) || encoder || max_rows <= 0 || q_lens.empty()) return 0;
  int longest = 0;
  for (int32_t n : q_lens) {
    if (n < 1) return 0;
    longest = std::max<int>(longest, n);
  }
  return static_cast<int64_t>(longest) * std::max(1, group) <= max_rows ? longest : 0;
}
inline int extend_decode_q_len(const ForwardBatch& batch, int group, int max_rows) {
  return extend_decode_q_len(batch.mode, batch.extend_seq_lens_host,
                             !batch.encoder_lens_host.empty(), group, max_rows);
}

// Whether the longest request of an extend-like forward has at most min_q_len new tokens (the
// wgmma kernel then declines it; 0 = never).
inline bool below_wgmma_q_len(ForwardMode mode, std::span<const int32_t> q_lens, int min_q_len) {
  if (!small_extend_mode(mode) || min_q_len <= 0 || q_lens.empty()) return false;
  return *std::max_element(q_lens.begin(), q_lens.end()) <= min_q_len;
}
inline bool below_wgmma_q_len(const ForwardBatch& batch, int min_q_len) {
  return below_wgmma_q_len(batch.mode, batch.extend_seq_lens_host, min_q_len);
}

// Whether an extend-like forward has few new tokens per request: flashinfer's decode tiles
// (extend_decode_q_len) or prefill tiles (below_wgmma_q_len) take it whole, the wgmma kernels
// none of it. The fa3 engine's plan, the case runner and the GPU tests' expectations.
inline bool few_new_tokens_per_request(ForwardMode mode, std::span<const int32_t> q_lens,
                                       bool encoder, int group, int max_rows, int min_q_len) {
  return extend_decode_q_len(mode, q_lens, encoder, group, max_rows) > 0 ||
         below_wgmma_q_len(mode, q_lens, min_q_len);
}
inline bool few_new_tokens_per_request(const ForwardBatch& batch, int group, int max_rows,
                                       int min_q_len) {
  return few_new_tokens_per_request(batch.mode, batch.extend_seq_lens_host,
                                    !batch.encoder_lens_host.empty(), group, max_rows, min_q_len);
}

// ATTNKIT_EXTEND_PARTITION (default 1; 0: a mixed forward runs whole on one kernel, as before).
inline bool extend_partition_from_env() {
  return env_int_range("ATTNKIT_EXTEND_PARTITION", 1, 0, 1) != 0;
}

// Decode-tile work items a partition's small requests may take at most: 16-row tiles bound the
// flashinfer planner's count (its 32-row tiles halve it), and it keeps a forward on its prefill
// tiles past kDecodeTileItemsBound items (flashinfer_backend.cpp).
inline constexpr int64_t kPartitionDecodeItemsBound = 32768;

// The partition of an extend-like forward that is not small as a whole (extend_decode_q_len is 0
// and below_wgmma_q_len false): a mixed batch of SGLang's --enable-mixed-chunk (a chunked prefill
// beside decode rows), or a prefill batch with a few short turns. Its requests with 1 .. max_rows /
// group new tokens run on flashinfer's decode tiles, the others on the SM90 wgmma kernel, each
// kernel writing only its own requests' rows (the other's get q_len 0 in its plan). On the wgmma
// tiles a decode row fills 1 of 128 rows of a (request, q head) tile and reads its keys once per q
// head; on the decode tiles its group's heads share one read (H200 2026-11-30: b64 kv 4k with one
// new token each 0.93 ms on wgmma, 0.27 on the decode tiles). Over an fp8_e4m3 pool fa3's FP8
// wgmma kernel is the wgmma side (its plan must take a window / sinks / soft-cap, else the forward
// stays whole: fa3::choose_fp8_variant_partitioned) and an e4m3 q's few-token rows reach the
// decode tiles widened to bf16 (fa3/kernels/q_widen.h). Returns one flag per request (1:
// decode tiles) when both sets are non-empty, else an empty vector. q_lens: each request's new
// tokens (a request with none is in neither kernel's rows).
inline std::vector<uint8_t> extend_partition(ForwardMode mode, std::span<const int32_t> q_lens,
                                             bool encoder, int group, int max_rows, int min_q_len) {
  if (!small_extend_mode(mode) || encoder || max_rows <= 0 || q_lens.empty()) return {};
  if (extend_decode_q_len(mode, q_lens, encoder, group, max_rows) > 0 ||
      below_wgmma_q_len(mode, q_lens, min_q_len)) {
    return {};  // small as a whole: every request on flashinfer's tiles
  }
  const int64_t g = std::max(1, group);
  constexpr int64_t kTileRows = 16;
  std::vector<uint8_t> flags(q_lens.size(), 0);
  bool any_small = false;
  bool any_large = false;
  int64_t items = 0;
  for (size_t r = 0; r < q_lens.size(); ++r) {
    const int64_t n = q_lens[r];
    if (n >= 1 && n * g <= max_rows) {
      flags[r] = 1;
      any_small = true;
      items += (n * g + kTileRows - 1) / kTileRows;
    } else if (n >= 1) {
      any_large = true;
    }
  }
  if (!any_small || !any_large || items > kPartitionDecodeItemsBound) return {};
  return flags;
}
inline std::vector<uint8_t> extend_partition(const ForwardBatch& batch, int group, int max_rows,
                                             int min_q_len) {
  return extend_partition(batch.mode, batch.extend_seq_lens_host, !batch.encoder_lens_host.empty(),
                          group, max_rows, min_q_len);
}

// ---- Overlapping the two kernels of a partitioned forward ----
// The wgmma kernel (compute-bound) runs on a persistent grid of sm_count - reserve CTAs, one per
// SM, and lets the next grid launch as soon as its CTAs have started
// (griddepcontrol.launch_dependents); the decode tiles (memory-bound) follow it as a programmatic
// dependent launch and start on the `reserve` SMs it leaves free, then on the SMs its CTAs free as
// they finish. They write disjoint rows; one decode CTA waits for the wgmma grid
// (griddepcontrol.wait) before it exits, so whatever follows in the stream runs after both.
// The wgmma kernel's tail split is off in such forwards (its merge would sit between the two).

// ATTNKIT_PARTITION_OVERLAP (default 1; 0: the two kernels run one after the other, as before).
inline bool partition_overlap_from_env() {
  return env_int_range("ATTNKIT_PARTITION_OVERLAP", 1, 0, 1) != 0;
}
// ATTNKIT_PARTITION_RESERVE: the SMs left to the decode tiles (an experiment knob; -1, the
// default: partition_overlap_reserve's model; 0: no overlap). Clamped below sm_count by the engine.
inline int partition_reserve_from_env() {
  return env_int_range("ATTNKIT_PARTITION_RESERVE", -1, -1, 1 << 16);
}

// The model's machine balance: the wgmma kernel's FLOP per byte the decode tiles stream in the
// same time on the whole GPU (H200: ~600 TFLOP/s on causal d 128 bf16 tiles, ~4.2 TB/s copy).
inline constexpr double kOverlapFlopPerByte = 140.0;
// The FP8 kernel's speed over the bf16 one on the same tiles (causal d 128, H200: 1.40-1.48x,
// docs/PERF.md): its FLOPs count 1 / this in the model.
inline constexpr double kOverlapFp8Speedup = 1.45;
// The fraction of the SMs whose decode CTAs reach the copy rate (more add nothing).
inline constexpr int kOverlapSaturatingSmsDivisor = 3;

// SMs to reserve for the decode tiles of a partitioned forward whose decode requests stream
// `decode_bytes` of K / V and whose wgmma requests cost `wgmma_flops`: the reserve r (0: none)
// that minimises the modelled time, in units of the decode's full-rate time per byte:
//   the wgmma kernel on S - r SMs:  Tw = t_wg * S / (S - r),   t_wg = flops / kOverlapFlopPerByte;
//   the decode meanwhile at rate f = min(1, r / (S / 3)) of the copy rate; if it is done by then,
//   T = Tw, else the rest at the full rate: T = t_dec + (1 - f) * Tw (exactly t_dec once f = 1,
//   so that equal times compare equal and the smallest such reserve is taken).
// r = 0 is the serial time t_wg + t_dec; a reserve is chosen only if it saves >= 3% of that. The
// model counts neither the persistent grid's round quantisation nor the wgmma kernel's own reads
// (H200: measured 0.84-0.94 of the serial time where it predicts 0.79-0.88), so of equal times
// the smallest reserve, which leaves the most SMs to the wgmma kernel, is the safe one.
inline int partition_overlap_reserve(double decode_bytes, double wgmma_flops, int sm_count) {
  if (sm_count < 8 || !(decode_bytes > 0) || !(wgmma_flops > 0)) return 0;
  const double t_dec = decode_bytes;
  const double t_wg = wgmma_flops / kOverlapFlopPerByte;
  const double serial = t_dec + t_wg;
  const double sat = std::max(1, sm_count / kOverlapSaturatingSmsDivisor);
  const int max_reserve = sm_count - std::max(1, sm_count / 8);
  double best = serial;
  int best_r = 0;
  for (int r = 1; r <= max_reserve; ++r) {
    const double tw = t_wg * sm_count / (sm_count - r);
    const double f = std::min(1.0, r / sat);
    const double t = f * tw >= t_dec ? tw : t_dec + (1.0 - f) * tw;
    if (t < best * (1.0 - 1e-12)) {
      best = t;
      best_r = r;
    }
  }
  return best <= 0.97 * serial ? best_r : 0;
}

// Over an fp8_e4m3 pool: the model's reserve (the FP8 kernel's FLOPs at 1 / kOverlapFp8Speedup),
// at most sm_count / kOverlapFp8ReserveDivisor. The decode tiles over fp8 do not reach the copy
// rate from a third of the SMs (over the whole GPU they stream at 73-83% of it, docs/PERF.md
// "Session 76"), so SMs taken from the FP8 kernel buy little decode rate; a few SMs that start
// the decode early and take the kernel's tail as its CTAs finish are what pays. H200 2026-12-02
// (docs/PERF.md "Session 78"), the three fp8 mixed forwards of bench/cases/mixed_extend_fp8.json
// with bf16 / e4m3 q under forced reserves 8 / 22 / 44 / 66 / 88: 8 was the fastest or within
// 1% of it in each, the model's 44 for two of them 1-5% slower than 8. At least 1 SM where the
// model reserves any (GPUs of 8-15 SMs).
inline constexpr int kOverlapFp8ReserveDivisor = 16;
inline int partition_overlap_reserve_fp8(double decode_bytes, double fp8_flops, int sm_count) {
  const int r = partition_overlap_reserve(decode_bytes, fp8_flops / kOverlapFp8Speedup, sm_count);
  return std::min(r, std::max(1, sm_count / kOverlapFp8ReserveDivisor));
}

// The model's inputs for a partition (flags as extend_partition returns them; q_lens / kv_lens per
// request: new tokens, and keys = cached prefix + new tokens): K / V bytes the decode requests
// stream once per kv head, and the wgmma requests' QK^T + PV FLOPs over their causal keys.
struct PartitionWork {
  double decode_bytes = 0;
  double wgmma_flops = 0;
};
inline PartitionWork partition_work(std::span<const uint8_t> flags, std::span<const int32_t> q_lens,
                                    std::span<const int32_t> kv_lens, int num_q_heads,
                                    int num_kv_heads, int qk_head_dim, int v_head_dim,
                                    int kv_elem_bytes) {
  PartitionWork w;
  const size_t n = std::min({flags.size(), q_lens.size(), kv_lens.size()});
  for (size_t r = 0; r < n; ++r) {
    const double q = std::max(0, q_lens[r]);
    const double kv = std::max(0, kv_lens[r]);
    if (flags[r] != 0) {
      w.decode_bytes += kv * num_kv_heads * (qk_head_dim + v_head_dim) * kv_elem_bytes;
    } else {
      const double prefix = std::max(0.0, kv - q);
      const double pairs = q * prefix + q * (q + 1) / 2;  // windows, bidirectional: as causal
      w.wgmma_flops += 2.0 * num_q_heads * (qk_head_dim + v_head_dim) * pairs;
    }
  }
  return w;
}

}  // namespace attnkit::detail
