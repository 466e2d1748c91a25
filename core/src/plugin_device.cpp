// Device, Allocator, Stream, Event and Kernel implemented over a plugin's C table.
#include "registry.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bp {

// ---- Buffer ----------------------------------------------------------------------------------

Buffer::~Buffer() {
  static_cast<detail::PluginDevice*>(device_)->release(handle_, size_);
}

void* Buffer::host_pointer() const noexcept {
  return static_cast<detail::PluginDevice*>(device_)->host_pointer(handle_);
}

namespace detail {

namespace {
std::string format_bytes(uint64_t n) {
  char buf[64];
  if (n >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", n / double(1ull << 30));
  else if (n >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", n / double(1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  return buf;
}
}  // namespace

[[noreturn]] void throw_plugin_error(const bp_plugin_api* api, bp_error* err,
                                     const std::string& context, bool invalid_is_device_error) {
  int32_t code = err->code;
  std::string msg = context + ": " + (err->message ? err->message : "(no message)");
  std::string native = err->native_name ? err->native_name : "";
  std::string plugin = err->plugin ? err->plugin : (api && api->name ? api->name : "?");
  if (!native.empty()) msg += " [" + native + "]";
  msg += " (plugin " + plugin + ")";
  if (api && api->error_free) api->error_free(err);
  switch (code) {
    case BP_ERROR_OUT_OF_MEMORY:
      throw OutOfMemory(msg);
    case BP_ERROR_UNSUPPORTED:
      throw UnsupportedError(msg);
    case BP_ERROR_INVALID_ARGUMENT:
      if (invalid_is_device_error) throw DeviceError(msg);
      throw PluginError(msg, native);
    default:
      throw PluginError(msg, native);
  }
}

// ---- Stream / Event --------------------------------------------------------------------------

PluginStream::~PluginStream() {
  if (bp_error* e = dev_.api()->stream_destroy(s_)) dev_.api()->error_free(e);
}
Device& PluginStream::device() const {
  return dev_;
}
void PluginStream::synchronize() {
  check(dev_.api(), dev_.api()->stream_synchronize(s_), "stream synchronize", &dev_);
}

namespace {
// Note [Events without plugin support]: when a plugin leaves the event slots NULL, record
// synchronises the stream and stamps a host clock, so wait() has nothing left to wait for.
class PluginEvent final : public Event {
 public:
  PluginEvent(PluginDevice& dev, bp_event* e) : dev_(dev), e_(e) {}
  ~PluginEvent() override {
    if (e_)
      if (bp_error* err = dev_.api()->event_destroy(e_)) dev_.api()->error_free(err);
  }
  void record(Stream& s) override {
    if (e_) {
      check(dev_.api(), dev_.api()->event_record(e_, s.handle()), "event record", &dev_);
    } else {
      s.synchronize();
      host_time_ = std::chrono::steady_clock::now();
    }
  }
  void synchronize() override {
    if (e_) check(dev_.api(), dev_.api()->event_synchronize(e_), "event synchronize", &dev_);
  }
  double elapsed_ms(Event& end_base) override {
    auto& end = static_cast<PluginEvent&>(end_base);
    if (e_ && dev_.api()->event_elapsed_ms) {
      double ms = 0;
      check(dev_.api(), dev_.api()->event_elapsed_ms(e_, end.e_, &ms), "event elapsed", &dev_);
      return ms;
    }
    if (e_) {  // events without timing: synchronise and use host clocks from here on
      end.synchronize();
    }
    return std::chrono::duration<double, std::milli>(end.host_time_ - host_time_).count();
  }
  bp_event* handle() const { return e_; }

 private:
  PluginDevice& dev_;
  bp_event* e_;
  std::chrono::steady_clock::time_point host_time_{};
};
}  // namespace

void PluginStream::wait(Event& event) {
  auto& ev = static_cast<PluginEvent&>(event);
  if (ev.handle())
    check(dev_.api(), dev_.api()->stream_wait_event(s_, ev.handle()), "stream wait", &dev_);
}

// ---- Kernel ----------------------------------------------------------------------------------

void PluginKernel::launch(Stream& stream, std::span<const bp_tensor_desc> in,
                          std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  const bp_plugin_api* api = dev_.api();
  bp_error* err = api->launch(k_, stream.handle(), in.data(), static_cast<int32_t>(in.size()),
                              out.data(), static_cast<int32_t>(out.size()), attrs.data(),
                              static_cast<int32_t>(attrs.size()));
  if (err) {
    std::string what =
        "launch " + std::string(op_name(op_)) + " (" + std::string(dtype_name(dtype_)) + ")";
    throw_plugin_error(api, err, dev_.str() + ": " + what);
  }
}

// ---- Allocator -------------------------------------------------------------------------------

std::shared_ptr<Buffer> PluginAllocator::allocate(uint64_t bytes, Stream& stream) {
  bp_buffer* b = nullptr;
  bp_error* err = dev_.api()->mem_alloc(dev_.index(), stream.handle(), bytes, &b);
  if (err) {
    std::string what = "allocating " + format_bytes(bytes) + " (free " +
                       format_bytes(dev_.free_memory()) + " of " +
                       format_bytes(dev_.properties().total_memory) + ")";
    throw_plugin_error(dev_.api(), err, dev_.str() + ": " + what);
  }
  return std::make_shared<Buffer>(dev_, b, bytes);
}

std::shared_ptr<Buffer> PluginAllocator::allocate(uint64_t bytes) {
  return allocate(bytes, dev_.default_stream());
}

MemoryStats PluginAllocator::stats() {
  bp_memory_stats s{};
  s.struct_size = sizeof s;
  check(dev_.api(), dev_.api()->memory_stats(dev_.index(), &s), "memory stats", &dev_);
  return {s.allocated, s.reserved, s.peak_allocated, s.num_allocs};
}
void PluginAllocator::reset_peak() {
  check(dev_.api(), dev_.api()->memory_reset_peak(dev_.index()), "reset peak", &dev_);
}
void PluginAllocator::empty_cache() {
  if (dev_.api()->memory_empty_cache)
    check(dev_.api(), dev_.api()->memory_empty_cache(dev_.index()), "empty cache", &dev_);
}

// ---- Device ----------------------------------------------------------------------------------

PluginDevice::PluginDevice(Plugin& plugin, int index)
    : Device(plugin.api->device_type, index),
      plugin_(plugin),
      backend_(plugin.api->name),
      allocator_(*this) {
  bp_device_properties p{};
  p.struct_size = sizeof p;
  p.supports_f64 = 1;
  check(api(), api()->device_properties(index, &p), "device properties", this);
  props_.name = p.name;
  props_.vendor = p.vendor;
  props_.uuid = p.uuid;
  props_.pci_bus_id = p.pci_bus_id;
  props_.total_memory = p.total_memory;
  props_.free_memory = p.free_memory;
  props_.compute_major = p.compute_major;
  props_.compute_minor = p.compute_minor;
  props_.cores = p.cores;
  props_.supports_f64 = p.supports_f64 != 0;
  props_.unified_memory = p.unified_memory != 0;
}

// Note [Plugin lifetime]: devices are destroyed only at process exit, when plugins may already
// have torn down their drivers; streams are therefore leaked rather than destroyed late.
PluginDevice::~PluginDevice() {
  for (auto& s : streams_) (void)s.release();
}

uint64_t PluginDevice::free_memory() const {
  bp_device_properties p{};
  p.struct_size = sizeof p;
  if (bp_error* e = api()->device_properties(index(), &p)) {
    api()->error_free(e);
    return props_.free_memory;
  }
  return p.free_memory;
}

Stream& PluginDevice::default_stream() {
  PluginStream* s = default_stream_.load(std::memory_order_acquire);
  if (s) return *s;
  std::lock_guard<std::mutex> lock(mu_);
  s = default_stream_.load(std::memory_order_relaxed);
  if (!s) {
    bp_stream* h = nullptr;
    check(api(), api()->stream_create(index(), &h), "create default stream", this);
    streams_.push_back(std::make_unique<PluginStream>(*this, h));
    s = streams_.back().get();
    default_stream_.store(s, std::memory_order_release);
  }
  return *s;
}

std::unique_ptr<Stream> PluginDevice::create_stream() {
  bp_stream* h = nullptr;
  check(api(), api()->stream_create(index(), &h), "create stream", this);
  return std::make_unique<PluginStream>(*this, h);
}

std::unique_ptr<Event> PluginDevice::create_event() {
  bp_event* e = nullptr;
  if (has_events()) check(api(), api()->event_create(index(), &e), "create event", this);
  return std::make_unique<PluginEvent>(*this, e);
}

void PluginDevice::synchronize() {
  if (default_stream_.load(std::memory_order_acquire)) default_stream().synchronize();
}

Kernel* PluginDevice::try_resolve(Op op, DType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Kernel* k = kernels_[slot(op, dtype)].load(std::memory_order_relaxed)) return k;
  bp_kernel* handle = nullptr;
  bp_error* err = api()->find_kernel(index(), std::string(op_name(op)).c_str(),
                                     static_cast<int32_t>(dtype), &handle);
  if (err) {
    if (err->code != BP_ERROR_UNSUPPORTED) throw_plugin_error(api(), err, str() + ": find kernel");
    api()->error_free(err);
    return nullptr;
  }
  kernel_store_.push_back(std::make_unique<PluginKernel>(*this, op, dtype, handle));
  Kernel* k = kernel_store_.back().get();
  kernels_[slot(op, dtype)].store(k, std::memory_order_release);
  return k;
}

// Note [Unsupported ops]: the message lists the devices of other backends that have the op;
// no lock is held while asking them, so two backends lacking the same op cannot deadlock.
Kernel& PluginDevice::resolve_kernel(Op op, DType dtype) {
  if (Kernel* k = try_resolve(op, dtype)) return *k;
  std::string others;
  for (Device* d : Registry::get().devices()) {
    if (&static_cast<PluginDevice*>(d)->plugin_ == &plugin_) continue;  // same backend
    if (d->supports(op, dtype)) others += (others.empty() ? "" : ", ") + d->str();
  }
  throw UnsupportedError("op '" + std::string(op_name(op)) + "' with dtype " +
                         std::string(dtype_name(dtype)) + " is not implemented on " + str() +
                         " (backend " + backend_ +
                         "); devices that have it: " + (others.empty() ? "none" : others));
}

bool PluginDevice::supports(Op op, DType dtype) {
  if (kernels_[slot(op, dtype)].load(std::memory_order_acquire)) return true;
  try {
    return try_resolve(op, dtype) != nullptr;
  } catch (const Error&) {
    return false;
  }
}

void PluginDevice::copy_from_host(Stream& s, Buffer& dst, uint64_t dst_off, const void* src,
                                  uint64_t n) {
  if (n == 0) return;
  check(api(), api()->copy_h2d(s.handle(), dst.handle(), dst_off, src, n), "copy host->device",
        this);
}
void PluginDevice::copy_to_host(Stream& s, void* dst, const Buffer& src, uint64_t src_off,
                                uint64_t n) {
  if (n == 0) return;
  check(api(), api()->copy_d2h(s.handle(), dst, src.handle(), src_off, n), "copy device->host",
        this);
}
void PluginDevice::copy_within(Stream& s, Buffer& dst, uint64_t dst_off, const Buffer& src,
                               uint64_t src_off, uint64_t n) {
  if (n == 0) return;
  check(api(), api()->copy_d2d(s.handle(), dst.handle(), dst_off, src.handle(), src_off, n),
        "copy device->device", this);
}
void PluginDevice::memset(Stream& s, Buffer& dst, uint64_t off, int value, uint64_t n) {
  if (n == 0) return;
  check(api(), api()->memset(s.handle(), dst.handle(), off, value, n), "memset", this);
}

void* PluginDevice::host_alloc(uint64_t n) {
  if (api()->host_alloc) {
    void* p = nullptr;
    check(api(), api()->host_alloc(index(), n, &p), "pinned host alloc", this);
    return p;
  }
  void* p = std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  if (!p) throw OutOfMemory(str() + ": out of host memory staging " + format_bytes(n));
  return p;
}
void PluginDevice::host_free(void* p) noexcept {
  if (!p) return;
  if (api()->host_alloc) {
    if (bp_error* e = api()->host_free(index(), p)) api()->error_free(e);
  } else {
    std::free(p);
  }
}

void PluginDevice::release(bp_buffer* b, uint64_t size) noexcept {
  PluginStream* s = default_stream_.load(std::memory_order_acquire);
  if (bp_error* e = api()->mem_free(index(), s ? s->handle() : nullptr, b, size)) {
    // A free that fails has nothing to hand the error to: report it once on stderr.
    std::fprintf(stderr, "backplane: %s: freeing %llu bytes failed: %s\n", str().c_str(),
                 static_cast<unsigned long long>(size), e->message ? e->message : "");
    api()->error_free(e);
  }
}

// Note [Cross-device copies]
//   Same plugin with copy_peer: the copy runs on dst's default stream after an event from
//   src's stream, and src's stream then waits for the copy so that a later free of src stays
//   ordered after it. Otherwise the data goes through host memory: straight from or into a
//   unified-memory device's buffer, else through a pinned staging buffer, synchronously.
void PluginDevice::copy_from_device(Buffer& dst, uint64_t dst_off, const Buffer& src,
                                    uint64_t src_off, uint64_t n) {
  if (n == 0) return;
  auto& sdev = static_cast<PluginDevice&>(src.device());
  Stream& ds = default_stream();
  Stream& ss = sdev.default_stream();
  if (&sdev == this) {
    copy_within(ds, dst, dst_off, src, src_off, n);
    return;
  }
  if (&sdev.plugin_ == &plugin_ && api()->copy_peer) {
    if (has_events()) {
      auto before = sdev.create_event();
      before->record(ss);
      ds.wait(*before);
    } else {
      ss.synchronize();
    }
    check(api(),
          api()->copy_peer(ds.handle(), index(), dst.handle(), dst_off, sdev.index(), src.handle(),
                           src_off, n),
          "peer copy", this);
    if (has_events()) {
      auto after = create_event();
      after->record(ds);
      ss.wait(*after);
    } else {
      ds.synchronize();
    }
    return;
  }
  ss.synchronize();
  if (const void* sp = src.host_pointer()) {
    copy_from_host(ds, dst, dst_off, static_cast<const char*>(sp) + src_off, n);
    ds.synchronize();
    return;
  }
  if (void* dp = dst.host_pointer()) {
    ds.synchronize();
    sdev.copy_to_host(ss, static_cast<char*>(dp) + dst_off, src, src_off, n);
    ss.synchronize();
    return;
  }
  void* staging = sdev.host_alloc(n);
  try {
    sdev.copy_to_host(ss, staging, src, src_off, n);
    ss.synchronize();
    copy_from_host(ds, dst, dst_off, staging, n);
    ds.synchronize();
  } catch (...) {
    sdev.host_free(staging);
    throw;
  }
  sdev.host_free(staging);
}

}  // namespace detail
}  // namespace bp
