// Decision table for resolve(): every rule of DESIGN.md section 5 and every example launch of
// SGLang's attention-backend guide, on the virtual devices, with the real config files from
// tests/data/configs. Each row asserts the choice (backends, page size, KV dtype, CUDA graphs,
// warnings) or the error text.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/kv_cache.h"
#include "attnkit/model_config.h"
#include "attnkit/selection.h"

namespace attnkit {
namespace {

using Flags = std::function<void(ServerArgs&)>;

struct Expect {
  std::string prefill;
  std::string decode;
  int page_size = 1;
  std::string kv = "auto";
  std::optional<bool> cuda_graph;
  std::vector<std::string> warnings;  // substrings that must appear among the warnings
  std::optional<int> spec_topk;
  std::string verify_backend;
  std::string linear;  // "prefill/decode" GDN backends; empty = no linear attention
};

struct ErrorExpect {
  StatusCode code = StatusCode::kUnsupported;
  std::vector<std::string> substrings;  // all must appear in the message
};

struct Case {
  std::string name;
  std::string config;  // file name under tests/data/configs, without .json
  std::string device;  // virtual device name
  Flags flags;
  std::optional<Expect> expect;
  std::optional<ErrorExpect> error;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

Flags none() {
  return [](ServerArgs&) {};
}
// EAGLE as a chain (steps 3, topk 1, 4 draft tokens), at `page_size` when given.
Flags eagle_chain(std::optional<int> page_size) {
  return [page_size](ServerArgs& a) {
    a.speculative_algorithm = "EAGLE";
    a.speculative_num_steps = 3;
    a.speculative_eagle_topk = 1;
    a.speculative_num_draft_tokens = 4;
    if (page_size) a.page_size = *page_size;
  };
}
Flags backend(const std::string& b) {
  return [b](ServerArgs& a) { a.attention_backend = b; };
}

Case ok(std::string name, std::string config, std::string device, Flags flags, Expect e) {
  return Case{std::move(name),  std::move(config), std::move(device),
              std::move(flags), std::move(e),      std::nullopt};
}
Case err(std::string name, std::string config, std::string device, Flags flags, StatusCode code,
         std::vector<std::string> substrings) {
  return Case{std::move(name),  std::move(config), std::move(device),
              std::move(flags), std::nullopt,      ErrorExpect{code, std::move(substrings)}};
}

const std::string kLlama = "llama-3.1-8b-instruct";
const std::string kDsV3 = "deepseek-v3";
const std::string kDsR1 = "deepseek-r1";
const std::string kDsV2Lite = "deepseek-v2-lite";
const std::string kDsV32 = "deepseek-v3.2-exp";
const std::string kQwenNext = "qwen3-next-80b-a3b-instruct";
const std::string kQwen1M = "qwen2.5-7b-instruct-1m";
const std::string kGptOss = "gpt-oss-20b";
const std::string kGemma2 = "gemma-2-9b-it";
const std::string kMistral = "mistral-7b-v0.1";
const std::string kWhisper = "whisper-large-v3";

std::vector<Case> cases() {
  constexpr auto kUnsupported = StatusCode::kUnsupported;
  constexpr auto kInvalid = StatusCode::kInvalidArgument;
  return {
      // ---- device defaults ----
      ok("cpu_default_intel_amx", kLlama, "cpu", none(),
         {"intel_amx", "intel_amx", 1, "auto", false}),
      ok("cpu_noamx_default_falls_back_to_torch_native", kLlama, "cpu-noamx", none(),
         {"torch_native", "torch_native", 1, "auto", false, {"intel_amx -> torch_native"}}),
      ok("cpu_noamx_explicit_intel_amx_fixup", kLlama, "cpu-noamx", backend("intel_amx"),
         {"torch_native",
          "torch_native",
          1,
          "auto",
          false,
          {"--attention-backend intel_amx -> torch_native: this CPU has no AMX-BF16"}}),
      ok("npu_default_ascend_page128", kLlama, "npu", none(),
         {"ascend", "ascend", 128, "auto", false, {"ascend is not built in this binary"}}),
      ok("xpu_default_intel_xpu_page128", kLlama, "xpu", none(),
         {"intel_xpu", "intel_xpu", 128, "auto", false}),
      err("cpu_mla_has_no_backend", kDsV3, "cpu", none(), kUnsupported,
          {"the device default intel_amx does not support MLA models (deepseek_v3)",
           "MLA backends for virtual cpu", "none"}),

      // ---- generic default: MHA ----
      ok("mha_sm90_fa3", kLlama, "sm90", none(), {"fa3", "fa3", 1, "auto", true}),
      ok("mha_sm100_trtllm_mha_page64", kLlama, "sm100", none(),
         {"trtllm_mha", "trtllm_mha", 64, "auto", true}),
      // SGLang's is_no_spec_infer_or_topk_one: topk 1 counts as "no tree" only at page size 1, on
      // SM100 as on Hopper (SM100 picked trtllm_mha at page 16 while SGLang picks flashinfer).
      ok("mha_sm100_spec_topk1_page16_flashinfer", kLlama, "sm100", eagle_chain(16),
         {"flashinfer", "flashinfer", 16, "auto", true, {}, 1, "flashinfer"}),
      ok("mha_sm100_spec_topk1_page1_trtllm_mha", kLlama, "sm100", eagle_chain(std::nullopt),
         {"trtllm_mha", "trtllm_mha", 64, "auto", true, {}, 1, "trtllm_mha"}),
      // Speculative decoding without a topk: the automatic topk is 4 for Llama, which trtllm_mha
      // cannot run, so SM100 keeps flashinfer (picking trtllm_mha there made every such select
      // fail).
      ok("mha_sm100_spec_auto_topk_flashinfer", kLlama, "sm100",
         [](ServerArgs& a) { a.speculative_algorithm = "EAGLE"; },
         {"flashinfer", "flashinfer", 1, "auto", true, {}, 4, "flashinfer"}),
      // DeepSeek-V3.2 takes SGLang's chain parameters (topk 1) like V3 / V2: the refusal names
      // topk 1 (nsa, a descriptor here, has no speculative row), not the tree's 4.
      err("mla_sm90_dsv32_spec_chain_params", kDsV32, "sm90",
          [](ServerArgs& a) { a.speculative_algorithm = "EAGLE"; }, kUnsupported,
          {"--speculative-eagle-topk 1 (automatic) is not supported by the model rule nsa"}),
      // An empty candidate list says "none" (the message ended in ": "); the automatic topk is
      // named so, the algorithm as typed, and the chain the backend does run is offered.
      err("cpu_spec_tree_has_no_backend", kLlama, "cpu",
          [](ServerArgs& a) { a.speculative_algorithm = "NEXTN"; }, kUnsupported,
          {"--speculative-algorithm NEXTN with --speculative-eagle-topk 4 (automatic) is not "
           "supported by the device default intel_amx",
           "MHA backends with spec topk>1: none; intel_amx runs --speculative-eagle-topk 1"}),
      // Without AMX, intel_amx is torch_native after the fix-up: never offered as the way out.
      err("cpu_noamx_spec_names_the_fixup", kLlama, "cpu-noamx",
          [](ServerArgs& a) {
            a.attention_backend = "intel_amx";
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 1;
          },
          kUnsupported,
          {"--speculative-algorithm EAGLE with --speculative-eagle-topk 1 is not supported by "
           "torch_native (fix-up of --attention-backend intel_amx); MHA backends with spec "
           "topk=1: none"}),
      // ---- NGRAM (SGLang: CUDA only; topk = trie breadth 10, draft tokens = match window 12) ----
      err("cpu_ngram_is_cuda_only", kLlama, "cpu",
          [](ServerArgs& a) { a.speculative_algorithm = "NGRAM"; }, kUnsupported,
          {"--speculative-algorithm NGRAM runs on CUDA / ROCm GPUs only", "virtual cpu"}),
      ok("ngram_sm90_auto_breadth", kLlama, "sm90",
         [](ServerArgs& a) { a.speculative_algorithm = "NGRAM"; },
         {"fa3", "fa3", 1, "auto", true, {}, 10, "fa3"}),
      err("ngram_tree_paged_needs_flashinfer", kLlama, "sm90",
          [](ServerArgs& a) {
            a.speculative_algorithm = "NGRAM";
            a.page_size = 16;
          },
          kUnsupported,
          {"--speculative-algorithm NGRAM with --speculative-eagle-topk 10 (automatic) and page "
           "size 16 is not supported by the generic default fa3",
           "use --attention-backend flashinfer, --page-size 1 or --speculative-eagle-topk 1"}),
      ok("ngram_tree_paged_flashinfer", kLlama, "sm90",
         [](ServerArgs& a) {
           a.speculative_algorithm = "NGRAM";
           a.page_size = 16;
           a.attention_backend = "flashinfer";
         },
         {"flashinfer", "flashinfer", 16, "auto", true, {}, 10, "flashinfer"}),
      // Speculative decoding runs no mixed chunked-prefill batches (SGLang turns the flag off).
      ok("spec_turns_mixed_chunk_off", kLlama, "sm90",
         [](ServerArgs& a) {
           a.speculative_algorithm = "EAGLE";
           a.enable_mixed_chunk = true;
         },
         {"fa3",
          "fa3",
          1,
          "auto",
          true,
          {"--enable-mixed-chunk is ignored: speculative decoding (--speculative-algorithm EAGLE)"},
          4,
          "fa3"}),
      ok("mha_sm100_spec_topk4_flashinfer", kLlama, "sm100",
         [](ServerArgs& a) {
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 4;
         },
         {"flashinfer", "flashinfer", 1, "auto", true, {}, 4, "flashinfer"}),
      ok("mha_sm90_spec_topk4_not_fa3_default", kLlama, "sm90",
         [](ServerArgs& a) {
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 4;
           a.speculative_num_steps = 5;
           a.speculative_num_draft_tokens = 8;
         },
         {"flashinfer", "flashinfer", 1, "auto", true, {}, 4, "flashinfer"}),
      ok("mha_sm90_spec_topk1_fa3_default", kLlama, "sm90",
         [](ServerArgs& a) {
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 1;
           a.speculative_num_steps = 3;
         },
         {"fa3", "fa3", 1, "auto", true, {}, 1, "fa3"}),
      ok("mha_sm80_flashinfer", kLlama, "sm80", none(),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("mha_sm89_flashinfer", kLlama, "sm89", none(),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("mha_sm120_flashinfer", kLlama, "sm120", none(),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("mha_sm75_triton_flashinfer_needs_sm80", kLlama, "sm75", none(),
         {"triton", "triton", 1, "auto", true}),
      ok("mha_rocm_aiter", kLlama, "rocm", none(), {"aiter", "aiter", 1, "auto", true}),
      ok("sinks_sm80_triton", kGptOss, "sm80", none(), {"triton", "triton", 1, "auto", true}),
      ok("sinks_sm90_fa3", kGptOss, "sm90", none(), {"fa3", "fa3", 1, "auto", true}),
      ok("sinks_sm100_trtllm_mha", kGptOss, "sm100", none(),
         {"trtllm_mha", "trtllm_mha", 64, "auto", true}),
      ok("sinks_cpu_intel_amx", kGptOss, "cpu", none(),
         {"intel_amx", "intel_amx", 1, "auto", false}),
      // Without AMX the contract's fix-up would take torch_native, whose row has no sliding
      // window (gpt-oss uses both sinks and a window): intel_amx stays on its AVX paths instead
      // (it was refused), named or not.
      ok("sinks_window_cpu_noamx_intel_amx_avx", kGptOss, "cpu-noamx", none(),
         {"intel_amx",
          "intel_amx",
          1,
          "auto",
          false,
          {"the device default intel_amx runs its AVX-512 / AVX2 paths: this CPU has no "
           "AMX-BF16, and SGLang's fix-up torch_native lacks sliding-window attention, which the "
           "model uses"}}),
      ok("sinks_window_cpu_noamx_named_intel_amx", kGptOss, "cpu-noamx", backend("intel_amx"),
         {"intel_amx",
          "intel_amx",
          1,
          "auto",
          false,
          {"--attention-backend intel_amx runs its AVX-512 / AVX2 paths"}}),
      // A model torch_native serves still takes SGLang's fix-up (cpu_noamx_* above).
      err("sinks_flashinfer_rejected", kGptOss, "sm90", backend("flashinfer"), kUnsupported,
          {"--attention-backend flashinfer does not support attention sinks", "allowed: triton"}),

      // ---- generic default: MLA ----
      ok("mla_sm90_fa3", kDsV3, "sm90", none(), {"fa3", "fa3", 1, "auto", true}),
      ok("mla_sm100_deepseek_v3_trtllm_mla", kDsV3, "sm100", none(),
         {"trtllm_mla", "trtllm_mla", 64, "auto", true}),
      ok("mla_sm100_deepseek_r1_trtllm_mla", kDsR1, "sm100", none(),
         {"trtllm_mla", "trtllm_mla", 64, "auto", true}),
      ok("mla_sm100_deepseek_v2_flashinfer", kDsV2Lite, "sm100", none(),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("mla_sm80_triton", kDsV3, "sm80", none(), {"triton", "triton", 1, "auto", true}),
      ok("mla_rocm_128_heads_aiter", kDsV3, "rocm", none(), {"aiter", "aiter", 1, "auto", true}),
      ok("mla_rocm_16_heads_per_rank_aiter", kDsV3, "rocm", [](ServerArgs& a) { a.tp_size = 8; },
         {"aiter", "aiter", 1, "auto", true}),
      ok("mla_rocm_32_heads_per_rank_triton", kDsV3, "rocm", [](ServerArgs& a) { a.tp_size = 4; },
         {"triton", "triton", 1, "auto", true}),
      ok("deepseek_v32_sm90_nsa_page64", kDsV32, "sm90", none(), {"nsa", "nsa", 64, "auto", true}),
      ok("deepseek_v32_sm100_nsa_fp8_kv", kDsV32, "sm100", none(),
         {"nsa", "nsa", 64, "fp8_e4m3", true}),
      ok("deepseek_v32_page16_forced_64", kDsV32, "sm90", [](ServerArgs& a) { a.page_size = 16; },
         {"nsa", "nsa", 64, "auto", true, {"--page-size 16 -> 64: nsa support only page_size 64"}}),
      err("nsa_needs_deepseek_v32", kDsV3, "sm90", backend("nsa"), kInvalid,
          {"--attention-backend nsa needs a DeepSeek-V3.2 model"}),
      err("nsa_has_no_mha_row", kLlama, "sm90", backend("nsa"), kUnsupported,
          {"--attention-backend nsa does not support MHA models (llama)", "fa3"}),
      err("flashmla_has_no_mha_row", kLlama, "sm90", backend("flashmla"), kUnsupported,
          {"--attention-backend flashmla does not support MHA models"}),

      // ---- dual chunk ----
      ok("dual_chunk_default", kQwen1M, "sm90", none(),
         {"dual_chunk_flash_attn",
          "dual_chunk_flash_attn",
          1,
          "auto",
          true,
          {"radix cache disabled"}}),
      ok("dual_chunk_explicit", kQwen1M, "sm80", backend("dual_chunk_flash_attn"),
         {"dual_chunk_flash_attn", "dual_chunk_flash_attn", 1, "auto", true}),
      err("dual_chunk_has_no_speculative_decoding", kQwen1M, "sm90",
          [](ServerArgs& a) {
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 1;
          },
          kUnsupported,
          {"--speculative-algorithm EAGLE is not supported for this model: its config has "
           "dual_chunk_attention_config, which needs the model rule dual_chunk_flash_attn, and "
           "dual_chunk_flash_attn has no speculative decoding"}),
      err("dual_chunk_other_backend_is_error", kQwen1M, "sm90", backend("fa3"), kInvalid,
          {"--attention-backend fa3", "dual_chunk_attention_config",
           "allowed: dual_chunk_flash_attn"}),
      err("dual_chunk_on_non_dual_chunk_model_ok_but_window", kMistral, "sm90",
          backend("dual_chunk_flash_attn"), kUnsupported,
          {"dual_chunk_flash_attn does not support sliding-window attention"}),

      // ---- per-backend fix-ups ----
      ok("flashmla_forces_page64", kDsR1, "sm90", backend("flashmla"),
         {"flashmla", "flashmla", 64, "auto", true}),
      ok("flashmla_page16_forced_with_warning", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.page_size = 16;
         },
         {"flashmla", "flashmla", 64, "auto", true, {"--page-size 16 -> 64"}}),
      ok("flashmla_fp8", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.kv_cache_dtype = "fp8_e4m3";
         },
         {"flashmla", "flashmla", 64, "fp8_e4m3", true}),
      err("flashmla_needs_sm90", kDsR1, "sm80", backend("flashmla"), kUnsupported,
          {"--attention-backend flashmla cannot run on virtual sm80", "needs CUDA sm90+",
           "device is sm80", "MLA prefill backends for this device: triton, flashinfer, fa3"}),
      ok("cutlass_mla_page128", kDsR1, "sm100", backend("cutlass_mla"),
         {"cutlass_mla", "cutlass_mla", 128, "auto", true}),
      err("cutlass_mla_needs_sm100", kDsR1, "sm90", backend("cutlass_mla"), kUnsupported,
          {"cutlass_mla", "needs CUDA sm100 family", "device is sm90"}),
      ok("flashmla_page64_kept_without_warning", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.page_size = 64;
         },
         {"flashmla", "flashmla", 64, "auto", true}),
      ok("flashmla_page128_forced_to_64", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.page_size = 128;
         },
         {"flashmla", "flashmla", 64, "auto", true, {"--page-size 128 -> 64"}}),
      ok("cutlass_mla_page64_forced_to_128", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "cutlass_mla";
           a.page_size = 64;
         },
         {"cutlass_mla", "cutlass_mla", 128, "auto", true, {"--page-size 64 -> 128"}}),
      ok("cutlass_mla_page1_forced_to_128", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "cutlass_mla";
           a.page_size = 1;
         },
         {"cutlass_mla", "cutlass_mla", 128, "auto", true, {"--page-size 1 -> 128"}}),
      err("flashmla_fp8_e5m2_rejected", kDsR1, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "flashmla";
            a.kv_cache_dtype = "fp8_e5m2";
          },
          kUnsupported,
          {"fp8_e5m2 is not supported by --attention-backend flashmla", "fp8 KV only as fp8_e4m3"}),
      ok("trtllm_mla_page32_kept", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mla";
           a.page_size = 32;
         },
         {"trtllm_mla", "trtllm_mla", 32, "auto", true}),
      ok("trtllm_mla_page16_to_64", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mla";
           a.page_size = 16;
         },
         {"trtllm_mla",
          "trtllm_mla",
          64,
          "auto",
          true,
          {"--page-size 16 -> 64: trtllm_mla support only page_size 32,64"}}),
      err("trtllm_mla_needs_sm100", kDsR1, "sm90", backend("trtllm_mla"), kUnsupported,
          {"--attention-backend trtllm_mla cannot run on virtual sm90", "sm100"}),
      err("trtllm_mla_fp8_e5m2_rejected", kDsR1, "sm100",
          [](ServerArgs& a) {
            a.attention_backend = "trtllm_mla";
            a.kv_cache_dtype = "fp8_e5m2";
          },
          kUnsupported,
          {"--kv-cache-dtype fp8_e5m2 is not supported by --attention-backend trtllm_mla",
           "fp8 KV only as fp8_e4m3"}),
      ok("trtllm_mha_sm100_page128_to_64", kLlama, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mha";
           a.page_size = 128;
         },
         {"trtllm_mha", "trtllm_mha", 64, "auto", true, {"--page-size 128 -> 64"}}),
      ok("trtllm_mha_page16_kept", kLlama, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mha";
           a.page_size = 16;
         },
         {"trtllm_mha", "trtllm_mha", 16, "auto", true}),
      ok("trtllm_mha_sm90_decode_role", kLlama, "sm90",
         [](ServerArgs& a) { a.decode_attention_backend = "trtllm_mha"; },
         {"fa3", "trtllm_mha", 64, "auto", true}),
      ok("trtllm_mha_sm120_decode_role", kLlama, "sm120",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "flashinfer";
           a.decode_attention_backend = "trtllm_mha";
         },
         {"flashinfer", "trtllm_mha", 64, "auto", true}),
      err("trtllm_mha_sm90_prefill_role_rejected", kLlama, "sm90", backend("trtllm_mha"),
          kUnsupported,
          {"--attention-backend trtllm_mha cannot run prefill on virtual sm90",
           "--decode-attention-backend trtllm_mha"}),
      err("trtllm_mha_sm89_rejected", kLlama, "sm89",
          [](ServerArgs& a) { a.decode_attention_backend = "trtllm_mha"; }, kUnsupported,
          {"--decode-attention-backend trtllm_mha (decode backend) cannot run", "sm90+"}),
      err("trtllm_mha_spec_topk2_rejected", kLlama, "sm100",
          [](ServerArgs& a) {
            a.attention_backend = "trtllm_mha";
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 2;
          },
          kUnsupported,
          {"--speculative-eagle-topk 2 is not supported by --attention-backend trtllm_mha",
           "spec topk>1"}),
      ok("fa4_sm90_page128", kLlama, "sm90", backend("fa4"), {"fa4", "fa4", 128, "auto", true}),
      ok("fa4_page128_given", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "fa4";
           a.page_size = 128;
         },
         {"fa4", "fa4", 128, "auto", true}),
      err("fa4_sm90_page64_is_error", kLlama, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "fa4";
            a.page_size = 64;
          },
          kUnsupported,
          {"--page-size 64 is not supported by fa4 on virtual sm90", "MHA needs page_size 128"}),
      ok("fa4_sm100_page64_forced", kLlama, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "fa4";
           a.page_size = 64;
         },
         {"fa4", "fa4", 128, "auto", true, {"--page-size 64 -> 128"}}),
      err("fa4_prefill_with_trtllm_mha_decode_page_conflict", kLlama, "sm100",
          [](ServerArgs& a) { a.prefill_attention_backend = "fa4"; }, kUnsupported,
          {"prefill backend fa4 needs page_size in {128}",
           "decode backend trtllm_mha needs {16,32,64}", "share one KV pool"}),
      ok("fa3_fp8_e5m2_to_triton", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "fa3";
           a.kv_cache_dtype = "fp8_e5m2";
         },
         {"triton",
          "triton",
          1,
          "fp8_e5m2",
          true,
          {"--attention-backend fa3 -> triton: fa3 stores fp8 KV only as fp8_e4m3"}}),
      ok("fa3_default_fp8_e5m2_to_triton", kLlama, "sm90",
         [](ServerArgs& a) { a.kv_cache_dtype = "fp8_e5m2"; },
         {"triton", "triton", 1, "fp8_e5m2", true, {"the generic default fa3 -> triton"}}),
      ok("fa3_fp8_e4m3_kept", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "fa3";
           a.kv_cache_dtype = "fp8_e4m3";
         },
         {"fa3", "fa3", 1, "fp8_e4m3", true}),
      ok("torch_native_turns_graphs_off", kLlama, "sm90", backend("torch_native"),
         {"torch_native",
          "torch_native",
          1,
          "auto",
          false,
          {"CUDA graphs disabled: torch_native has no CUDA-graph support"}}),
      ok("flex_attention_turns_graphs_off", kLlama, "sm90", backend("flex_attention"),
         {"flex_attention",
          "flex_attention",
          1,
          "auto",
          false,
          {"CUDA graphs disabled: flex_attention"}}),
      err("flex_attention_with_spec_rejected", kLlama, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "flex_attention";
            a.speculative_algorithm = "EAGLE";
          },
          kUnsupported,
          {"--speculative-algorithm EAGLE is not supported with --attention-backend "
           "flex_attention",
           "flex_attention rejects speculative decoding"}),
      ok("disable_cuda_graph_flag", kLlama, "sm90",
         [](ServerArgs& a) { a.disable_cuda_graph = true; }, {"fa3", "fa3", 1, "auto", false}),
      err("fa3_on_sm100_rejected", kLlama, "sm100", backend("fa3"), kUnsupported,
          {"--attention-backend fa3 cannot run on virtual sm100", "sm80-sm90"}),
      err("triton_on_cpu_rejected", kLlama, "cpu", backend("triton"), kUnsupported,
          {"triton runs on cuda/rocm, not on cpu",
           "MHA prefill backends for this device: "
           "torch_native, intel_amx"}),
      err("aiter_on_cuda_rejected", kLlama, "sm90", backend("aiter"), kUnsupported,
          {"aiter runs on rocm, not on cuda"}),

      // ---- model features ----
      err("window_model_on_torch_native", kGemma2, "sm90", backend("torch_native"), kUnsupported,
          {"torch_native does not support sliding-window attention", "sliding_window 4096",
           "triton, flashinfer, fa3"}),
      ok("window_model_on_cpu_default", kMistral, "cpu", none(),
         {"intel_amx", "intel_amx", 1, "auto", false}),
      err("window_model_on_flex_attention_rejected", kMistral, "sm90",
          [](ServerArgs& a) { a.attention_backend = "flex_attention"; }, kUnsupported,
          {"flex_attention does not support sliding-window attention"}),
      ok("window_model_on_flashinfer", kGemma2, "sm80", none(),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("encoder_decoder_fa3", kWhisper, "sm90", none(), {"fa3", "fa3", 1, "auto", true}),
      // A default without encoder attention falls back to triton with a warning (was an error);
      // the same backend named by the user is refused.
      ok("encoder_decoder_sm80_default_falls_back_to_triton", kWhisper, "sm80", none(),
         {"triton",
          "triton",
          1,
          "auto",
          true,
          {"the generic default flashinfer lacks non-causal encoder attention, which the model "
           "uses; using triton"}}),
      ok("encoder_decoder_sm100_default_falls_back_to_triton", kWhisper, "sm100", none(),
         {"triton", "triton", 1, "auto", true, {"lacks non-causal encoder attention"}}),
      err("encoder_decoder_flashinfer_rejected", kWhisper, "sm80", backend("flashinfer"),
          kUnsupported,
          {"--attention-backend flashinfer does not support non-causal encoder attention"}),

      // ---- linear attention (GDN) ----
      ok("qwen3_next_sm100_triton", kQwenNext, "sm100", none(),
         {"triton", "triton", 1, "auto", true, {}, std::nullopt, "", "triton/triton"}),
      ok("qwen3_next_sm100_trtllm_mha", kQwenNext, "sm100", backend("trtllm_mha"),
         {"trtllm_mha", "trtllm_mha", 64, "auto", true, {}, std::nullopt, "", "triton/triton"}),
      err("qwen3_next_sm100_flex_rejected", kQwenNext, "sm100", backend("flex_attention"),
          kUnsupported,
          {"--attention-backend flex_attention cannot serve the full-attention layers of a GDN "
           "hybrid on SM100",
           "allowed: triton, trtllm_mha, fa4, flashinfer"}),
      ok("qwen3_next_sm90_fa3", kQwenNext, "sm90", none(),
         {"fa3", "fa3", 1, "auto", true, {}, std::nullopt, "", "triton/triton"}),
      ok("qwen3_next_cutedsl_decode", kQwenNext, "sm90",
         [](ServerArgs& a) { a.linear_attn_decode_backend = "cutedsl"; },
         {"fa3", "fa3", 1, "auto", true, {}, std::nullopt, "", "triton/cutedsl"}),
      err("qwen3_next_cutedsl_prefill_rejected", kQwenNext, "sm90",
          [](ServerArgs& a) { a.linear_attn_backend = "cutedsl"; }, kUnsupported,
          {"--linear-attn-backend cutedsl: this GDN backend has no extend (prefill) kernel",
           "prefill backends: triton"}),
      err("qwen3_next_cutedsl_needs_sm90", kQwenNext, "sm80",
          [](ServerArgs& a) { a.linear_attn_decode_backend = "cutedsl"; }, kUnsupported,
          {"--linear-attn-decode-backend cutedsl cannot run on virtual sm80", "sm90+"}),
      err("qwen3_next_cutedsl_verify_rejected", kQwenNext, "sm90",
          [](ServerArgs& a) {
            a.linear_attn_decode_backend = "cutedsl";
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 1;
            a.speculative_attention_mode = "decode";
          },
          kUnsupported, {"cutedsl has no target_verify kernel"}),
      ok("linear_flags_ignored_on_plain_model", kLlama, "sm90",
         [](ServerArgs& a) { a.linear_attn_decode_backend = "cutedsl"; },
         {"fa3", "fa3", 1, "auto", true, {"are ignored: the model has no linear-attention"}}),

      // ---- KV4 ----
      ok("kv4_triton", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "triton";
           a.kv_cache_dtype = "fp4_e2m1";
         },
         {"triton", "triton", 1, "fp4_e2m1", true}),
      ok("kv4_trtllm_mha", kLlama, "sm100", [](ServerArgs& a) { a.kv_cache_dtype = "fp4_e2m1"; },
         {"trtllm_mha", "trtllm_mha", 64, "fp4_e2m1", true}),
      err("kv4_fa3_rejected", kLlama, "sm90", [](ServerArgs& a) { a.kv_cache_dtype = "fp4_e2m1"; },
          kUnsupported,
          {"--kv-cache-dtype fp4_e2m1 (KV4) is not supported by the generic default fa3",
           "KV4 backends: torch_native, triton, fa4, flex_attention"}),
      ok("kv4_fa4_prefill_triton_decode", kLlama, "sm90",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "fa4";
           a.decode_attention_backend = "triton";
           a.kv_cache_dtype = "fp4_e2m1";
         },
         {"fa4", "triton", 128, "fp4_e2m1", true}),
      err("kv4_fa4_decode_rejected", kLlama, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "fa4";
            a.kv_cache_dtype = "fp4_e2m1";
          },
          kUnsupported, {"fa4 runs KV4 only as the prefill backend", "--decode-attention-backend"}),
      err("kv4_fa4_with_trtllm_mha_rejected", kLlama, "sm100",
          [](ServerArgs& a) {
            a.prefill_attention_backend = "fa4";
            a.decode_attention_backend = "trtllm_mha";
            a.kv_cache_dtype = "fp4_e2m1";
          },
          kUnsupported, {"KV4 with prefill backend fa4 is not compatible with", "trtllm_mha"}),
      ok("kv4_mla_flashmla", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.kv_cache_dtype = "fp4_e2m1";
         },
         {"flashmla", "flashmla", 64, "fp4_e2m1", true}),
      err("kv4_mla_triton_rejected", kDsR1, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "triton";
            a.kv_cache_dtype = "fp4_e2m1";
          },
          kUnsupported, {"KV4", "--attention-backend triton", "flashinfer, fa4, flashmla"}),
      ok("kv4_fa4_prefill_trtllm_mla_decode", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mla";
           a.prefill_attention_backend = "fa4";
           a.kv_cache_dtype = "fp4_e2m1";
         },
         {"fa4", "trtllm_mla", 64, "fp4_e2m1", true}),
      err("fp8_on_flashinfer_mla_rejected", kDsR1, "sm80",
          [](ServerArgs& a) {
            a.attention_backend = "flashinfer";
            a.kv_cache_dtype = "fp8_e4m3";
          },
          kUnsupported,
          {"--kv-cache-dtype fp8_e4m3 is not supported by --attention-backend flashinfer (MLA)",
           "backends with fp8 KV"}),

      // ---- page size and chunked prefill ----
      ok("page_size_given_any_backend", kLlama, "sm80", [](ServerArgs& a) { a.page_size = 16; },
         {"flashinfer", "flashinfer", 16, "auto", true}),
      err("chunked_prefill_not_multiple_of_page", kDsR1, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "flashmla";
            a.chunked_prefill_size = 1000;
          },
          kInvalid,
          {"--chunked-prefill-size 1000 must be a multiple of the page size 64", "use 1024"}),
      ok("chunked_prefill_multiple_of_page", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.chunked_prefill_size = 8192;
         },
         {"flashmla", "flashmla", 64, "auto", true}),
      err("hybrid_page_sets_disjoint", kDsR1, "sm100",
          [](ServerArgs& a) {
            a.prefill_attention_backend = "cutlass_mla";
            a.decode_attention_backend = "flashmla";
          },
          kUnsupported,
          {"prefill backend cutlass_mla needs page_size in {128}",
           "decode backend flashmla needs {64}"}),

      // ---- speculative rules ----
      ok("spec_topk4_page16_flashinfer", kLlama, "sm80",
         [](ServerArgs& a) {
           a.attention_backend = "flashinfer";
           a.page_size = 16;
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 4;
         },
         {"flashinfer", "flashinfer", 16, "auto", true, {}, 4, "flashinfer"}),
      ok("spec_topk4_page16_fa3", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "fa3";
           a.page_size = 16;
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 4;
         },
         {"fa3", "fa3", 16, "auto", true, {}, 4, "fa3"}),
      // Our triton reads the verify tree mask per token at any page size (descriptor row), so
      // SGLang's "topk > 1 with page > 1 needs flashinfer or fa3" does not apply to it.
      ok("spec_topk4_page16_triton", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "triton";
           a.page_size = 16;
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 4;
         },
         {"triton", "triton", 16, "auto", true, {}, 4, "triton"}),
      ok("spec_topk4_page1_triton", kLlama, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "triton";
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 4;
         },
         {"triton", "triton", 1, "auto", true, {}, 4, "triton"}),
      err("spec_mla_fa3_topk2_page64_rejected", kDsR1, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "fa3";
            a.page_size = 64;
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 2;
          },
          kUnsupported, {"topk > 1 only with page_size 1"}),
      ok("spec_auto_params_deepseek_chain", kDsR1, "sm90",
         [](ServerArgs& a) { a.speculative_algorithm = "NEXTN"; },
         {"fa3", "fa3", 1, "auto", true, {}, 1, "fa3"}),
      err("spec_torch_native_rejected", kLlama, "sm90",
          [](ServerArgs& a) {
            a.attention_backend = "torch_native";
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 1;
          },
          kUnsupported,
          {"--speculative-eagle-topk 1 is not supported by --attention-backend "
           "torch_native"}),
      ok("hybrid_spec_mode_decode_verifies_on_decode_backend", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mla";
           a.prefill_attention_backend = "fa4";
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 1;
           a.speculative_attention_mode = "decode";
         },
         {"fa4", "trtllm_mla", 64, "auto", true, {}, 1, "trtllm_mla"}),
      err("hybrid_spec_mode_prefill_needs_prefill_spec", kDsR1, "sm100",
          [](ServerArgs& a) {
            a.attention_backend = "trtllm_mla";
            a.prefill_attention_backend = "fa4";
            a.speculative_algorithm = "EAGLE";
            a.speculative_eagle_topk = 1;
          },
          kUnsupported, {"is not supported by --prefill-attention-backend fa4 (prefill backend)"}),
      ok("hybrid_spec_prefill_mode_captures_both", kLlama, "sm90",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "triton";
           a.decode_attention_backend = "fa3";
           a.speculative_algorithm = "EAGLE";
           a.speculative_eagle_topk = 1;
         },
         {"triton", "fa3", 1, "auto", true, {}, 1, "triton"}),
      ok("hybrid_eager_prefill_backend_keeps_graphs", kLlama, "sm90",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "torch_native";
           a.decode_attention_backend = "fa3";
         },
         {"torch_native", "fa3", 1, "auto", true}),
      ok("hybrid_same_backends_collapse", kLlama, "sm90",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "flashinfer";
           a.decode_attention_backend = "flashinfer";
         },
         {"flashinfer", "flashinfer", 1, "auto", true}),

      // ---- flag values ----
      err("unknown_backend", kLlama, "sm90", backend("flash"), kInvalid,
          {"--attention-backend \"flash\" is not a known attention backend",
           "valid values: torch_native, intel_amx, triton, flashinfer, fa3"}),
      err("unknown_decode_backend", kLlama, "sm90",
          [](ServerArgs& a) { a.decode_attention_backend = "xqa"; }, kInvalid,
          {"--decode-attention-backend \"xqa\" is not a known attention backend"}),
      err("bad_kv_dtype", kLlama, "sm90", [](ServerArgs& a) { a.kv_cache_dtype = "int8"; },
          kInvalid, {"--kv-cache-dtype \"int8\" is not valid", "fp8_e4m3"}),
      err("bad_page_size", kLlama, "sm90", [](ServerArgs& a) { a.page_size = 0; }, kInvalid,
          {"--page-size 0 is invalid"}),
      err("tp_size_not_dividing_heads", kLlama, "sm90", [](ServerArgs& a) { a.tp_size = 3; },
          kInvalid,
          {"--tp-size 3 does not divide the model's 32 attention heads (num_attention_heads)"}),
      // 0 is refused before it divides anything (the modulo by it was a SIGFPE).
      err("tp_size_zero", kLlama, "sm90", [](ServerArgs& a) { a.tp_size = 0; }, kInvalid,
          {"--tp-size 0 is invalid; it must be a positive integer"}),
      err("bad_spec_mode", kLlama, "sm90",
          [](ServerArgs& a) { a.speculative_attention_mode = "verify"; }, kInvalid,
          {"--speculative-attention-mode \"verify\" is not valid; valid values: prefill, decode"}),
      err("bad_spec_algorithm", kLlama, "sm90",
          [](ServerArgs& a) { a.speculative_algorithm = "MEDUSA"; }, kInvalid,
          {"--speculative-algorithm \"MEDUSA\" is not valid", "EAGLE, EAGLE3, NEXTN"}),
      err("bad_linear_backend", kQwenNext, "sm90",
          [](ServerArgs& a) { a.linear_attn_backend = "fla"; }, kInvalid,
          {"--linear-attn-backend \"fla\" is not a known linear-attention backend",
           "valid values: triton, cutedsl"}),
  };
}

// The SGLang attention-backend guide's example launches (docs/advanced_features/
// attention_backend.md), each on the device it targets.
std::vector<Case> guide_cases() {
  return {
      ok("guide_flashinfer_llama_a100", kLlama, "sm80", backend("flashinfer"),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("guide_flashinfer_deepseek_v3", kDsV3, "sm80", backend("flashinfer"),
         {"flashinfer", "flashinfer", 1, "auto", true}),
      ok("guide_fa3_llama_h100", kLlama, "sm90", backend("fa3"), {"fa3", "fa3", 1, "auto", true}),
      ok("guide_fa3_deepseek_v3", kDsV3, "sm90", backend("fa3"), {"fa3", "fa3", 1, "auto", true}),
      ok("guide_triton_llama", kLlama, "sm90", backend("triton"),
         {"triton", "triton", 1, "auto", true}),
      ok("guide_triton_deepseek_v3", kDsV3, "sm90", backend("triton"),
         {"triton", "triton", 1, "auto", true}),
      ok("guide_torch_native_llama", kLlama, "sm80", backend("torch_native"),
         {"torch_native", "torch_native", 1, "auto", false}),
      ok("guide_flashmla_deepseek_r1", kDsR1, "sm90", backend("flashmla"),
         {"flashmla", "flashmla", 64, "auto", true}),
      ok("guide_flashmla_deepseek_r1_fp8", kDsR1, "sm90",
         [](ServerArgs& a) {
           a.attention_backend = "flashmla";
           a.kv_cache_dtype = "fp8_e4m3";
         },
         {"flashmla", "flashmla", 64, "fp8_e4m3", true}),
      ok("guide_trtllm_mla_deepseek_r1_b200", kDsR1, "sm100", backend("trtllm_mla"),
         {"trtllm_mla", "trtllm_mla", 64, "auto", true}),
      ok("guide_trtllm_mla_deepseek_r1_fp8", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mla";
           a.kv_cache_dtype = "fp8_e4m3";
         },
         {"trtllm_mla", "trtllm_mla", 64, "fp8_e4m3", true}),
      ok("guide_fa4_prefill_deepseek_r1", kDsR1, "sm100",
         [](ServerArgs& a) { a.prefill_attention_backend = "fa4"; },
         {"fa4", "flashinfer", 1, "auto", true}),
      ok("guide_hybrid_fa4_prefill_trtllm_mla_decode", kDsR1, "sm100",
         [](ServerArgs& a) {
           a.attention_backend = "trtllm_mla";
           a.prefill_attention_backend = "fa4";
         },
         {"fa4", "trtllm_mla", 64, "auto", true}),
      ok("guide_cutlass_mla_deepseek_r1", kDsR1, "sm100", backend("cutlass_mla"),
         {"cutlass_mla", "cutlass_mla", 128, "auto", true}),
      ok("guide_ascend_llama", kLlama, "npu", backend("ascend"),
         {"ascend", "ascend", 128, "auto", false}),
      ok("guide_intel_xpu_llama", kLlama, "xpu", backend("intel_xpu"),
         {"intel_xpu", "intel_xpu", 128, "auto", false}),
      ok("guide_wave_llama", kLlama, "rocm", backend("wave"), {"wave", "wave", 1, "auto", true}),
      ok("guide_flex_attention_llama", kLlama, "sm90", backend("flex_attention"),
         {"flex_attention", "flex_attention", 1, "auto", false}),
      ok("guide_dual_chunk_qwen_1m", kQwen1M, "sm90", backend("dual_chunk_flash_attn"),
         {"dual_chunk_flash_attn", "dual_chunk_flash_attn", 1, "auto", true}),
      ok("guide_trtllm_mha_decode_h100", kLlama, "sm90",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "fa3";
           a.decode_attention_backend = "trtllm_mha";
         },
         {"fa3", "trtllm_mha", 64, "auto", true}),
      ok("guide_fa4_page128_llama", kLlama, "sm90",
         [](ServerArgs& a) {
           a.prefill_attention_backend = "fa4";
           a.decode_attention_backend = "fa3";
           a.page_size = 128;
         },
         {"fa4", "fa3", 128, "auto", true}),
      ok("guide_qwen3_next_b200", kQwenNext, "sm100", none(),
         {"triton", "triton", 1, "auto", true, {}, std::nullopt, "", "triton/triton"}),
      ok("guide_deepseek_v32_nsa", kDsV32, "sm90", none(), {"nsa", "nsa", 64, "auto", true}),
  };
}

Result<ModelAttentionConfig> load(const std::string& name) {
  return load_model_config(std::string(ATTNKIT_TEST_DATA_DIR) + "/configs/" + name + ".json");
}

void run_case(const Case& c) {
  Result<ModelAttentionConfig> model = load(c.config);
  ASSERT_TRUE(model.is_ok()) << c.config << ": " << model.status().to_string();
  Result<DeviceInfo> device = device_by_name(c.device);
  ASSERT_TRUE(device.is_ok()) << device.status().to_string();
  ServerArgs args;
  c.flags(args);
  Result<Selection> s = resolve(args, *model, *device);
  if (c.error) {
    ASSERT_FALSE(s.is_ok()) << "expected an error, got:\n" << s->to_text();
    EXPECT_EQ(s.status().code(), c.error->code) << s.status().to_string();
    for (const std::string& sub : c.error->substrings) {
      EXPECT_NE(s.status().message().find(sub), std::string::npos)
          << "missing \"" << sub << "\" in: " << s.status().message();
    }
    return;
  }
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const Expect& e = *c.expect;
  const std::string text = s->to_text();
  EXPECT_EQ(s->prefill_backend, e.prefill) << text;
  EXPECT_EQ(s->decode_backend, e.decode) << text;
  EXPECT_EQ(s->is_hybrid(), e.prefill != e.decode);
  EXPECT_EQ(s->page_size, e.page_size) << text;
  EXPECT_STREQ(kv_cache_dtype_name(s->kv_cache_dtype), e.kv.c_str()) << text;
  if (e.cuda_graph) {
    EXPECT_EQ(s->cuda_graph, *e.cuda_graph) << text;
  }
  for (const std::string& w : e.warnings) {
    const bool found = std::any_of(s->warnings.begin(), s->warnings.end(), [&](const auto& line) {
      return line.find(w) != std::string::npos;
    });
    EXPECT_TRUE(found) << "missing warning \"" << w << "\" in:\n" << text;
  }
  if (e.spec_topk) {
    ASSERT_TRUE(s->speculative.has_value()) << text;
    EXPECT_EQ(s->speculative->topk, *e.spec_topk);
    EXPECT_EQ(s->speculative->verify_backend, e.verify_backend);
  } else {
    EXPECT_FALSE(s->speculative.has_value()) << text;
  }
  if (e.linear.empty()) {
    EXPECT_FALSE(s->linear_attn.has_value()) << text;
  } else {
    ASSERT_TRUE(s->linear_attn.has_value()) << text;
    EXPECT_EQ(s->linear_attn->prefill_backend + "/" + s->linear_attn->decode_backend, e.linear);
  }
  // Every decision leaves a reason: device/model, backend, kv dtype, page size, graphs.
  EXPECT_GE(s->reasons.size(), 4u) << text;
}

class SelectionTable : public ::testing::TestWithParam<Case> {};
TEST_P(SelectionTable, Decides) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, SelectionTable, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

class SglangGuide : public ::testing::TestWithParam<Case> {};
TEST_P(SglangGuide, Decides) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Examples, SglangGuide, ::testing::ValuesIn(guide_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- rules that need a hand-made model or device ----

TEST(Selection, GdnCannotCombineWithMla) {
  Result<ModelAttentionConfig> model = load(kDsV3);
  ASSERT_TRUE(model.is_ok());
  model->has_linear_attention = true;
  Result<Selection> s = resolve(ServerArgs{}, *model, *device_by_name("sm90"));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("combines GDN linear attention with MLA"), std::string::npos)
      << s.status().message();
}

TEST(Selection, HopperWithOldCudaDefaultsToFlashinfer) {
  DeviceInfo d = *device_by_name("sm90");
  constexpr int kCuda122 = 12020;
  d.cuda_runtime_version = kCuda122;
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  Result<Selection> s = resolve(ServerArgs{}, *model, d);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->decode_backend, "flashinfer");
}

TEST(Selection, TopkOneForcesDraftTokensToStepsPlusOne) {
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  ServerArgs a;
  a.speculative_algorithm = "EAGLE";
  a.speculative_num_steps = 3;
  a.speculative_eagle_topk = 1;
  a.speculative_num_draft_tokens = 7;
  Result<Selection> s = resolve(a, *model, *device_by_name("sm90"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_draft_tokens, 4);
  EXPECT_FALSE(s->warnings.empty());
}

// The API's bound on the speculative counts (the CLI refuses them first): 2^31 - 1 steps made
// num_steps + 1 = -2^31 draft tokens (helper 61, session 70).
TEST(Selection, SpeculativeCountsAreBoundedThroughTheApi) {
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  for (int value : {kMaxSpeculativeValue + 1, std::numeric_limits<int>::max()}) {
    ServerArgs a;
    a.speculative_algorithm = "EAGLE";
    a.speculative_eagle_topk = 1;
    a.speculative_num_steps = value;
    Result<Selection> s = resolve(a, *model, *device_by_name("sm90"));
    ASSERT_FALSE(s.is_ok()) << value;
    EXPECT_NE(s.status().message().find("--speculative-num-steps " + std::to_string(value) +
                                        " is invalid; it must be an integer from 1 to 1024"),
              std::string::npos)
        << s.status().to_string();
  }
  ServerArgs a;
  a.speculative_algorithm = "EAGLE";
  a.speculative_eagle_topk = 1;
  a.speculative_num_steps = kMaxSpeculativeValue;
  Result<Selection> s = resolve(a, *model, *device_by_name("sm90"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_draft_tokens, kMaxSpeculativeValue + 1);
}

// A tree's draft tokens are its root and at most topk + (steps - 1) * topk^2 candidates: more
// given is refused naming the flags, an automatic count past them is cut with a warning.
TEST(Selection, NgramAndMixedChunkFollowSglang) {
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  auto run = [&](const Flags& flags) {
    ServerArgs a;
    flags(a);
    return resolve(a, *model, *device_by_name("sm90"));
  };
  Result<Selection> s = run([](ServerArgs& a) {
    a.speculative_algorithm = "STANDALONE";
    a.enable_mixed_chunk = true;
  });
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_FALSE(s->enable_mixed_chunk);
  s = run([](ServerArgs& a) { a.enable_mixed_chunk = true; });  // no speculative decoding: kept
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_TRUE(s->enable_mixed_chunk);
  // NGRAM's automatic breadth and match window.
  s = run([](ServerArgs& a) { a.speculative_algorithm = "NGRAM"; });
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->topk, 10);
  EXPECT_EQ(s->speculative->num_draft_tokens, 12);
  // A breadth-1 NGRAM keeps its match window (EAGLE's chain would cut it to steps + 1).
  s = run([](ServerArgs& a) {
    a.speculative_algorithm = "NGRAM";
    a.speculative_eagle_topk = 1;
    a.speculative_num_steps = 3;
    a.speculative_num_draft_tokens = 12;
  });
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_draft_tokens, 12);
  for (const std::string& w : s->warnings)
    EXPECT_EQ(w.find("draft-tokens"), std::string::npos) << w;
}

TEST(Selection, TreeDraftTokensFitTheTree) {
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  auto spec = [&](int steps, int topk, std::optional<int> draft) {
    ServerArgs a;
    a.speculative_algorithm = "EAGLE";
    a.speculative_num_steps = steps;
    a.speculative_eagle_topk = topk;
    a.speculative_num_draft_tokens = draft;
    return resolve(a, *model, *device_by_name("sm90"));
  };
  Result<Selection> s = spec(1, 8, 1024);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find(
                "--speculative-num-draft-tokens 1024 is invalid: the draft tree of "
                "--speculative-eagle-topk 8 over --speculative-num-steps 1 holds at most 1 + topk "
                "+ (steps - 1) * topk^2 = 9 tokens"),
            std::string::npos)
      << s.status().to_string();
  EXPECT_FALSE(spec(2, 2, 8).is_ok());  // 1 + 2 + 4 = 7
  // A value the user left to the model is named as automatic (Llama: 5 steps).
  ServerArgs auto_steps;
  auto_steps.speculative_algorithm = "EAGLE";
  auto_steps.speculative_eagle_topk = 8;
  auto_steps.speculative_num_draft_tokens = 1024;
  s = resolve(auto_steps, *model, *device_by_name("sm90"));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("--speculative-eagle-topk 8 over --speculative-num-steps 5 "
                                      "(automatic) holds at most 1 + topk + (steps - 1) * topk^2 "
                                      "= 265 tokens"),
            std::string::npos)
      << s.status().to_string();
  for (auto [steps, topk, draft] : {std::array{1, 8, 9}, {2, 2, 7}, {5, 4, 69}}) {
    s = spec(steps, topk, draft);
    ASSERT_TRUE(s.is_ok()) << steps << " " << topk << " " << draft << ": "
                           << s.status().to_string();
    EXPECT_EQ(s->speculative->num_draft_tokens, draft);
    for (const std::string& w : s->warnings)
      EXPECT_EQ(w.find("draft tokens"), std::string::npos) << w;
  }
  // The automatic 8 draft tokens do not fit topk 2 over one step: cut to 3, with a warning.
  s = spec(1, 2, std::nullopt);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_draft_tokens, 3);
  EXPECT_TRUE(std::any_of(s->warnings.begin(), s->warnings.end(), [](const std::string& w) {
    return w.find(
               "speculative draft tokens 8 -> 3: the draft tree of --speculative-eagle-topk 2 "
               "over --speculative-num-steps 1") != std::string::npos;
  }));
  // NGRAM's topk is its match trie's breadth, not a tree's: its draft tokens are not bounded so.
  ServerArgs ngram;
  ngram.speculative_algorithm = "NGRAM";
  ngram.speculative_num_steps = 1;
  ngram.speculative_eagle_topk = 2;
  ngram.speculative_num_draft_tokens = 12;
  s = resolve(ngram, *model, *device_by_name("sm90"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_draft_tokens, 12);
  for (const std::string& w : s->warnings)
    EXPECT_EQ(w.find("draft tokens"), std::string::npos) << w;
  // The largest counts do not overflow the bound.
  s = spec(kMaxSpeculativeValue, kMaxSpeculativeValue, kMaxSpeculativeValue);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_draft_tokens, kMaxSpeculativeValue);
}

TEST(Selection, AutoSpecParamsForLlamaAreATree) {
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  ServerArgs a;
  a.speculative_algorithm = "EAGLE3";
  Result<Selection> s = resolve(a, *model, *device_by_name("sm90"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->speculative->num_steps, 5);
  EXPECT_EQ(s->speculative->topk, 4);
  EXPECT_EQ(s->speculative->num_draft_tokens, 8);
}

TEST(Selection, RealDeviceRejectsUnbuiltExplicitBackend) {
  DeviceInfo d = *device_by_name("sm90");
  d.is_virtual = false;
  std::string unbuilt;
  for (const BackendDescriptor& b : builtin_registry().all()) {
    if (!b.built && b.mha && check_backend_on_device(b, d, BackendRole::kPrefill).is_ok() &&
        b.name != "dual_chunk_flash_attn") {
      unbuilt = b.name;
      break;
    }
  }
  if (unbuilt.empty()) GTEST_SKIP() << "every sm90 MHA backend is built in this binary";
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  ServerArgs a;
  a.attention_backend = unbuilt;
  Result<Selection> s = resolve(a, *model, d);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotBuilt) << s.status().to_string();
  EXPECT_NE(
      s.status().message().find("--attention-backend " + unbuilt + " is not built in this binary"),
      std::string::npos)
      << s.status().message();
}

// A model rule's backend is what the model needs: a dual-chunk config that also uses a sliding
// window is refused (dual_chunk_flash_attn has none), not moved to triton, which would drop the
// dual-chunk attention a 1M context needs.
TEST(Selection, ModelRuleBackendIsNotSwappedForAFeature) {
  Result<ModelAttentionConfig> model = load(kQwen1M);
  ASSERT_TRUE(model.is_ok());
  model->sliding_window = 32768;  // on every layer (use_sliding_window with max_window_layers 0)
  for (LayerKind& k : model->layer_kinds) k = LayerKind::kSlidingAttention;
  Result<Selection> s = resolve(ServerArgs{}, *model, *device_by_name("sm80"));
  ASSERT_FALSE(s.is_ok()) << s->to_text();
  EXPECT_EQ(s.status().code(), StatusCode::kUnsupported) << s.status().to_string();
  EXPECT_NE(s.status().message().find("dual_chunk_flash_attn does not support sliding-window"),
            std::string::npos)
      << s.status().message();
}

// One fallback of a backend serving both roles is one warning, not a second one calling it the
// "decode backend" of a batch that is not hybrid.
TEST(Selection, SharedDefaultFallsBackWithOneWarning) {
  Result<ModelAttentionConfig> model = load(kWhisper);
  ASSERT_TRUE(model.is_ok());
  Result<Selection> s = resolve(ServerArgs{}, *model, *device_by_name("sm80"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->prefill_backend, "triton");
  EXPECT_EQ(s->decode_backend, "triton");
  const auto lacks = std::count_if(s->warnings.begin(), s->warnings.end(), [](const auto& w) {
    return w.find("lacks non-causal encoder attention") != std::string::npos;
  });
  EXPECT_EQ(lacks, 1) << s->to_text();
}

TEST(Selection, RealCpuDefaultIsBuiltAndHasNoBuildWarning) {
  DeviceInfo d = *device_by_name("cpu");
  d.is_virtual = false;
  Result<ModelAttentionConfig> model = load(kLlama);
  ASSERT_TRUE(model.is_ok());
  Result<Selection> s = resolve(ServerArgs{}, *model, d);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->decode_backend, "intel_amx");
  for (const std::string& w : s->warnings) EXPECT_EQ(w.find("not built"), std::string::npos) << w;
}

// A model head dim without kernels in this binary: intel_amx runs head dims 16..256 in steps of
// 16, so head_dim 72 (hidden 576 over 8 heads) is refused by name when named, and the CPU default
// falls back to torch_native with a warning (it failed at backend creation before).
// A ModelAttentionConfig built by hand (parse_model_config checks the config.json ones) gets its
// head counts and dims checked by name.
TEST(Selection, HandBuiltModelValuesAreChecked) {
  Result<ModelAttentionConfig> parsed = parse_model_config(
      R"({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 2})");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const DeviceInfo cpu = *device_by_name("cpu");
  ModelAttentionConfig m = *parsed;
  m.num_attention_heads = 3;
  m.num_key_value_heads = 2;
  Result<Selection> s = resolve(ServerArgs{}, m, cpu);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("num_key_value_heads 2 does not divide its "
                                      "num_attention_heads 3"),
            std::string::npos)
      << s.status().message();
  m = *parsed;
  m.head_dim = -64;
  s = resolve(ServerArgs{}, m, cpu);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("the model's head_dim -64 is negative"), std::string::npos)
      << s.status().message();
  EXPECT_TRUE(resolve(ServerArgs{}, *parsed, cpu).is_ok());
}

// create_selected_backend refuses a quantised pool under a selection made for another dtype (an
// fp8 pool under a bf16 selection was accepted, its backends never checked for fp8); full-precision
// pools stand in for one another (an f32 pool for exact checks under the bf16 default).
TEST(Selection, CreateSelectedBackendChecksThePoolDtype) {
  Result<ModelAttentionConfig> model = parse_model_config(
      R"({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 2})");
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  ServerArgs args;
  args.attention_backend = "torch_native";
  Result<Selection> sel = resolve(args, *model, *device_by_name("cpu"));
  ASSERT_TRUE(sel.is_ok()) << sel.status().to_string();
  ASSERT_EQ(sel->kv_dtype, DType::kBF16);
  KVPoolConfig c;
  c.num_layers = 2;
  c.page_size = sel->page_size;
  c.size = 4 * sel->page_size;
  c.device = Device::cpu();
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.v_head_dim = 64;
  std::unique_ptr<ReqToTokenPool> table = ReqToTokenPool::create(2, 64, Device::cpu()).value();
  BackendContext ctx;
  ctx.device = Device::cpu();
  ctx.num_q_heads = 8;
  ctx.num_kv_heads = 2;
  ctx.qk_head_dim = 64;
  ctx.v_head_dim = 64;
  ctx.page_size = sel->page_size;
  ctx.req_to_token_pool = table.get();
  c.dtype = DType::kFP8E4M3;
  std::unique_ptr<MHAKVPool> fp8 = MHAKVPool::create(c).value();
  ctx.kv_pool = fp8.get();
  Result<std::unique_ptr<AttentionBackend>> made = create_selected_backend(*sel, ctx);
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find("ctx.kv_pool stores fp8_e4m3 but the selection's KV "
                                         "cache dtype is bf16"),
            std::string::npos)
      << made.status().message();
  c.dtype = DType::kF32;
  std::unique_ptr<MHAKVPool> f32 = MHAKVPool::create(c).value();
  ctx.kv_pool = f32.get();
  made = create_selected_backend(*sel, ctx);
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
}

TEST(Selection, HeadDimWithoutKernelsIsRefusedOrFallsBack) {
  Result<ModelAttentionConfig> model = parse_model_config(
      R"({"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 2})");
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  ASSERT_EQ(model->head_dim, 72);
  DeviceInfo d = *device_by_name("cpu");
  d.is_virtual = false;
  ServerArgs named;
  named.attention_backend = "intel_amx";
  Result<Selection> refused = resolve(named, *model, d);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.status().message().find("intel_amx has no kernels for head_dim 72 in this "
                                            "binary (compiled: 16,32,48,64"),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("torch_native"), std::string::npos)
      << refused.status().message();
  Result<Selection> fallback = resolve(ServerArgs{}, *model, d);
  ASSERT_TRUE(fallback.is_ok()) << fallback.status().to_string();
  EXPECT_EQ(fallback->decode_backend, "torch_native");
  EXPECT_EQ(fallback->prefill_backend, "torch_native");
  // One warning naming the default that serves both roles, not a second one calling it the
  // "decode backend".
  const auto warned = std::count_if(
      fallback->warnings.begin(), fallback->warnings.end(),
      [](const std::string& w) { return w.find("head_dim 72") != std::string::npos; });
  EXPECT_EQ(warned, 1) << fallback->to_text();
  for (const std::string& w : fallback->warnings) {
    EXPECT_EQ(w.find("decode backend"), std::string::npos) << w;
  }
  // Planning for another machine: no build of intel_amx has head_dim 72 (its kernels' dims do not
  // depend on the build), so the named backend is refused there too, naming its dims.
  Result<Selection> planned = resolve(named, *model, *device_by_name("cpu"));
  ASSERT_FALSE(planned.is_ok());
  EXPECT_EQ(planned.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(planned.status().message().find("intel_amx has no kernels for head_dim 72 in any "
                                            "build (its head dims: 16,32,48,64"),
            std::string::npos)
      << planned.status().message();
  // A CUDA backend for another machine: a head dim outside what ATTNKIT_HEAD_DIMS can take is
  // refused by name (a pruned build's missing dim of that list would be a warning).
  ServerArgs fa3;
  fa3.attention_backend = "fa3";
  Result<Selection> cuda = resolve(fa3, *model, *device_by_name("sm90"));
  ASSERT_FALSE(cuda.is_ok());
  EXPECT_NE(cuda.status().message().find("fa3 has no kernels for head_dim 72 in any build "
                                         "(ATTNKIT_HEAD_DIMS takes 64,80,96,128,256)"),
            std::string::npos)
      << cuda.status().message();
}

TEST(Selection, VirtualDeviceWarnsAboutUnbuiltBackend) {
  Result<ModelAttentionConfig> model = load(kDsR1);
  ASSERT_TRUE(model.is_ok());
  ServerArgs a;
  a.attention_backend = "trtllm_mla";
  Result<Selection> s = resolve(a, *model, *device_by_name("sm100"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  ASSERT_FALSE(s->warnings.empty());
  EXPECT_NE(s->warnings.back().find("trtllm_mla is not built in this binary (not implemented yet)"),
            std::string::npos)
      << s->warnings.back();
}

TEST(Selection, JsonAndTextCarryTheDecision) {
  Result<ModelAttentionConfig> model = load(kDsR1);
  ASSERT_TRUE(model.is_ok());
  ServerArgs a;
  a.attention_backend = "trtllm_mla";
  a.prefill_attention_backend = "fa4";
  Result<Selection> s = resolve(a, *model, *device_by_name("sm100"));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const std::string json = s->to_json();
  EXPECT_NE(json.find("\"prefill_backend\": \"fa4\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"decode_backend\": \"trtllm_mla\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"page_size\": 64"), std::string::npos) << json;
  const std::string text = s->to_text();
  EXPECT_NE(text.find("hybrid:               yes"), std::string::npos) << text;
}

TEST(Selection, CheckBackendOnDeviceIsRoleAware) {
  const BackendDescriptor* trtllm = builtin_registry().find("trtllm_mha");
  ASSERT_NE(trtllm, nullptr);
  const DeviceInfo sm90 = *device_by_name("sm90");
  EXPECT_TRUE(check_backend_on_device(*trtllm, sm90, BackendRole::kDecode).is_ok());
  EXPECT_FALSE(check_backend_on_device(*trtllm, sm90, BackendRole::kPrefill).is_ok());
  const DeviceInfo sm100 = *device_by_name("sm100");
  EXPECT_TRUE(check_backend_on_device(*trtllm, sm100, BackendRole::kPrefill).is_ok());
  const DeviceInfo sm120 = *device_by_name("sm120");
  EXPECT_TRUE(check_backend_on_device(*trtllm, sm120, BackendRole::kDecode).is_ok());
  EXPECT_FALSE(check_backend_on_device(*trtllm, sm120, BackendRole::kPrefill).is_ok());
}

}  // namespace
}  // namespace attnkit
