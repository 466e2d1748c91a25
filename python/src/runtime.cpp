// Devices, dtypes and the runtime (plugin report, default device, seeds, modes), and the
// argument conversions every binding file uses.
#include "bp_python.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <string>

namespace bp::python {

std::string utf8_text(nb::handle s, const char* what, const char* accepted) {
  Py_ssize_t n = 0;
  if (const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n))
    return std::string(p, static_cast<size_t>(n));
  PyErr_Clear();
  const Py_ssize_t len = PyUnicode_GetLength(s.ptr());
  Py_ssize_t at = 0;
  Py_UCS4 bad = 0;
  for (Py_ssize_t i = 0; i < len; ++i) {
    const Py_UCS4 c = PyUnicode_ReadChar(s.ptr(), i);
    if (c >= 0xD800 && c <= 0xDFFF) {
      at = i;
      bad = c;
      break;
    }
  }
  PyErr_Clear();
  // The text as ASCII with escapes (the surrogate as \udcff), at most 64 characters of it.
  std::string shown;
  if (PyObject* b = PyUnicode_AsEncodedString(s.ptr(), "ascii", "backslashreplace")) {
    shown.assign(PyBytes_AS_STRING(b), static_cast<size_t>(PyBytes_GET_SIZE(b)));
    Py_DECREF(b);
  }
  PyErr_Clear();
  if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(bad));
  throw nb::value_error((std::string(what) + " '" + shown +
                         "' is not valid Unicode: a lone surrogate (" + code + ") at position " +
                         std::to_string(at) + " has no UTF-8 form; " + accepted)
                            .c_str());
}

std::optional<bool> optional_flag(nb::handle h, const char* what) {
  if (h.is_none()) return std::nullopt;
  if (PyBool_Check(h.ptr())) return h.ptr() == Py_True;
  throw nb::type_error((std::string(what) + " must be True, False or None, got " +
                        nb::repr(h).c_str() + " (" + nb::type_name(h.type()).c_str() + ")")
                           .c_str());
}

std::pair<int64_t, int64_t> int_pair(nb::handle h, const char* what, const char* expected) {
  PyObject* o = h.ptr();
  const bool tuple = PyTuple_Check(o), list = PyList_Check(o);
  if ((tuple || list) && PySequence_Fast_GET_SIZE(o) == 2) {
    PyObject* first = PySequence_Fast_GET_ITEM(o, 0);
    PyObject* second = PySequence_Fast_GET_ITEM(o, 1);
    if (PyLong_Check(first) && PyLong_Check(second)) {
      int overflow = 0;
      const long long a = PyLong_AsLongLongAndOverflow(first, &overflow);
      if (!overflow) {
        const long long b = PyLong_AsLongLongAndOverflow(second, &overflow);
        if (!overflow) return {a, b};
      }
    }
  }
  PyErr_Clear();
  std::string shown = nb::repr(h).c_str();
  if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
  throw nb::type_error((std::string(what) + " " + shown + " (" + nb::type_name(h.type()).c_str() +
                        "); expected " + expected)
                           .c_str());
}

Device& as_device(nb::handle h) {
  if (h.is_none()) return default_device();
  Device* d = nullptr;
  if (nb::try_cast<Device*>(h, d, false) && d) return *d;
  if (PyUnicode_Check(h.ptr()))
    return device(
        utf8_text(h, "device string", "a device string is ASCII, such as 'cpu:0' or 'cuda:1'"));
  // torch.device, cupy devices with a str() of "cuda:1", ...
  if (nb::hasattr(h, "type") && nb::hasattr(h, "index")) return device(nb::str(h).c_str());
  throw DeviceError(
      "expected a device (backplane.Device, a string such as 'cuda:0', or None "
      "for the default device), got an object of type " +
      std::string(nb::type_name(h.type()).c_str()));
}

DType as_dtype(nb::handle h, DType fallback) {
  if (h.is_none()) return fallback;
  DType t;
  if (nb::try_cast<DType>(h, t, false)) return t;
  if (PyUnicode_Check(h.ptr()))
    return dtype_from_name(utf8_text(h, "dtype name", "a dtype name is ASCII, such as 'float32'"));
  std::string name;
  // NumPy dtypes and scalar types (numpy.float32, numpy.dtype('int64')), Python's float/int/
  // bool types through NumPy's names for them, torch dtypes ("torch.float32").
  PyObject* np = PyImport_ImportModule("numpy");
  if (np) {
    PyObject* dt = PyObject_CallMethod(np, "dtype", "O", h.ptr());
    Py_DECREF(np);
    if (dt) {
      PyObject* nm = PyObject_GetAttrString(dt, "name");
      Py_DECREF(dt);
      if (nm) {
        if (PyUnicode_Check(nm)) {
          Py_ssize_t n = 0;
          if (const char* p = PyUnicode_AsUTF8AndSize(nm, &n))
            name.assign(p, static_cast<size_t>(n));
        }
        Py_DECREF(nm);
      }
    }
  }
  PyErr_Clear();
  if (name.empty()) {
    name = nb::str(h).c_str();
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  }
  try {
    return dtype_from_name(name);
  } catch (const DTypeError&) {
    throw DTypeError("unsupported dtype " + std::string(nb::repr(h).c_str()) +
                     "; expected a backplane dtype (backplane.float32, ...), a name such as "
                     "'float32', or a NumPy/PyTorch dtype of f32, f64, f16, bf16, i32, i64, u8, "
                     "bool");
  }
}

Shape shape_from_sequence(nb::handle seq, const char* what) {
  Shape s;
  for (nb::handle item : seq) {
    if (!PyIndex_Check(item.ptr()))
      throw ShapeError(std::string(what) + ": sizes must be integers, got " +
                       nb::repr(item).c_str());
    s.push_back(PyLong_AsLongLong(item.ptr()));
    if (PyErr_Occurred()) throw nb::python_error();
  }
  return s;
}

Shape shape_from_args(const nb::args& args, const char* what) {
  if (args.size() == 1 && !PyIndex_Check(args[0].ptr())) {
    if (!PySequence_Check(args[0].ptr()))
      throw ShapeError(std::string(what) + ": expected sizes as integers or one sequence, got " +
                       nb::repr(args[0]).c_str());
    return shape_from_sequence(args[0], what);
  }
  return shape_from_sequence(args, what);
}

namespace {

nb::dict properties_dict(const Device& d) {
  const DeviceProperties& p = d.properties();
  nb::dict out;
  out["name"] = p.name;
  out["vendor"] = p.vendor;
  out["uuid"] = p.uuid;
  out["pci_bus_id"] = p.pci_bus_id;
  out["total_memory"] = p.total_memory;
  out["compute_capability"] = nb::make_tuple(p.compute_major, p.compute_minor);
  out["cores"] = p.cores;
  out["supports_f64"] = p.supports_f64;
  out["unified_memory"] = p.unified_memory;
  return out;
}

nb::dict stats_dict(const MemoryStats& s) {
  nb::dict out;
  out["allocated"] = s.allocated;
  out["reserved"] = s.reserved;
  out["peak_allocated"] = s.peak_allocated;
  out["num_allocs"] = s.num_allocs;
  out["total_allocs"] = s.total_allocs;
  return out;
}

const char* status_name(PluginReport::Status s) {
  switch (s) {
    case PluginReport::Status::loaded:
      return "loaded";
    case PluginReport::Status::skipped:
      return "skipped";
    case PluginReport::Status::failed:
      break;
  }
  return "failed";
}

}  // namespace

void register_runtime(nb::module_& m) {
  nb::enum_<DType>(m, "dtype", "Element types of tensors.")
      .value("float32", DType::f32)
      .value("float64", DType::f64)
      .value("float16", DType::f16)
      .value("bfloat16", DType::bf16)
      .value("int32", DType::i32)
      .value("int64", DType::i64)
      .value("uint8", DType::u8)
      .value("bool", DType::boolean);
  m.def("_dtype_itemsize", [](DType t) { return dtype_size(t); });
  m.def("_as_dtype", [](nb::handle h) { return as_dtype(h); });

  nb::class_<Device>(m, "Device",
                     "A compute device, owned by the runtime for the whole process (get one with "
                     "backplane.device('cuda:0')). Devices compare by identity.")
      .def_prop_ro("type", [](const Device& d) { return d.type(); })
      .def_prop_ro("index", [](const Device& d) { return d.index(); })
      .def_prop_ro(
          "name", [](const Device& d) { return d.properties().name; },
          "The device's name, e.g. 'NVIDIA H100 80GB HBM3'.")
      .def_prop_ro("backend", [](const Device& d) { return d.backend_name(); })
      .def("properties", &properties_dict)
      .def("free_memory", &Device::free_memory)
      .def("memory_stats", [](Device& d) { return stats_dict(d.memory_stats()); })
      .def("reset_peak_memory_stats", [](Device& d) { d.allocator().reset_peak(); })
      .def("empty_cache", [](Device& d) { d.allocator().empty_cache(); })
      .def(
          "synchronize",
          [](Device& d) {
            nb::gil_scoped_release nogil;
            d.synchronize();
          },
          "Waits for all work queued on the device.")
      .def("__str__", [](const Device& d) { return d.str(); })
      .def("__repr__",
           [](const Device& d) {
             return "device(type='" + d.type() + "', index=" + std::to_string(d.index()) + ")";
           })
      .def(
          "__eq__",
          [](const Device& a, nb::handle b) {
            Device* d = nullptr;
            return nb::try_cast<Device*>(b, d, false) && d == &a;
          },
          nb::arg("other").none())
      .def("__hash__", [](const Device& d) { return reinterpret_cast<uintptr_t>(&d); });

  auto ref = nb::rv_policy::reference;
  m.def(
      "device", [](nb::handle spec) -> Device& { return as_device(spec); }, nb::arg("spec").none(),
      ref,
      "The device named by `spec` ('cuda:1', 'cuda' = 'cuda:0', 'cpu'). DeviceError listing the "
      "devices that exist, or quoting why a backend has none.");
  m.def(
      "num_devices", [](const std::string& type) { return num_devices(type); },
      nb::arg("type") = "cuda");
  m.def(
      "try_device", [](const std::string& spec) -> Device& { return try_device(spec); },
      nb::arg("spec"), ref);
  m.def(
      "all_devices", [](const std::string& type) { return all_devices(type); }, nb::arg("type"),
      ref);
  m.def(
      "devices", []() { return devices(); }, ref);
  m.def("_is_available", [](const std::string& type) {
    Availability a = is_available(type);
    return nb::make_tuple(a.available, a.reason);
  });
  m.def(
      "default_device", []() -> Device& { return default_device(); }, ref);
  m.def(
      "set_default_device", [](nb::handle d) { set_default_device(as_device(d)); },
      nb::arg("device").none());
  m.def(
      "_synchronize",
      [](nb::handle d) {
        if (d.is_none()) {
          nb::gil_scoped_release nogil;
          synchronize();
        } else {
          Device& dev = as_device(d);
          nb::gil_scoped_release nogil;
          dev.synchronize();
        }
      },
      nb::arg("device").none() = nb::none());
  m.def(
      "manual_seed", [](uint64_t seed) { manual_seed(seed); }, nb::arg("seed"));
  m.def(
      "set_allow_tf32", [](bool on) { set_allow_tf32(on); }, nb::arg("allow"));
  m.def("allow_tf32", []() { return allow_tf32(); });
  m.def(
      "set_sync_debug",
      [](const std::string& mode) {
        if (mode == "off")
          set_sync_debug(SyncDebug::off);
        else if (mode == "warn")
          set_sync_debug(SyncDebug::warn);
        else if (mode == "error")
          set_sync_debug(SyncDebug::error);
        else
          throw Error("set_sync_debug: mode must be 'off', 'warn' or 'error', got '" + mode + "'");
      },
      nb::arg("mode"));
  m.def("sync_debug", []() {
    switch (sync_debug()) {
      case SyncDebug::warn:
        return "warn";
      case SyncDebug::error:
        return "error";
      case SyncDebug::off:
        break;
    }
    return "off";
  });
  // Note [Fallback policy] in runtime.hpp.
  m.def(
      "set_fallback_policy",
      [](const std::string& policy) {
        if (policy == "error")
          set_fallback_policy(FallbackPolicy::error);
        else if (policy == "warn")
          set_fallback_policy(FallbackPolicy::warn);
        else if (policy == "allow")
          set_fallback_policy(FallbackPolicy::allow);
        else
          throw Error("set_fallback_policy: policy must be 'error', 'warn' or 'allow', got '" +
                      policy + "'");
      },
      nb::arg("policy"));
  m.def("fallback_stats", []() {
    nb::list out;
    for (const FallbackStats& f : fallback_stats()) {
      nb::dict d;
      d["device"] = f.device;
      d["op"] = f.op;
      d["dtype"] = f.dtype;
      d["action"] = f.action;
      d["count"] = f.count;
      d["bytes_copied"] = f.bytes_copied;
      d["seconds"] = f.seconds;
      out.append(d);
    }
    return out;
  });
  m.def("fallback_table", []() { return fallback_table(); });
  m.def("load_report", []() {
    nb::list out;
    for (const PluginReport& r : load_report()) {
      nb::dict d;
      d["path"] = r.path;
      d["status"] = status_name(r.status);
      d["decision"] = r.decision;
      d["reason"] = r.reason;
      d["name"] = r.name;
      d["device_type"] = r.device_type;
      d["version"] = r.version;
      d["abi"] = std::to_string(r.abi_major) + "." + std::to_string(r.abi_minor);
      d["device_count"] = r.device_count;
      out.append(d);
    }
    return out;
  });
}

}  // namespace bp::python
