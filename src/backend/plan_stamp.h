// What a forward checks against the batch its backend's init_forward_metadata planned. A plan holds
// query offsets, split partitions and token indices computed from that batch's lengths; a forward
// of another batch would run on them: past its q / out when it has more tokens (refused by count
// since session 37), and silently wrong when it has the same mode, batch size and token count but
// other lengths (a token moved between requests, another prefix, other request rows). An eager
// plan therefore keeps a digest of the host arrays it was built from, and every layer's forward
// compares it. Graph plans keep none: a replay runs the captured kernels, not forward().
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "attnkit/forward_batch.h"
#include "attnkit/status.h"

namespace attnkit {

// The host arrays a plan is built from (request rows, sequence / prefix / extend lengths, extend
// offsets, encoder lengths, the verify mask's offsets, draft count and topk) and the KV and
// request-table pools it read, folded into 64 bits. The table rows' contents are not: they are the
// planned forward's until it ends.
// O(batch size); about a microsecond at batch 256.
uint64_t plan_lengths_digest(const ForwardBatch& batch);

// What an eager plan keeps of its batch: the digest above, and the stream it planned on (the
// backend's stream for the batch: ForwardBatch::stream, or the context's when that is null): the
// plan's uploads and index kernels ran there, so a layer launched on another stream could read
// them before they land.
struct PlanKey {
  uint64_t lengths = 0;
  StreamHandle stream = nullptr;
};
PlanKey plan_key(const ForwardBatch& batch, StreamHandle stream);

struct PlanStamp {
  bool valid = false;
  ForwardMode mode = ForwardMode::kIdle;
  int bs = 0;
  int64_t num_tokens = -1;         // -1: any count (the path it delegates to checks)
  std::optional<PlanKey> lengths;  // eager plans: plan_key; graph plans: none
  // A CUDA-graph replay plan: its buffers hold the replayed batch's indices for the captured
  // kernels, and no forward() runs on it (a capture plan serves the capture's forwards and the
  // warm-up forwards before it).
  bool replay = false;
};

// kInvalidArgument naming `backend` when `batch` is not the batch `plan` was made for: no plan, or
// another mode / batch size / token count ("forward called without a matching
// init_forward_metadata"), the same shape with other lengths, a replay plan, or (eager plans) a
// forward whose stream (the backend's stream for `batch`) is not the one it was planned on.
Status check_forward_matches_plan(std::string_view backend, const PlanStamp& plan,
                                  const ForwardBatch& batch, StreamHandle stream);

}  // namespace attnkit
