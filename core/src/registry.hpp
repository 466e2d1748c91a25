// Internal: the plugin registry and the Device implementation over the plugin ABI.
#pragma once

#include <backplane/device.hpp>
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bp::detail {

// Converts a plugin's error object (freed here) into the matching bp::Error subclass:
// BP_ERROR_OUT_OF_MEMORY -> OutOfMemory, BP_ERROR_UNSUPPORTED -> UnsupportedError,
// anything else -> PluginError. `context` says what the host was doing ("cuda:0: launch add").
[[noreturn]] void throw_plugin_error(const bp_plugin_api* api, bp_error* err,
                                     const std::string& context);

inline void check(const bp_plugin_api* api, bp_error* err, const char* what, const Device* dev) {
  if (err) throw_plugin_error(api, err, (dev ? dev->str() + ": " : std::string()) + what);
}

// The loader's checks of a plugin's table, before anything in it is called (Note [Plugin table
// checks] in registry.cpp): returns "" when the table may be used, else the reason for the load
// report. Fills r's ABI version, name, device type and version as far as the table's
// struct_size covers them. Reads nothing past api->struct_size, calls no slot; the strings it
// reads must be NUL-terminated or NULL. Used by the registry and by the fuzz target
// tests/fuzz/fuzz_plugin_table.cpp on tables in memory.
std::string check_plugin_table(const bp_plugin_api* api, PluginReport& r);

// A loaded plugin. Lives until process exit (plugins are never unloaded: Note [Plugin
// lifetime] in registry.cpp).
struct Plugin {
  std::string path;
  const bp_plugin_api* api = nullptr;
  bool has_minor1 = false;  // list_ops may be read
  std::string no_devices_reason;
  std::vector<std::unique_ptr<Device>> devices;
};

class PluginDevice;

class PluginStream final : public Stream {
 public:
  PluginStream(PluginDevice& dev, bp_stream* s) : dev_(dev), s_(s) {}
  ~PluginStream() override;
  Device& device() const override;
  bp_stream* handle() const override { return s_; }
  void synchronize() override;
  void wait(Event& event) override;

 private:
  PluginDevice& dev_;
  bp_stream* s_;
};

class PluginKernel final : public Kernel {
 public:
  PluginKernel(PluginDevice& dev, Op op, DType dtype, bp_kernel* k)
      : dev_(dev), op_(op), dtype_(dtype), k_(k) {}
  Op op() const override { return op_; }
  DType dtype() const override { return dtype_; }
  void launch(Stream& stream, std::span<const bp_tensor_desc> inputs,
              std::span<const bp_tensor_desc> outputs, std::span<const bp_attr> attrs) override;

 private:
  PluginDevice& dev_;
  Op op_;
  DType dtype_;
  bp_kernel* k_;
};

class PluginAllocator final : public Allocator {
 public:
  explicit PluginAllocator(PluginDevice& dev) : dev_(dev) {}
  std::shared_ptr<Buffer> allocate(uint64_t bytes, Stream& stream) override;
  std::shared_ptr<Buffer> allocate(uint64_t bytes) override;
  MemoryStats stats() override;
  void reset_peak() override;
  void empty_cache() override;

 private:
  PluginDevice& dev_;
};

class PluginDevice final : public Device {
 public:
  PluginDevice(Plugin& plugin, int index);
  ~PluginDevice() override;

  const std::string& backend_name() const override { return backend_; }
  const DeviceProperties& properties() const override { return props_; }
  uint64_t free_memory() const override;
  Allocator& allocator() override { return allocator_; }
  Stream& default_stream() override;
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void synchronize() override;
  Kernel& kernel(Op op, DType dtype) override {
    Kernel* k = kernels_[slot(op, dtype)].load(std::memory_order_acquire);
    return k ? *k : resolve_kernel(op, dtype);
  }
  bool supports(Op op, DType dtype) override;

  void copy_from_host(Stream& s, Buffer& dst, uint64_t dst_off, const void* src,
                      uint64_t n) override;
  void copy_to_host(Stream& s, void* dst, const Buffer& src, uint64_t src_off, uint64_t n) override;
  void copy_within(Stream& s, Buffer& dst, uint64_t dst_off, const Buffer& src, uint64_t src_off,
                   uint64_t n) override;
  void memset(Stream& s, Buffer& dst, uint64_t off, int value, uint64_t n) override;
  void copy_from_device(Buffer& dst, uint64_t dst_off, const Buffer& src, uint64_t src_off,
                        uint64_t n) override;

  const bp_plugin_api* api() const { return plugin_.api; }
  Plugin& plugin() { return plugin_; }
  bool has_events() const { return plugin_.api->event_create != nullptr; }
  void* host_pointer(bp_buffer* b) const noexcept {
    return plugin_.api->mem_host_pointer ? plugin_.api->mem_host_pointer(b) : nullptr;
  }
  void release(bp_buffer* b, uint64_t size) noexcept;
  void* host_alloc(uint64_t n) override;
  void host_free(void* p) noexcept override;

 private:
  static size_t slot(Op op, DType dtype) {
    return static_cast<size_t>(op) * kNumDTypes + static_cast<size_t>(dtype);
  }
  Kernel& resolve_kernel(Op op, DType dtype);  // throws UnsupportedError
  Kernel* try_resolve(Op op, DType dtype);     // nullptr when the backend lacks it

  Plugin& plugin_;
  std::string backend_;
  DeviceProperties props_;
  PluginAllocator allocator_;
  std::atomic<PluginStream*> default_stream_{nullptr};
  std::mutex mu_;  // guards slow paths: stream creation, kernel resolution
  std::vector<std::unique_ptr<PluginStream>> streams_;
  std::vector<std::unique_ptr<PluginKernel>> kernel_store_;
  std::array<std::atomic<Kernel*>, static_cast<size_t>(kNumOps) * kNumDTypes> kernels_{};
};

// The process-wide registry.
class Registry {
 public:
  static Registry& get();  // loads plugins on first use
  const std::vector<PluginReport>& report() const { return report_; }
  const std::vector<std::unique_ptr<Plugin>>& plugins() const { return plugins_; }
  std::vector<Device*> devices() const;
  Plugin* plugin_for_type(std::string_view type) const;
  // The report line of the plugin that serves (or failed to serve) a device type.
  const PluginReport* report_for_type(std::string_view type) const;
  std::vector<std::string> known_types() const;

  Device* default_device_override = nullptr;
  std::atomic<Device*> default_device_cache{nullptr};

  // Loads and initialises one candidate file with every check; does not register it.
  static PluginReport load_candidate(const std::string& path);

 private:
  Registry();
  // Adds a loaded plugin and its devices; marks the report failed if properties fail.
  void register_plugin(PluginReport& r);
  std::vector<PluginReport> report_;
  std::vector<std::unique_ptr<Plugin>> plugins_;
};

// Sync-debug hook: called before an implicit device-to-host read on `dev`.
void note_implicit_sync(const Device& dev, const char* what);

}  // namespace bp::detail
