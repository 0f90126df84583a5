#include "support/backend_case_test.h"

#include "attnkit/registry.h"

namespace attnkit::test_support {

std::string case_param_name(const ::testing::TestParamInfo<harness::CaseSpec>& info) {
  return info.param.name;
}

DeviceInfo device_info_for(Device device) {
  if (device.is_cuda()) {
    Result<DeviceInfo> info = detect_cuda(device.ordinal);
    if (info.is_ok()) return info.value();
  }
  return detect_cpu();
}

void run_shared_case(std::string_view backend, Device device, const harness::CaseSpec& spec,
                     bool save_kv) {
  const BackendDescriptor* descriptor = builtin_registry().find(backend);
  ASSERT_NE(descriptor, nullptr) << "backend " << backend << " is not registered";
  const std::string reason = harness::skip_reason(*descriptor, spec, device_info_for(device));
  if (!reason.empty()) GTEST_SKIP() << reason;

  Result<harness::PreparedCase> prepared = harness::prepare_case(spec, device);
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  Result<std::unique_ptr<AttentionBackend>> created =
      harness::create_backend_for_case(*descriptor, *prepared);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  const Status run = harness::run_backend(**created, *prepared, save_kv);
  ASSERT_TRUE(run.is_ok()) << spec.describe() << "\n" << run.to_string();
  Result<harness::Comparison> cmp = harness::compare_with_reference(*prepared);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_EQ(cmp->nan_inf_count, 0) << "unwritten (NaN-poisoned) or non-finite outputs\n"
                                   << spec.describe() << "\n"
                                   << cmp->summary();
  EXPECT_TRUE(cmp->passed()) << spec.describe() << "\n" << cmp->summary();
}

}  // namespace attnkit::test_support
