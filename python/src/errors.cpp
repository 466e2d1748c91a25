// The Python exception classes of backplane and the translation of bp::Error subclasses.
//
// Each class subclasses backplane.Error (itself a RuntimeError, as PyTorch raises for device
// and shape problems) and the builtin that says what kind of mistake it is, so both
// `except backplane.ShapeError` and `except ValueError` catch a shape mismatch:
//   Error(RuntimeError)
//   DeviceError(Error)             DeviceMismatch(Error)        SyncError(Error)
//   CaptureError(Error)
//   PluginError(Error)             OutOfMemory(Error, MemoryError)
//     AsyncError(PluginError)        DeviceLost(AsyncError)
//   ShapeError(Error, ValueError)  DTypeError(Error, TypeError)  IndexError(Error, IndexError)
//   UnsupportedError(Error, NotImplementedError)                IOError(Error, OSError)
// The message is the C++ message unchanged; PluginError carries `native_name` (the vendor's
// error name, "" when there is none); AsyncError (work that failed on the device after its call
// returned, Note [Asynchronous errors]) also `op`, `device`, `op_id` and `severity`
// ("op_failed", "stream_poisoned" or "device_lost").
#include "bp_python.hpp"

#include <array>
#include <exception>
#include <initializer_list>
#include <new>
#include <utility>

namespace bp::python {

namespace {

std::array<PyObject*, static_cast<size_t>(ErrorKind::count_)> g_classes{};

struct ClassSpec {
  ErrorKind kind;
  const char* name;
  PyObject* builtin;  // besides backplane.Error; nullptr for none
  const char* doc;
};

void set_error(ErrorKind kind, const char* message) {
  PyErr_SetString(error_class(kind), message);
}

// Raises an instance of `cls` with `message` and the given attributes (new references, taken;
// a null one is skipped).
void raise_with(PyObject* cls, const char* message,
                std::initializer_list<std::pair<const char*, PyObject*>> attrs) {
  PyObject* inst = PyObject_CallFunction(cls, "s", message);
  for (const auto& [name, value] : attrs) {
    if (inst && value) PyObject_SetAttrString(inst, name, value);
    Py_XDECREF(value);
  }
  if (!inst) return;  // the call set an error already
  PyErr_SetObject(cls, inst);
  Py_DECREF(inst);
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const DeviceMismatch& e) {
    set_error(ErrorKind::mismatch, e.what());
  } catch (const DeviceError& e) {
    set_error(ErrorKind::device, e.what());
  } catch (const OutOfMemory& e) {
    set_error(ErrorKind::oom, e.what());
  } catch (const AsyncError& e) {
    static constexpr const char* kSeverity[] = {"op_failed", "stream_poisoned", "device_lost"};
    PyObject* cls = error_class(dynamic_cast<const DeviceLost*>(&e) ? ErrorKind::device_lost
                                                                    : ErrorKind::async_error);
    raise_with(cls, e.what(),
               {{"native_name", PyUnicode_FromString(e.native_name().c_str())},
                {"op", PyUnicode_FromString(e.op().c_str())},
                {"device", PyUnicode_FromString(e.device().c_str())},
                {"op_id", PyLong_FromUnsignedLongLong(e.op_id())},
                {"severity", PyUnicode_FromString(kSeverity[static_cast<int>(e.severity())])}});
  } catch (const PluginError& e) {
    raise_with(error_class(ErrorKind::plugin), e.what(),
               {{"native_name", PyUnicode_FromString(e.native_name().c_str())}});
  } catch (const UnsupportedError& e) {
    set_error(ErrorKind::unsupported, e.what());
  } catch (const ShapeError& e) {
    set_error(ErrorKind::shape, e.what());
  } catch (const IndexError& e) {
    set_error(ErrorKind::index, e.what());
  } catch (const DTypeError& e) {
    set_error(ErrorKind::dtype, e.what());
  } catch (const IOError& e) {
    set_error(ErrorKind::io, e.what());
  } catch (const SyncError& e) {
    set_error(ErrorKind::sync, e.what());
  } catch (const CaptureError& e) {
    set_error(ErrorKind::capture, e.what());
  } catch (const Error& e) {
    set_error(ErrorKind::error, e.what());
  }
}

}  // namespace

void set_python_error() noexcept {
  try {
    throw;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const nb::builtin_exception& e) {
    PyObject* cls = PyExc_RuntimeError;
    switch (e.type()) {
      case nb::exception_type::stop_iteration:
        cls = PyExc_StopIteration;
        break;
      case nb::exception_type::index_error:
        cls = PyExc_IndexError;
        break;
      case nb::exception_type::key_error:
        cls = PyExc_KeyError;
        break;
      case nb::exception_type::value_error:
        cls = PyExc_ValueError;
        break;
      case nb::exception_type::type_error:
        cls = PyExc_TypeError;
        break;
      case nb::exception_type::buffer_error:
        cls = PyExc_BufferError;
        break;
      case nb::exception_type::import_error:
        cls = PyExc_ImportError;
        break;
      case nb::exception_type::attribute_error:
        cls = PyExc_AttributeError;
        break;
      default:
        break;
    }
    PyErr_SetString(cls, e.what());
  } catch (const Error&) {
    translate(std::current_exception(), nullptr);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

PyObject* error_class(ErrorKind kind) {
  return g_classes[static_cast<size_t>(kind)];
}

void register_errors(nb::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc(
      "backplane.Error", "Base of every error Backplane raises (a RuntimeError).",
      PyExc_RuntimeError, nullptr);
  if (!base) throw nb::python_error();
  g_classes[static_cast<size_t>(ErrorKind::error)] = base;
  m.attr("Error") = nb::handle(base);

  const ClassSpec specs[] = {
      {ErrorKind::device, "DeviceError", nullptr,
       "A device string that does not parse, a device that does not exist, or a backend that "
       "is not available (the message quotes the reason)."},
      {ErrorKind::mismatch, "DeviceMismatch", nullptr,
       "Operands of one op live on different devices; never resolved by a silent copy."},
      {ErrorKind::oom, "OutOfMemory", PyExc_MemoryError,
       "A device allocation failed after the backend trimmed its caches and retried."},
      {ErrorKind::plugin, "PluginError", nullptr,
       "A plugin failed to load or returned an error; `native_name` is the vendor's error "
       "name."},
      {ErrorKind::unsupported, "UnsupportedError", PyExc_NotImplementedError,
       "An op or feature the device's backend does not have; the message names who does."},
      {ErrorKind::shape, "ShapeError", PyExc_ValueError,
       "Shapes that do not fit the op (broadcast, matmul, reshape, a model's parameter)."},
      {ErrorKind::index, "IndexError", PyExc_IndexError,
       "An index outside the range it addresses (an embedding index past the table)."},
      {ErrorKind::dtype, "DTypeError", PyExc_TypeError,
       "Dtypes that do not fit the op, or an unknown dtype name."},
      {ErrorKind::io, "IOError", PyExc_OSError,
       "A file that cannot be read or written, or whose contents are malformed."},
      {ErrorKind::sync, "SyncError", nullptr,
       "An implicit device-to-host synchronisation while sync-debug mode is 'error'."},
      {ErrorKind::capture, "CaptureError", nullptr,
       "Work that cannot be captured in a graph (a host read, a synchronisation, ...) queued "
       "while a capture is open; it did nothing and the capture stays open."},
  };
  for (const ClassSpec& s : specs) {
    PyObject* bases = s.builtin ? PyTuple_Pack(2, base, s.builtin) : PyTuple_Pack(1, base);
    if (!bases) throw nb::python_error();
    std::string qual = std::string("backplane.") + s.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qual.c_str(), s.doc, bases, nullptr);
    Py_DECREF(bases);
    if (!cls) throw nb::python_error();
    g_classes[static_cast<size_t>(s.kind)] = cls;
    m.attr(s.name) = nb::handle(cls);
  }
  nb::handle(error_class(ErrorKind::plugin)).attr("native_name") = "";
  // AsyncError(PluginError) and DeviceLost(AsyncError).
  const ClassSpec async_specs[] = {
      {ErrorKind::async_error, "AsyncError", error_class(ErrorKind::plugin),
       "Work that failed on the device after the call that queued it returned (a kernel fault, "
       "an index out of range found on the device), raised by the next synchronisation or host "
       "read: `op`, `device`, `op_id` and `severity` name what failed."},
      {ErrorKind::device_lost, "DeviceLost", nullptr,
       "The device can run nothing more in this process (a sticky CUDA error); every later call "
       "on it raises this at once."},
  };
  for (const ClassSpec& s : async_specs) {
    PyObject* parent = s.builtin ? s.builtin : error_class(ErrorKind::async_error);
    std::string qual = std::string("backplane.") + s.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qual.c_str(), s.doc, parent, nullptr);
    if (!cls) throw nb::python_error();
    g_classes[static_cast<size_t>(s.kind)] = cls;
    m.attr(s.name) = nb::handle(cls);
  }
  for (const char* attr : {"op", "device", "severity"})
    nb::handle(error_class(ErrorKind::async_error)).attr(attr) = "";
  nb::handle(error_class(ErrorKind::async_error)).attr("op_id") = 0;
  nb::register_exception_translator(translate);
}

}  // namespace bp::python
