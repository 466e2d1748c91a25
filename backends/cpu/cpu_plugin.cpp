// The CPU backend plugin: the one file that touches the ABI table (through the SDK's
// BP_SDK_DEFINE_PLUGIN). Device "cpu:0" is every core and the host memory.
//
// Note [CPU buffers]
//   A bp_buffer* is the host address of a 64-byte aligned tbbmalloc block (cpu_allocator.hpp),
//   so mem_host_pointer returns it unchanged and the host can skip staging copies.
//
// Note [CPU native handles]
//   buffer_native reports the host address (ordinal 0, kDLCPU). buffer_import wraps any host
//   memory as a tagged handle (Note [Tagged buffer handles] in plugin_sdk.hpp); because the
//   stream is eager, every use of the memory has finished when mem_free is called, so mem_free
//   calls the owner's release right there, on the freeing thread. Imported bytes are not
//   counted in memory_stats. Streams have no native object: stream_native answers NULL, and
//   stream_import accepts only NULL (the eager stream) and returns a new stream token.
//
// Note [CPU streams]
//   The CPU stream executes eagerly: every memset, copy and launch runs to completion on the
//   calling thread (and the oneTBB workers it fans out to) before the call returns. Streams
//   are therefore tokens, stream_synchronize and the waits on events are no-ops, and an event
//   records the steady_clock time at which everything before it had finished.
//
// Note [CPU backend under ThreadSanitizer]
//   oneTBB from the distribution is not instrumented: TSan cannot see its scheduler hand a
//   range to a worker and join it, and reports every parallel kernel's output, read after
//   parallel_for returns, as a race. A TSan build therefore limits oneTBB to the calling thread
//   (tbb::global_control max_allowed_parallelism 1): host threads still run kernels at once, so
//   every report is about code TSan can judge, and nothing needs suppressing.
//
// Note [oneTBB workers at exit]
//   oneTBB's own exit path (the static destructor of libtbb) only asks its workers to stop and
//   returns, so the workers exit while the process runs its remaining exit handlers. One of
//   them is LeakSanitizer's leak check: its tracer suspends every thread and reads each one's
//   thread-local storage, and a worker tearing down its dynamic TLS (libtbb and libgomp are
//   opened with the plugin, so their TLS is dynamic) under the tracer can crash it ("Tracer
//   caught signal 11", as the AddressSanitizer step did after a passing MathTest.Matmul). So init
//   takes a task_scheduler_handle and registers an exit handler that finalizes oneTBB, which
//   blocks until every worker has exited. The handler is registered after libtbb's static
//   constructors ran, so it runs before libtbb's destructor and before the leak check (whose
//   handler the sanitizer runtime registered first). If a thread still runs a oneTBB algorithm
//   then, finalize declines and the workers stop as before.
#include "cpu_allocator.hpp"
#include "cpu_device.hpp"
#include "cpu_kernels.hpp"

#include <backplane/abi/plugin_abi.h>
#include <backplane/sdk/plugin_sdk.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#define BP_CPU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BP_CPU_TSAN 1
#endif
#endif
#include <tbb/global_control.h>

#include <cstdlib>
#include <new>

namespace bp::cpu {
namespace {

// Note [oneTBB workers at exit].
tbb::task_scheduler_handle* g_tbb_handle = nullptr;

void finalize_tbb_at_exit() {
  if (g_tbb_handle) (void)tbb::finalize(*g_tbb_handle, std::nothrow);
}

struct CpuStream {
  int32_t device;
};

struct CpuEvent {
  int32_t device;
  std::atomic<int64_t> ns{-1};  // steady_clock time of the last record; -1 before one
};

void check_device(int32_t device, const char* what) {
  if (device != 0)
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                  bp::sdk::format("cpu: %s: device index %d does not exist (the cpu backend "
                                  "has one device, cpu:0)",
                                  what, static_cast<int>(device)));
}

char* address(bp_buffer* buf, uint64_t offset, uint64_t size, const char* what) {
  if (!buf && size != 0)
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                  bp::sdk::format("cpu:0: %s of %llu bytes on a NULL buffer", what,
                                  static_cast<unsigned long long>(size)));
  return bp::sdk::buffer_address(buf) + offset;
}

void check_host(const void* p, uint64_t size, const char* what) {
  if (!p && size != 0)
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                  bp::sdk::format("cpu:0: %s of %llu bytes with a NULL host pointer", what,
                                  static_cast<unsigned long long>(size)));
}

// The pairs the families implement; everything inside an op's dtype domain is (Note [Dtype
// domains] in plugin_abi.h), so no pair needs a reason of its own.
bp::sdk::OpTable make_op_table() {
  return bp::sdk::OpTable("cpu:0", [](int32_t op, int32_t dtype, bp_op_decl& d) {
    if (const CpuKernel* k = kernel_for(op, dtype)) {
      d.kernel = reinterpret_cast<bp_kernel*>(const_cast<CpuKernel*>(k));
      d.support = BP_SUPPORT_YES;
    }
  });
}

class CpuBackend final : public bp::sdk::Backend {
 public:
  void init() override {
    configure_thresholds_from_environment();
    configure_loops();
    configure_matmul();   // Note [One thread pool] in cpu_matmul.cpp
    if (!g_tbb_handle) {  // Note [oneTBB workers at exit]
      g_tbb_handle = new tbb::task_scheduler_handle(tbb::attach{});
      std::atexit(finalize_tbb_at_exit);
    }
#if BP_CPU_TSAN
    static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
#endif
  }

  int32_t device_count(const char** out_reason) override {
    *out_reason = "";
    return 1;
  }

  void device_properties(int32_t device, bp_device_properties& props) override {
    check_device(device, "device_properties");
    fill_device_properties(props);
  }

  // ---- Streams and events (Note [CPU streams]) ----
  bp_stream* stream_create(int32_t device) override {
    check_device(device, "stream_create");
    return reinterpret_cast<bp_stream*>(new CpuStream{device});
  }
  void stream_destroy(bp_stream* stream) override {
    delete reinterpret_cast<CpuStream*>(stream);
  }
  void stream_synchronize(bp_stream*) override {}

  bool has_events() const override {
    return true;
  }
  bool has_event_timing() const override {
    return true;
  }
  bp_event* event_create(int32_t device) override {
    check_device(device, "event_create");
    auto* e = new CpuEvent;
    e->device = device;
    return reinterpret_cast<bp_event*>(e);
  }
  void event_destroy(bp_event* event) override {
    delete reinterpret_cast<CpuEvent*>(event);
  }
  void event_record(bp_event* event, bp_stream*) override {
    if (!event) bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "cpu:0: event_record on a NULL event");
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    reinterpret_cast<CpuEvent*>(event)->ns.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(),
        std::memory_order_release);
  }
  void stream_wait_event(bp_stream*, bp_event*) override {}
  void event_synchronize(bp_event*) override {}
  double event_elapsed_ms(bp_event* start, bp_event* end) override {
    if (!start || !end)
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "cpu:0: event_elapsed_ms with a NULL event");
    const int64_t a = reinterpret_cast<CpuEvent*>(start)->ns.load(std::memory_order_acquire);
    const int64_t b = reinterpret_cast<CpuEvent*>(end)->ns.load(std::memory_order_acquire);
    if (a < 0 || b < 0)
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                    bp::sdk::format("cpu:0: event_elapsed_ms: the %s event was never recorded",
                                    a < 0 ? "start" : "end"));
    return static_cast<double>(b - a) * 1e-6;
  }

  // ---- Memory (Note [CPU buffers]) ----
  bp_buffer* mem_alloc(int32_t device, bp_stream*, uint64_t size) override {
    check_device(device, "mem_alloc");
    return reinterpret_cast<bp_buffer*>(allocator_.allocate(size));
  }
  void mem_free(int32_t device, bp_stream*, bp_buffer* buf, uint64_t size) override {
    check_device(device, "mem_free");
    if (bp::sdk::is_imported(buf)) {  // Note [CPU native handles]: nothing is queued
      bp::sdk::release_imported(buf);
      return;
    }
    allocator_.deallocate(buf, size);
  }
  bool has_host_pointer() const override {
    return true;
  }
  void* mem_host_pointer(bp_buffer* buf) override {
    return bp::sdk::buffer_address(buf);
  }
  void memory_stats(int32_t device, bp_memory_stats& stats) override {
    check_device(device, "memory_stats");
    stats = allocator_.stats();
  }
  void memory_reset_peak(int32_t device) override {
    check_device(device, "memory_reset_peak");
    allocator_.reset_peak();
  }
  bool has_empty_cache() const override {
    return true;
  }
  void memory_empty_cache(int32_t device) override {
    check_device(device, "memory_empty_cache");
    allocator_.release_cache();
  }

  // ---- Copies: eager memcpy/memset, parallel when large ----
  void memset(bp_stream*, bp_buffer* buf, uint64_t offset, int32_t value, uint64_t size) override {
    parallel_memset(address(buf, offset, size, "memset"), value, size);
  }
  void copy_h2d(bp_stream*, bp_buffer* dst, uint64_t dst_off, const void* src,
                uint64_t size) override {
    check_host(src, size, "copy_h2d");
    parallel_memcpy(address(dst, dst_off, size, "copy_h2d"), src, size);
  }
  void copy_d2h(bp_stream*, void* dst, bp_buffer* src, uint64_t src_off, uint64_t size) override {
    check_host(dst, size, "copy_d2h");
    parallel_memcpy(dst, address(src, src_off, size, "copy_d2h"), size);
  }
  void copy_d2d(bp_stream*, bp_buffer* dst, uint64_t dst_off, bp_buffer* src, uint64_t src_off,
                uint64_t size) override {
    parallel_memcpy(address(dst, dst_off, size, "copy_d2d"),
                    address(src, src_off, size, "copy_d2d"), size);
  }

  // ---- Kernels ----
  bp_kernel* find_kernel_id(int32_t device, int32_t op, int32_t dtype) override {
    check_device(device, "find_kernel");
    return ops_.find(op, dtype);
  }
  void launch(bp_kernel* kernel, bp_stream*, const bp_tensor_desc* inputs, int32_t num_inputs,
              const bp_tensor_desc* outputs, int32_t num_outputs,
              const bp::sdk::Attrs& attrs) override {
    if (!kernel) bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "cpu:0: launch of a NULL kernel");
    run_kernel(*reinterpret_cast<const CpuKernel*>(kernel), inputs, num_inputs, outputs,
               num_outputs, attrs);
  }

  bool has_list_ops() const override {
    return true;
  }
  void list_ops(int32_t device, const bp_op_support** out_list, int32_t* out_count) override {
    check_device(device, "list_ops");
    ops_.list(out_list, out_count);
  }

  // ---- Native handles (Note [CPU native handles]) ----
  bool has_buffer_native() const override {
    return true;
  }
  void buffer_native(bp_buffer* buf, uint64_t offset, bp_native_buffer& out) override {
    if (bp::sdk::is_imported(buf)) {
      const bp::sdk::ImportedBuffer& r = *bp::sdk::imported_record(buf);
      if (offset > r.size)
        bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                      bp::sdk::format("cpu:0: buffer_native: offset %llu is past the end of an "
                                      "imported buffer of %llu bytes",
                                      static_cast<unsigned long long>(offset),
                                      static_cast<unsigned long long>(r.size)));
    }
    out.address = bp::sdk::buffer_address(buf) + offset;
    out.device_ordinal = 0;
    out.dlpack_device_type = BP_DLPACK_CPU;
  }
  bool has_stream_native() const override {
    return true;
  }
  void* stream_native(bp_stream*) override {
    return nullptr;
  }
  bool has_buffer_import() const override {
    return true;
  }
  bp_buffer* buffer_import(int32_t device, void* address, uint64_t size, bp_release_fn release,
                           void* release_ctx) override {
    check_device(device, "buffer_import");
    auto* r = new bp::sdk::ImportedBuffer{address, size, release, release_ctx, 0, BP_DLPACK_CPU};
    return bp::sdk::imported_handle(r);
  }
  bool has_stream_import() const override {
    return true;
  }
  bp_stream* stream_import(int32_t device, void* native_stream) override {
    check_device(device, "stream_import");
    if (native_stream)
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                    bp::sdk::format("cpu:0: stream_import: %p is not a cpu stream; cpu streams "
                                    "are eager and have no native object (the only native cpu "
                                    "stream is NULL, what stream_native reports)",
                                    native_stream));
    return reinterpret_cast<bp_stream*>(new CpuStream{device});
  }

 private:
  CpuAllocator allocator_;
  const bp::sdk::OpTable ops_ = make_op_table();
};

}  // namespace
}  // namespace bp::cpu

BP_SDK_DEFINE_PLUGIN(bp::cpu::CpuBackend, "cpu", "cpu", "0.1.0")
