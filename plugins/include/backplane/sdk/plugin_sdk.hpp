// Header-only C++ SDK for writing a Backplane backend plugin.
//
// A backend derives from bp::sdk::Backend, overrides the virtual functions, and expands
// BP_SDK_DEFINE_PLUGIN(Class, "name", "device_type", "version") in exactly one .cpp file. The
// macro defines the one exported symbol, bp_plugin_get_api, and a bp_plugin_api table whose
// slots call the backend and convert every C++ exception into a bp_error (Note [Error
// objects] in plugin_abi.h): a plugin written with the SDK never lets an exception or an abort
// cross the boundary.
//
// Throw bp::sdk::Failure (through bp::sdk::fail) to return a specific code and native name;
// std::bad_alloc becomes BP_ERROR_OUT_OF_MEMORY and any other std::exception
// BP_ERROR_INTERNAL.
//
// Thread-safety: the SDK adds no locks; the backend guards its own shared state.
#ifndef BACKPLANE_PLUGIN_SDK_HPP_
#define BACKPLANE_PLUGIN_SDK_HPP_

#include <backplane/abi/error.h>
#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/op_table.h>
#include <backplane/abi/plugin_abi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace bp::sdk {

// An exception carrying an ABI error code and an optional vendor error name.
class Failure : public std::exception {
 public:
  Failure(bp_error_code code, std::string message, std::string native_name = "")
      : code_(code), message_(std::move(message)), native_(std::move(native_name)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  bp_error_code code() const noexcept { return code_; }
  const std::string& native_name() const noexcept { return native_; }

 private:
  bp_error_code code_;
  std::string message_;
  std::string native_;
};

[[noreturn]] inline void fail(bp_error_code code, std::string message,
                              std::string native_name = "") {
  throw Failure(code, std::move(message), std::move(native_name));
}

// Builds a message with printf formatting.
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::snprintf(s.data(), s.size() + 1, fmt, args...);
  return s;
}

// Allocates an error object owned by the caller (bp_error_create of backplane/abi/error.h);
// freed by free_error (the error_free slot).
inline bp_error* make_error(const char* plugin, int32_t code, const std::string& message,
                            const std::string& native) {
  return bp_error_create(plugin, code, native.c_str(), "%s", message.c_str());
}

inline void free_error(bp_error* e) {
  bp_error_destroy(e);
}

// Runs f, converting exceptions into error objects of `plugin`.
template <typename F>
bp_error* guarded(const char* plugin, F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const Failure& e) {
    return make_error(plugin, e.code(), e.what(), e.native_name());
  } catch (const std::bad_alloc&) {
    return make_error(plugin, BP_ERROR_OUT_OF_MEMORY, "out of host memory", "std::bad_alloc");
  } catch (const std::exception& e) {
    return make_error(plugin, BP_ERROR_INTERNAL, e.what(), "");
  } catch (...) {
    return make_error(plugin, BP_ERROR_INTERNAL, "unknown exception in plugin", "");
  }
}

// Note [Asynchronous errors] in plugin_abi.h: the op id the host gave with op_begin for the
// work the calling thread queues now, 0 when it gave none. The SDK's op_begin slot stores it;
// a queuing call takes it once (take_op_id resets it, so a later call without op_begin has 0).
inline uint64_t& op_id_slot() noexcept {
  static thread_local uint64_t id = 0;
  return id;
}
inline uint64_t take_op_id() noexcept {
  uint64_t& slot = op_id_slot();
  const uint64_t id = slot;
  slot = 0;
  return id;
}

// The attributes of one launch, looked up by id (Note [Attribute ids] in plugin_abi.h): the
// array is read with its writer's stride, so arrays from a host of minor 1 (no id: the name is
// mapped, the only string compare) work as well as a current host's (ids only).
class Attrs {
 public:
  Attrs(const bp_attr* a, int32_t n)
      : a_(reinterpret_cast<const char*>(a)),
        n_(a && n > 0 ? n : 0),
        stride_(n_ > 0 ? a->struct_size : sizeof(bp_attr)) {}
  // Throws BP_ERROR_INVALID_ARGUMENT when the array cannot be an attribute array.
  void validate() const {
    if (n_ > 0 && stride_ < sizeof(bp_attr_minor1))
      fail(BP_ERROR_INVALID_ARGUMENT,
           format("launch: attribute struct_size %zu is smaller than the smallest bp_attr (%zu)",
                  stride_, sizeof(bp_attr_minor1)));
  }
  int32_t size() const { return n_; }
  const bp_attr& at(int32_t k) const {
    return *reinterpret_cast<const bp_attr*>(a_ + static_cast<size_t>(k) * stride_);
  }
  // The id of attribute k (its name mapped when the writer set no id).
  int32_t id(int32_t k) const { return bp_attr_get_id(&at(k), stride_); }
  const bp_attr* find(bp_attr_id id) const {
    for (int32_t k = 0; k < n_; ++k)
      if (this->id(k) == id) return &at(k);
    return nullptr;
  }
  bool has(bp_attr_id id) const { return find(id) != nullptr; }
  double f(bp_attr_id id, double fallback = 0.0) const {
    const bp_attr* a = find(id);
    return a ? bp_attr_float(a) : fallback;
  }
  int64_t i(bp_attr_id id, int64_t fallback = 0) const {
    const bp_attr* a = find(id);
    return a ? bp_attr_int(a) : fallback;
  }

 private:
  const char* a_;
  int32_t n_;
  size_t stride_;
};

// A backend's op table (Note [Op tables] in op_table.h): built once from a resolver
// `void(int32_t op, int32_t dtype, bp_op_decl& decl)` that is asked about every pair inside its
// op's dtype domain, it answers find_kernel_id (and so find_kernel, whose name the SDK maps to
// the number) and list_ops, which therefore always agree. Read-only once built.
//
//   ops_ = bp::sdk::OpTable("mydev", [](int32_t op, int32_t dtype, bp_op_decl& d) {
//     if (op == BP_OP_ADD && dtype == BP_DTYPE_F32) {
//       d.kernel = as_handle(&my_add);
//       d.support = BP_SUPPORT_YES;
//     }
//   });
//   bp_kernel* find_kernel_id(int32_t, int32_t op, int32_t dtype) override {
//     return ops_.find(op, dtype);
//   }
//   void list_ops(int32_t, const bp_op_support** l, int32_t* n) override { ops_.list(l, n); }
class OpTable {
 public:
  OpTable() = default;
  // `label` starts the error messages ("cpu:0", "opencl").
  template <class F>
  OpTable(std::string label, F&& resolve)
      : label_(std::move(label)), t_(std::make_unique<bp_op_table>()) {
    using R = std::remove_reference_t<F>;
    bp_op_table_build(
        t_.get(),
        [](void* user, int32_t op, int32_t dtype, bp_op_decl* d) {
          (*static_cast<R*>(user))(op, dtype, *d);
        },
        &resolve);
  }

  // The declaration of a pair the table supports (or expects to fail); throws
  // BP_ERROR_UNSUPPORTED naming the op, the dtype and the declared reason otherwise.
  const bp_op_decl& require(int32_t op, int32_t dtype) const {
    bp_kernel* k = nullptr;
    const char* why = "";
    if (!t_) fail(BP_ERROR_INTERNAL, label_ + ": the op table was never built");
    if (bp_op_table_find(t_.get(), op, dtype, &k, &why) != 0) {
      if (!bp_op_table_get(t_.get(), op, dtype))
        fail(BP_ERROR_UNSUPPORTED,
             format("%s: op number %d with dtype number %d: %s", label_.c_str(), op, dtype, why));
      fail(BP_ERROR_UNSUPPORTED, format("%s: op '%s' is not supported for dtype %s: %s",
                                        label_.c_str(), bp_op_name(op), bp_dtype_name(dtype), why));
    }
    return t_->decls[op][dtype];
  }
  // The kernel handle of a supported pair (NULL for one the backend creates lazily); throws as
  // require does.
  bp_kernel* find(int32_t op, int32_t dtype) const { return require(op, dtype).kernel; }
  // list_ops: every pair of the catalogue with its support and reason.
  void list(const bp_op_support** out_list, int32_t* out_count) const {
    if (!t_) fail(BP_ERROR_INTERNAL, label_ + ": the op table was never built");
    *out_list = t_->list;
    *out_count = BP_OP_TABLE_SIZE;
  }

 private:
  std::string label_;
  std::unique_ptr<bp_op_table> t_;
};

// Number of elements described by a tensor descriptor.
inline int64_t numel(const bp_tensor_desc& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

// True when the descriptor is row-major contiguous (size-1 dimensions ignored).
inline bool is_contiguous(const bp_tensor_desc& t) {
  int64_t expected = 1;
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// Copies a string into a fixed char array field of a property struct.
template <size_t N>
void copy_string(char (&dst)[N], std::string_view src) {
  size_t n = src.size() < N - 1 ? src.size() : N - 1;
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

// Note [Tagged buffer handles]
//   Backends whose bp_buffer* is the address of their own allocation (cpu, cuda) keep that
//   representation when they import foreign memory (the buffer_import slot): an imported
//   handle is the address of an ImportedBuffer record with its lowest bit set. Their own
//   allocations are at least 64-byte aligned, so the bit is free and never set on them;
//   buffer_address() resolves either kind with one test, and mem_free tells an imported
//   buffer (release it) from an owned one (free it) by the same bit. A handle that is 0 stays
//   0 (the 0-byte allocation some backends return).
struct ImportedBuffer {
  void* address = nullptr;  // the owner's memory
  uint64_t size = 0;
  bp_release_fn release = nullptr;  // may be NULL
  void* release_ctx = nullptr;
  int32_t device = 0;
  int32_t dlpack_device_type = 0;  // what buffer_native reports for it
};

inline bool is_imported(const bp_buffer* b) noexcept {
  return (reinterpret_cast<uintptr_t>(b) & 1u) != 0;
}
inline ImportedBuffer* imported_record(bp_buffer* b) noexcept {
  return reinterpret_cast<ImportedBuffer*>(reinterpret_cast<uintptr_t>(b) & ~uintptr_t{1});
}
// The handle of a new record (ownership passes to the handle: release_imported frees it).
inline bp_buffer* imported_handle(ImportedBuffer* r) noexcept {
  return reinterpret_cast<bp_buffer*>(reinterpret_cast<uintptr_t>(r) | 1u);
}
// The address a handle stands for: its own address, or the imported memory's.
inline char* buffer_address(bp_buffer* b) noexcept {
  return is_imported(b) ? static_cast<char*>(imported_record(b)->address)
                        : reinterpret_cast<char*>(b);
}
inline const char* buffer_address(const bp_buffer* b) noexcept {
  return buffer_address(const_cast<bp_buffer*>(b));
}
// Calls the owner's release (once) and deletes the record of an imported handle. The caller
// guarantees that no queued work still uses the memory (Note [Imported memory]) and holds no
// lock that release could need: release may call back into the plugin.
inline void release_imported(bp_buffer* b) noexcept {
  ImportedBuffer* r = imported_record(b);
  bp_release_fn fn = r->release;
  void* ctx = r->release_ctx;
  delete r;
  if (fn) fn(ctx);
}

// Base class of a backend. One instance per process, created on first call to the entry
// symbol. Slots whose has_*() answers false are left NULL in the table, so the host applies
// the documented default.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual void init() {}
  virtual void shutdown() {}
  virtual int32_t device_count(const char** out_reason) = 0;
  virtual void device_properties(int32_t device, bp_device_properties& props) = 0;

  virtual bp_stream* stream_create(int32_t device) = 0;
  virtual void stream_destroy(bp_stream* stream) = 0;
  virtual void stream_synchronize(bp_stream* stream) = 0;

  virtual bool has_events() const { return false; }
  virtual bp_event* event_create(int32_t) { fail(BP_ERROR_UNSUPPORTED, "events"); }
  virtual void event_destroy(bp_event*) {}
  virtual void event_record(bp_event*, bp_stream*) {}
  virtual void stream_wait_event(bp_stream*, bp_event*) {}
  virtual void event_synchronize(bp_event*) {}
  virtual bool has_event_timing() const { return false; }
  virtual double event_elapsed_ms(bp_event*, bp_event*) { return 0.0; }

  virtual bp_buffer* mem_alloc(int32_t device, bp_stream* stream, uint64_t size) = 0;
  virtual void mem_free(int32_t device, bp_stream* stream, bp_buffer* buf, uint64_t size) = 0;
  virtual bool has_host_pointer() const { return false; }
  virtual void* mem_host_pointer(bp_buffer*) { return nullptr; }
  virtual void memory_stats(int32_t device, bp_memory_stats& stats) = 0;
  virtual void memory_reset_peak(int32_t device) = 0;
  virtual bool has_empty_cache() const { return false; }
  virtual void memory_empty_cache(int32_t) {}

  virtual bool has_host_alloc() const { return false; }
  virtual void* host_alloc(int32_t, uint64_t) { return nullptr; }
  virtual void host_free(int32_t, void*) {}

  virtual void memset(bp_stream* stream, bp_buffer* buf, uint64_t offset, int32_t value,
                      uint64_t size) = 0;
  virtual void copy_h2d(bp_stream* s, bp_buffer* dst, uint64_t dst_off, const void* src,
                        uint64_t size) = 0;
  virtual void copy_d2h(bp_stream* s, void* dst, bp_buffer* src, uint64_t src_off,
                        uint64_t size) = 0;
  virtual void copy_d2d(bp_stream* s, bp_buffer* dst, uint64_t dst_off, bp_buffer* src,
                        uint64_t src_off, uint64_t size) = 0;
  virtual bool has_copy_peer() const { return false; }
  virtual void copy_peer(bp_stream*, int32_t, bp_buffer*, uint64_t, int32_t, bp_buffer*, uint64_t,
                         uint64_t) {}

  // The kernel of catalogue op `op` (bp_op) for `dtype`; returns nullptr (or throws
  // BP_ERROR_UNSUPPORTED) when the pair is not implemented. Serves both find_kernel_id and
  // find_kernel (whose name the SDK maps to the number). `op` and `dtype` may be out of range
  // (a newer host): answer nullptr or BP_ERROR_UNSUPPORTED then.
  virtual bp_kernel* find_kernel_id(int32_t device, int32_t op, int32_t dtype) = 0;
  virtual void launch(bp_kernel* kernel, bp_stream* stream, const bp_tensor_desc* inputs,
                      int32_t num_inputs, const bp_tensor_desc* outputs, int32_t num_outputs,
                      const Attrs& attrs) = 0;

  virtual bool has_list_ops() const { return false; }
  virtual void list_ops(int32_t, const bp_op_support** out_list, int32_t* out_count) {
    *out_list = nullptr;
    *out_count = 0;
  }

  // ---- minor 2: native handles (Note [Native handles] in plugin_abi.h) ----
  // Each pair: has_*() true sets the slot. The SDK has already checked the pointers it can
  // (out parameters, a NULL stream, a NULL address with a non-zero size) and copies `out` into
  // the caller's struct up to its struct_size.
  virtual bool has_buffer_native() const { return false; }
  virtual void buffer_native(bp_buffer*, uint64_t, bp_native_buffer&) {
    fail(BP_ERROR_UNSUPPORTED, "buffer_native is not implemented");
  }
  virtual bool has_stream_native() const { return false; }
  virtual void* stream_native(bp_stream*) {
    fail(BP_ERROR_UNSUPPORTED, "stream_native is not implemented");
  }
  // On success the backend owns the duty to call release(ctx) once (Note [Imported memory]);
  // when it throws, release must not have been called.
  virtual bool has_buffer_import() const { return false; }
  virtual bp_buffer* buffer_import(int32_t, void*, uint64_t, bp_release_fn, void*) {
    fail(BP_ERROR_UNSUPPORTED, "buffer_import is not implemented");
  }
  virtual bool has_stream_import() const { return false; }
  virtual bp_stream* stream_import(int32_t, void*) {
    fail(BP_ERROR_UNSUPPORTED, "stream_import is not implemented");
  }

  // ---- minor 3: native graphs (Note [Native graphs] in plugin_abi.h) ----
  // has_graphs() true sets all five slots; false leaves them NULL and libbackplane records the
  // launches itself. The SDK has checked the stream, graph and out pointers for NULL.
  virtual bool has_graphs() const { return false; }
  virtual void graph_begin_capture(bp_stream*) {
    fail(BP_ERROR_UNSUPPORTED, "graph_begin_capture is not implemented");
  }
  virtual bp_graph* graph_end_capture(bp_stream*) {
    fail(BP_ERROR_UNSUPPORTED, "graph_end_capture is not implemented");
  }
  virtual void graph_instantiate(bp_graph*) {
    fail(BP_ERROR_UNSUPPORTED, "graph_instantiate is not implemented");
  }
  virtual void graph_launch(bp_graph*, bp_stream*) {
    fail(BP_ERROR_UNSUPPORTED, "graph_launch is not implemented");
  }
  virtual void graph_destroy(bp_graph*) {}

  // ---- minor 6: asynchronous errors (Note [Asynchronous errors] in plugin_abi.h) ----
  // has_stream_fault() true sets op_begin (the SDK keeps the id: take_op_id) and stream_fault,
  // which fills `out` (zeroed, struct_size set) from the stream's record and clears it when
  // asked (bp::sdk::FaultRecord does both). The SDK has checked the pointers.
  virtual bool has_stream_fault() const { return false; }
  virtual void stream_fault(bp_stream*, bool /*clear*/, bp_stream_fault& /*out*/) {}
};

// Fills a bp_plugin_api table that forwards to the Backend returned by `get`.
template <Backend& (*get)(), const char* const* kName>
struct Table {
  static const char* name() { return *kName; }
  static bp_kernel* find_checked(int32_t d, int32_t op, int32_t dtype) {
    bp_kernel* k = get().find_kernel_id(d, op, dtype);
    if (!k)
      fail(BP_ERROR_UNSUPPORTED, format("%s: no kernel for op '%s' with dtype %s", *kName,
                                        bp_op_name(op), bp_dtype_name(dtype)));
    return k;
  }
  template <typename F>
  static bp_error* run(F&& f) noexcept {
    return guarded(*kName, std::forward<F>(f));
  }
  static void build(bp_plugin_api& t, const char* type, const char* version) {
    Backend& b = get();
    t.struct_size = sizeof(bp_plugin_api);
    t.abi_major = BP_ABI_MAJOR;
    t.abi_minor = BP_ABI_MINOR;
    t.name = *kName;
    t.device_type = type;
    t.version = version;
    t.error_free = [](bp_error* e) { free_error(e); };
    t.init = []() { return run([] { get().init(); }); };
    t.shutdown = []() {
      try {
        get().shutdown();
      } catch (...) {
      }
    };
    t.device_count = [](const char** reason) -> int32_t {
      static const char* empty = "";
      *reason = empty;
      try {
        return get().device_count(reason);
      } catch (const std::exception& e) {
        static thread_local std::string why;
        why = e.what();
        *reason = why.c_str();
        return 0;
      }
    };
    t.device_properties = [](int32_t d, bp_device_properties* p) {
      return run([&] {
        if (!p || p->struct_size < sizeof(size_t))
          fail(BP_ERROR_INVALID_ARGUMENT,
               "device_properties: out_props is NULL or its struct_size is not set");
        bp_device_properties full{};
        full.struct_size = sizeof(full);
        get().device_properties(d, full);
        size_t n = p->struct_size < sizeof(full) ? p->struct_size : sizeof(full);
        std::memcpy(reinterpret_cast<char*>(p) + sizeof(size_t),
                    reinterpret_cast<char*>(&full) + sizeof(size_t), n - sizeof(size_t));
      });
    };
    t.stream_create = [](int32_t d, bp_stream** out) {
      return run([&] { *out = get().stream_create(d); });
    };
    t.stream_destroy = [](bp_stream* s) { return run([&] { get().stream_destroy(s); }); };
    t.stream_synchronize = [](bp_stream* s) { return run([&] { get().stream_synchronize(s); }); };
    if (b.has_events()) {
      t.event_create = [](int32_t d, bp_event** out) {
        return run([&] { *out = get().event_create(d); });
      };
      t.event_destroy = [](bp_event* e) { return run([&] { get().event_destroy(e); }); };
      t.event_record = [](bp_event* e, bp_stream* s) {
        return run([&] { get().event_record(e, s); });
      };
      t.stream_wait_event = [](bp_stream* s, bp_event* e) {
        return run([&] { get().stream_wait_event(s, e); });
      };
      t.event_synchronize = [](bp_event* e) { return run([&] { get().event_synchronize(e); }); };
    }
    if (b.has_events() && b.has_event_timing()) {
      t.event_elapsed_ms = [](bp_event* a, bp_event* c, double* ms) {
        return run([&] { *ms = get().event_elapsed_ms(a, c); });
      };
    }
    t.mem_alloc = [](int32_t d, bp_stream* s, uint64_t n, bp_buffer** out) {
      return run([&] { *out = get().mem_alloc(d, s, n); });
    };
    t.mem_free = [](int32_t d, bp_stream* s, bp_buffer* buf, uint64_t n) {
      return run([&] {
        if (buf) get().mem_free(d, s, buf, n);
      });
    };
    if (b.has_host_pointer()) {
      t.mem_host_pointer = [](bp_buffer* buf) -> void* {
        try {
          return get().mem_host_pointer(buf);
        } catch (...) {
          return nullptr;
        }
      };
    }
    t.memory_stats = [](int32_t d, bp_memory_stats* out) {
      return run([&] {
        if (!out || out->struct_size < sizeof(size_t))
          fail(BP_ERROR_INVALID_ARGUMENT,
               "memory_stats: out_stats is NULL or its struct_size is not set");
        bp_memory_stats full{};
        full.struct_size = sizeof(full);
        get().memory_stats(d, full);
        size_t n = out->struct_size < sizeof(full) ? out->struct_size : sizeof(full);
        std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
                    reinterpret_cast<char*>(&full) + sizeof(size_t), n - sizeof(size_t));
      });
    };
    t.memory_reset_peak = [](int32_t d) { return run([&] { get().memory_reset_peak(d); }); };
    if (b.has_empty_cache()) {
      t.memory_empty_cache = [](int32_t d) { return run([&] { get().memory_empty_cache(d); }); };
    }
    if (b.has_host_alloc()) {
      t.host_alloc = [](int32_t d, uint64_t n, void** out) {
        return run([&] { *out = get().host_alloc(d, n); });
      };
      t.host_free = [](int32_t d, void* p) { return run([&] { get().host_free(d, p); }); };
    }
    t.memset = [](bp_stream* s, bp_buffer* buf, uint64_t off, int32_t v, uint64_t n) {
      return run([&] { get().memset(s, buf, off, v, n); });
    };
    t.copy_h2d = [](bp_stream* s, bp_buffer* dst, uint64_t off, const void* src, uint64_t n) {
      return run([&] { get().copy_h2d(s, dst, off, src, n); });
    };
    t.copy_d2h = [](bp_stream* s, void* dst, bp_buffer* src, uint64_t off, uint64_t n) {
      return run([&] { get().copy_d2h(s, dst, src, off, n); });
    };
    t.copy_d2d = [](bp_stream* s, bp_buffer* dst, uint64_t doff, bp_buffer* src, uint64_t soff,
                    uint64_t n) {
      return run([&] { get().copy_d2d(s, dst, doff, src, soff, n); });
    };
    if (b.has_copy_peer()) {
      t.copy_peer = [](bp_stream* s, int32_t dd, bp_buffer* dst, uint64_t doff, int32_t sd,
                       bp_buffer* src, uint64_t soff, uint64_t n) {
        return run([&] { get().copy_peer(s, dd, dst, doff, sd, src, soff, n); });
      };
    }
    t.find_kernel = [](int32_t d, const char* op, int32_t dtype, bp_kernel** out) {
      return run([&] {
        const int32_t id = bp_op_from_name(op);
        if (id < 0)
          fail(BP_ERROR_UNSUPPORTED,
               format("%s: '%s' is not an op of the catalogue", *kName, op ? op : "(NULL)"));
        *out = find_checked(d, id, dtype);
      });
    };
    t.find_kernel_id = [](int32_t d, int32_t op, int32_t dtype, bp_kernel** out) {
      return run([&] { *out = find_checked(d, op, dtype); });
    };
    t.launch = [](bp_kernel* k, bp_stream* s, const bp_tensor_desc* in, int32_t nin,
                  const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs, int32_t na) {
      return run([&] {
        const Attrs a(attrs, na);
        a.validate();
        get().launch(k, s, in, nin, out, nout, a);
      });
    };
    if (b.has_list_ops()) {
      t.list_ops = [](int32_t d, const bp_op_support** out, int32_t* count) {
        return run([&] { get().list_ops(d, out, count); });
      };
    }
    if (b.has_buffer_native()) {
      t.buffer_native = [](bp_buffer* buf, uint64_t off, bp_native_buffer* out) {
        return run([&] {
          if (!out || out->struct_size < sizeof(size_t))
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: buffer_native: out_native is NULL or its struct_size is not set",
                        *kName));
          if (!buf)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: buffer_native: buffer is NULL (a 0-byte allocation has no native "
                        "address)",
                        *kName));
          bp_native_buffer full{};
          full.struct_size = sizeof(full);
          get().buffer_native(buf, off, full);
          size_t n = out->struct_size < sizeof(full) ? out->struct_size : sizeof(full);
          std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
                      reinterpret_cast<char*>(&full) + sizeof(size_t), n - sizeof(size_t));
        });
      };
    }
    if (b.has_stream_native()) {
      t.stream_native = [](bp_stream* s, void** out) {
        return run([&] {
          if (!out)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: stream_native: out_native is NULL", *kName));
          if (!s)
            fail(BP_ERROR_INVALID_ARGUMENT, format("%s: stream_native: stream is NULL", *kName));
          *out = get().stream_native(s);
        });
      };
    }
    if (b.has_buffer_import()) {
      t.buffer_import = [](int32_t d, void* address, uint64_t size, bp_release_fn release,
                           void* ctx, bp_buffer** out) {
        return run([&] {
          if (!out)
            fail(BP_ERROR_INVALID_ARGUMENT, format("%s: buffer_import: out_buf is NULL", *kName));
          if (!address && size != 0)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: buffer_import: address is NULL for %llu bytes (only an empty "
                        "buffer may have a NULL address)",
                        *kName, static_cast<unsigned long long>(size)));
          *out = get().buffer_import(d, address, size, release, ctx);
        });
      };
    }
    if (b.has_stream_import()) {
      t.stream_import = [](int32_t d, void* native, bp_stream** out) {
        return run([&] {
          if (!out)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: stream_import: out_stream is NULL", *kName));
          *out = get().stream_import(d, native);
        });
      };
    }
    if (b.has_graphs()) {
      t.graph_begin_capture = [](bp_stream* s) {
        return run([&] {
          if (!s)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: graph_begin_capture: stream is NULL", *kName));
          get().graph_begin_capture(s);
        });
      };
      t.graph_end_capture = [](bp_stream* s, bp_graph** out) {
        return run([&] {
          if (!s || !out)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: graph_end_capture: stream or out_graph is NULL", *kName));
          *out = nullptr;
          *out = get().graph_end_capture(s);
        });
      };
      t.graph_instantiate = [](bp_graph* g) {
        return run([&] {
          if (!g)
            fail(BP_ERROR_INVALID_ARGUMENT, format("%s: graph_instantiate: graph is NULL", *kName));
          get().graph_instantiate(g);
        });
      };
      t.graph_launch = [](bp_graph* g, bp_stream* s) {
        return run([&] {
          if (!g || !s)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: graph_launch: graph or stream is NULL", *kName));
          get().graph_launch(g, s);
        });
      };
      t.graph_destroy = [](bp_graph* g) {
        return run([&] {
          if (g) get().graph_destroy(g);
        });
      };
    }
    if (b.has_stream_fault()) {
      t.op_begin = [](uint64_t id) { op_id_slot() = id; };
      t.stream_fault = [](bp_stream* s, int32_t clear, bp_stream_fault* out) {
        return run([&] {
          if (!s || !out || out->struct_size < sizeof(size_t))
            fail(BP_ERROR_INVALID_ARGUMENT,
                 format("%s: stream_fault: stream or out_fault is NULL, or its struct_size is "
                        "not set",
                        *kName));
          bp_stream_fault full{};
          full.struct_size = sizeof(full);
          get().stream_fault(s, clear != 0, full);
          const size_t n = out->struct_size < sizeof(full) ? out->struct_size : sizeof(full);
          std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
                      reinterpret_cast<const char*>(&full) + sizeof(size_t), n - sizeof(size_t));
        });
      };
    }
  }
};

}  // namespace bp::sdk

// Defines the plugin's entry symbol for backend class `Class`.
#define BP_SDK_DEFINE_PLUGIN(Class, kNameLit, kTypeLit, kVersionLit)                        \
  namespace {                                                                               \
  const char* const bp_sdk_plugin_name = kNameLit;                                          \
  bp::sdk::Backend& bp_sdk_backend() {                                                      \
    static Class* instance = new Class(); /* never destroyed: lives as long as the .so */   \
    return *instance;                                                                       \
  }                                                                                         \
  }                                                                                         \
  extern "C" BP_PLUGIN_EXPORT const bp_plugin_api* bp_plugin_get_api(uint32_t host_major,   \
                                                                     uint32_t host_minor) { \
    /* The host compares versions and reports a mismatch with both numbers. */              \
    (void)host_major;                                                                       \
    (void)host_minor;                                                                       \
    static bp_plugin_api table = [] {                                                       \
      bp_plugin_api t{};                                                                    \
      bp::sdk::Table<bp_sdk_backend, &bp_sdk_plugin_name>::build(t, kTypeLit, kVersionLit); \
      return t;                                                                             \
    }();                                                                                    \
    return &table;                                                                          \
  }

#endif  // BACKPLANE_PLUGIN_SDK_HPP_
