// Factory for the `torch_native` backend; its descriptor lives in src/registry/builtin.cpp.
//
// torch_native is the correctness oracle: a plain CPU implementation that computes every logit,
// softmax and output in fp64 and writes the result in q's dtype. On a CUDA context it runs the
// same host code through staging: it synchronises, copies the inputs, the batch's arrays and the
// request rows (from ReqToTokenPool::host_row) to the host, validates the staged batch as a CPU
// pool's would be (each out_cache_loc slot against its row) before the cache write to the device
// pool (kv_pool->set_kv), then copies the layer's pool buffers into a host mirror of the pool
// (built at creation from ctx.kv_pool, which is therefore required), and the outputs back. It
// synchronises and may allocate
// inside forward (an eager reference, never CUDA-graph captured). It supports every feature of the
// interface: extend (cached prefix read from the pool through req_to_token + new tokens; causal,
// bidirectional for AttentionType::kEncoderOnly, the TARGET_VERIFY tree mask), decode, MIXED and
// DRAFT_EXTEND, GQA/MQA, sliding window, soft-cap, sinks, cross-attention, fp8/fp4 KV (through the
// pool's dequantisation rules), MLA absorbed (576/512) and MLA non-absorbed prefill (192/128).
//
// Semantics (shared with the case table in src/harness/case_runner.h):
//  * Request r's req_to_token row: encoder_lens[r] encoder tokens, then its decoder tokens.
//    Self-attention keys are decoder tokens [0, kv_len) with kv_len = seq_len (decode, extend) or
//    seq_len + N (TARGET_VERIFY); cross-attention keys are the encoder tokens, all visible.
//  * Query i of request r has position prefix_r + i; key j has position j (its decoder index).
//    Decoder: key visible when j <= q_pos and (window < 0 or q_pos - j <= window). Encoder-only:
//    visible when window < 0 or |q_pos - j| <= window. TARGET_VERIFY with a custom mask: visibility
//    of key j is mask[mask_indptr[r] + i * (prefix + N) + j] (window applied on top); topk 1
//    without a mask is causal.
//  * logit = scaling * q.k (k dequantised: fp8 value * k_scale, fp4 code * block * k_scale);
//    soft-cap: cap * tanh(logit / cap). A sink s_h adds exp(s_h) to the denominator only.
//    lse = log(sum_j exp(logit_j) + exp(s_h)), natural log; no visible key: out 0, lse -inf
//    (with a sink: lse = s_h).
//  * MLA absorbed: keys are the pool rows [latent | rope] (k_scale), V their first kv_lora_rank
//    columns (dequantised with k_scale as well: V is the same stored data).
//  * MLA non-absorbed (qk_head_dim != kv_lora_rank + qk_rope_head_dim): plain MHA of the new tokens
//    over the new tokens' k/v (causal within each request); the MLA pool is not read, unless
//    layer.mla_prefix is set (chunked prefix cache): then the request's cached prefix latent rows
//    (rounded to q's dtype) are decompressed with layer.mla_prefix->expand on the host (all at
//    once) and are visible to every new token. (mha_varlen_fp64 + harness::merge_attention_states
//    remain for callers that merge partial results themselves.)
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "attnkit/backend.h"

namespace attnkit {

Result<std::unique_ptr<AttentionBackend>> create_torch_native_backend(const BackendContext& ctx);

namespace reference {

// fp64 results of one layer call.
struct ReferenceOutput {
  std::vector<double> out;  // [T, Hq, Dv]
  std::vector<double> lse;  // [T, Hq]
};

// The whole computation of forward_extend / forward_decode without the cache write and without
// rounding: host tensors, host pools (batch.kv_pool / batch.req_to_token_pool on the CPU). Inputs
// are validated with validate_forward_inputs (save_kv = false) and every req_to_token entry read
// is checked against the pool's slots. q may be fp8_e4m3 (dequantised with layer.q_scale).
Result<ReferenceOutput> compute_attention_fp64(const TensorView& q, const TensorView& k,
                                               const TensorView& v, const AttentionLayer& layer,
                                               const ForwardBatch& batch);

// The req_to_token check compute_attention_fp64 makes: every entry it reads for this layer and
// batch is a usable slot of batch.kv_pool ([page_size, rows)). batch.req_to_token_pool must be a
// host table. torch_native runs it before its cache write, so that a refused call leaves the
// pool as it was.
Status check_pool_rows(const AttentionLayer& layer, const ForwardBatch& batch);

// Plain (non-paged) variable-length MHA in fp64 on host tensors: q [Tq, H, D], k [Tk, Hkv, D],
// v [Tk, Hkv, Dv] (f32/f16/bf16), sequences given by cu_seqlens_q / cu_seqlens_k (bs + 1 entries).
// causal: query i of a sequence sees key j when j <= i + (Lk - Lq) (bottom-right aligned).
// out [Tq, H, Dv], lse [Tq, H] (natural log; -inf for a query with no visible key).
Status mha_varlen_fp64(const TensorView& q, const TensorView& k, const TensorView& v,
                       std::span<const int32_t> cu_seqlens_q, std::span<const int32_t> cu_seqlens_k,
                       bool causal, double scaling, double logit_cap, std::vector<double>* out,
                       std::vector<double>* lse);

}  // namespace reference
}  // namespace attnkit
