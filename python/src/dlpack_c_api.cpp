// The DLPack 1.3 C exchange API: Tensor.__dlpack_c_exchange_api__ (producer) and its use by
// backplane.from_dlpack on producer types that have one (consumer).
//
// Note [DLPack C exchange API]
//   type(t).__dlpack_c_exchange_api__ is a PyCapsule named "dlpack_exchange_api" holding a
//   static DLPackExchangeAPI (version 1.3, no older table chained), so C code (a kernel
//   library, another framework) exchanges tensors without a Python call or capsule:
//   - managed_tensor_from_py_object_no_sync(obj, &m): a DLManagedTensorVersioned viewing the
//     tensor (flags 0: Backplane memory is writable) that holds the tensor's storage block until
//     m->deleter(m); the deleter needs no GIL. OpenCL tensors have no address: BufferError.
//   - dltensor_from_py_object_no_sync(obj, &dl): the same description, non-owning: shape and
//     strides point into the tensor, valid while the caller keeps `obj` alive and unchanged.
//   - managed_tensor_to_py_object_no_sync(m, &obj): a backplane.Tensor over m's memory (zero
//     copy; a read-only m is copied), which calls m's deleter under the GIL once its last view
//     is gone and the work queued on it is done.
//   - managed_tensor_allocator(prototype, &m, ctx, SetError): a new contiguous tensor of the
//     prototype's dtype, shape and device (cpu memory for kDLCPU, a cuda device for kDLCUDA),
//     exported as above; failures are reported through SetError with the kind "MemoryError",
//     "TypeError" (dtype), "ValueError" (shape, device) or "RuntimeError". Needs no GIL.
//   - current_work_stream(type, id, &s): the stream Backplane queues that device's work on,
//     its default stream (a cudaStream_t; NULL for host memory).
//   Every function but the allocator is called with the GIL held, as the protocol says, and
//   sets a Python exception when it returns -1.
//   Who orders what (none of the functions synchronises): the tensor's pending writes are
//   queued on current_work_stream's stream, and the storage block is freed stream-ordered on
//   that stream once the deleter has dropped the last reference. A consumer that launches its
//   kernels on that stream (the protocol's rule) is therefore ordered after our writes, and its
//   reads are ordered before the block's reuse even when it calls the deleter right after
//   queueing them (PyTorch does so when its tensor dies). A consumer that uses another stream
//   must make it wait for current_work_stream's stream before reading, and make that stream
//   wait for its own work before calling the deleter; the capsule protocol, which is told the
//   consumer's stream, does both itself (Note [DLPack streams], Note [DLPack export frees]).
//   As consumer, from_dlpack(x) uses type(x)'s table when it has one (cached per type; a major
//   version other than 1 is looked for in the prev_api chain): the producer's managed tensor,
//   then on a device with streams our default stream waits (an event, never the host) for the
//   stream the producer's current_work_stream names, which its pending writes are queued on.
//   The import's release (the producer's deleter) runs after our queued work on the memory is
//   done (Note [DLPack lifetimes]). Types without a usable table go through __dlpack__.
#include "dlpack_internal.hpp"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace bp::python {

namespace {

constexpr const char* kApiCapsule = "dlpack_exchange_api";
constexpr const char* kApiAttr = "__dlpack_c_exchange_api__";

PyTypeObject* g_tensor_type = nullptr;  // backplane.Tensor, set at registration

// ---- producer --------------------------------------------------------------------------------

// An exported tensor: the managed tensor, the storage it keeps alive and its geometry, in one
// allocation. Left uninitialised but for the storage (every field is written before use: the
// zeroing showed up as a quarter of an export's time).
struct CExport {
  DLManagedTensorVersioned managed;
  std::shared_ptr<Buffer> storage;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];
};

void delete_c_export(DLManagedTensorVersioned* m) {
  delete static_cast<CExport*>(m->manager_ctx);
  --dl::live_exports;
}

const Tensor& tensor_of(void* obj, const char* what) {
  auto* o = static_cast<PyObject*>(obj);
  if (!o || !PyObject_TypeCheck(o, g_tensor_type))
    throw nb::type_error((std::string(what) + ": expected a backplane.Tensor, got " +
                          (o ? Py_TYPE(o)->tp_name : "NULL"))
                             .c_str());
  return *nb::inst_ptr<Tensor>(nb::handle(o));
}

// The description of `t` in `out`, shape and strides pointing at `shape` and `strides`. A
// device without addressable memory (OpenCL) raises BufferError, as the protocol asks.
void describe(const Tensor& t, DLTensor& out, int64_t* shape, int64_t* strides) {
  NativeBuffer n;
  try {
    n = t.native();
  } catch (const UnsupportedError& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    throw nb::python_error();
  }
  out.data = n.address;
  out.device = {static_cast<DLDeviceType>(n.dlpack_device_type), n.device_ordinal};
  out.ndim = t.rank();
  out.dtype = dl::to_dl(t.dtype());
  out.shape = shape;
  out.strides = strides;
  out.byte_offset = 0;
}

DLManagedTensorVersioned* export_tensor(const Tensor& t) {
  auto* e = new CExport;
  DLManagedTensorVersioned& m = e->managed;
  try {
    describe(t, m.dl_tensor, e->shape, e->strides);
  } catch (...) {
    delete e;
    throw;
  }
  const Dims& s = t.dims();
  const Dims& st = t.stride_dims();
  for (int k = 0; k < s.rank; ++k) {
    e->shape[k] = s.d[k];
    e->strides[k] = st.d[k];
  }
  e->storage = t.storage();
  m.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  m.manager_ctx = e;
  m.deleter = delete_c_export;
  m.flags = 0;
  ++dl::live_exports;
  return &m;
}

int managed_from_py(void* obj, DLManagedTensorVersioned** out) {
  try {
    *out = export_tensor(tensor_of(obj, "managed_tensor_from_py_object_no_sync"));
    return 0;
  } catch (...) {
    set_python_error();
    return -1;
  }
}

int dltensor_from_py(void* obj, DLTensor* out) {
  try {
    const Tensor& t = tensor_of(obj, "dltensor_from_py_object_no_sync");
    // Dims hold int64_t inline in the tensor: pointed at, never written through.
    describe(t, *out, const_cast<int64_t*>(t.dims().d), const_cast<int64_t*>(t.stride_dims().d));
    return 0;
  } catch (...) {
    set_python_error();
    return -1;
  }
}

int managed_to_py(DLManagedTensorVersioned* m, void** out) {
  try {
    if (!m) throw nb::value_error("managed_tensor_to_py_object_no_sync: tensor is NULL");
    Tensor t = dl::import_versioned(m, std::nullopt);
    *out = nb::cast(std::move(t)).release().ptr();
    return 0;
  } catch (...) {
    set_python_error();
    return -1;
  }
}

int allocate(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
             void (*set_error)(void* error_ctx, const char* kind, const char* message)) {
  const char* kind = "RuntimeError";
  std::string msg;
  try {
    if (!prototype) throw ShapeError("managed_tensor_allocator: prototype is NULL");
    const DLTensor& p = *prototype;
    const DType dtype = dl::from_dl(p.dtype, "managed_tensor_allocator");
    if (p.ndim < 0 || p.ndim > kMaxRank)
      throw ShapeError("managed_tensor_allocator: rank " + std::to_string(p.ndim) +
                       " is outside what Backplane supports (0.." + std::to_string(kMaxRank) + ")");
    if (p.ndim > 0 && !p.shape)
      throw ShapeError("managed_tensor_allocator: the prototype has rank " +
                       std::to_string(p.ndim) + " and no shape");
    Shape shape(p.shape, p.shape + p.ndim);
    for (int k = 0; k < p.ndim; ++k)
      if (shape[k] < 0)
        throw ShapeError("managed_tensor_allocator: negative size " + std::to_string(shape[k]) +
                         " in dimension " + std::to_string(k));
    if (p.device.device_type != kDLCPU && p.device.device_type != kDLCUDA)
      throw UnsupportedError(
          "managed_tensor_allocator: Backplane allocates host memory "
          "(kDLCPU) and CUDA memory (kDLCUDA), not DLPack device type " +
          std::to_string(p.device.device_type));
    Device& dev = dl::device_of(p.device.device_type, p.device.device_id);
    *out = export_tensor(empty(shape, dev, dtype));
    return 0;
  } catch (const OutOfMemory& e) {
    kind = "MemoryError";
    msg = e.what();
  } catch (const DTypeError& e) {
    kind = "TypeError";
    msg = e.what();
  } catch (const ShapeError& e) {
    kind = "ValueError";
    msg = e.what();
  } catch (const DeviceError& e) {
    kind = "ValueError";
    msg = e.what();
  } catch (const UnsupportedError& e) {
    kind = "ValueError";
    msg = e.what();
  } catch (const std::exception& e) {
    msg = e.what();
  } catch (...) {
    msg = "managed_tensor_allocator: unknown C++ exception";
  }
  *out = nullptr;
  if (set_error) set_error(error_ctx, kind, msg.c_str());
  return -1;
}

int current_work_stream(DLDeviceType type, int32_t id, void** out) {
  try {
    if (type == kDLCPU || type == kDLCUDAHost) {
      *out = nullptr;
      return 0;
    }
    Device& dev = dl::device_of(type, id);
    *out = dl::is_host(dev) ? nullptr : dev.default_stream().native_handle();
    return 0;
  } catch (...) {
    set_python_error();
    return -1;
  }
}

const DLPackExchangeAPI g_api = {
    {{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, nullptr},
    allocate,
    managed_from_py,
    managed_to_py,
    dltensor_from_py,
    current_work_stream,
};

// ---- consumer --------------------------------------------------------------------------------

// Types seen by from_dlpack and their tables (nullptr: none), each entry with a weak reference
// to its type whose callback drops the entry when the type dies (so a new type at the same
// address is looked up afresh). No strong reference: a cached type, and through its methods
// their module, must not outlive the interpreter (nanobind's leak check at exit).
struct ApiCacheEntry {
  PyTypeObject* type;
  const DLPackExchangeAPI* api;
  PyObject* weak;  // owned
};
constexpr size_t kApiCacheSize = 32;
auto* g_api_cache = new std::vector<ApiCacheEntry>();

PyObject* forget_type(PyObject*, PyObject* weak) {
  auto& c = *g_api_cache;
  for (size_t i = 0; i < c.size(); ++i)
    if (c[i].weak == weak) {
      Py_DECREF(c[i].weak);
      c.erase(c.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  Py_RETURN_NONE;
}

PyMethodDef g_forget_def = {"_dlpack_forget_type", forget_type, METH_O, nullptr};
PyObject* g_forget = nullptr;  // the weak references' callback, made once

const DLPackExchangeAPI* lookup_api(PyTypeObject* type) {
  nb::object cap = nb::steal(PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), kApiAttr));
  if (!cap.is_valid() || !PyCapsule_IsValid(cap.ptr(), kApiCapsule)) {
    PyErr_Clear();
    return nullptr;
  }
  auto* h =
      static_cast<const DLPackExchangeAPIHeader*>(PyCapsule_GetPointer(cap.ptr(), kApiCapsule));
  while (h && h->version.major != DLPACK_MAJOR_VERSION) h = h->prev_api;
  if (!h) return nullptr;
  auto* api = reinterpret_cast<const DLPackExchangeAPI*>(h);
  if (!api->managed_tensor_from_py_object_no_sync || !api->current_work_stream) return nullptr;
  return api;
}

}  // namespace

const DLPackExchangeAPI* dl::exchange_api_of(PyTypeObject* type) {
  for (const ApiCacheEntry& e : *g_api_cache)
    if (e.type == type) return e.api;
  const DLPackExchangeAPI* api = lookup_api(type);
  if (g_api_cache->size() < kApiCacheSize) {
    if (!g_forget) g_forget = PyCFunction_New(&g_forget_def, nullptr);
    PyObject* weak =
        g_forget ? PyWeakref_NewRef(reinterpret_cast<PyObject*>(type), g_forget) : nullptr;
    if (weak)
      g_api_cache->push_back({type, api, weak});
    else
      PyErr_Clear();  // not cached: looked up again next time
  }
  return api;
}

Tensor dl::import_through(const DLPackExchangeAPI& api, nb::handle obj, std::optional<bool> copy) {
  DLManagedTensorVersioned* m = nullptr;
  if (api.managed_tensor_from_py_object_no_sync(obj.ptr(), &m) != 0) throw nb::python_error();
  if (!m)
    throw nb::buffer_error((std::string("from_dlpack: ") + Py_TYPE(obj.ptr())->tp_name +
                            "'s managed_tensor_from_py_object_no_sync returned no tensor")
                               .c_str());
  Device* found = nullptr;  // looked up once, for the stream check and the import
  if (m->version.major == DLPACK_MAJOR_VERSION) {
    try {
      Device& dev = device_of(m->dl_tensor.device.device_type, m->dl_tensor.device.device_id);
      found = &dev;
      if (!is_host(dev)) {
        void* theirs = nullptr;
        if (api.current_work_stream(m->dl_tensor.device.device_type, m->dl_tensor.device.device_id,
                                    &theirs) != 0)
          throw nb::python_error();
        Stream& ours = dev.default_stream();
        if (theirs != ours.native_handle()) {
          std::unique_ptr<Stream> producer = dev.import_stream(theirs);
          order_streams(dev, *producer, ours);
        }
      }
    } catch (...) {
      if (m->deleter) m->deleter(m);
      throw;
    }
  }
  return import_versioned(m, copy, found);
}

// ---- registration ----------------------------------------------------------------------------

namespace {

// For bench/python/dlpack_roundtrip.py: nanoseconds per call of `src`'s type's table in a C++
// loop of n calls, without Python in between. mode "managed": managed_tensor_from_py_object +
// deleter; "dltensor": dltensor_from_py_object; "stream": current_work_stream of src's device;
// "import": from_dlpack's C++ path without Python, what a C++ consumer pays: src's type's
// managed_tensor_from_py_object, Backplane's import into a bp::Tensor (with the stream check of
// a device with streams), then the tensor dropped and the producer's deleter called;
// "exchange": managed_tensor_from_py_object of src's type, then managed_tensor_to_py_object of
// dst_type's table, then the new object released (a full exchange into dst_type).
double exchange_loop_ns(nb::handle src, nb::handle dst_type, int64_t n, const std::string& mode) {
  const DLPackExchangeAPI* api = dl::exchange_api_of(Py_TYPE(src.ptr()));
  if (!api)
    throw nb::type_error(
        (std::string(Py_TYPE(src.ptr())->tp_name) + " has no " + kApiAttr).c_str());
  enum Kind { kManaged, kDLTensor, kStream, kImport, kExchange };
  static constexpr const char* kNames[] = {"managed", "dltensor", "stream", "import", "exchange"};
  int kind = 0;
  while (kind <= kExchange && mode != kNames[kind]) ++kind;
  if (kind > kExchange)
    throw nb::value_error(("_dlpack_c_exchange_ns: mode '" + mode +
                           "'; expected 'managed', 'dltensor', 'stream', 'import' or 'exchange'")
                              .c_str());
  const DLPackExchangeAPI* to = nullptr;
  if (kind == kExchange) {
    if (!PyType_Check(dst_type.ptr()))
      throw nb::type_error("_dlpack_c_exchange_ns: dst_type must be a type for mode 'exchange'");
    to = dl::exchange_api_of(reinterpret_cast<PyTypeObject*>(dst_type.ptr()));
    if (!to || !to->managed_tensor_to_py_object_no_sync)
      throw nb::type_error("_dlpack_c_exchange_ns: dst_type has no managed_tensor_to_py_object");
  }
  if (kind == kDLTensor && !api->dltensor_from_py_object_no_sync)
    throw nb::type_error("_dlpack_c_exchange_ns: the source type has no dltensor_from_py_object");
  DLTensor probe{};
  DLManagedTensorVersioned* m = nullptr;
  if (api->managed_tensor_from_py_object_no_sync(src.ptr(), &m) != 0) throw nb::python_error();
  const DLDevice device = m->dl_tensor.device;
  m->deleter(m);
  void* obj = nullptr;
  void* stream = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    int rc = 0;
    switch (kind) {
      case kManaged:
        rc = api->managed_tensor_from_py_object_no_sync(src.ptr(), &m);
        if (rc == 0) m->deleter(m);
        break;
      case kDLTensor:
        rc = api->dltensor_from_py_object_no_sync(src.ptr(), &probe);
        break;
      case kStream:
        rc = api->current_work_stream(device.device_type, device.device_id, &stream);
        break;
      case kImport:
        (void)dl::import_through(*api, src, std::nullopt);  // throws on failure
        break;
      case kExchange:
        rc = api->managed_tensor_from_py_object_no_sync(src.ptr(), &m);
        if (rc == 0) rc = to->managed_tensor_to_py_object_no_sync(m, &obj);
        if (rc == 0) Py_DECREF(static_cast<PyObject*>(obj));
    }
    if (rc != 0) throw nb::python_error();
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

}  // namespace

void register_dlpack_c_api(nb::class_<Tensor>& cls, nb::module_& m) {
  g_tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  cls.attr(kApiAttr) = nb::capsule(static_cast<const void*>(&g_api), kApiCapsule);
  m.def("_dlpack_c_exchange_ns", &exchange_loop_ns, nb::arg("src"),
        nb::arg("dst_type").none() = nb::none(), nb::arg("n") = 100000, nb::arg("mode") = "managed",
        "Nanoseconds per call of type(src).__dlpack_c_exchange_api__ in a C++ loop "
        "(bench/python/dlpack_roundtrip.py).");
  m.def(
      "_dlpack_c_exchange_api_of",
      [](nb::handle type) {
        if (!PyType_Check(type.ptr())) throw nb::type_error("expected a type");
        return reinterpret_cast<uintptr_t>(
            dl::exchange_api_of(reinterpret_cast<PyTypeObject*>(type.ptr())));
      },
      "The address of the exchange table from_dlpack uses for a type (0: none, __dlpack__).");
}

}  // namespace bp::python
