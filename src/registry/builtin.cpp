// The built-in backend descriptors: one per flag of DESIGN.md section 4, plus the GDN
// linear-attention kernels. These rows are the single statement of what each backend supports;
// selection, validation, `attnkit matrix` and the runtime checks all read them.
#include <utility>

#include "attnkit/registry.h"
#include "backends/intel_amx/intel_amx_backend.h"
#include "backends/torch_native/torch_native_backend.h"
#ifdef ATTNKIT_WITH_CUDA
#include "backends/fa3/fa3_backend.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "backends/mla/mla_paged_backend.h"
#include "backends/triton/triton_backend.h"
#endif

namespace attnkit {
namespace {

// The head dims the CUDA MHA kernels are written for (CMake's default ATTNKIT_HEAD_DIMS, which a
// build may prune).
const std::vector<int> kCudaKernelHeadDims = {64, 80, 96, 128, 256};

// Head dims compiled into the CUDA MHA kernels (CMake ATTNKIT_HEAD_DIMS); empty = any.
std::vector<int> cuda_head_dims() {
#ifdef ATTNKIT_HEAD_DIMS_LIST
  return {ATTNKIT_HEAD_DIMS_LIST};
#else
  return {};
#endif
}

// A CUDA MHA row's head dims: those of this build, and those any build can have.
void set_cuda_head_dims(FeatureRow* row) {
  row->head_dims = cuda_head_dims();
  row->buildable_head_dims = kCudaKernelHeadDims;
}

// Why a backend is missing from this binary.
constexpr const char* kNotImplemented = "not implemented yet";
constexpr const char* kNeedsRocm = "needs ROCm";
constexpr const char* kNeedsNpu = "needs an Ascend NPU";
constexpr const char* kNeedsXpu = "needs an Intel XPU";

PageRule any_pages() { return PageRule{PageRule::Kind::kAny, {}}; }
PageRule token_pages() { return PageRule{PageRule::Kind::kTokenOnly, {}}; }
PageRule fixed_pages(std::vector<int> sizes) {
  return PageRule{PageRule::Kind::kFixed, std::move(sizes)};
}

// MHA row in DESIGN.md's column order:
// page>1 native / FP8 KV / FP4 KV / spec topk=1 / topk>1 / sliding window / multimodal.
FeatureRow mha_row(PageRule pages, bool fp8, bool fp4, bool topk1, bool topk_gt1, bool window,
                   bool multimodal) {
  FeatureRow r;
  r.pages = std::move(pages);
  r.fp8_kv = fp8;
  r.fp4_kv = fp4;
  r.spec_topk1 = topk1;
  r.spec_topk_gt1 = topk_gt1;
  r.sliding_window = window;
  r.multimodal = multimodal;
  return r;
}

// MLA row in DESIGN.md's column order:
// native page sizes / FP8 KV / FP4 KV / chunked prefix cache / spec topk=1 / topk>1.
FeatureRow mla_row(PageRule pages, bool fp8, bool fp4, bool chunked_prefix, bool topk1,
                   bool topk_gt1) {
  FeatureRow r;
  r.pages = std::move(pages);
  r.fp8_kv = fp8;
  r.fp4_kv = fp4;
  r.chunked_prefix_cache = chunked_prefix;
  r.spec_topk1 = topk1;
  r.spec_topk_gt1 = topk_gt1;
  return r;
}

BackendDescriptor cuda_descriptor(std::string name, std::string implementation, int min_cc,
                                  int max_cc = 0) {
  BackendDescriptor d;
  d.name = std::move(name);
  d.implementation = std::move(implementation);
  d.platforms = {Platform::kCUDA};
  d.min_compute_capability = min_cc;
  d.max_compute_capability = max_cc;
  d.cuda_graph = true;
  d.built = false;
  d.not_built_reason = kNotImplemented;
  return d;
}

BackendDescriptor torch_native() {
  BackendDescriptor d;
  d.name = "torch_native";
  // One fp64 host implementation; on CUDA it stages the layer's pool and inputs through the host
  // (a correctness reference, not a fast path).
  d.implementation =
      "plain reference (CPU; CUDA by host staging), fp64 accumulation, the correctness oracle";
  d.platforms = {Platform::kCPU, Platform::kCUDA};
  d.mha = mha_row(token_pages(), true, true, false, false, false, true);
  d.cuda_graph = false;
  d.built = true;
  d.create = create_torch_native_backend;
  return d;
}

BackendDescriptor intel_amx() {
  // Head dims: multiples of 16 (the bf16 tile and vector width) up to 256.
  constexpr int kAmxHeadDimStep = 16;
  constexpr int kAmxMaxHeadDim = 256;
  BackendDescriptor d;
  d.name = "intel_amx";
  d.implementation =
      "CPU: AMX-BF16 tiles + AVX-512, OpenMP; without AMX the same blocked extend by AVX-512 "
      "register blocks (bf16 dot products or f32 FMA), else AVX2 / scalar paths";
  d.platforms = {Platform::kCPU};
  // Beyond SGLang's row (all "no"): fp8 e4m3/e5m2 KV, verify chains (topk 1), sliding window and
  // encoder / cross attention, all checked against the reference on every ISA path.
  d.mha = mha_row(token_pages(), true, false, true, false, true, true);
  for (int dim = kAmxHeadDimStep; dim <= kAmxMaxHeadDim; dim += kAmxHeadDimStep) {
    d.mha->head_dims.push_back(dim);
  }
  d.cuda_graph = false;
#if defined(__x86_64__) || defined(_M_X64)
  d.built = true;
  d.create = create_intel_amx_backend;
#else
  d.built = false;
  d.not_built_reason = "needs an x86-64 CPU";
#endif
  return d;
}

BackendDescriptor triton() {
  constexpr int kMinCc = 75;
  BackendDescriptor d = cuda_descriptor(
      "triton",
      "portable CUDA (SM75+ SIMT; mma.sync on SM80+, compact tiles where a block may opt in to "
      "less shared memory: sm_86 / sm_89), split-KV decode + two-loop extend; the universal GPU "
      "fallback",
      kMinCc);
  d.mha = mha_row(token_pages(), true, true, true, true, true, true);
  set_cuda_head_dims(&*d.mha);
  d.mla = mla_row(any_pages(), false, false, false, true, true);
  d.mla->topk_gt1_needs_page1 = true;
  // SGLang's Triton kernels also run on ROCm (its MLA fallback there); a HIP build is planned.
  d.platforms.push_back(Platform::kROCm);
#ifdef ATTNKIT_WITH_CUDA
  d.built = true;
  d.not_built_reason.clear();
  d.create = create_triton_backend;
#else
  d.not_built_reason = "built without CUDA";
#endif
  return d;
}

BackendDescriptor flashinfer() {
  constexpr int kMinCc = 80;
  BackendDescriptor d = cuda_descriptor(
      "flashinfer",
      "tensor-core (mma.sync, SM80+) plan/run kernels, GQA-packed decode load-balanced across "
      "SMs (uneven batches cut into equal key chunks, split-KV merged by LSE); SM90 prefill/extend "
      "of bf16/f16 MHA d 64/128/256 with KV of the q dtype (window / soft-cap / sinks too) "
      "runs the fa3 wgmma kernel (shared engine), everything else (SM80, fp8 KV, verify masks, "
      "d 80/96) the mma.sync prefill kernel; target verify of up to 32 (draft, q head) rows per "
      "request on the decode kernel (16 rows per CTA, 32 in two M tiles per warp at d <= 128, "
      "the drafts' chain / tree mask per row, split-KV merged in the kernel), more rows on the "
      "prefill kernel; extends whose requests have few new tokens each: up to 32 (token, q head) "
      "rows per request on the same decode tiles (the layer's mask over the new tokens), up to 16 "
      "new tokens on the mma.sync prefill tiles, not on wgmma; on SM90 a mixed forward of such "
      "requests beside longer ones (a chunked prefill with decode rows) is split: the longer ones "
      "on wgmma, the others on the decode tiles (bf16/f16 KV); sm_86 / sm_89 (99 KiB shared "
      "memory per block): "
      "compact decode / prefill tiles, MHA d 256 on the portable kernels; page-1 MLA: "
      "decode and verify (topk 1) on the shared tensor-core MLA kernels "
      "(bf16 KV, needs 227 KiB shared memory per block: SM90; wgmma for 64-row tiles); 192-128 "
      "prefill (causal, bf16/f16, no window / soft-cap / sinks) on SM90 on the fa3 wgmma MLA "
      "kernel, elsewhere (and extend / fp4 KV) on the portable SIMT kernels; MLA chunked prefix "
      "cache (prefix chunks gathered, decompressed by the caller's expander, attended on the "
      "same wgmma kernel on SM90, else the SIMT kernel, LSE-merged by the cascade merge kernel)",
      kMinCc);
  d.mha = mha_row(any_pages(), true, false, true, true, true, false);
  set_cuda_head_dims(&*d.mha);
  d.mla = mla_row(token_pages(), false, true, true, true, false);
#ifdef ATTNKIT_WITH_CUDA
  d.built = true;
  d.not_built_reason.clear();
  d.create = create_flashinfer_backend;
#else
  d.not_built_reason = "built without CUDA";
#endif
  return d;
}

BackendDescriptor fa3_descriptor() {
  constexpr int kMinCc = 80;
  constexpr int kMaxCc = 90;
  BackendDescriptor d = cuda_descriptor(
      "fa3",
      "SM90: warp-specialised wgmma prefill/extend (TMA page boxes for pages of >= 8 rows, "
      "cp.async page gather otherwise, into a 128B-swizzled mbarrier ring; 2 consumer warpgroups "
      "(3 on 192-row tiles at d 64, and at d 128 where the padding costs under 5% of the "
      "work; a request's tiles end at its last token, so its first tile holds the padding), "
      "ping-pong (2 warpgroups) + softmax/P.V overlap (serial softmax then P.V at d 256 "
      "and on 3 warpgroups at d 128), P.V "
      "from registers, "
      "causal block skip, persistent "
      "zigzag over longest-first tiles, the last partial round's units split over key ranges "
      "and merged by LSE, key blocks of 128 / 80 at d 256) for bf16/f16 MHA d "
      "64/128/256, causal or bidirectional, sliding window / soft-cap / sinks in its variant "
      "instantiations (no tail split there); fp8_e4m3 KV with "
      "bf16 q at d 128 runs an FP8 variant (Q quantised to e4m3 per row, or given in e4m3 with "
      "a per-layer q_scale, P e4m3, both GEMMs on e4m3 wgmma, q/k/v scales folded; V^T "
      "pre-transposed per layer into a workspace through the "
      "page table (any page size; shared-memory transpose in the kernel for forwards with few "
      "queries per key), speculative softmax, row sums through the P.V GEMM, with it three "
      "consumer warpgroups on 192-row tiles, each running S, softmax and P.V of a key block "
      "in turn; forwards whose "
      "longest request has > 2048 keys promote each key block's P.V to fp32 registers, as the "
      "e4m3 wgmma's short accumulator loses long sums; fp8 accuracy, about 3-4% rel L2; "
      "sliding window / sinks / soft-cap in the variant instantiations of that plan and of the "
      "two-warpgroup plan of forwards with few queries per key); decode, target verify, extends "
      "with few new tokens per request (the flashinfer row's decode / prefill tiles, an e4m3 q "
      "widened to bf16 for them; beside longer requests of a mixed forward, those requests "
      "alone, beside the wgmma kernel (bf16/f16 or FP8) that runs the others, an e4m3 q "
      "widened to bf16 for them), a "
      "window / sinks / soft-cap over fp8 KV on other (knob-forced) plans, other fp8 KV, d 80/96, "
      "cross-attention, SM80 and CUDA graphs run the flashinfer mma.sync kernels; MLA: the "
      "non-absorbed 192/128 prefill layers (causal over the new tokens, bf16/f16, no window / "
      "soft-cap / sinks) run an SM90 wgmma kernel of their own (K / V read from the layer's k / "
      "v, 128-row tiles, S from Q in shared memory over 12 k-steps), and so do the attention "
      "passes of their chunked prefix cache (the new tokens over themselves, then over each "
      "decompressed prefix chunk, bidirectional, f32 partials merged by LSE; encoder-only layers "
      "too); the rest of MLA runs flashinfer's MLA paths",
      kMinCc, kMaxCc);
  d.mha = mha_row(any_pages(), true, false, true, true, true, true);
  set_cuda_head_dims(&*d.mha);
  d.mha->fp8_e4m3_only = true;
  d.mla = mla_row(any_pages(), false, false, true, true, true);
  d.mla->topk_gt1_needs_page1 = true;
#ifdef ATTNKIT_WITH_CUDA
  d.built = true;
  d.not_built_reason.clear();
  d.create = create_fa3_backend;
#else
  d.not_built_reason = "built without CUDA";
#endif
  return d;
}

BackendDescriptor fa4() {
  constexpr int kMinCc = 90;
  constexpr int kPage = 128;
  BackendDescriptor d = cuda_descriptor(
      "fa4",
      "FA3 structure plus FA4's softmax tricks (conditional rescale, polynomial exp2) on SM90; "
      "MHA page_size must be 128",
      kMinCc);
  d.mha = mha_row(fixed_pages({kPage}), false, true, true, true, false, true);
  set_cuda_head_dims(&*d.mha);
  d.mha->topk_gt1_needs_page1 = true;
  d.mla = mla_row(token_pages(), false, true, true, false, false);
  return d;
}

BackendDescriptor flex_attention() {
  constexpr int kMinCc = 80;
  BackendDescriptor d = cuda_descriptor(
      "flex_attention", "one templated kernel taking C++ score_mod/mask_mod functors", kMinCc);
  d.mha = mha_row(token_pages(), false, true, false, false, false, false);
  set_cuda_head_dims(&*d.mha);
  d.cuda_graph = false;
  return d;
}

BackendDescriptor trtllm_mha() {
  constexpr int kMinCc = 90;
  constexpr int kPrefillMinCc = 100;
  constexpr int kPrefillMaxCc = 109;
  BackendDescriptor d = cuda_descriptor(
      "trtllm_mha", "XQA-style GQA decode for SM90 (decode role only on SM90; prefill needs SM100)",
      kMinCc);
  d.mha = mha_row(fixed_pages({16, 32, 64}), true, true, true, false, true, false);
  set_cuda_head_dims(&*d.mha);
  d.prefill_min_compute_capability = kPrefillMinCc;
  d.prefill_max_compute_capability = kPrefillMaxCc;
  return d;
}

BackendDescriptor dual_chunk_flash_attn() {
  constexpr int kMinCc = 80;
  BackendDescriptor d = cuda_descriptor(
      "dual_chunk_flash_attn",
      "dual-chunk attention (intra/succ/inter chunks merged by LSE) for long-context models",
      kMinCc);
  d.mha = mha_row(any_pages(), false, false, false, false, false, false);
  set_cuda_head_dims(&*d.mha);
  return d;
}

BackendDescriptor flashmla() {
  constexpr int kMinCc = 90;
  BackendDescriptor d = cuda_descriptor(
      "flashmla",
      "MLA decode on the shared tensor-core kernels (SM90 wgmma for 64-query-row tiles: 128 "
      "heads, verify; an fp8 cache converted to f16 in shared memory by the consumer warps, "
      "f16 MMAs; "
      "mma.sync for up to 32 rows; ATTNKIT_MLA_WGMMA=0 keeps all on mma.sync; page-64 loader: "
      "whole bf16 tiles of the wgmma kernel by TMA, the rest by cp.async), split-KV with a "
      "device-side tile-scheduler plan + LSE combine, "
      "bf16 and fp8_e4m3 latent cache, s_q 1 and verify topk 1; 192/128 prefill (with the "
      "chunked prefix cache) via flashinfer's path (SM90: the fa3 wgmma MLA kernel), extend and "
      "fp4 KV via the portable SIMT kernels",
      kMinCc);
  d.mla = mla_row(fixed_pages({64}), true, true, true, true, false);
  d.mla->fp8_e4m3_only = true;
#ifdef ATTNKIT_WITH_CUDA
  d.built = true;
  d.not_built_reason.clear();
  d.create = create_flashmla_backend;
#else
  d.not_built_reason = "built without CUDA";
#endif
  return d;
}

BackendDescriptor cutlass_mla() {
  constexpr int kMinCc = 100;
  constexpr int kMaxCc = 109;
  // Selection stays faithful to SGLang (cutlass_mla needs SM100) although the shared kernel
  // family with its page-128 loader also runs on SM90, where its GPU tests exercise it.
  BackendDescriptor d = cuda_descriptor(
      "cutlass_mla",
      "MLA decode with 128-token pages on the shared tensor-core MLA kernels (SM90 wgmma for "
      "64-query-row tiles, an fp8 cache converted to f16 by the consumer warps, f16 MMAs; "
      "mma.sync for "
      "up to 32 rows; "
      "ATTNKIT_MLA_WGMMA=0 keeps all on mma.sync; page-128 loader (whole bf16 tiles of the "
      "wgmma kernel by TMA, the rest by cp.async), "
      "split-KV plan + LSE combine, bf16 and fp8_e4m3 cache); 192/128 prefill (with the chunked "
      "prefix cache) via flashinfer's path (SM90: the fa3 wgmma MLA kernel), extend and fp4 KV "
      "via the portable SIMT kernels",
      kMinCc, kMaxCc);
  d.mla = mla_row(fixed_pages({128}), true, true, true, true, false);
  d.mla->fp8_e4m3_only = true;
#ifdef ATTNKIT_WITH_CUDA
  d.built = true;
  d.not_built_reason.clear();
  d.create = create_cutlass_mla_backend;
#else
  d.not_built_reason = "built without CUDA";
#endif
  return d;
}

BackendDescriptor trtllm_mla() {
  constexpr int kMinCc = 100;
  constexpr int kMaxCc = 109;
  BackendDescriptor d = cuda_descriptor(
      "trtllm_mla", "Blackwell only (SM100): descriptor + selection only until hardware exists",
      kMinCc, kMaxCc);
  d.mla = mla_row(fixed_pages({32, 64}), true, true, true, true, false);
  d.mla->fp8_e4m3_only = true;
  return d;
}

BackendDescriptor nsa() {
  constexpr int kMinCc = 90;
  BackendDescriptor d = cuda_descriptor(
      "nsa",
      "DeepSeek-V3.2 sparse attention: indexer top-k + sparse MLA; page 64; dense one-shot MHA "
      "for short prefills (max kv len <= index_topk)",
      kMinCc);
  d.mla = mla_row(fixed_pages({64}), true, false, false, false, false);
  d.mla->fp8_e4m3_only = true;
  return d;
}

BackendDescriptor other_platform(std::string name, std::string implementation, Platform platform,
                                 const char* reason) {
  BackendDescriptor d;
  d.name = std::move(name);
  d.implementation = std::move(implementation);
  d.platforms = {platform};
  d.cuda_graph = false;
  d.built = false;
  d.not_built_reason = reason;
  return d;
}

BackendDescriptor aiter() {
  BackendDescriptor d =
      other_platform("aiter", "ROCm (AMD Instinct) kernels: descriptor only, not buildable here",
                     Platform::kROCm, kNeedsRocm);
  d.mha = mha_row(any_pages(), true, false, true, true, false, true);
  d.mha->topk_gt1_needs_page1 = true;
  d.mla = mla_row(token_pages(), true, false, false, true, false);
  d.cuda_graph = true;  // HIP graphs
  return d;
}

BackendDescriptor wave() {
  BackendDescriptor d =
      other_platform("wave", "ROCm Wave kernels: descriptor only, not buildable here",
                     Platform::kROCm, kNeedsRocm);
  d.mha = mha_row(any_pages(), false, false, false, false, false, false);
  d.cuda_graph = true;  // HIP graphs
  return d;
}

BackendDescriptor ascend() {
  constexpr int kPage = 128;
  BackendDescriptor d =
      other_platform("ascend", "Ascend NPU kernels: descriptor only, not buildable here",
                     Platform::kNPU, kNeedsNpu);
  d.mha = mha_row(fixed_pages({kPage}), false, false, true, false, false, true);
  d.mla = mla_row(fixed_pages({kPage}), false, false, false, false, false);
  return d;
}

BackendDescriptor intel_xpu() {
  BackendDescriptor d =
      other_platform("intel_xpu", "Intel XPU (XMX) kernels: descriptor only, not buildable here",
                     Platform::kXPU, kNeedsXpu);
  d.mha = mha_row(fixed_pages({32, 64, 128}), false, false, false, false, true, false);
  return d;
}

LinearAttnDescriptor gdn_triton() {
  constexpr int kMinCc = 75;
  LinearAttnDescriptor d;
  d.name = "triton";
  d.implementation =
      "not implemented yet (a descriptor for selection and validation): planned portable GDN "
      "kernels (CUDA + CPU): recurrent decode, chunked extend with per-chunk states, tree-aware "
      "target verify";
  d.platforms = {Platform::kCPU, Platform::kCUDA};
  d.min_compute_capability = kMinCc;
  d.decode = true;
  d.extend = true;
  d.target_verify = true;
  d.built = false;
  d.not_built_reason = kNotImplemented;
  return d;
}

LinearAttnDescriptor gdn_cutedsl() {
  constexpr int kMinCc = 90;
  LinearAttnDescriptor d;
  d.name = "cutedsl";
  d.implementation =
      "not implemented yet (a descriptor for selection and validation): planned CuTe-style "
      "fused GDN decode (SM90+), decode only";
  d.platforms = {Platform::kCUDA};
  d.min_compute_capability = kMinCc;
  d.decode = true;
  d.built = false;
  d.not_built_reason = kNotImplemented;
  return d;
}

}  // namespace

Status register_builtin_backends(BackendRegistry& registry) {
  // Registration order is the row order of `attnkit matrix`.
  BackendDescriptor all[] = {
      torch_native(),
      intel_amx(),
      triton(),
      flashinfer(),
      fa3_descriptor(),
      fa4(),
      flex_attention(),
      trtllm_mha(),
      dual_chunk_flash_attn(),
      flashmla(),
      cutlass_mla(),
      trtllm_mla(),
      nsa(),
      aiter(),
      wave(),
      ascend(),
      intel_xpu(),
  };
  for (BackendDescriptor& d : all) ATTNKIT_RETURN_IF_ERROR(registry.add(std::move(d)));
  ATTNKIT_RETURN_IF_ERROR(registry.add_linear(gdn_triton()));
  ATTNKIT_RETURN_IF_ERROR(registry.add_linear(gdn_cutedsl()));
  return Status::ok();
}

}  // namespace attnkit
