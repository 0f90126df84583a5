#include "bench/bench_spec_json.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_json.h"

namespace attnkit::bench {
namespace {

using Json = nlohmann::json;

Status bad(const std::string& key, const Json& v, const char* accepted) {
  return Status::invalid_argument("case spec: \"" + key + "\" = " + json_excerpt(v) +
                                  " (accepted: " + accepted + ")");
}

Status get_int(const std::string& key, const Json& v, int* out) {
  // An unsigned value past INT64_MAX read as int64 wraps negative (18446744073709551615 -> -1):
  // range-check unsigned values as unsigned.
  const bool in_range =
      v.is_number_unsigned()
          ? v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
          : v.is_number_integer() && v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
  if (!in_range) return bad(key, v, "an integer in [-2147483648, 2147483647]");
  *out = v.get<int>();
  return Status::ok();
}

Status get_int_list(const std::string& key, const Json& v, std::vector<int>* out) {
  if (!v.is_array()) return bad(key, v, "an array of integers");
  out->clear();
  for (const Json& x : v) {
    int value = 0;
    ATTNKIT_RETURN_IF_ERROR(get_int(key, x, &value));
    out->push_back(value);
  }
  return Status::ok();
}

Status get_bool(const std::string& key, const Json& v, bool* out) {
  if (!v.is_boolean()) return bad(key, v, "true or false");
  *out = v.get<bool>();
  return Status::ok();
}

// q_dtype: an activation dtype (f32, f16, bf16); kv_dtype: a KV cache dtype (those and the fp8 /
// fp4 ones; int32 is a dtype of the library but not of a cache).
Status get_dtype(const std::string& key, const Json& v, bool kv, DType* out) {
  const char* accepted = kv ? "a KV cache dtype: bf16, f16, f32, fp8_e4m3, fp8_e5m2, fp4_e2m1"
                            : "an activation dtype: bf16, f16, f32";
  if (!v.is_string()) return bad(key, v, accepted);
  Result<DType> d = parse_dtype(v.get<std::string>());
  const bool ok = d.is_ok() && (kv ? dtype_is_float(*d) : dtype_is_activation(*d));
  if (!ok) return bad(key, v, accepted);
  *out = *d;
  return Status::ok();
}

Status get_mode(const std::string& key, const Json& v, ForwardMode* out) {
  // Not idle: a case of an idle forward has no work to prepare (check_spec refuses it).
  constexpr ForwardMode kModes[] = {ForwardMode::kExtend, ForwardMode::kDecode, ForwardMode::kMixed,
                                    ForwardMode::kTargetVerify, ForwardMode::kDraftExtend};
  if (v.is_string()) {
    for (ForwardMode m : kModes) {
      if (v.get<std::string>() == forward_mode_name(m)) {
        *out = m;
        return Status::ok();
      }
    }
  }
  return bad(key, v, "extend, decode, mixed, target_verify, draft_extend");
}

}  // namespace

Result<harness::CaseSpec> parse_case_spec_json(const std::string& text) {
  Json root;
  ATTNKIT_RETURN_IF_ERROR(parse_json_text(text, "case spec", &root));
  if (!root.is_object()) {
    return Status::invalid_argument("case spec: expected a JSON object of CaseSpec fields");
  }
  harness::CaseSpec spec;
  spec.name = "custom";
  bool v_head_dim_given = false;
  for (const auto& [key, v] : root.items()) {
    Status s;
    if (key == "name") {
      const auto ident = [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      };
      // One copy of the string: begin() and end() of two temporaries would walk between them.
      const std::string name = v.is_string() ? v.get<std::string>() : std::string();
      if (name.empty() || !std::all_of(name.begin(), name.end(), ident)) {
        return bad(key, v, "a non-empty string of [A-Za-z0-9_]");
      }
      spec.name = name;
    } else if (key == "mode") {
      s = get_mode(key, v, &spec.mode);
    } else if (key == "page_size") {
      s = get_int(key, v, &spec.page_size);
    } else if (key == "prefix_lens") {
      s = get_int_list(key, v, &spec.prefix_lens);
    } else if (key == "new_lens") {
      s = get_int_list(key, v, &spec.new_lens);
    } else if (key == "num_q_heads") {
      s = get_int(key, v, &spec.num_q_heads);
    } else if (key == "num_kv_heads") {
      s = get_int(key, v, &spec.num_kv_heads);
    } else if (key == "head_dim") {
      s = get_int(key, v, &spec.head_dim);
    } else if (key == "v_head_dim") {
      v_head_dim_given = true;
      s = get_int(key, v, &spec.v_head_dim);
    } else if (key == "q_dtype") {
      s = get_dtype(key, v, /*kv=*/false, &spec.q_dtype);
    } else if (key == "kv_dtype") {
      s = get_dtype(key, v, /*kv=*/true, &spec.kv_dtype);
    } else if (key == "sliding_window") {
      s = get_int(key, v, &spec.sliding_window);
    } else if (key == "logit_cap") {
      switch (logit_cap_from_json(v, &spec.logit_cap)) {
        case LogitCapJson::kNotACap:
          return bad(key, v, "a finite number >= 0 (0 = off)");
        case LogitCapJson::kRoundsToZero:
          return bad(key, v, "0 (off) or a cap of at least the smallest f32; this one rounds to 0");
        case LogitCapJson::kOk:
          break;
      }
    } else if (key == "sinks") {
      s = get_bool(key, v, &spec.sinks);
    } else if (key == "fp8_q") {  // q handed over in fp8_e4m3 (fa3's SM90 FP8 prefill only)
      s = get_bool(key, v, &spec.fp8_q);
    } else if (key == "type") {
      if (v == "decoder") {
        spec.type = AttentionType::kDecoder;
      } else if (v == "encoder_only") {
        spec.type = AttentionType::kEncoderOnly;
      } else {
        return bad(key, v, "decoder, encoder_only");
      }
    } else if (key == "cross_attention") {
      s = get_bool(key, v, &spec.cross_attention);
    } else if (key == "encoder_lens") {
      s = get_int_list(key, v, &spec.encoder_lens);
    } else if (key == "spec_draft_tokens") {
      s = get_int(key, v, &spec.spec_draft_tokens);
    } else if (key == "spec_topk") {
      s = get_int(key, v, &spec.spec_topk);
    } else if (key == "mla") {
      s = get_bool(key, v, &spec.mla);
    } else if (key == "kv_lora_rank") {
      s = get_int(key, v, &spec.kv_lora_rank);
    } else if (key == "qk_rope_head_dim") {
      s = get_int(key, v, &spec.qk_rope_head_dim);
    } else if (key == "shuffle_pages") {
      s = get_bool(key, v, &spec.shuffle_pages);
    } else if (key == "seed") {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
        return bad(key, v, "a non-negative integer");
      }
      spec.seed = v.get<uint64_t>();
    } else {
      return Status::invalid_argument(
          "case spec: unknown key \"" + key +
          "\" (accepted: name, mode, page_size, prefix_lens, new_lens, num_q_heads, num_kv_heads, "
          "head_dim, v_head_dim, q_dtype, kv_dtype, sliding_window, logit_cap, sinks, fp8_q, type, "
          "cross_attention, encoder_lens, spec_draft_tokens, spec_topk, mla, kv_lora_rank, "
          "qk_rope_head_dim, shuffle_pages, seed)");
    }
    ATTNKIT_RETURN_IF_ERROR(s);
  }
  // v_head_dim left out: MHA takes head_dim (as the case files do); MLA absorbed takes
  // kv_lora_rank (V is the latent part of the [latent | rope] row); MLA prefill keeps CaseSpec's
  // 128 (DeepSeek's v_head_dim beside qk head_dim 192).
  if (!v_head_dim_given && !spec.mla) spec.v_head_dim = spec.head_dim;
  if (!v_head_dim_given && spec.mla_absorbed()) spec.v_head_dim = spec.kv_lora_rank;
  if (spec.prefix_lens.empty()) {
    return Status::invalid_argument("case spec: \"prefix_lens\" must list one length per request");
  }
  // A verify forward's new tokens are its drafts: new_lens would be dropped without a word.
  if (spec.mode == ForwardMode::kTargetVerify && root.contains("new_lens")) {
    return Status::invalid_argument(
        "case spec: \"new_lens\" does not apply to mode target_verify (each request verifies "
        "\"spec_draft_tokens\" tokens); leave it out");
  }
  // Decode: one new token per request unless given.
  if (spec.new_lens.empty() && spec.mode == ForwardMode::kDecode) {
    spec.new_lens.assign(spec.prefix_lens.size(), 1);
  }
  return spec;
}

}  // namespace attnkit::bench
