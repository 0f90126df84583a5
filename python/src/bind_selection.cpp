// Bindings of planning: model configs, devices, resolve()/select() with its reasons, and the
// support matrix read from the backend descriptors.
#include <string>

#include "attnkit/device.h"
#include "attnkit/model_config.h"
#include "attnkit/server_args.h"
#include "wrappers.h"

namespace attnkit::python {
namespace {

using namespace nb::literals;

nb::list platform_names(const std::vector<Platform>& platforms) {
  nb::list out;
  for (Platform p : platforms) out.append(platform_name(p));
  return out;
}

nb::object feature_row_dict(const FeatureRow* row) {
  if (row == nullptr) return nb::none();
  nb::dict d;
  d["pages"] = row->pages.to_string();
  d["native_page_sizes"] = row->pages.kind == PageRule::Kind::kFixed
                               ? nb::cast(row->pages.sizes)
                               : nb::cast(row->pages.kind == PageRule::Kind::kAny ? "any" : "none");
  d["fp8_kv"] = row->fp8_kv;
  d["fp8_e4m3_only"] = row->fp8_e4m3_only;
  d["fp4_kv"] = row->fp4_kv;
  d["spec_topk1"] = row->spec_topk1;
  d["spec_topk_gt1"] = row->spec_topk_gt1;
  d["topk_gt1_needs_page1"] = row->topk_gt1_needs_page1;
  d["sliding_window"] = row->sliding_window;
  d["multimodal"] = row->multimodal;
  d["chunked_prefix_cache"] = row->chunked_prefix_cache;
  d["head_dims"] = row->head_dims;
  return d;
}

// ServerArgs from keyword arguments spelled like the flags with underscores
// (attention_backend="fa3", page_size=64, kv_cache_dtype="fp8_e4m3", ...).
ServerArgs server_args_from(const nb::kwargs& kwargs) {
  ServerArgs a;
  for (auto [key_obj, value] : kwargs) {
    const std::string key = nb::cast<std::string>(key_obj);
    // A value of the wrong type is a ValueError naming the flag (nb::cast threw a bare
    // RuntimeError('std::bad_cast')).
    const auto wrong = [&](const char* expected) {
      raise_invalid("resolve: " + key + " must be " + expected + ", got " +
                    nb::cast<std::string>(nb::repr(value)) + " (" +
                    nb::cast<std::string>(nb::str(value.type())) + ")");
    };
    const auto str = [&]() {
      std::string out;
      if (!nb::isinstance<nb::str>(value) || !nb::try_cast(value, out)) wrong("a str");
      return out;
    };
    const auto opt_str = [&]() -> std::optional<std::string> {
      if (value.is_none()) return std::nullopt;
      return str();
    };
    const auto boolean = [&]() {
      if (!nb::isinstance<nb::bool_>(value)) wrong("True or False");
      return nb::cast<bool>(value);
    };
    const auto integer = [&]() {
      // Python and NumPy integers (anything with __index__); not bools, floats or strings.
      int out = 0;
      if (nb::isinstance<nb::bool_>(value) || nb::isinstance<nb::float_>(value) ||
          nb::isinstance<nb::str>(value) || !nb::try_cast(value, out)) {
        wrong("an int in the int32 range");
      }
      return out;
    };
    const auto opt_int = [&]() -> std::optional<int> {
      if (value.is_none()) return std::nullopt;
      return integer();
    };
    if (key == "attention_backend") {
      a.attention_backend = opt_str();
    } else if (key == "prefill_attention_backend") {
      a.prefill_attention_backend = opt_str();
    } else if (key == "decode_attention_backend") {
      a.decode_attention_backend = opt_str();
    } else if (key == "page_size") {
      a.page_size = opt_int();
    } else if (key == "kv_cache_dtype") {
      a.kv_cache_dtype = value.is_none() ? std::string("auto") : str();
    } else if (key == "disable_cuda_graph") {
      a.disable_cuda_graph = boolean();
    } else if (key == "chunked_prefill_size") {
      a.chunked_prefill_size = opt_int();
    } else if (key == "speculative_algorithm") {
      a.speculative_algorithm = opt_str();
    } else if (key == "speculative_num_steps") {
      a.speculative_num_steps = opt_int();
    } else if (key == "speculative_eagle_topk") {
      a.speculative_eagle_topk = opt_int();
    } else if (key == "speculative_num_draft_tokens") {
      a.speculative_num_draft_tokens = opt_int();
    } else if (key == "speculative_attention_mode") {
      a.speculative_attention_mode = str();
    } else if (key == "linear_attn_backend") {
      a.linear_attn_backend = str();
    } else if (key == "linear_attn_decode_backend") {
      a.linear_attn_decode_backend = opt_str();
    } else if (key == "linear_attn_prefill_backend") {
      a.linear_attn_prefill_backend = opt_str();
    } else if (key == "enable_mixed_chunk") {
      a.enable_mixed_chunk = boolean();
    } else if (key == "disable_radix_cache") {
      a.disable_radix_cache = boolean();
    } else if (key == "tp_size") {
      a.tp_size = integer();
    } else {
      raise_invalid("resolve: unknown server argument \"" + key +
                    "\" (flags use underscores: attention_backend, prefill_attention_backend, "
                    "decode_attention_backend, page_size, kv_cache_dtype, disable_cuda_graph, "
                    "chunked_prefill_size, speculative_algorithm, speculative_num_steps, "
                    "speculative_eagle_topk, speculative_num_draft_tokens, "
                    "speculative_attention_mode, linear_attn_backend, linear_attn_decode_backend, "
                    "linear_attn_prefill_backend, enable_mixed_chunk, disable_radix_cache, "
                    "tp_size)");
    }
  }
  return a;
}

ModelAttentionConfig model_from(nb::handle model) {
  ModelAttentionConfig config;
  if (nb::try_cast<ModelAttentionConfig>(model, config)) return config;
  if (nb::isinstance<nb::dict>(model)) {
    const std::string text =
        nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(model));
    return check(parse_model_config(text));
  }
  if (nb::isinstance<nb::str>(model) || nb::hasattr(model, "__fspath__")) {
    const std::string path =
        nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(model));
    return check(load_model_config(path));
  }
  raise_invalid(
      "model must be a config.json path, a model directory, a dict or an "
      "attnkit.ModelConfig; got " +
      nb::cast<std::string>(nb::str(model.type())));
}

DeviceInfo device_from(nb::handle device) {
  DeviceInfo info;
  if (nb::try_cast<DeviceInfo>(device, info)) return info;
  if (device.is_none()) return detect_default_device();
  return check(device_by_name(nb::cast<std::string>(nb::str(device))));
}

}  // namespace

nb::dict descriptor_dict(const BackendDescriptor& d) {
  nb::dict out;
  out["name"] = d.name;
  out["implementation"] = d.implementation;
  out["platforms"] = platform_names(d.platforms);
  out["min_compute_capability"] = d.min_compute_capability;
  out["max_compute_capability"] = d.max_compute_capability;
  out["prefill_min_compute_capability"] = d.prefill_min_compute_capability;
  out["prefill_max_compute_capability"] = d.prefill_max_compute_capability;
  out["mha"] = feature_row_dict(d.row(AttentionKind::kMHA));
  out["mla"] = feature_row_dict(d.row(AttentionKind::kMLA));
  out["cuda_graph"] = d.cuda_graph;
  out["decode_role"] = d.decode_role;
  out["prefill_role"] = d.prefill_role;
  out["built"] = d.built;
  out["not_built_reason"] = d.not_built_reason;
  return out;
}

const Selection* selection_of(nb::handle obj) {
  if (!nb::isinstance<Selection>(obj)) return nullptr;
  return nb::inst_ptr<Selection>(obj);
}

void bind_selection(nb::module_& m) {
  nb::class_<ModelAttentionConfig>(m, "ModelConfig",
                                   "Attention-relevant facts of a Hugging Face config.json.")
      .def_ro("model_type", &ModelAttentionConfig::model_type)
      .def_ro("num_layers", &ModelAttentionConfig::num_layers)
      .def_ro("num_attention_heads", &ModelAttentionConfig::num_attention_heads)
      .def_ro("num_key_value_heads", &ModelAttentionConfig::num_key_value_heads)
      .def_ro("head_dim", &ModelAttentionConfig::head_dim)
      .def_ro("v_head_dim", &ModelAttentionConfig::v_head_dim)
      .def_ro("sliding_window", &ModelAttentionConfig::sliding_window)
      .def_ro("is_mla", &ModelAttentionConfig::is_mla)
      .def_ro("kv_lora_rank", &ModelAttentionConfig::kv_lora_rank)
      .def_ro("qk_rope_head_dim", &ModelAttentionConfig::qk_rope_head_dim)
      .def_ro("has_attention_sinks", &ModelAttentionConfig::has_attention_sinks)
      .def_ro("has_linear_attention", &ModelAttentionConfig::has_linear_attention)
      .def_prop_ro("dtype", [](const ModelAttentionConfig& c) { return dtype_name(c.dtype); })
      .def("default_scaling", &ModelAttentionConfig::default_scaling)
      .def("attention_window_left", &ModelAttentionConfig::attention_window_left)
      .def("summary", &ModelAttentionConfig::summary)
      .def("__repr__",
           [](const ModelAttentionConfig& c) { return "ModelConfig(" + c.summary() + ")"; });
  m.def(
      "load_model_config", [](nb::handle path) { return model_from(path); }, "path"_a,
      "Parse a config.json file (or a model directory holding one).");
  m.def(
      "parse_model_config", [](const std::string& text) { return check(parse_model_config(text)); },
      "text"_a);

  nb::class_<DeviceInfo>(m, "DeviceInfo", "What the code runs on (real or virtual).")
      .def_ro("name", &DeviceInfo::name)
      .def_prop_ro("platform", [](const DeviceInfo& d) { return platform_name(d.platform); })
      .def_ro("compute_capability", &DeviceInfo::compute_capability)
      .def_ro("sm_count", &DeviceInfo::sm_count)
      .def_ro("has_avx2", &DeviceInfo::has_avx2)
      .def_ro("has_avx512", &DeviceInfo::has_avx512)
      .def_ro("has_avx512_bf16", &DeviceInfo::has_avx512_bf16)
      .def_ro("has_avx512_vbmi", &DeviceInfo::has_avx512_vbmi)
      .def_ro("has_amx_bf16", &DeviceInfo::has_amx_bf16)
      .def_ro("is_virtual", &DeviceInfo::is_virtual)
      .def("__repr__", [](const DeviceInfo& d) {
        return "DeviceInfo(" + d.name + ", " + platform_name(d.platform) + ")";
      });
  m.def(
      "device_info", [](nb::handle name) { return device_from(name); }, "name"_a = nb::none(),
      "A virtual device (\"cpu\", \"sm80\", \"sm90\", \"sm100\", \"rocm\", ...) or the detected "
      "one (None / \"auto\").");
  m.def("virtual_device_names", &virtual_device_names);

  nb::class_<Selection>(m, "Selection",
                        "The result of resolve(): backends, page size, KV dtype, "
                        "CUDA-graph decision, and one reason line per decision.")
      .def_ro("device_name", &Selection::device_name)
      .def_ro("model_summary", &Selection::model_summary)
      .def_prop_ro("kind", [](const Selection& s) { return attention_kind_name(s.kind); })
      .def_ro("prefill_backend", &Selection::prefill_backend)
      .def_ro("decode_backend", &Selection::decode_backend)
      .def_ro("page_size", &Selection::page_size)
      .def_prop_ro("kv_cache_dtype",
                   [](const Selection& s) { return kv_cache_dtype_name(s.kv_cache_dtype); })
      .def_prop_ro("kv_dtype", [](const Selection& s) { return dtype_name(s.kv_dtype); })
      .def_ro("cuda_graph", &Selection::cuda_graph)
      .def_prop_ro("is_hybrid", &Selection::is_hybrid)
      .def_ro("reasons", &Selection::reasons)
      .def_ro("warnings", &Selection::warnings)
      .def("to_text", &Selection::to_text)
      .def("to_json", &Selection::to_json)
      .def("to_dict",
           [](const Selection& s) {
             return nb::module_::import_("json").attr("loads")(s.to_json());
           })
      .def("__str__", &Selection::to_text)
      .def("__repr__", [](const Selection& s) {
        return "Selection(prefill=" + s.prefill_backend + ", decode=" + s.decode_backend +
               ", page_size=" + std::to_string(s.page_size) + ")";
      });

  const char* resolve_doc =
      "Backend selection and validation (a pure function): model is a config.json path, a model "
      "directory, a dict or a ModelConfig; device a virtual device name (\"sm90\", \"cpu\", ...), "
      "a DeviceInfo, or None/\"auto\" for the detected one; keyword arguments are the server "
      "flags with underscores (attention_backend=\"fa3\", page_size=64, "
      "kv_cache_dtype=\"fp8_e4m3\", "
      "speculative_algorithm=\"EAGLE\", ...). Returns a Selection (with .reasons and .warnings); "
      "a request that does not fit raises InvalidArgumentError / UnsupportedError naming the flag.";
  const auto resolve_fn = [](nb::handle model, nb::handle device, const nb::kwargs& kwargs) {
    const ModelAttentionConfig config = model_from(model);
    const DeviceInfo info = device_from(device);
    const ServerArgs args = server_args_from(kwargs);
    return check(resolve(args, config, info));
  };
  m.def("resolve", resolve_fn, "model"_a, "device"_a = nb::none(), "kwargs"_a, resolve_doc);
  m.def("select", resolve_fn, "model"_a, "device"_a = nb::none(), "kwargs"_a,
        "Alias of resolve() (the CLI's `attnkit select`).");

  m.def(
      "matrix",
      []() {
        nb::list out;
        for (const BackendDescriptor& d : builtin_registry().all()) out.append(descriptor_dict(d));
        return out;
      },
      "The support matrix: one dict per registered backend, read from its descriptor (the single "
      "source of truth): platforms, compute capability bounds, MHA / MLA feature rows, CUDA-graph "
      "support and whether it is built in this binary.");
  m.def("backend_names", []() { return builtin_registry().names(); });
  m.def("linear_attn_backends", []() {
    nb::list out;
    for (const LinearAttnDescriptor& d : builtin_registry().linear_all()) {
      nb::dict row;
      row["name"] = d.name;
      row["implementation"] = d.implementation;
      row["platforms"] = platform_names(d.platforms);
      row["min_compute_capability"] = d.min_compute_capability;
      row["decode"] = d.decode;
      row["extend"] = d.extend;
      row["target_verify"] = d.target_verify;
      row["built"] = d.built;
      row["not_built_reason"] = d.not_built_reason;
      out.append(row);
    }
    return out;
  });
}

}  // namespace attnkit::python
