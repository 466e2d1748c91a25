// DLPack 1.x exchange (the Python array API's protocol): Tensor.__dlpack__,
// Tensor.__dlpack_device__ and backplane.from_dlpack, zero-copy both ways on cpu and cuda over
// the native handles of plugin ABI 1.2 (Tensor::native, bp::from_blob, Device::import_stream).
//
// Note [DLPack streams]
//   Producer (our __dlpack__(stream=s) on a cuda tensor): the consumer will use the memory on
//   its stream s. We record an event on the tensor's device stream and make s wait for it
//   (Device::import_stream wraps s without owning it): never a device-wide synchronisation.
//   s follows the array API: None or 1 = the legacy default stream, 2 = the per-thread
//   default stream, any other integer = a cudaStream_t, -1 = the consumer asks for no
//   ordering, 0 is refused as ambiguous. On host-memory devices s must be None (or -1).
//   Consumer (from_dlpack(obj) of a cuda array): we pass the native stream of our device's
//   default stream, on which every op of the imported tensor will be queued, so the producer
//   orders its pending writes before our work.
//
// Note [DLPack lifetimes]
//   Export: the capsule owns a DLManagedTensor(Versioned) whose manager context holds a
//   bp::Tensor (the storage stays alive) and the shape/stride arrays; its deleter frees them
//   and needs no GIL. An unconsumed capsule calls the deleter from its destructor; a consumer
//   renames it to "used_dltensor[_versioned]" and calls the deleter when done.
//   Import: the tensor is bp::from_blob over the producer's memory; the release function
//   (run once, after the last view is gone and our queued work is done with the memory) calls
//   the producer's deleter under the GIL, as producers such as NumPy release Python objects
//   there. Counters of live exports and imports (backplane._core._dlpack_live) let tests
//   check that both sides let go.
#include "dlpack_internal.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bp::python {

namespace dl {

std::atomic<int64_t> live_exports{0};
GilCount live_imports{0};

}  // namespace dl

using dl::device_of;
using dl::from_dl;
using dl::host_device;
using dl::to_dl;

namespace {

constexpr const char* kVersioned = "dltensor_versioned";
constexpr const char* kUsedVersioned = "used_dltensor_versioned";
constexpr const char* kLegacy = "dltensor";
constexpr const char* kUsedLegacy = "used_dltensor";

[[noreturn]] void buffer_error(const std::string& msg) {
  PyErr_SetString(PyExc_BufferError, msg.c_str());
  throw nb::python_error();
}

}  // namespace

// ---- dtypes ----------------------------------------------------------------------------------

DLDataType dl::to_dl(DType t) {
  switch (t) {
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f64:
      return {kDLFloat, 64, 1};
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
    case DType::i64:
      return {kDLInt, 64, 1};
    case DType::u8:
      return {kDLUInt, 8, 1};
    case DType::boolean:
      return {kDLBool, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

DType dl::from_dl(DLDataType d, const char* what) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 32) return DType::f32;
    if (d.code == kDLFloat && d.bits == 64) return DType::f64;
    if (d.code == kDLFloat && d.bits == 16) return DType::f16;
    if (d.code == kDLBfloat && d.bits == 16) return DType::bf16;
    if (d.code == kDLInt && d.bits == 32) return DType::i32;
    if (d.code == kDLInt && d.bits == 64) return DType::i64;
    if (d.code == kDLUInt && d.bits == 8) return DType::u8;
    if (d.code == kDLBool && d.bits == 8) return DType::boolean;
  }
  static const char* names[] = {"int",    "uint",    "float", "opaque handle",
                                "bfloat", "complex", "bool"};
  std::string name =
      d.code < sizeof names / sizeof names[0]
          ? std::string(names[d.code]) + std::to_string(d.bits)
          : "type code " + std::to_string(d.code) + " of " + std::to_string(d.bits) + " bits";
  if (d.lanes != 1) name += " x" + std::to_string(d.lanes) + " lanes";
  throw DTypeError(std::string(what) + ": unsupported dtype " + name +
                   "; Backplane tensors hold float32, float64, float16, bfloat16, int32, int64, "
                   "uint8 or bool (convert on the producer's side first)");
}

// ---- devices ---------------------------------------------------------------------------------

// The Backplane device holding memory that DLPack calls (type, id). CUDA ids are vendor
// ordinals, which need not be our indices: each cuda device's ordinal is read once from the
// native handle of a small allocation.
Device& dl::host_device() {
  static Device* cpu = &device("cpu:0");  // devices live as long as the process
  return *cpu;
}

bool dl::is_host(Device& dev) {
  return &dev == &host_device() || dev.type() == "cpu" || dev.properties().unified_memory;
}

Device& dl::device_of(int32_t type, int32_t id) {
  if (type == kDLCPU || type == kDLCUDAHost) return host_device();
  if (type == kDLCUDA || type == kDLCUDAManaged) {
    // Filled once under the lock, then only read: a filled table is searched without it.
    static std::mutex mu;
    static std::vector<std::pair<int, Device*>> ordinals;
    static std::atomic<bool> filled{false};
    if (!filled.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu);
      if (!filled.load(std::memory_order_relaxed)) {
        std::vector<std::pair<int, Device*>> found;  // a throw below leaves none half-filled
        for (Device* d : all_devices("cuda")) {
          if (d->type() != "cuda") continue;
          auto probe = d->allocator().allocate(256);
          found.emplace_back(probe->native().device_ordinal, d);
        }
        ordinals = std::move(found);
        filled.store(true, std::memory_order_release);
      }
    }
    for (auto& [ord, d] : ordinals)
      if (ord == id) return *d;
    throw DeviceError("from_dlpack: the memory is on CUDA device " + std::to_string(id) +
                      ", which Backplane does not have (" + std::to_string(ordinals.size()) +
                      " cuda devices; is the cuda plugin loaded? see backplane.load_report())");
  }
  throw UnsupportedError("from_dlpack: DLPack device type " + std::to_string(type) + " (id " +
                         std::to_string(id) +
                         ") is not supported; Backplane imports host memory (kDLCPU, "
                         "kDLCUDAHost) and CUDA memory (kDLCUDA, kDLCUDAManaged)");
}

namespace {

// A (DLPack device type, device id) pair given to us: `h` as two integers that fit int32_t.
// TypeError / ValueError naming `what` and the accepted form otherwise.
std::pair<int32_t, int32_t> dl_pair(nb::handle h, const std::string& what) {
  auto [type, id] = int_pair(h, what.c_str(),
                             "a tuple (device_type, device_id) of two integers, such as (1, 0) "
                             "for the host or (2, 0) for the first CUDA device");
  if (type < INT32_MIN || type > INT32_MAX || id < INT32_MIN || id > INT32_MAX)
    throw nb::value_error((what + " (" + std::to_string(type) + ", " + std::to_string(id) +
                           "); DLPack device types and ids are 32-bit integers")
                              .c_str());
  return {static_cast<int32_t>(type), static_cast<int32_t>(id)};
}

// (DLPack device type, device id) of a tensor. UnsupportedError (with the backend's reason)
// for devices without addressable memory, such as OpenCL.
std::pair<int32_t, int32_t> dl_device_of(const Tensor& t) {
  NativeBuffer n = t.native();
  return {n.dlpack_device_type, n.device_ordinal};
}

// ---- export ----------------------------------------------------------------------------------

// Note [DLPack export frees]
//   The consumer may still have work queued on its stream that reads the memory when it calls
//   the deleter (PyTorch calls it as soon as its tensor object dies). Dropping our Tensor frees
//   the block on our default stream, where the next allocation of its size class can take it at
//   once, so the free must wait for the consumer's stream: the deleter records an event on the
//   stream the consumer named in __dlpack__(stream=...) and makes our default stream wait for
//   it before the Tensor goes (stream-ordered, the host never blocks). If that fails (the
//   consumer's stream was destroyed meanwhile) the device is synchronised instead. A consumer
//   that passed stream=-1 took the ordering on itself in both directions.
struct ExportCtx {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  bool order_free = false;   // a device stream other than ours consumes the memory
  void* consumer = nullptr;  // its native handle (NULL: the legacy default stream)
};

void release_export(ExportCtx* ctx) noexcept {
  if (ctx->order_free) {
    Device& dev = ctx->tensor.device();
    try {
      std::unique_ptr<Stream> theirs = dev.import_stream(ctx->consumer);
      std::unique_ptr<Event> done = dev.create_event();
      done->record(*theirs);
      dev.default_stream().wait(*done);
    } catch (...) {
      try {
        dev.synchronize();
      } catch (...) {  // a device error at free time has nobody to go to
      }
    }
  }
  delete ctx;
}

template <typename M>
void fill_export(M* m, ExportCtx* ctx, const Tensor& t, const NativeBuffer& n) {
  const Dims& s = t.dims();
  const Dims& st = t.stride_dims();
  ctx->shape.assign(s.d, s.d + s.rank);
  ctx->strides.assign(st.d, st.d + st.rank);
  DLTensor& dl = m->dl_tensor;
  dl.data = n.address;
  dl.device = {static_cast<DLDeviceType>(n.dlpack_device_type), n.device_ordinal};
  dl.ndim = s.rank;
  dl.dtype = to_dl(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  m->manager_ctx = ctx;
}

void delete_versioned(DLManagedTensorVersioned* m) {
  release_export(static_cast<ExportCtx*>(m->manager_ctx));
  delete m;
  --dl::live_exports;
}

void delete_legacy(DLManagedTensor* m) {
  release_export(static_cast<ExportCtx*>(m->manager_ctx));
  delete m;
  --dl::live_exports;
}

void capsule_destructor_versioned(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, kVersioned)) return;  // consumed: the consumer owns it
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersioned));
  if (m && m->deleter) m->deleter(m);
  PyErr_Restore(type, value, tb);
}

void capsule_destructor_legacy(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, kLegacy)) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacy));
  if (m && m->deleter) m->deleter(m);
  PyErr_Restore(type, value, tb);
}

// One event per device, recorded and waited on under a mutex by every ordering (an event may be
// re-recorded once a wait has captured it). Never destroyed (leaked at exit, when the plugins
// may already be gone).
std::mutex g_event_mu;
auto* g_events = new std::vector<std::pair<Device*, std::unique_ptr<Event>>>();

}  // namespace

void dl::order_streams(Device& dev, Stream& first, Stream& then) {
  std::lock_guard<std::mutex> lock(g_event_mu);
  Event* ev = nullptr;
  for (auto& [d, e] : *g_events)
    if (d == &dev) ev = e.get();
  if (!ev) ev = g_events->emplace_back(&dev, dev.create_event()).second.get();
  ev->record(first);
  then.wait(*ev);
}

namespace {

// Note [DLPack streams], producer side.
// Returns true when the consumer's stream is a device stream other than ours (`*consumer` its
// handle): the export's free must then be ordered after it (Note [DLPack export frees]).
bool order_for_consumer(const Tensor& t, nb::handle stream, void** consumer_out) {
  Device& dev = t.device();
  Stream& ours = dev.default_stream();
  if (dl::is_host(dev)) {
    if (!stream.is_none() && !(PyLong_Check(stream.ptr()) && nb::cast<int64_t>(stream) == -1))
      buffer_error("__dlpack__: stream must be None for a tensor on " + dev.str() +
                   " (host memory has no streams), got " + nb::repr(stream).c_str());
    ours.synchronize();  // a no-op on eager host streams
    return false;
  }
  int64_t s = 1;
  if (!stream.is_none()) {
    if (!PyLong_Check(stream.ptr()))
      throw nb::type_error(("__dlpack__: stream must be None or an integer (a cudaStream_t "
                            "pointer, 1 legacy default, 2 per-thread default, -1 no "
                            "synchronisation), got " +
                            std::string(nb::repr(stream).c_str()))
                               .c_str());
    s = nb::cast<int64_t>(stream);
  }
  if (s == -1) return false;
  if (s == 0)
    buffer_error(
        "__dlpack__: stream=0 is ambiguous for CUDA (use 1 for the legacy default "
        "stream, 2 for the per-thread default stream)");
  void* consumer = s == 1 ? nullptr : reinterpret_cast<void*>(static_cast<intptr_t>(s));
  if (consumer == ours.native_handle()) return false;  // same stream: already ordered
  *consumer_out = consumer;
  // The consumer's stream is wrapped per call and let go at once: a kept wrapper would join
  // the streams that Device::synchronize waits for.
  std::unique_ptr<Stream> theirs = dev.import_stream(consumer);
  dl::order_streams(dev, ours, *theirs);
  return true;
}

nb::object dlpack_export(nb::handle self, nb::handle stream, nb::handle max_version,
                         nb::handle dl_device, nb::handle copy) {
  Tensor t = nb::cast<const Tensor&>(self);
  const std::optional<bool> copy_flag = optional_flag(copy, "__dlpack__: copy");
  bool copied = false;
  if (!dl_device.is_none()) {
    auto want = dl_pair(dl_device, "__dlpack__: dl_device is");
    auto have = dl_device_of(t);
    if (want != have) {
      if (copy_flag == false)
        buffer_error("__dlpack__: dl_device " + std::string(nb::repr(dl_device).c_str()) +
                     " differs from the tensor's device " + t.device().str() +
                     " and copy=False forbids a copy");
      if (want.first != kDLCPU)
        buffer_error("__dlpack__: can only copy to the host (kDLCPU, 0), not to DLPack device " +
                     std::string(nb::repr(dl_device).c_str()));
      t = t.copy_to(host_device());  // cross-device copies to host memory are synchronous
      copied = true;
    }
  }
  if (!copied && copy_flag == true) {
    t = t.clone();
    copied = true;
  }
  if (t.requires_grad()) t = t.detach();
  const NativeBuffer n = t.native();  // UnsupportedError with the reason (opencl) first
  void* consumer = nullptr;
  const bool order_free = order_for_consumer(t, stream, &consumer);

  bool versioned = false;
  uint32_t minor = DLPACK_MINOR_VERSION;
  if (!max_version.is_none()) {
    auto mv = int_pair(max_version, "__dlpack__: max_version is",
                       "a tuple (major, minor) of two integers, such as (1, 1)");
    if (mv.first >= 1) {
      versioned = true;
      if (mv.first == 1 && mv.second < static_cast<int64_t>(minor))
        minor = static_cast<uint32_t>(std::max<int64_t>(mv.second, 0));
    }
  }
  auto* ctx = new ExportCtx{t, {}, {}, order_free, consumer};
  PyObject* cap = nullptr;
  if (versioned) {
    auto* m = new DLManagedTensorVersioned{};
    m->version = {DLPACK_MAJOR_VERSION, minor};
    m->deleter = delete_versioned;
    m->flags = copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0;
    fill_export(m, ctx, t, n);
    ++dl::live_exports;
    cap = PyCapsule_New(m, kVersioned, capsule_destructor_versioned);
    if (!cap) {
      delete_versioned(m);
      throw nb::python_error();
    }
  } else {
    auto* m = new DLManagedTensor{};
    m->deleter = delete_legacy;
    fill_export(m, ctx, t, n);
    ++dl::live_exports;
    cap = PyCapsule_New(m, kLegacy, capsule_destructor_legacy);
    if (!cap) {
      delete_legacy(m);
      throw nb::python_error();
    }
  }
  return nb::steal(cap);
}

// ---- import ----------------------------------------------------------------------------------

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Whether this thread holds the GIL, without PyGILState's thread-specific-storage lookups: a
// thread's state is current exactly while it holds the GIL (a release, Py_BEGIN_ALLOW_THREADS
// or nanobind's gil_scoped_release, makes it NULL). The free-threaded build has no GIL to
// hold, so it always asks PyGILState (which attaches the thread).
bool holds_gil() {
#ifdef Py_GIL_DISABLED
  return false;
#elif PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked() != nullptr;
#else
  return _PyThreadState_UncheckedGet() != nullptr;
#endif
}

// Note [DLPack lifetimes], import side: the producer's deleter, once, under the GIL; the C
// release function of bp::from_blob (no allocation of its own: `m` is its context).
template <typename M>
void release_managed(void* ctx) noexcept {
  auto* m = static_cast<M*>(ctx);
  if (!Py_IsInitialized() || finalizing()) return;  // at exit: let it go, uncounted
  if (holds_gil()) {
    --dl::live_imports;
    if (m->deleter) m->deleter(m);
    return;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  --dl::live_imports;
  if (m->deleter) m->deleter(m);
  PyGILState_Release(g);
}

template <typename M>
Tensor import_managed(M* m, bool read_only, std::optional<bool> copy,
                      const char* what = "from_dlpack", Device* dev = nullptr) {
  DLTensor& dl = m->dl_tensor;
  DType dtype;
  try {
    dtype = from_dl(dl.dtype, what);
    if (dl.ndim < 0 || dl.ndim > bp::kMaxRank)
      throw ShapeError(std::string(what) + ": rank " + std::to_string(dl.ndim) +
                       " is outside what Backplane supports (0.." + std::to_string(bp::kMaxRank) +
                       ")");
  } catch (...) {
    if (m->deleter) m->deleter(m);
    throw;
  }
  // Scratch vectors from_blob reads, so that an import allocates none of its own. Every import
  // holds the GIL (it reads a Python object), which then guards one shared pair; without a GIL
  // each thread has its own (a thread-local lookup, __tls_get_addr in a loaded module).
#ifdef Py_GIL_DISABLED
  thread_local struct { Shape shape, strides; } scratch;
#else
  static struct { Shape shape, strides; } scratch;
#endif
  Shape& shape = scratch.shape;
  Shape& strides = scratch.strides;
  shape.assign(dl.shape, dl.shape + dl.ndim);
  if (dl.strides)
    strides.assign(dl.strides, dl.strides + dl.ndim);
  else
    strides.clear();
  for (size_t k = 0; k < strides.size(); ++k)
    if (strides[k] < 0) {
      if (m->deleter) m->deleter(m);
      throw ShapeError(std::string(what) + ": negative stride " + std::to_string(strides[k]) +
                       " in dimension " + std::to_string(k) +
                       " (a reversed view); Backplane tensors have non-negative strides: pass a "
                       "copy, e.g. numpy.ascontiguousarray(a)");
    }
  if (!dev) try {
      dev = &device_of(dl.device.device_type, dl.device.device_id);
    } catch (...) {
      if (m->deleter) m->deleter(m);
      throw;
    }
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  // from_blob calls the release function only on success; on failure the deleter is ours.
  ++dl::live_imports;
  Tensor t = [&] {
    try {
      return from_blob(*dev, data, shape, strides, dtype, &release_managed<M>, m);
    } catch (...) {
      --dl::live_imports;
      if (m->deleter) m->deleter(m);
      throw;
    }
  }();
  const bool want_copy = copy == true;
  if (read_only && copy == false)
    buffer_error(std::string(what) +
                 ": the producer marked the memory read-only and copy=False; "
                 "Backplane tensors are writable (pass copy=None or True)");
  if (read_only || want_copy) t = t.clone();
  return t;
}

}  // namespace

Tensor dl::import_versioned(DLManagedTensorVersioned* m, std::optional<bool> copy, Device* dev) {
  if (m->version.major != DLPACK_MAJOR_VERSION) {
    // A newer major layout: only `version` and `deleter` may be used.
    const std::string v = std::to_string(m->version.major) + "." + std::to_string(m->version.minor);
    if (m->deleter) m->deleter(m);
    buffer_error("DLPack: a managed tensor of DLPack " + v +
                 "; Backplane reads major version 1 (DLPack 1.x)");
  }
  return import_managed(m, (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, copy, "from_dlpack",
                        dev);
}

namespace {

Tensor import_capsule(nb::handle cap, std::optional<bool> copy) {
  PyObject* c = cap.ptr();
  if (PyCapsule_IsValid(c, kVersioned)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, kVersioned));
    if (m->version.major != DLPACK_MAJOR_VERSION) {
      // A newer major layout: only `version` may be read; hand it back untouched.
      buffer_error("from_dlpack: DLPack " + std::to_string(m->version.major) + "." +
                   std::to_string(m->version.minor) + " capsule; Backplane reads major version 1");
    }
    if (PyCapsule_SetName(c, kUsedVersioned) != 0) throw nb::python_error();
    bool ro = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    return import_managed(m, ro, copy);
  }
  if (PyCapsule_IsValid(c, kLegacy)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kLegacy));
    if (PyCapsule_SetName(c, kUsedLegacy) != 0) throw nb::python_error();
    return import_managed(m, false, copy);
  }
  PyErr_Clear();
  if (PyCapsule_CheckExact(c)) {
    const char* name = PyCapsule_GetName(c);
    PyErr_Clear();
    std::string n = name ? name : "(unnamed)";
    if (n == kUsedVersioned || n == kUsedLegacy)
      buffer_error("from_dlpack: this DLPack capsule was already consumed (its name is '" + n +
                   "'); a capsule can be imported only once: call __dlpack__() again for "
                   "another one");
    throw nb::type_error(("from_dlpack: a capsule named '" + n +
                          "' is not a DLPack tensor ('dltensor_versioned' or 'dltensor')")
                             .c_str());
  }
  throw nb::type_error(("from_dlpack: expected an object with __dlpack__ or a DLPack capsule, "
                        "got " +
                        std::string(nb::type_name(cap.type()).c_str()))
                           .c_str());
}

// Note [DLPack streams], consumer side: the stream argument for a producer on `dev`.
nb::object consumer_stream(Device& dev) {
  if (dev.type() == "cpu" || dev.properties().unified_memory) return nb::none();
  void* s = dev.default_stream().native_handle();
  if (!s) return nb::int_(1);  // the legacy default stream
  return nb::int_(reinterpret_cast<intptr_t>(s));
}

// The capsule protocol: obj.__dlpack__(stream=..., max_version=...).
Tensor import_protocol(nb::handle obj, std::optional<bool> copy) {
  nb::object dlpack = nb::getattr(obj, "__dlpack__", nb::none());
  if (dlpack.is_none())
    throw nb::type_error(("from_dlpack: " + std::string(nb::type_name(obj.type()).c_str()) +
                          " has no __dlpack__ method (expected a DLPack producer such as a "
                          "NumPy, PyTorch or CuPy array, or a DLPack capsule)")
                             .c_str());
  nb::object stream = nb::none();
  nb::object dlpack_device = nb::getattr(obj, "__dlpack_device__", nb::none());
  if (!dlpack_device.is_none()) {
    auto dd =
        dl_pair(dlpack_device(), "from_dlpack: " + std::string(nb::type_name(obj.type()).c_str()) +
                                     ".__dlpack_device__() returned");
    stream = consumer_stream(device_of(dd.first, dd.second));
  }
  // __dlpack__(stream=stream, max_version=(1, 3)) by vectorcall; names and version made once
  // (and kept for the process).
  static PyObject* kwnames = Py_BuildValue("(ss)", "stream", "max_version");
  static PyObject* max_version = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
  PyObject* argv[3] = {nullptr, stream.ptr(), max_version};
  PyObject* r =
      PyObject_Vectorcall(dlpack.ptr(), argv + 1, PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
  nb::object cap;
  if (r) {
    cap = nb::steal(r);
  } else {
    nb::python_error e;
    if (!e.matches(PyExc_TypeError)) throw e;
    // A producer from before DLPack 1.0 knows only `stream`.
    cap = dlpack(nb::arg("stream") = stream);
  }
  return import_capsule(cap, copy);
}

Tensor from_dlpack(nb::handle obj, nb::handle device_arg, nb::handle copy_arg) {
  // Every argument is checked before the producer is asked for a capsule, so a refusal
  // consumes nothing.
  const std::optional<bool> copy = optional_flag(copy_arg, "from_dlpack: copy");
  Device* want = device_arg.is_none() ? nullptr : &as_device(device_arg);
  if (PyCapsule_CheckExact(obj.ptr())) return import_capsule(obj, copy);
  // Note [DLPack C exchange API]: the producer's C functions when its type has them.
  const DLPackExchangeAPI* api = dl::exchange_api_of(Py_TYPE(obj.ptr()));
  Tensor t = api ? dl::import_through(*api, obj, copy) : import_protocol(obj, copy);
  if (want && want != &t.device()) {
    if (copy == false)
      buffer_error("from_dlpack: the data is on " + t.device().str() + ", device=" + want->str() +
                   " needs a copy and copy=False forbids it");
    t = t.copy_to(*want);
  }
  return t;
}

}  // namespace

void register_dlpack(nb::class_<Tensor>& cls, nb::module_& m) {
  cls.def("__dlpack__", &dlpack_export, nb::kw_only(), nb::arg("stream").none() = nb::none(),
          nb::arg("max_version").none() = nb::none(), nb::arg("dl_device").none() = nb::none(),
          nb::arg("copy").none() = nb::none(),
          "A DLPack capsule sharing this tensor's memory (Note [DLPack streams]): "
          "'dltensor_versioned' when max_version >= (1, 0), else the legacy 'dltensor'.");
  cls.def(
      "__dlpack_device__",
      [](const Tensor& t) {
        auto d = dl_device_of(t);
        return nb::make_tuple(d.first, d.second);
      },
      "(DLPack device type, device id): (1, 0) on cpu, (2, CUDA ordinal) on cuda.");
  cls.def(
      "data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); },
      "The native address of the first element (host address or CUDA device pointer).");
  m.def("from_dlpack", &from_dlpack, nb::arg("x"), nb::kw_only(),
        nb::arg("device").none() = nb::none(), nb::arg("copy").none() = nb::none(),
        "A tensor sharing the memory of a DLPack producer (NumPy, PyTorch, CuPy, ...) or of a "
        "DLPack capsule, without copying: through the producer type's "
        "__dlpack_c_exchange_api__ when it has one, else its __dlpack__ (Note [DLPack "
        "streams], Note [DLPack lifetimes], Note [DLPack C exchange API]).");
  register_dlpack_c_api(cls, m);
  m.def("_dlpack_live", []() {
    return nb::make_tuple(dl::live_exports.load(), static_cast<int64_t>(dl::live_imports));
  });
}

}  // namespace bp::python
