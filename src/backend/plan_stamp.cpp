// PlanStamp: a forward against the batch its plan was made for (plan_stamp.h).
#include "backend/plan_stamp.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/str_cat.h"

namespace attnkit {
namespace {

// A multiply-xor fold over 8-byte words; each array's length goes in first so that a value moved
// between two arrays changes the digest.
class Digest {
 public:
  template <typename T>
  void add(const std::vector<T>& values) {
    mix(static_cast<uint64_t>(values.size()));
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    const size_t n = values.size() * sizeof(T);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, bytes + i, 8);
      mix(w);
    }
    if (i < n) {
      uint64_t w = 0;
      std::memcpy(&w, bytes + i, n - i);
      mix(w);
    }
  }
  void mix(uint64_t w) {
    h_ ^= w + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2);
    h_ *= 0xff51afd7ed558ccdull;
    h_ ^= h_ >> 33;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace

uint64_t plan_lengths_digest(const ForwardBatch& batch) {
  Digest d;
  d.add(batch.req_pool_indices_host);
  d.add(batch.seq_lens_host);
  d.add(batch.extend_prefix_lens_host);
  d.add(batch.extend_seq_lens_host);
  d.add(batch.extend_start_loc_host);
  d.add(batch.encoder_lens_host);
  d.add(batch.spec.mask_indptr_host);
  d.mix(static_cast<uint64_t>(static_cast<uint32_t>(batch.spec.draft_token_num)) << 32 |
        static_cast<uint32_t>(batch.spec.topk));
  // The pools the plan read (token indices and the cascade's shared prefix come from the request
  // table at plan time).
  d.mix(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(batch.kv_pool)));
  d.mix(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(batch.req_to_token_pool)));
  return d.value();
}

Status check_forward_matches_plan(std::string_view backend, const PlanStamp& plan,
                                  const ForwardBatch& batch, StreamHandle stream) {
  if (!plan.valid || plan.mode != batch.mode || plan.bs != batch.batch_size ||
      (plan.num_tokens >= 0 && plan.num_tokens != batch.num_tokens)) {
    return Status::invalid_argument(
        cat(backend, ": forward called without a matching init_forward_metadata (mode ",
            forward_mode_name(batch.mode), ", batch_size ", batch.batch_size, ", num_tokens ",
            batch.num_tokens, ")"));
  }
  if (plan.replay) {
    return Status::invalid_argument(
        cat(backend, ": forward called on a CUDA-graph replay plan (mode ",
            forward_mode_name(batch.mode), ", batch_size ", batch.batch_size,
            "): launch the captured graph, or call init_forward_metadata for an eager forward"));
  }
  if (plan.lengths.has_value() && plan.lengths->lengths != plan_lengths_digest(batch)) {
    return Status::invalid_argument(
        cat(backend, ": forward's batch (mode ", forward_mode_name(batch.mode), ", batch_size ",
            batch.batch_size, ", num_tokens ", batch.num_tokens,
            ") has other request rows or lengths than the batch init_forward_metadata planned "
            "(the plan's offsets and partitions come from those): call init_forward_metadata "
            "with this batch first"));
  }
  if (plan.lengths.has_value() && plan.lengths->stream != stream) {
    const auto name = [](StreamHandle s) {
      return s == nullptr ? std::string("the default stream (nullptr)") : cat("stream ", s);
    };
    return Status::invalid_argument(
        cat(backend, ": forward on ", name(stream),
            " (ForwardBatch.stream, or the context's stream when it is null) but "
            "init_forward_metadata planned this batch on ",
            name(plan.lengths->stream),
            ", where its uploads and index kernels were enqueued: run the layers on the stream the "
            "forward was planned on (or plan again on this one)"));
  }
  return Status::ok();
}

PlanKey plan_key(const ForwardBatch& batch, StreamHandle stream) {
  return PlanKey{plan_lengths_digest(batch), stream};
}

}  // namespace attnkit
