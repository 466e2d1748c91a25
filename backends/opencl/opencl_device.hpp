// Devices of the OpenCL backend: discovery over every platform the ICD loader reports, the
// static facts of each device, and its execution state (context, streams, events).
//
// Layering: Device (static facts + lazily created context) owns an Allocator
// (opencl_allocator.hpp) and a ProgramCache (opencl_program.hpp). Streams (bp_stream) and events
// (bp_event) are created by the plugin and refer to their Device, which outlives them.
#pragma once

#include "opencl_common.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace bp::opencl {

class Allocator;
class ProgramCache;

// Static facts queried once at discovery.
struct DeviceInfo {
  std::string name;            // CL_DEVICE_NAME
  std::string vendor;          // CL_DEVICE_VENDOR
  std::string version;         // CL_DEVICE_VERSION, "OpenCL 3.0 PoCL ..."
  std::string uuid;            // from cl_khr_device_uuid, else ""
  std::string pci_bus_id;      // from cl_khr_pci_bus_info or cl_nv_device_attribute_query
  uint64_t global_memory = 0;  // CL_DEVICE_GLOBAL_MEM_SIZE
  uint64_t max_alloc = 0;      // CL_DEVICE_MAX_MEM_ALLOC_SIZE
  uint64_t local_memory = 0;   // CL_DEVICE_LOCAL_MEM_SIZE
  uint32_t compute_units = 0;
  size_t max_work_group = 0;  // CL_DEVICE_MAX_WORK_GROUP_SIZE
  bool fp64 = false;          // cl_khr_fp64 and a non-zero CL_DEVICE_DOUBLE_FP_CONFIG
  int32_t compute_major = 0;  // NVIDIA compute capability when the driver reports it, else 0
  int32_t compute_minor = 0;
  int32_t kind = BP_DEVICE_KIND_UNKNOWN;  // from CL_DEVICE_TYPE: CPU, GPU, or ACCELERATOR
  // Launches of one kernel on several queues are ordered one after another (Note [PoCL
  // dlhandle cache] in opencl_kernels_common.cpp): PoCL before 7.0.
  bool order_kernel_across_queues = false;
};

// True for a CL_PLATFORM_VERSION of PoCL before 7.0 ("OpenCL 3.0 PoCL 3.1+debian ..."), whose
// CPU drivers can abort when one kernel runs on several queues at once.
bool pocl_dlhandle_cache_bug(const std::string& platform_version);

// One OpenCL device, opencl:<index>. Created at discovery, destroyed at plugin shutdown.
// Thread-safety: all members may be called from any thread.
class Device {
 public:
  Device(int32_t index, cl_platform_id platform, cl_device_id id, DeviceInfo info);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int32_t index() const { return index_; }
  cl_device_id id() const { return id_; }
  const DeviceInfo& info() const { return info_; }
  // "opencl:0 (NVIDIA H100 80GB HBM3)", for messages.
  const std::string& label() const { return label_; }

  // The device's context, created on first use. Throws on failure (and again on later calls).
  cl_context context();
  // An in-order profiling queue for work submitted without a stream; created on first use.
  cl_command_queue internal_queue();
  // Creates a new in-order queue with profiling enabled. Caller releases it.
  cl_command_queue create_queue();

  Allocator& allocator() { return *allocator_; }
  ProgramCache& programs() { return *programs_; }

  // Stream registry (Note [Cross-stream reuse] in opencl_allocator.cpp). register_stream
  // returns the stream's id (never 0); enqueue_marker enqueues a marker on the live stream
  // `id` and returns its event (caller releases), or nullptr when that stream is gone.
  uint64_t register_stream(cl_command_queue queue);
  void unregister_stream(uint64_t id);
  cl_event enqueue_marker(uint64_t id);

 private:
  void ensure_context();

  int32_t index_;
  cl_platform_id platform_;
  cl_device_id id_;
  DeviceInfo info_;
  std::string label_;

  std::once_flag context_once_;
  cl_context context_ = nullptr;
  cl_int context_status_ = CL_SUCCESS;
  std::mutex queue_mutex_;
  cl_command_queue internal_queue_ = nullptr;

  std::mutex streams_mutex_;
  std::unordered_map<uint64_t, cl_command_queue> streams_;
  std::atomic<uint64_t> next_stream_id_{1};

  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<ProgramCache> programs_;
};

// The result of enumerating platforms and devices. `reason` explains an empty list
// ("no OpenCL platform: clGetPlatformIDs returned CL_PLATFORM_NOT_FOUND_KHR (-1001) ...").
struct Discovery {
  std::vector<std::unique_ptr<Device>> devices;
  std::string reason;
};

// Enumerates every device of every platform (platform order, then device order). Never throws
// for a missing driver: the reason is recorded instead.
Discovery discover_devices();

}  // namespace bp::opencl

// The ABI's opaque handles, defined by this plugin.

// A stream: one in-order command queue with profiling enabled.
struct bp_stream {
  bp::opencl::Device* device;
  cl_command_queue queue;
  uint64_t id;            // in the device's stream registry
  bool imported = false;  // wraps a foreign queue (stream_import): destroyed without waiting
};

// An event: the marker enqueued by the latest event_record, plus the host time at which that
// marker completed (a fallback for event_elapsed_ms when the driver gives no profiling data).
struct bp_event {
  struct HostStamp {
    std::atomic<int64_t> ns{0};  // steady_clock nanoseconds at completion; 0 until then
  };
  bp::opencl::Device* device;
  std::mutex mutex;  // guards marker and stamp against concurrent record/query
  cl_event marker = nullptr;
  std::shared_ptr<HostStamp> stamp;
};
