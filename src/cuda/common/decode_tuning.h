// Experiment knob of the paged decode split planners (triton and flashinfer): the grid's target
// blocks per SM. Default: the ring decode's residency (2 blocks of 110 KB shared memory per SM90
// multiprocessor), i.e. one wave. ATTNKIT_DECODE_BLOCKS_PER_SM=N (1..8) overrides it when the
// backend is created, so a device run can compare waves without a rebuild
// (docs/perf/decode_notes.md). Not part of the API; the default is the documented heuristic.
#pragma once

#include <cstdlib>

namespace attnkit::cuda {

inline int decode_blocks_per_sm(int default_value) {
  const char* env = std::getenv("ATTNKIT_DECODE_BLOCKS_PER_SM");
  if (env == nullptr || *env == '\0') return default_value;
  const int v = std::atoi(env);
  return v >= 1 && v <= 8 ? v : default_value;
}

}  // namespace attnkit::cuda
