// Uses the installed library: lists the registered backends and round-trips a dtype conversion.
#include <attnkit/dtype.h>
#include <attnkit/registry.h>

#include <cstdio>

int main() {
  const auto& registry = attnkit::builtin_registry();
  int built = 0;
  for (const auto& d : registry.all()) built += d.built ? 1 : 0;
  const float x = attnkit::bf16_bits_to_float(attnkit::float_to_bf16_bits(1.5f));
  std::printf("attnkit consumer: %zu backends registered, %d built, bf16(1.5) = %g\n",
              registry.all().size(), built, x);
  return (registry.find("torch_native") != nullptr && x == 1.5f) ? 0 : 1;
}
