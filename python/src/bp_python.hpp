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
  count_
};
PyObject* error_class(ErrorKind kind);

// A device argument: None (the default device), a Device, a string ("cuda:1"), or any object
// whose str() is a device string (torch.device). DeviceError for anything else.
Device& as_device(nb::handle h);
// A dtype argument: None (`fallback`), a backplane dtype, a name ("float32", "f32", "int64"),
// a NumPy dtype or scalar type, a torch dtype. DTypeError naming the accepted forms otherwise.
DType as_dtype(nb::handle h, DType fallback = DType::f32);
// A shape from Python arguments: (2, 3), ((2, 3),) or ([2, 3],). ShapeError otherwise.
Shape shape_from_args(const nb::args& args, const char* what);
Shape shape_from_sequence(nb::handle seq, const char* what);

void register_errors(nb::module_& m);
void register_runtime(nb::module_& m);
void register_tensor(nb::module_& m);
void register_indexing(nb::class_<Tensor>& cls);
void register_dlpack(nb::class_<Tensor>& cls, nb::module_& m);
void register_train(nb::module_& m);
void register_graph(nb::module_& m);
void register_nn_functional(nb::module_& m);
void register_profiler(nb::module_& m);
void register_dist(nb::module_& m);

}  // namespace bp::python
