// `attnkit select`: run backend selection (resolve()) for a model config on a device and print
// the decision with one reason per line. Flags use SGLang's spellings.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/model_config.h"
#include "attnkit/registry.h"
#include "attnkit/selection.h"
#include "attnkit/server_args.h"
#include "tools/attnkit/cli_checks.h"
#include "tools/attnkit/commands.h"

namespace attnkit {
namespace {

struct SelectArgs {
  std::string model_config;
  std::string device = "auto";
  std::string format = "text";
  std::string attention_backend;
  std::string prefill_attention_backend;
  std::string decode_attention_backend;
  int page_size = 0;
  std::string kv_cache_dtype = "auto";
  bool disable_cuda_graph = false;
  int chunked_prefill_size = 0;
  std::string speculative_algorithm;
  int speculative_num_steps = 0;
  int speculative_eagle_topk = 0;
  int speculative_num_draft_tokens = 0;
  std::string speculative_attention_mode = "prefill";
  std::string linear_attn_backend = "triton";
  std::string linear_attn_decode_backend;
  std::string linear_attn_prefill_backend;
  bool enable_mixed_chunk = false;
  bool disable_radix_cache = false;
  int tp_size = 1;
};

// An optional flag value: set only when the user gave the option.
template <typename T>
std::optional<T> given(const CLI::App& cmd, const char* flag, const T& value) {
  return cmd.count(flag) > 0 ? std::optional<T>(value) : std::nullopt;
}

void run_select(const CLI::App& cmd, const SelectArgs& a) {
  Result<ModelAttentionConfig> model = load_model_config(a.model_config);
  if (!model) cli_fail("--model-config " + a.model_config + ": " + model.status().message());
  Result<DeviceInfo> device = device_by_name(a.device);
  if (!device) cli_fail(device.status().message());
  ServerArgs args;
  args.attention_backend = given(cmd, "--attention-backend", a.attention_backend);
  args.prefill_attention_backend =
      given(cmd, "--prefill-attention-backend", a.prefill_attention_backend);
  args.decode_attention_backend =
      given(cmd, "--decode-attention-backend", a.decode_attention_backend);
  args.page_size = given(cmd, "--page-size", a.page_size);
  args.kv_cache_dtype = a.kv_cache_dtype;
  args.disable_cuda_graph = a.disable_cuda_graph;
  args.chunked_prefill_size = given(cmd, "--chunked-prefill-size", a.chunked_prefill_size);
  args.speculative_algorithm = given(cmd, "--speculative-algorithm", a.speculative_algorithm);
  args.speculative_num_steps = given(cmd, "--speculative-num-steps", a.speculative_num_steps);
  args.speculative_eagle_topk = given(cmd, "--speculative-eagle-topk", a.speculative_eagle_topk);
  args.speculative_num_draft_tokens =
      given(cmd, "--speculative-num-draft-tokens", a.speculative_num_draft_tokens);
  args.speculative_attention_mode = a.speculative_attention_mode;
  args.linear_attn_backend = given(cmd, "--linear-attn-backend", a.linear_attn_backend);
  args.linear_attn_decode_backend =
      given(cmd, "--linear-attn-decode-backend", a.linear_attn_decode_backend);
  args.linear_attn_prefill_backend =
      given(cmd, "--linear-attn-prefill-backend", a.linear_attn_prefill_backend);
  args.enable_mixed_chunk = a.enable_mixed_chunk;
  args.disable_radix_cache = a.disable_radix_cache;
  args.tp_size = a.tp_size;
  Result<Selection> selection = resolve(args, *model, *device);
  if (!selection) cli_fail("select: " + selection.status().message());
  std::cout << (a.format == "json" ? selection->to_json() + "\n" : selection->to_text());
}

}  // namespace

void register_select_command(CLI::App& app) {
  auto a = std::make_shared<SelectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "select",
      "Choose the attention backends for a model on a device (SGLang's rules) and print the "
      "decision with the reason for each choice");
  const std::vector<std::string> backends = builtin_registry().names();
  const std::vector<std::string> linear = builtin_registry().linear_names();
  std::vector<std::string> devices = virtual_device_names();
  devices.insert(devices.begin(), "auto");

  cmd->add_option("--model-config", a->model_config,
                  "Hugging Face config.json of the model, or its directory")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--device", a->device,
                  "Device to plan for: auto (this machine) or a virtual device")
      ->check(CLI::IsMember(devices))
      ->capture_default_str();
  cmd->add_option("--format", a->format, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("--attention-backend", a->attention_backend,
                  "Backend for both phases (default: chosen from device and model)")
      ->check(CLI::IsMember(backends));
  cmd->add_option("--prefill-attention-backend", a->prefill_attention_backend,
                  "Backend for prefill/extend (the other phase inherits --attention-backend)")
      ->check(CLI::IsMember(backends));
  cmd->add_option("--decode-attention-backend", a->decode_attention_backend,
                  "Backend for decode (the other phase inherits --attention-backend)")
      ->check(CLI::IsMember(backends));
  cmd->add_option("--page-size", a->page_size,
                  "Tokens per KV page (default 1; some backends "
                  "force their own)")
      ->transform(cli::positive_int());
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype, "KV-cache dtype")
      ->check(CLI::IsMember(
          {"auto", "bf16", "bfloat16", "fp16", "float16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"}))
      ->capture_default_str();
  cmd->add_flag("--disable-cuda-graph", a->disable_cuda_graph, "Run decode eagerly");
  cmd->add_option("--chunked-prefill-size", a->chunked_prefill_size,
                  "Max tokens per prefill chunk (-1 = off); must be a multiple of the page size")
      ->transform(cli::integer_at_least(-1));
  cmd->add_option("--speculative-algorithm", a->speculative_algorithm,
                  "Speculative decoding algorithm")
      ->check(CLI::IsMember({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}));
  cmd->add_option("--speculative-num-steps", a->speculative_num_steps, "Draft steps")
      ->transform(cli::integer_in_range(1, kMaxSpeculativeValue));
  cmd->add_option("--speculative-eagle-topk", a->speculative_eagle_topk,
                  "Draft branches per step (1 = chain, > 1 = tree); for NGRAM the match "
                  "trie's breadth (SGLang's --speculative-ngram-max-bfs-breadth, default 10)")
      ->transform(cli::integer_in_range(1, kMaxSpeculativeValue));
  cmd->add_option("--speculative-num-draft-tokens", a->speculative_num_draft_tokens,
                  "Draft tokens verified per request")
      ->transform(cli::integer_in_range(1, kMaxSpeculativeValue));
  cmd->add_option("--speculative-attention-mode", a->speculative_attention_mode,
                  "Which phase's backend runs verify/draft-extend")
      ->check(CLI::IsMember({"prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--linear-attn-backend", a->linear_attn_backend,
                  "GDN linear-attention kernels (models with linear-attention layers)")
      ->check(CLI::IsMember(linear))
      ->capture_default_str();
  cmd->add_option("--linear-attn-decode-backend", a->linear_attn_decode_backend,
                  "GDN kernels for decode (default: --linear-attn-backend)")
      ->check(CLI::IsMember(linear));
  cmd->add_option("--linear-attn-prefill-backend", a->linear_attn_prefill_backend,
                  "GDN kernels for prefill (default: --linear-attn-backend)")
      ->check(CLI::IsMember(linear));
  cmd->add_flag("--enable-mixed-chunk", a->enable_mixed_chunk,
                "Mix chunked prefill and decode in one batch");
  cmd->add_flag("--disable-radix-cache", a->disable_radix_cache, "Disable the prefix cache");
  cmd->add_option("--tp-size", a->tp_size, "Tensor-parallel ranks (heads per rank)")
      ->transform(cli::positive_int())
      ->capture_default_str();
  cmd->callback([cmd, a] { run_select(*cmd, *a); });
}

}  // namespace attnkit
