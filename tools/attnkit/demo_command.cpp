// `attnkit demo`: the README's main demo. On whatever device is present it resolves the attention
// backend for a Llama-3.1-8B-shaped model (32 q / 8 kv heads, head dim 128, bf16), builds a paged
// KV cache with random history, runs one mixed batch (chunked prefill rows next to decode rows,
// kv_len 0 and odd lengths included) and one decode step through the selected backend, and
// verifies both against the fp64 reference.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/model_config.h"
#include "attnkit/registry.h"
#include "attnkit/selection.h"
#include "attnkit/server_args.h"
#include "core/str_cat.h"
#include "harness/case_runner.h"
#include "tools/attnkit/cli_checks.h"
#include "tools/attnkit/commands.h"

namespace attnkit {
namespace {

struct DemoOptions {
  std::string device = "auto";
  std::optional<std::string> attention_backend;
  std::optional<int> page_size;
  std::string kv_cache_dtype = "auto";
};

ModelAttentionConfig demo_model() {
  ModelAttentionConfig m;
  m.model_type = "llama";
  m.architectures = {"LlamaForCausalLM"};
  m.num_layers = 2;  // the demo runs two layers; the shapes are Llama-3.1-8B's
  m.hidden_size = 4096;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  m.v_head_dim = 128;
  m.dtype = DType::kBF16;
  m.max_position_embeddings = 131072;
  m.layer_kinds.assign(static_cast<size_t>(m.num_layers), LayerKind::kFullAttention);
  return m;
}

Result<DeviceInfo> demo_device(const std::string& name) {
  if (name == "auto") {
    // A GPU this binary has no code for (detect_cuda: kUnsupported) runs the demo on the CPU,
    // saying why; no GPU at all is the usual CPU case.
    Result<DeviceInfo> cuda = detect_cuda(0);
    if (cuda.is_ok()) return cuda;
    if (cuda.status().code() == StatusCode::kUnsupported) {
      std::cerr << "attnkit demo: " << cuda.status().message() << "; using the CPU\n";
    }
    return detect_cpu();
  }
  if (name == "cpu") return detect_cpu();
  if (name == "cuda") return detect_cuda(0);
  return Status::invalid_argument("--device " + name + " is not accepted (auto, cpu, cuda)");
}

// One step: prepare the case on the device, run the selected backend, compare with the reference.
Status run_step(const char* title, harness::CaseSpec spec, const Selection& selection,
                Device device, bool* passed) {
  spec.page_size = selection.page_size;
  spec.kv_dtype = selection.kv_dtype;
  ATTNKIT_ASSIGN_OR_RETURN(harness::PreparedCase prepared, harness::prepare_case(spec, device));
  ATTNKIT_ASSIGN_OR_RETURN(auto backend, create_selected_backend(selection, prepared.context()));
  std::printf("\n%s\n  %s\n", title, spec.describe().c_str());
  std::printf("  requests:");
  for (int r = 0; r < spec.batch_size(); ++r) {
    std::printf(" [cached %d + new %d]", spec.prefix_lens[static_cast<size_t>(r)],
                spec.new_lens[static_cast<size_t>(r)]);
  }
  std::printf("\n  pages in use: %lld of %lld (page size %d), tokens this step: %d\n",
              static_cast<long long>(prepared.allocator->num_pages() -
                                     prepared.allocator->available_pages()),
              static_cast<long long>(prepared.allocator->num_pages()), spec.page_size,
              prepared.num_tokens);
  ATTNKIT_RETURN_IF_ERROR(harness::run_backend(*backend, prepared, /*save_kv=*/true));
  ATTNKIT_ASSIGN_OR_RETURN(harness::Comparison cmp, harness::compare_with_reference(prepared));
  std::printf("  %s vs fp64 reference: %s -> %s\n", backend->descriptor().name.c_str(),
              cmp.summary().c_str(), cmp.passed() ? "PASS" : "FAIL");
  *passed = *passed && cmp.passed();
  return Status::ok();
}

Status run_demo(const DemoOptions& opt, bool* passed) {
  ATTNKIT_ASSIGN_OR_RETURN(DeviceInfo device_info, demo_device(opt.device));
  ServerArgs args;
  args.attention_backend = opt.attention_backend;
  args.page_size = opt.page_size ? opt.page_size : std::optional<int>(16);
  args.kv_cache_dtype = opt.kv_cache_dtype;
  const ModelAttentionConfig model = demo_model();
  ATTNKIT_ASSIGN_OR_RETURN(Selection selection, resolve(args, model, device_info));
  if (!opt.page_size) {
    // The 16 is the demo's, not the user's: its lines must not credit the flag.
    for (std::vector<std::string>* lines : {&selection.reasons, &selection.warnings}) {
      for (std::string& line : *lines) {
        for (const auto& [from, to] :
             {std::pair<std::string, std::string>{"(--page-size", "(the demo's default"},
              {"--page-size 16 -> ", "the demo's page size 16 -> "}}) {
          if (const size_t at = line.find(from); at != std::string::npos)
            line.replace(at, from.size(), to);
        }
      }
    }
  }

  const Device device = device_info.platform == Platform::kCUDA ? Device::cuda(0) : Device::cpu();
  harness::CaseSpec mixed;
  mixed.name = "demo_mixed";
  mixed.mode = ForwardMode::kMixed;
  mixed.prefix_lens = {0, 37, 300, 1013, 0};  // chunked prefill rows and decode rows
  mixed.new_lens = {97, 64, 1, 1, 1};         // the last request has kv_len 1
  mixed.num_q_heads = model.num_attention_heads;
  mixed.num_kv_heads = model.num_key_value_heads;
  mixed.head_dim = model.head_dim;
  mixed.v_head_dim = model.v_head_dim;
  mixed.q_dtype = model.dtype;
  mixed.seed = 20261122;
  harness::CaseSpec decode = mixed;
  decode.name = "demo_decode";
  decode.mode = ForwardMode::kDecode;
  decode.prefix_lens = {96, 100, 300, 1013, 4095};
  decode.new_lens = {1, 1, 1, 1, 1};
  decode.seed = mixed.seed + 1;
  // The steps' shapes under the selected page size, checked before anything is printed or run
  // (--page-size 2147483647 printed the plan, then failed naming a request-table row).
  for (harness::CaseSpec* spec : {&mixed, &decode}) {
    harness::CaseSpec sized = *spec;
    sized.page_size = selection.page_size;
    sized.kv_dtype = selection.kv_dtype;
    if (const Status st = harness::validate_case(sized); !st.is_ok()) {
      return Status::invalid_argument(cat("--page-size ", selection.page_size,
                                          " does not fit the demo's requests: ", st.message()));
    }
  }
  std::printf("attnkit demo on %s\n%s", device_info.name.c_str(), selection.to_text().c_str());
  ATTNKIT_RETURN_IF_ERROR(
      run_step("step 1: mixed batch (chunked prefill + decode)", mixed, selection, device, passed));
  ATTNKIT_RETURN_IF_ERROR(run_step("step 2: decode", decode, selection, device, passed));
  std::printf("\n%s\n", *passed ? "demo: all outputs match the reference"
                                : "demo: MISMATCH against the reference");
  return Status::ok();
}

}  // namespace

void register_demo_command(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Auto-select a backend for this device, run a mixed extend+decode batch and a decode step "
      "over a paged KV cache, and verify against the fp64 reference");
  cmd->add_option("--device", opt->device, "auto (CUDA if present, else CPU), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--attention-backend", opt->attention_backend,
                  "Backend to use instead of the automatic choice");
  // The demo's longest request holds 4096 tokens: a larger page only pads (a page of 100000 rows
  // took minutes and gigabytes to allocate and fill).
  cmd->add_option("--page-size", opt->page_size,
                  cat("KV-cache page size (default 16, at most ", harness::kMaxCasePageSize, ")"))
      ->transform(cli::integer_in_range(1, harness::kMaxCasePageSize));
  cmd->add_option("--kv-cache-dtype", opt->kv_cache_dtype,
                  "auto, bf16, fp16, fp8_e4m3, fp8_e5m2, fp4_e2m1");
  cmd->callback([opt] {
    bool passed = true;
    const Status s = run_demo(*opt, &passed);
    if (!s.is_ok()) cli_fail("demo: " + s.to_string());
    if (!passed) throw CLI::RuntimeError(1);
  });
}

}  // namespace attnkit
