// attnkit.Error and its subclasses: one per StatusCode, each also deriving from the built-in
// exception a Python caller would expect (ValueError for bad arguments, LookupError for unknown
// names, MemoryError for exhausted pools).
#include <array>
#include <cstddef>
#include <string>

#include "common.h"

namespace attnkit::python {
namespace {

struct ErrorType {
  StatusCode code;
  const char* name;        // Python class name
  PyObject* builtin_base;  // second base besides attnkit.Error, or nullptr
  const char* doc;
  PyObject* type = nullptr;
};

constexpr size_t kNumStatusCodes = static_cast<size_t>(StatusCode::kInternal) + 1;

// Indexed by StatusCode (kOk has no exception).
std::array<ErrorType, kNumStatusCodes>& error_types() {
  static std::array<ErrorType, kNumStatusCodes> types = {{
      {StatusCode::kOk, "", nullptr, ""},
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "A parameter is malformed or out of range (status invalid_argument)."},
      {StatusCode::kUnsupported, "UnsupportedError", nullptr,
       "Valid input that this backend, kernel or build does not implement (status unsupported)."},
      {StatusCode::kNotBuilt, "NotBuiltError", nullptr,
       "The backend exists but is not compiled into this build or platform (status not_built)."},
      {StatusCode::kOutOfMemory, "OutOfMemoryError", PyExc_MemoryError,
       "A pool, the page allocator or device memory is exhausted (status out_of_memory)."},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError,
       "A named backend, file or key does not exist (status not_found)."},
      {StatusCode::kCudaError, "CudaError", nullptr,
       "A CUDA runtime call or kernel launch failed (status cuda_error)."},
      {StatusCode::kInternal, "InternalError", nullptr,
       "An internal invariant failed: a bug in attnkit (status internal)."},
  }};
  return types;
}

PyObject* g_error_base = nullptr;

void set_code_attr(PyObject* type, StatusCode code) {
  nb::handle(type).attr("code") = nb::str(status_code_name(code));
}

}  // namespace

void register_errors(nb::module_& m) {
  g_error_base = PyErr_NewExceptionWithDoc(
      "attnkit.Error",
      "Base class of every attnkit error. str(e) is the library's message; e.code is the status "
      "code name (\"invalid_argument\", \"unsupported\", ...).",
      PyExc_RuntimeError, nullptr);
  if (g_error_base == nullptr) throw nb::python_error();
  nb::handle(g_error_base).attr("code") = nb::none();
  m.attr("Error") = nb::handle(g_error_base);
  for (ErrorType& t : error_types()) {
    if (t.code == StatusCode::kOk) continue;
    nb::object bases = t.builtin_base != nullptr
                           ? nb::make_tuple(nb::handle(g_error_base), nb::handle(t.builtin_base))
                           : nb::make_tuple(nb::handle(g_error_base));
    const std::string qualified = std::string("attnkit.") + t.name;
    t.type = PyErr_NewExceptionWithDoc(qualified.c_str(), t.doc, bases.ptr(), nullptr);
    if (t.type == nullptr) throw nb::python_error();
    set_code_attr(t.type, t.code);
    m.attr(t.name) = nb::handle(t.type);
  }
}

void check(const Status& status) {
  if (status.is_ok()) return;
  const auto index = static_cast<size_t>(status.code());
  PyObject* type = index < error_types().size() && error_types()[index].type != nullptr
                       ? error_types()[index].type
                       : g_error_base;
  PyErr_SetString(type, status.message().c_str());
  throw nb::python_error();
}

void raise_invalid(const std::string& message) {
  PyErr_SetString(error_types()[static_cast<size_t>(StatusCode::kInvalidArgument)].type,
                  message.c_str());
  throw nb::python_error();
}

}  // namespace attnkit::python
