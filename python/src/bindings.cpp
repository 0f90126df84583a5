// The attnkit._attnkit extension module: nanobind bindings over the attnkit library. Arrays cross
// through DLPack (nb::ndarray) zero-copy; library errors become attnkit.Error subclasses carrying
// the library's message.
#include "attnkit/dtype.h"
#include "wrappers.h"

namespace attnkit::python {

NB_MODULE(_attnkit, m) {
  m.doc() = "attnkit: the attention-backend layer of an LLM inference server (C++/CUDA).";
  m.attr("__version__") = ATTNKIT_VERSION;
#ifdef ATTNKIT_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  register_errors(m);
  bind_kv(m);
  bind_backend(m);
  bind_selection(m);
}

}  // namespace attnkit::python
