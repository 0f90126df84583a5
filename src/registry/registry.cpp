// BackendRegistry, PageRule and the flag-name helpers of registry.h.
#include "attnkit/registry.h"

#include <algorithm>

#include "core/device_scope.h"
#include "core/str_cat.h"

namespace attnkit {
namespace {

Platform platform_of(const Device& device) {
  return device.is_cuda() ? Platform::kCUDA : Platform::kCPU;
}

}  // namespace

const char* attention_kind_name(AttentionKind kind) {
  return kind == AttentionKind::kMHA ? "MHA" : "MLA";
}

bool PageRule::allows(int page_size) const {
  if (page_size < 1) return false;
  if (kind != Kind::kFixed) return true;
  return std::find(sizes.begin(), sizes.end(), page_size) != sizes.end();
}

std::string PageRule::to_string() const {
  switch (kind) {
    case Kind::kAny:
      return "any";
    case Kind::kFixed:
      return join(sizes, ",");
    case Kind::kTokenOnly:
      return "no (token indices)";
  }
  return "?";
}

const char* kv_cache_dtype_name(KVCacheDType d) {
  switch (d) {
    case KVCacheDType::kAuto:
      return "auto";
    case KVCacheDType::kBF16:
      return "bf16";
    case KVCacheDType::kFP16:
      return "fp16";
    case KVCacheDType::kFP8E4M3:
      return "fp8_e4m3";
    case KVCacheDType::kFP8E5M2:
      return "fp8_e5m2";
    case KVCacheDType::kFP4E2M1:
      return "fp4_e2m1";
  }
  return "?";
}

Result<KVCacheDType> parse_kv_cache_dtype(std::string_view name) {
  struct Alias {
    const char* name;
    KVCacheDType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"auto", KVCacheDType::kAuto},        {"bf16", KVCacheDType::kBF16},
      {"bfloat16", KVCacheDType::kBF16},    {"fp16", KVCacheDType::kFP16},
      {"float16", KVCacheDType::kFP16},     {"fp8_e4m3", KVCacheDType::kFP8E4M3},
      {"fp8_e5m2", KVCacheDType::kFP8E5M2}, {"fp4_e2m1", KVCacheDType::kFP4E2M1},
  };
  for (const Alias& a : kAliases) {
    if (name == a.name) return a.dtype;
  }
  return Status::invalid_argument(
      "--kv-cache-dtype \"" + std::string(name) +
      "\" is not valid; valid values: auto, bf16 (bfloat16), fp16 (float16), fp8_e4m3, fp8_e5m2, "
      "fp4_e2m1");
}

bool BackendDescriptor::runs_on(Platform p) const {
  return std::find(platforms.begin(), platforms.end(), p) != platforms.end();
}

bool LinearAttnDescriptor::runs_on(Platform p) const {
  return std::find(platforms.begin(), platforms.end(), p) != platforms.end();
}

Status BackendRegistry::add(BackendDescriptor descriptor) {
  if (descriptor.name.empty()) {
    return Status::invalid_argument("BackendRegistry::add: descriptor.name is empty");
  }
  if (find(descriptor.name) != nullptr) {
    return Status::invalid_argument("BackendRegistry::add: backend \"" + descriptor.name +
                                    "\" is already registered");
  }
  if (!descriptor.mha && !descriptor.mla) {
    return Status::invalid_argument("BackendRegistry::add: backend \"" + descriptor.name +
                                    "\" has neither an MHA nor an MLA feature row");
  }
  if (descriptor.built && !descriptor.create) {
    return Status::invalid_argument("BackendRegistry::add: backend \"" + descriptor.name +
                                    "\" is marked built but has no factory");
  }
  if (!descriptor.built && descriptor.not_built_reason.empty()) {
    return Status::invalid_argument("BackendRegistry::add: backend \"" + descriptor.name +
                                    "\" is not built and gives no not_built_reason");
  }
  descriptors_.push_back(std::move(descriptor));
  return Status::ok();
}

const BackendDescriptor* BackendRegistry::find(std::string_view name) const {
  for (const BackendDescriptor& d : descriptors_) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  out.reserve(descriptors_.size());
  for (const BackendDescriptor& d : descriptors_) out.push_back(d.name);
  return out;
}

Result<const BackendDescriptor*> BackendRegistry::get(std::string_view name) const {
  if (const BackendDescriptor* d = find(name)) return d;
  return Status::not_found("attention backend \"" + std::string(name) +
                           "\" is not known; valid backends: " + join(names(), ", "));
}

Result<std::unique_ptr<AttentionBackend>> BackendRegistry::create(std::string_view name,
                                                                  const BackendContext& ctx) const {
  ATTNKIT_ASSIGN_OR_RETURN(const BackendDescriptor* d, get(name));
  if (!d->built) {
    return Status::not_built("attention backend " + d->name +
                             " is not built in this binary: " + d->not_built_reason);
  }
  const Platform platform = platform_of(ctx.device);
  if (!d->runs_on(platform)) {
    return Status::unsupported("attention backend " + d->name + " does not run on " +
                               platform_name(platform) + " (device " + ctx.device.to_string() +
                               ")");
  }
  const AttentionKind kind = ctx.is_mla ? AttentionKind::kMLA : AttentionKind::kMHA;
  const FeatureRow* row = d->row(kind);
  if (row == nullptr) {
    return Status::unsupported("attention backend " + d->name + " does not support " +
                               attention_kind_name(kind) + " attention");
  }
  if (!row->pages.allows(ctx.page_size)) {
    return Status::unsupported("page_size " + std::to_string(ctx.page_size) +
                               " is not supported by " + d->name + " (needs " +
                               row->pages.to_string() + ")");
  }
  if (!row->head_dims.empty() && std::find(row->head_dims.begin(), row->head_dims.end(),
                                           ctx.qk_head_dim) == row->head_dims.end()) {
    return Status::unsupported("qk_head_dim " + std::to_string(ctx.qk_head_dim) +
                               " is not compiled into " + d->name +
                               " (compiled: " + join(row->head_dims, ",") + ")");
  }
  if (ctx.kv_pool != nullptr) {
    const DType kv = ctx.kv_pool->dtype();
    if (dtype_is_fp8(kv) && !row->fp8_kv) {
      return Status::unsupported("fp8 KV cache (" + std::string(dtype_name(kv)) +
                                 ") is not supported by " + d->name);
    }
    if (kv == DType::kFP8E5M2 && row->fp8_e4m3_only) {
      return Status::unsupported("fp8_e5m2 KV cache is not supported by " + d->name +
                                 " (fp8_e4m3 only)");
    }
    if (kv == DType::kFP4E2M1 && !row->fp4_kv) {
      return Status::unsupported("fp4_e2m1 KV cache is not supported by " + d->name);
    }
    if (ctx.kv_pool->page_size() != ctx.page_size) {
      return Status::invalid_argument("BackendContext: page_size " + std::to_string(ctx.page_size) +
                                      " differs from the KV pool's page_size " +
                                      std::to_string(ctx.kv_pool->page_size()));
    }
  }
  ATTNKIT_RETURN_IF_ERROR(
      check_pools_on_device("BackendContext", ctx.kv_pool, ctx.req_to_token_pool, ctx.device));
  // Construction queries and allocates on the context's device (kernel attributes, workspaces).
  const DeviceScope scope(ctx.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(ctx.stream, ctx.device, "BackendContext.stream"));
  return d->create(ctx);
}

Status BackendRegistry::add_linear(LinearAttnDescriptor descriptor) {
  if (descriptor.name.empty()) {
    return Status::invalid_argument("BackendRegistry::add_linear: descriptor.name is empty");
  }
  if (find_linear(descriptor.name) != nullptr) {
    return Status::invalid_argument("BackendRegistry::add_linear: linear-attention backend \"" +
                                    descriptor.name + "\" is already registered");
  }
  if (!descriptor.built && descriptor.not_built_reason.empty()) {
    return Status::invalid_argument("BackendRegistry::add_linear: backend \"" + descriptor.name +
                                    "\" is not built and gives no not_built_reason");
  }
  linear_.push_back(std::move(descriptor));
  return Status::ok();
}

const LinearAttnDescriptor* BackendRegistry::find_linear(std::string_view name) const {
  for (const LinearAttnDescriptor& d : linear_) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::vector<std::string> BackendRegistry::linear_names() const {
  std::vector<std::string> out;
  out.reserve(linear_.size());
  for (const LinearAttnDescriptor& d : linear_) out.push_back(d.name);
  return out;
}

Result<const LinearAttnDescriptor*> BackendRegistry::get_linear(std::string_view name) const {
  if (const LinearAttnDescriptor* d = find_linear(name)) return d;
  return Status::not_found(
      "linear-attention backend \"" + std::string(name) +
      "\" is not known; valid linear-attention backends: " + join(linear_names(), ", "));
}

const BackendRegistry& builtin_registry() {
  // Built on first use (thread-safe function-local static); registration is explicit.
  static const BackendRegistry registry = [] {
    BackendRegistry r;
    const Status status = register_builtin_backends(r);
    // The built-in table is constant data; a failure here is a bug in builtin.cpp.
    assert(status.is_ok() && "register_builtin_backends failed");
    (void)status;
    return r;
  }();
  return registry;
}

}  // namespace attnkit
