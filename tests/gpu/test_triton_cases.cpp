// The shared case table (src/harness/case_runner.h) run by the triton backend on the CUDA device
// against the fp64 reference: every case twice, with save_kv (the backend writes the new k/v) and
// reading everything from the pool (the runner writes it). Cases the descriptor rules out are
// skipped with its reason.
#include "support/backend_case_test.h"

ATTNKIT_BACKEND_CASE_TESTS(TritonCases, "triton", ::attnkit::Device::cuda(0));
