// Shared helpers of the attnkit Python extension: Status -> exception, DLPack import/export,
// dtype / device / stream arguments and host integer arrays.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
// Every translation unit sees the same type casters.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#if NB_VERSION_MAJOR < 2
#error "attnkit's Python bindings need nanobind >= 2.0 (nb::array_api, nanobind.nb_ndarray)"
#endif

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::python {

namespace nb = nanobind;

// Any DLPack-capable object (torch tensors on CPU or CUDA, NumPy arrays, ...), imported zero-copy.
// Array: one attnkit only reads (q, k, v, index arrays, masks, sinks), so read-only NumPy arrays
// (np.broadcast_to, a non-writable buffer) are accepted. OutArray: one attnkit writes (out, lse,
// the KV buffers of a wrapped pool), so it must be writable.
using Array = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;
// What attnkit hands out: a nanobind.nb_ndarray implementing __dlpack__ / __dlpack_device__ and
// the buffer protocol (np.from_dlpack, torch.from_dlpack, np.asarray).
using ExportArray = nb::ndarray<nb::array_api>;

// ---- errors (errors.cpp) ----
// Creates attnkit.Error and its per-StatusCode subclasses in module `m`.
void register_errors(nb::module_& m);
// Raises the Python exception of status.code() carrying status.message(); no-op when ok.
void check(const Status& status);
template <typename T>
T check(Result<T> result) {
  check(result.status());
  return std::move(result).value();
}
// Raises attnkit.InvalidArgumentError with `message`.
[[noreturn]] void raise_invalid(const std::string& message);

// ---- conversions (convert.cpp) ----
// A borrowed view of `array` (same memory). `as` reinterprets raw storage: an 8-bit integer array
// as fp8_e4m3 / fp8_e5m2 / fp4_e2m1 (packed: the last dimension doubles) or a 16-bit integer
// array as bf16 / f16, for frameworks without those dtypes (NumPy). Errors name `name`.
TensorView to_view(const Array& array, const char* name, std::optional<DType> as = std::nullopt);
TensorView to_view(const OutArray& array, const char* name, std::optional<DType> as = std::nullopt);
// `obj` as an array attnkit writes into (`writes` says what, for the error): a read-only array
// or an object that is not an array is an InvalidArgumentError naming `name`.
OutArray writable_array(nb::handle obj, const char* name, const char* writes);
// An exported DLPack array over `view`; `owner` is kept alive while the array lives. fp8 and fp4
// views export as uint8 storage (fp4: [..., D / 2] packed bytes), every other dtype as itself.
ExportArray to_array(const TensorView& view, nb::handle owner);

// "bf16", "float16", "torch.bfloat16", np.dtype(...), "float8_e4m3fn", ...
DType parse_dtype_arg(nb::handle obj, const char* name);
// "cpu", "cuda", "cuda:1", torch.device(...)
Device parse_device_arg(nb::handle obj);
// None / 0 -> default stream; an int (cudaStream_t as an integer, e.g.
// torch.cuda.current_stream().cuda_stream); or an object with a .cuda_stream attribute.
StreamHandle parse_stream_arg(nb::handle obj);

// Integers of a list / tuple / range, or of a 1-D int32 / int64 array on any device (a CUDA array
// is copied to the host synchronously).
std::vector<int64_t> host_ints(nb::handle obj, const char* name);
// The same for an imported 1-D int32 / int64 view.
std::vector<int64_t> view_ints(const TensorView& view, const char* name);
std::vector<int32_t> narrow_ints32(const std::vector<int64_t>& values, const char* name);
std::vector<int32_t> host_ints32(nb::handle obj, const char* name);

// A new NumPy-compatible (DLPack) array owning a copy of `values` as a 1-D array.
nb::object numpy_array(std::vector<int64_t> values);
nb::object numpy_array(std::vector<int32_t> values);

}  // namespace attnkit::python
