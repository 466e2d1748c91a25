// The OpenCL backend plugin: the only file that touches the ABI table (through the SDK).
// Serves every device of every OpenCL platform the ICD loader finds as opencl:0..N-1.
#include "opencl_allocator.hpp"
#include "opencl_common.hpp"
#include "opencl_device.hpp"
#include "opencl_kernels.hpp"
#include "opencl_program.hpp"

#include <backplane/sdk/plugin_sdk.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

namespace bp::opencl {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What event_record hands to the marker's completion callback. The driver calls the callback
// on a thread of its own and synchronises with the registering thread in ways a race detector
// may not see (PoCL is not instrumented), so the hand-off itself is ordered: the record
// publishes the block with a release store, the callback acquires it before reading.
struct MarkerCallback {
  std::atomic<bool> published{false};
  std::shared_ptr<bp_event::HostStamp> stamp;  // keeps the stamp alive until completion
};

void CL_CALLBACK on_marker_complete(cl_event, cl_int, void* user) {
  auto* cb = static_cast<MarkerCallback*>(user);
  while (!cb->published.load(std::memory_order_acquire)) {
  }  // set before the callback was registered: never spins
  cb->stamp->ns.store(steady_ns());
  delete cb;
}

// The kernels resolved on one device, created on first find_kernel of each (op, dtype).
struct DeviceKernels {
  std::mutex mutex;
  std::array<std::array<std::unique_ptr<bp_kernel>, BP_DTYPE_COUNT>, kOpCount> table;
};

class OpenclBackend final : public sdk::Backend {
 public:
  void init() override {
    std::call_once(init_once_, [this] {
      Discovery d = discover_devices();
      devices_ = std::move(d.devices);
      reason_ = std::move(d.reason);
      for (size_t i = 0; i < devices_.size(); ++i)
        kernels_.push_back(std::make_unique<DeviceKernels>());
    });
  }

  void shutdown() override {
    kernels_.clear();
    devices_.clear();
  }

  int32_t device_count(const char** out_reason) override {
    init();
    if (devices_.empty()) *out_reason = reason_.c_str();
    return static_cast<int32_t>(devices_.size());
  }

  void device_properties(int32_t d, bp_device_properties& p) override {
    Device& dev = device(d);
    const DeviceInfo& info = dev.info();
    sdk::copy_string(p.name, info.name + " [" + short_version(info.version) + "]");
    sdk::copy_string(p.vendor, info.vendor);
    sdk::copy_string(p.uuid, info.uuid);
    sdk::copy_string(p.pci_bus_id, info.pci_bus_id);
    p.total_memory = info.global_memory;
    uint64_t held = dev.allocator().reserved();
    p.free_memory = info.global_memory > held ? info.global_memory - held : 0;
    p.compute_major = info.compute_major;
    p.compute_minor = info.compute_minor;
    p.cores = static_cast<int32_t>(info.compute_units);
    p.supports_f64 = info.fp64 ? 1 : 0;
    p.unified_memory = 0;
    p.kind = info.kind;
  }

  // ---- Streams ----

  bp_stream* stream_create(int32_t d) override {
    Device& dev = device(d);
    cl_command_queue q = dev.create_queue();
    uint64_t id = dev.register_stream(q);
    return new bp_stream{&dev, q, id};
  }

  void stream_destroy(bp_stream* s) override {
    if (!s) return;
    // A wrapped foreign queue keeps its pending work (Note [Native handles]): only flush it.
    cl_int status = s->imported ? clFlush(s->queue) : clFinish(s->queue);
    s->device->unregister_stream(s->id);
    clReleaseCommandQueue(s->queue);
    Device* dev = s->device;
    delete s;
    if (status != CL_SUCCESS) fail_cl(status, "clFinish", dev->label() + ": destroying a stream");
  }

  void stream_synchronize(bp_stream* s) override {
    check_stream(s, "stream_synchronize");
    BP_CL_CHECK(clFinish(s->queue), s->device->label() + ": stream_synchronize");
  }

  // ---- Events ----

  bool has_events() const override { return true; }
  bool has_event_timing() const override { return true; }

  bp_event* event_create(int32_t d) override {
    auto* e = new bp_event;
    e->device = &device(d);
    return e;
  }

  void event_destroy(bp_event* e) override {
    if (!e) return;
    if (e->marker) clReleaseEvent(e->marker);
    delete e;
  }

  void event_record(bp_event* e, bp_stream* s) override {
    check_event(e, "event_record");
    check_stream(s, "event_record");
    if (e->device != s->device)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("opencl: event_record: event of %s recorded on a stream of %s",
                            e->device->label().c_str(), s->device->label().c_str()));
    cl_event marker = nullptr;
    BP_CL_CHECK(clEnqueueMarkerWithWaitList(s->queue, 0, nullptr, &marker),
                s->device->label() + ": event_record");
    auto stamp = std::make_shared<bp_event::HostStamp>();
    auto* user = new MarkerCallback;
    user->stamp = stamp;
    user->published.store(true, std::memory_order_release);
    if (clSetEventCallback(marker, CL_COMPLETE, on_marker_complete, user) != CL_SUCCESS)
      delete user;
    std::lock_guard<std::mutex> lock(e->mutex);
    if (e->marker) clReleaseEvent(e->marker);
    e->marker = marker;
    e->stamp = std::move(stamp);
  }

  void stream_wait_event(bp_stream* s, bp_event* e) override {
    check_stream(s, "stream_wait_event");
    check_event(e, "stream_wait_event");
    cl_event marker = retained_marker(e);
    if (!marker) return;  // never recorded: nothing to wait for
    cl_int status = e->device == s->device
                        ? clEnqueueBarrierWithWaitList(s->queue, 1, &marker, nullptr)
                        : clWaitForEvents(1, &marker);  // other context: wait on the host
    clReleaseEvent(marker);
    if (status != CL_SUCCESS)
      fail_cl(status, "clEnqueueBarrierWithWaitList", s->device->label() + ": stream_wait_event");
  }

  void event_synchronize(bp_event* e) override {
    check_event(e, "event_synchronize");
    cl_event marker = retained_marker(e);
    if (!marker) return;
    cl_int status = clWaitForEvents(1, &marker);
    clReleaseEvent(marker);
    if (status != CL_SUCCESS)
      fail_cl(status, "clWaitForEvents", e->device->label() + ": event_synchronize");
  }

  // Note [Event timing]: the difference of CL_PROFILING_COMMAND_END of the two markers (all our
  // queues have profiling enabled). Drivers that give markers no profiling data fall back to
  // the host clock read when each marker's completion callback ran.
  double event_elapsed_ms(bp_event* a, bp_event* b) override {
    check_event(a, "event_elapsed_ms");
    check_event(b, "event_elapsed_ms");
    cl_event ma = retained_marker(a), mb = retained_marker(b);
    struct Release {
      cl_event e;
      ~Release() {
        if (e) clReleaseEvent(e);
      }
    } ra{ma}, rb{mb};
    if (!ma || !mb)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                "opencl: event_elapsed_ms: both events must have been recorded");
    cl_event both[2] = {ma, mb};
    BP_CL_CHECK(clWaitForEvents(2, both), a->device->label() + ": event_elapsed_ms");
    if (a->device == b->device) {
      cl_ulong ta = 0, tb = 0;
      if (clGetEventProfilingInfo(ma, CL_PROFILING_COMMAND_END, sizeof ta, &ta, nullptr) ==
              CL_SUCCESS &&
          clGetEventProfilingInfo(mb, CL_PROFILING_COMMAND_END, sizeof tb, &tb, nullptr) ==
              CL_SUCCESS &&
          ta != 0 && tb != 0)
        return (static_cast<double>(tb) - static_cast<double>(ta)) * 1e-6;
    }
    int64_t ha = host_stamp(a), hb = host_stamp(b);
    if (ha == 0 || hb == 0)
      sdk::fail(BP_ERROR_DEVICE,
                "opencl: event_elapsed_ms: the driver reported neither profiling times nor "
                "completion callbacks for the markers",
                "CL_PROFILING_INFO_NOT_AVAILABLE");
    return static_cast<double>(hb - ha) * 1e-6;
  }

  // ---- Memory ----

  bp_buffer* mem_alloc(int32_t d, bp_stream* s, uint64_t size) override {
    Device& dev = device(d);
    if (s && s->device != &dev) mismatch("mem_alloc", dev, s);
    bp_buffer* buf = dev.allocator().allocate(size, s);
    dev.allocator().counters().on_alloc(size);
    return buf;
  }

  void mem_free(int32_t d, bp_stream* s, bp_buffer* buf, uint64_t) override {
    Device& dev = device(d);
    if (buf->device != d)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("opencl: mem_free: buffer of opencl:%d freed on %s", buf->device,
                            dev.label().c_str()));
    if (s && s->device != &dev) mismatch("mem_free", dev, s);
    dev.allocator().counters().on_free(buf->size);
    dev.allocator().release(buf, s);
  }

  void memory_stats(int32_t d, bp_memory_stats& stats) override {
    stats = device(d).allocator().stats();
  }
  void memory_reset_peak(int32_t d) override { device(d).allocator().counters().reset_peak(); }
  bool has_empty_cache() const override { return true; }
  void memory_empty_cache(int32_t d) override { device(d).allocator().empty_cache(); }

  // ---- Copies ----
  // Note [Copy semantics]: host<->device copies are blocking (the host memory is free to
  // change as soon as the call returns, stricter than the ABI asks); they run in stream order.

  void memset(bp_stream* s, bp_buffer* buf, uint64_t off, int32_t value, uint64_t size) override {
    check_stream(s, "memset");
    if (size == 0) return;
    check_range(buf, off, size, "memset");
    cl_uchar byte = static_cast<cl_uchar>(value);
    BP_CL_CHECK(clEnqueueFillBuffer(s->queue, buf->mem, &byte, 1, off, size, 0, nullptr, nullptr),
                s->device->label() +
                    sdk::format(": memset of %llu bytes at offset %llu", ull(size), ull(off)));
  }

  void copy_h2d(bp_stream* s, bp_buffer* dst, uint64_t off, const void* src,
                uint64_t size) override {
    check_stream(s, "copy_h2d");
    if (size == 0) return;
    check_range(dst, off, size, "copy_h2d");
    BP_CL_CHECK(
        clEnqueueWriteBuffer(s->queue, dst->mem, CL_TRUE, off, size, src, 0, nullptr, nullptr),
        s->device->label() +
            sdk::format(": copy_h2d of %llu bytes to offset %llu", ull(size), ull(off)));
  }

  void copy_d2h(bp_stream* s, void* dst, bp_buffer* src, uint64_t off, uint64_t size) override {
    check_stream(s, "copy_d2h");
    if (size == 0) return;
    check_range(src, off, size, "copy_d2h");
    BP_CL_CHECK(
        clEnqueueReadBuffer(s->queue, src->mem, CL_TRUE, off, size, dst, 0, nullptr, nullptr),
        s->device->label() +
            sdk::format(": copy_d2h of %llu bytes from offset %llu", ull(size), ull(off)));
  }

  void copy_d2d(bp_stream* s, bp_buffer* dst, uint64_t doff, bp_buffer* src, uint64_t soff,
                uint64_t size) override {
    check_stream(s, "copy_d2d");
    if (size == 0) return;
    check_range(dst, doff, size, "copy_d2d (destination)");
    check_range(src, soff, size, "copy_d2d (source)");
    std::string what =
        s->device->label() + sdk::format(": copy_d2d of %llu bytes from offset %llu to offset %llu",
                                         ull(size), ull(soff), ull(doff));
    if (dst->mem == src->mem) {
      if (doff == soff) return;
      bool overlap = soff < doff + size && doff < soff + size;
      if (overlap) {  // OpenCL refuses overlapping copies: go through a temporary buffer
        Allocator& alloc = s->device->allocator();
        bp_buffer* tmp = alloc.allocate(size, s);
        cl_int st =
            clEnqueueCopyBuffer(s->queue, src->mem, tmp->mem, soff, 0, size, 0, nullptr, nullptr);
        if (st == CL_SUCCESS)
          st =
              clEnqueueCopyBuffer(s->queue, tmp->mem, dst->mem, 0, doff, size, 0, nullptr, nullptr);
        alloc.release(tmp, s);
        if (st != CL_SUCCESS) fail_cl(st, "clEnqueueCopyBuffer", what);
        return;
      }
    }
    BP_CL_CHECK(
        clEnqueueCopyBuffer(s->queue, src->mem, dst->mem, soff, doff, size, 0, nullptr, nullptr),
        what);
  }

  // ---- Kernels ----

  // The op table answers which pairs exist (and why not); kernels are created on a device's
  // first find of each pair.
  bp_kernel* find_kernel_id(int32_t d, int32_t id, int32_t dtype) override {
    Device& dev = device(d);
    (dev.info().fp64 ? ops_fp64_ : ops_no_fp64_).require(id, dtype);
    const Op op = static_cast<Op>(id);
    const OpInfo& info = op_info(op);
    DeviceKernels& dk = *kernels_[static_cast<size_t>(d)];
    std::lock_guard<std::mutex> lock(dk.mutex);
    std::unique_ptr<bp_kernel>& slot = dk.table[static_cast<size_t>(op)][dtype];
    if (slot) return slot.get();
    cl_program program = dev.programs().get(dtype, info.family);
    auto k = std::make_unique<bp_kernel>(&dev, op, dtype);
    switch (info.family) {
      case Family::kElementwise:
        create_elementwise_kernels(*k, program);
        break;
      case Family::kReduction:
        create_reduction_kernels(*k, program);
        break;
      case Family::kMatmul:
        create_matmul_kernels(*k, program);
        break;
      case Family::kRandom:
        create_random_kernels(*k, program);
        break;
      case Family::kConv:
        create_conv_kernels(*k, program);
        break;
      case Family::kPool:
        create_pool_kernels(*k, program);
        break;
      case Family::kNorm:
        create_norm_kernels(*k, program);
        break;
      case Family::kIndex:
        create_index_kernels(*k, program);
        break;
      case Family::kSoftmax:
        create_softmax_kernels(*k, program);
        break;
      case Family::kTransformer:
        create_transformer_kernels(*k, program);
        break;
      case Family::kAttention:
        create_attention_kernels(*k, program);
        break;
      case Family::kOptim:
        create_optim_kernels(*k, program);
        break;
      case Family::kLoss:
        create_loss_kernels(*k, program);
        break;
    }
    slot = std::move(k);
    return slot.get();
  }

  void launch(bp_kernel* k, bp_stream* s, const bp_tensor_desc* in, int32_t num_in,
              const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) override {
    if (!k) sdk::fail(BP_ERROR_INVALID_ARGUMENT, "opencl: launch: kernel is NULL");
    if (num_in < 0 || num_out < 0 || (num_in > 0 && !in) || (num_out > 0 && !out))
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("opencl: %s: bad tensor lists (%d inputs, %d outputs)",
                            op_label(*k).c_str(), num_in, num_out));
    if (s && s->device != k->device)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("opencl: %s launched on a stream of %s", op_label(*k).c_str(),
                            s->device->label().c_str()));
    LaunchContext lc{*k->device, s, s ? s->queue : k->device->internal_queue()};
    switch (op_info(k->op).family) {
      case Family::kElementwise:
        launch_elementwise(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kReduction:
        launch_reduction(*k, lc, in, num_in, out, num_out);
        break;
      case Family::kMatmul:
        launch_matmul(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kRandom:
        launch_random(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kConv:
        launch_conv(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kPool:
        launch_pool(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kNorm:
        launch_norm(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kIndex:
        launch_index(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kSoftmax:
        launch_softmax(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kTransformer:
        launch_transformer(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kAttention:
        launch_attention(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kOptim:
        launch_optim(*k, lc, in, num_in, out, num_out, attrs);
        break;
      case Family::kLoss:
        launch_loss(*k, lc, in, num_in, out, num_out, attrs);
        break;
    }
    if (!s) BP_CL_CHECK(clFinish(lc.queue), op_label(*k) + ": launch without a stream");
  }

  bool has_list_ops() const override { return true; }
  void list_ops(int32_t d, const bp_op_support** out_list, int32_t* out_count) override {
    (device(d).info().fp64 ? ops_fp64_ : ops_no_fp64_).list(out_list, out_count);
  }

  // ---- Native handles ----
  // Note [OpenCL native handles]: a stream's native object is its cl_command_queue, and a
  // foreign in-order queue of the device's context can be wrapped (retained while wrapped, so
  // stream_destroy drops only our reference). Buffers are cl_mem objects, which have no
  // address a pointer-based consumer (DLPack, NCCL) could use, so buffer_native and
  // buffer_import answer BP_ERROR_UNSUPPORTED with that reason rather than being left NULL.

  bool has_buffer_native() const override { return true; }
  void buffer_native(bp_buffer* buf, uint64_t, bp_native_buffer&) override {
    sdk::fail(BP_ERROR_UNSUPPORTED,
              sdk::format("opencl:%d: buffer_native: OpenCL buffers are cl_mem objects, not "
                          "pointer-addressable memory; read them with a copy to the host (or to "
                          "a cpu tensor)",
                          buf->device));
  }
  bool has_stream_native() const override { return true; }
  void* stream_native(bp_stream* s) override { return s->queue; }
  bool has_buffer_import() const override { return true; }
  bp_buffer* buffer_import(int32_t d, void*, uint64_t, bp_release_fn, void*) override {
    sdk::fail(BP_ERROR_UNSUPPORTED,
              sdk::format("%s: buffer_import: OpenCL buffers are cl_mem objects; foreign "
                          "memory given by an address cannot be wrapped without copying (copy "
                          "it in from the host instead)",
                          device(d).label().c_str()));
  }
  bool has_stream_import() const override { return true; }
  bp_stream* stream_import(int32_t d, void* native) override {
    Device& dev = device(d);
    auto q = static_cast<cl_command_queue>(native);
    if (!q)
      sdk::fail(
          BP_ERROR_INVALID_ARGUMENT,
          sdk::format("%s: stream_import: the cl_command_queue is NULL", dev.label().c_str()));
    cl_context ctx = nullptr;
    cl_device_id id = nullptr;
    cl_command_queue_properties props = 0;
    cl_int st = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, nullptr);
    if (st == CL_SUCCESS) st = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof id, &id, nullptr);
    if (st == CL_SUCCESS)
      st = clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof props, &props, nullptr);
    if (st != CL_SUCCESS)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("%s: stream_import: %p is not a valid cl_command_queue (%s)",
                            dev.label().c_str(), native, cl_error_name(st).c_str()),
                cl_error_name(st));
    if (id != dev.id() || ctx != dev.context())
      sdk::fail(
          BP_ERROR_INVALID_ARGUMENT,
          sdk::format("%s: stream_import: the queue belongs to %s; a stream must use "
                      "the device's own context (create the queue with the context "
                      "of a Backplane stream's queue)",
                      dev.label().c_str(), id != dev.id() ? "another device" : "another context"));
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("%s: stream_import: the queue is out of order; streams are "
                            "in-order queues",
                            dev.label().c_str()));
    BP_CL_CHECK(clRetainCommandQueue(q), dev.label() + ": stream_import");
    uint64_t id_in_registry = dev.register_stream(q);
    return new bp_stream{&dev, q, id_in_registry, /*imported=*/true};
  }

 private:
  // "OpenCL 3.0 PoCL HSTR: pthread-..." -> "OpenCL 3.0 PoCL": the first three words.
  static std::string short_version(const std::string& v) {
    size_t pos = 0;
    for (int words = 0; words < 3 && pos != std::string::npos; ++words)
      pos = v.find(' ', pos == 0 && words == 0 ? 0 : pos + 1);
    return pos == std::string::npos ? v : v.substr(0, pos);
  }

  static unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

  Device& device(int32_t d) {
    init();
    if (d < 0 || static_cast<size_t>(d) >= devices_.size())
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("opencl: device index %d is out of range (%zu device(s))", d,
                            devices_.size()));
    return *devices_[static_cast<size_t>(d)];
  }

  static void check_stream(bp_stream* s, const char* what) {
    if (!s) sdk::fail(BP_ERROR_INVALID_ARGUMENT, sdk::format("opencl: %s: stream is NULL", what));
  }
  static void check_event(bp_event* e, const char* what) {
    if (!e) sdk::fail(BP_ERROR_INVALID_ARGUMENT, sdk::format("opencl: %s: event is NULL", what));
  }
  [[noreturn]] static void mismatch(const char* what, const Device& dev, bp_stream* s) {
    sdk::fail(BP_ERROR_INVALID_ARGUMENT,
              sdk::format("opencl: %s on %s with a stream of %s", what, dev.label().c_str(),
                          s->device->label().c_str()));
  }
  static void check_range(const bp_buffer* buf, uint64_t off, uint64_t size, const char* what) {
    if (!buf) sdk::fail(BP_ERROR_INVALID_ARGUMENT, sdk::format("opencl: %s: buffer is NULL", what));
    if (off > buf->size || size > buf->size - off)
      sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                sdk::format("opencl: %s: bytes [%llu, %llu) lie outside a %llu-byte buffer of "
                            "opencl:%d",
                            what, ull(off), ull(off + size), ull(buf->size), buf->device));
  }

  static cl_event retained_marker(bp_event* e) {
    std::lock_guard<std::mutex> lock(e->mutex);
    if (e->marker) clRetainEvent(e->marker);
    return e->marker;
  }
  static int64_t host_stamp(bp_event* e) {
    std::lock_guard<std::mutex> lock(e->mutex);
    return e->stamp ? e->stamp->ns.load() : 0;
  }

  // Every pair of every op's dtype domain, but f64 on a device without doubles (Note [fp64] in
  // opencl_device.cpp). Kernel handles are made per device on first find, so none is declared.
  static sdk::OpTable make_op_table(bool fp64) {
    return sdk::OpTable("opencl", [fp64](int32_t, int32_t dtype, bp_op_decl& decl) {
      if (dtype == BP_DTYPE_F64 && !fp64) {
        decl.reason = kNoFp64Reason;
      } else {
        decl.support = BP_SUPPORT_YES;
      }
    });
  }

  std::once_flag init_once_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::string reason_;
  std::vector<std::unique_ptr<DeviceKernels>> kernels_;
  const sdk::OpTable ops_fp64_ = make_op_table(true), ops_no_fp64_ = make_op_table(false);
};

}  // namespace
}  // namespace bp::opencl

BP_SDK_DEFINE_PLUGIN(bp::opencl::OpenclBackend, "opencl", "opencl", "1.0.0")
