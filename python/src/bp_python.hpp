// Shared pieces of the `backplane._core` extension: argument conversion (devices, dtypes,
// shapes), the exception classes, and the registration functions of each binding file.
//
// Note [Lean per-op path]
//   Tensor operators are bound directly on the C++ class, so `a + b` costs one nanobind
//   dispatch (first overload, no implicit conversion), the core op and one new Python object;
//   no Python-level wrapper runs. Everything that needs Python (repr, tolist, flexible
//   argument parsing) lives in the pure-Python layer, off the per-op path.
#pragma once

#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/serialize.hpp>
#include <backplane/train.hpp>

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace bp::python {

namespace nb = nanobind;

// The Python exception classes (created in register_errors, owned by the module).
enum class ErrorKind {
  error,
  device,
  mismatch,
  oom,
  plugin,
  unsupported,
  shape,
  dtype,
  io,
  sync,
  capture,
  index,
  async_error,
  device_lost,
  count_
};
PyObject* error_class(ErrorKind kind);
// Sets the Python error for the exception being handled (call it inside a catch block): a
// bp::Error as its backplane class, a nanobind exception as its builtin, anything else as
// RuntimeError (MemoryError for std::bad_alloc). For C entry points that must not throw.
void set_python_error() noexcept;

// A device argument: None (the default device), a Device, a string ("cuda:1"), or any object
// whose str() is a device string (torch.device). DeviceError for anything else.
Device& as_device(nb::handle h);
// A dtype argument: None (`fallback`), a backplane dtype, a name ("float32", "f32", "int64"),
// a NumPy dtype or scalar type, a torch dtype. DTypeError naming the accepted forms otherwise.
DType as_dtype(nb::handle h, DType fallback = DType::f32);
// The UTF-8 bytes of the Python str `s`. A str holding a lone surrogate (such as '\udcff', which
// os.fsdecode makes of undecodable bytes) has no UTF-8 form: ValueError naming `what`, the
// position of the surrogate and the accepted form (`accepted`), never nanobind's bare cast error.
std::string utf8_text(nb::handle s, const char* what, const char* accepted);
// An optional flag such as DLPack's `copy`: None (nullopt), True or False. TypeError naming `what`
// and the value's type for anything else (a str such as 'maybe' is not a flag).
std::optional<bool> optional_flag(nb::handle h, const char* what);
// A pair of integers such as (device type, device id) or (major, minor): a tuple (or list) of two
// ints that fit int64_t. TypeError naming `what`, the value and `expected` otherwise.
std::pair<int64_t, int64_t> int_pair(nb::handle h, const char* what, const char* expected);
// A shape from Python arguments: (2, 3), ((2, 3),) or ([2, 3],). ShapeError otherwise.
Shape shape_from_args(const nb::args& args, const char* what);
Shape shape_from_sequence(nb::handle seq, const char* what);

void register_errors(nb::module_& m);
void register_runtime(nb::module_& m);
void register_tensor(nb::module_& m);
void register_indexing(nb::class_<Tensor>& cls);
void register_dlpack(nb::class_<Tensor>& cls, nb::module_& m);
void register_train(nb::module_& m);
void register_amp(nb::module_& m);
void register_graph(nb::module_& m);
void register_nn_functional(nb::module_& m);
void register_profiler(nb::module_& m);
void register_dist(nb::module_& m);

}  // namespace bp::python
