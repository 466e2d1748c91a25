#include "opencl_device.hpp"

#include "opencl_allocator.hpp"
#include "opencl_program.hpp"

#include <cstdlib>
#include <cstring>

// Vendor queries of cl_nv_device_attribute_query missing from older headers.
#ifndef CL_DEVICE_PCI_BUS_ID_NV
#define CL_DEVICE_PCI_BUS_ID_NV 0x4008
#endif
#ifndef CL_DEVICE_PCI_SLOT_ID_NV
#define CL_DEVICE_PCI_SLOT_ID_NV 0x4009
#endif
#ifndef CL_DEVICE_PCI_DOMAIN_ID_NV
#define CL_DEVICE_PCI_DOMAIN_ID_NV 0x400A
#endif

namespace bp::opencl {
namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ' || s.back() == '\n')) s.pop_back();
  size_t b = 0;
  while (b < s.size() && s[b] == ' ') ++b;
  return s.substr(b);
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "";
  std::string s(n, '\0');
  if (clGetDeviceInfo(d, what, n, s.data(), nullptr) != CL_SUCCESS) return "";
  return trim(s);
}

std::string platform_string(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  if (clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "";
  std::string s(n, '\0');
  if (clGetPlatformInfo(p, what, n, s.data(), nullptr) != CL_SUCCESS) return "";
  return trim(s);
}

template <typename T>
T device_value(cl_device_id d, cl_device_info what, T fallback = T{}) {
  T v{};
  return clGetDeviceInfo(d, what, sizeof(T), &v, nullptr) == CL_SUCCESS ? v : fallback;
}

bool has_extension(const std::string& extensions, const char* name) {
  size_t len = std::strlen(name), pos = 0;
  while ((pos = extensions.find(name, pos)) != std::string::npos) {
    bool start = pos == 0 || extensions[pos - 1] == ' ';
    bool end = pos + len == extensions.size() || extensions[pos + len] == ' ';
    if (start && end) return true;
    pos += len;
  }
  return false;
}

// Parses "OpenCL <major>.<minor> ..." into major * 10 + minor; 0 when unparsable.
int parse_cl_version(const std::string& version) {
  int major = 0, minor = 0;
  if (std::sscanf(version.c_str(), "OpenCL %d.%d", &major, &minor) != 2) return 0;
  return major * 10 + minor;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace

bool pocl_dlhandle_cache_bug(const std::string& platform_version) {
  // "PoCL 3.1+debian" (older releases print "pocl 1.8").
  size_t at = platform_version.find("PoCL ");
  if (at == std::string::npos) at = platform_version.find("pocl ");
  int major = 0;
  if (at == std::string::npos || std::sscanf(platform_version.c_str() + at + 5, "%d", &major) != 1)
    return false;
  return major < 7;
}

namespace {

DeviceInfo query_info(cl_platform_id platform, cl_device_id d) {
  DeviceInfo info;
  info.name = device_string(d, CL_DEVICE_NAME);
  info.vendor = device_string(d, CL_DEVICE_VENDOR);
  info.version = device_string(d, CL_DEVICE_VERSION);
  // BP_OPENCL_ORDER_KERNELS=0/1 overrides the detection (to reproduce PoCL's abort, or to test
  // the ordering on another driver).
  const char* order = std::getenv("BP_OPENCL_ORDER_KERNELS");
  info.order_kernel_across_queues =
      order && *order ? std::strcmp(order, "0") != 0
                      : pocl_dlhandle_cache_bug(platform_string(platform, CL_PLATFORM_VERSION));
  info.global_memory = device_value<cl_ulong>(d, CL_DEVICE_GLOBAL_MEM_SIZE);
  info.max_alloc = device_value<cl_ulong>(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  info.local_memory = device_value<cl_ulong>(d, CL_DEVICE_LOCAL_MEM_SIZE);
  info.compute_units = device_value<cl_uint>(d, CL_DEVICE_MAX_COMPUTE_UNITS);
  info.max_work_group = device_value<size_t>(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, 1);
  const cl_device_type type = device_value<cl_device_type>(d, CL_DEVICE_TYPE);
  info.kind = (type & CL_DEVICE_TYPE_GPU)   ? BP_DEVICE_KIND_GPU
              : (type & CL_DEVICE_TYPE_CPU) ? BP_DEVICE_KIND_CPU
                                            : BP_DEVICE_KIND_ACCELERATOR;  // ACCELERATOR, CUSTOM

  std::string ext = device_string(d, CL_DEVICE_EXTENSIONS);
  // Note [fp64]: doubles need the extension (our kernels enable it with a pragma) and a
  // non-empty CL_DEVICE_DOUBLE_FP_CONFIG. BP_OPENCL_DISABLE_FP64=1 hides it (for testing the
  // path a device without doubles takes).
  cl_device_fp_config dbl = device_value<cl_device_fp_config>(d, CL_DEVICE_DOUBLE_FP_CONFIG);
  info.fp64 = has_extension(ext, "cl_khr_fp64") && dbl != 0 && !env_flag("BP_OPENCL_DISABLE_FP64");

  if (has_extension(ext, "cl_khr_device_uuid")) {
    cl_uchar uuid[CL_UUID_SIZE_KHR];
    if (clGetDeviceInfo(d, CL_DEVICE_UUID_KHR, sizeof uuid, uuid, nullptr) == CL_SUCCESS) {
      static const char* hex = "0123456789abcdef";
      for (int i = 0; i < CL_UUID_SIZE_KHR; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) info.uuid += '-';
        info.uuid += hex[uuid[i] >> 4];
        info.uuid += hex[uuid[i] & 15];
      }
    }
  }
  if (has_extension(ext, "cl_khr_pci_bus_info")) {
    cl_device_pci_bus_info_khr pci{};
    if (clGetDeviceInfo(d, CL_DEVICE_PCI_BUS_INFO_KHR, sizeof pci, &pci, nullptr) == CL_SUCCESS)
      info.pci_bus_id = sdk::format("%04x:%02x:%02x.%x", pci.pci_domain, pci.pci_bus,
                                    pci.pci_device, pci.pci_function);
  }
  if (has_extension(ext, "cl_nv_device_attribute_query")) {
    info.compute_major =
        static_cast<int32_t>(device_value<cl_uint>(d, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV));
    info.compute_minor =
        static_cast<int32_t>(device_value<cl_uint>(d, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV));
    if (info.pci_bus_id.empty()) {
      cl_uint bus = 0, slot = 0, domain = 0;
      if (clGetDeviceInfo(d, CL_DEVICE_PCI_BUS_ID_NV, sizeof bus, &bus, nullptr) == CL_SUCCESS &&
          clGetDeviceInfo(d, CL_DEVICE_PCI_SLOT_ID_NV, sizeof slot, &slot, nullptr) == CL_SUCCESS) {
        clGetDeviceInfo(d, CL_DEVICE_PCI_DOMAIN_ID_NV, sizeof domain, &domain, nullptr);
        // The slot id packs device (bits 3..7) and function (bits 0..2).
        info.pci_bus_id = sdk::format("%04x:%02x:%02x.%x", domain, bus, slot >> 3, slot & 7);
      }
    }
  }
  return info;
}

}  // namespace

Device::Device(int32_t index, cl_platform_id platform, cl_device_id id, DeviceInfo info)
    : index_(index), platform_(platform), id_(id), info_(std::move(info)) {
  label_ = sdk::format("opencl:%d (%s)", index_, info_.name.c_str());
  allocator_ = std::make_unique<Allocator>(*this);
  programs_ = std::make_unique<ProgramCache>(*this);
}

Device::~Device() {
  // Cached buffers and programs belong to the context: release them first.
  allocator_.reset();
  programs_.reset();
  if (internal_queue_) clReleaseCommandQueue(internal_queue_);
  if (context_) clReleaseContext(context_);
}

void Device::ensure_context() {
  std::call_once(context_once_, [this] {
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                     reinterpret_cast<cl_context_properties>(platform_), 0};
    context_ = clCreateContext(props, 1, &id_, nullptr, nullptr, &context_status_);
    if (context_status_ != CL_SUCCESS) context_ = nullptr;
  });
  if (!context_) fail_cl(context_status_, "clCreateContext", label_);
}

cl_context Device::context() {
  ensure_context();
  return context_;
}

cl_command_queue Device::create_queue() {
  ensure_context();
  cl_int status = CL_SUCCESS;
  cl_command_queue q = clCreateCommandQueue(context_, id_, CL_QUEUE_PROFILING_ENABLE, &status);
  if (status != CL_SUCCESS) fail_cl(status, "clCreateCommandQueue", label_);
  return q;
}

cl_command_queue Device::internal_queue() {
  std::lock_guard<std::mutex> lock(queue_mutex_);
  if (!internal_queue_) internal_queue_ = create_queue();
  return internal_queue_;
}

uint64_t Device::register_stream(cl_command_queue queue) {
  uint64_t id = next_stream_id_.fetch_add(1);
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_[id] = queue;
  return id;
}

void Device::unregister_stream(uint64_t id) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.erase(id);
}

cl_event Device::enqueue_marker(uint64_t id) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return nullptr;
  cl_event ev = nullptr;
  BP_CL_CHECK(clEnqueueMarkerWithWaitList(it->second, 0, nullptr, &ev),
              label_ + ": ordering a cached buffer across streams");
  return ev;
}

Discovery discover_devices() {
  Discovery out;
  cl_uint num_platforms = 0;
  cl_int status = clGetPlatformIDs(0, nullptr, &num_platforms);
  if (status != CL_SUCCESS || num_platforms == 0) {
    const char* vendors = std::getenv("OCL_ICD_VENDORS");
    const char* files = std::getenv("OCL_ICD_FILENAMES");
    std::string where =
        vendors ? sdk::format("OCL_ICD_VENDORS=%s", vendors) : std::string("/etc/OpenCL/vendors");
    if (files) where += sdk::format(", OCL_ICD_FILENAMES=%s", files);
    if (status == CL_SUCCESS) status = CL_PLATFORM_NOT_FOUND_KHR;
    out.reason = sdk::format(
        "no OpenCL platform: clGetPlatformIDs returned %s (%d); the ICD loader found no "
        "usable vendor driver (searched %s; install a driver's .icd file or point "
        "OCL_ICD_VENDORS / OCL_ICD_FILENAMES at one)",
        cl_error_name(status).c_str(), static_cast<int>(status), where.c_str());
    return out;
  }
  std::vector<cl_platform_id> platforms(num_platforms);
  status = clGetPlatformIDs(num_platforms, platforms.data(), nullptr);
  if (status != CL_SUCCESS) {
    out.reason =
        sdk::format("clGetPlatformIDs returned %s (%d) while listing %u platforms",
                    cl_error_name(status).c_str(), static_cast<int>(status), num_platforms);
    return out;
  }
  std::string skipped;
  for (cl_platform_id p : platforms) {
    std::string pname = platform_string(p, CL_PLATFORM_NAME);
    cl_uint n = 0;
    status = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n);
    if (status != CL_SUCCESS || n == 0) {
      skipped +=
          sdk::format("; platform '%s' has no devices (%s)", pname.c_str(),
                      cl_error_name(status == CL_SUCCESS ? CL_DEVICE_NOT_FOUND : status).c_str());
      continue;
    }
    std::vector<cl_device_id> ids(n);
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n, ids.data(), nullptr) != CL_SUCCESS) continue;
    for (cl_device_id d : ids) {
      DeviceInfo info = query_info(p, d);
      if (parse_cl_version(info.version) < 12) {
        skipped += sdk::format("; device '%s' of platform '%s' is '%s' (OpenCL 1.2 needed)",
                               info.name.c_str(), pname.c_str(), info.version.c_str());
        continue;
      }
      if (!device_value<cl_bool>(d, CL_DEVICE_AVAILABLE, CL_TRUE)) {
        skipped += sdk::format("; device '%s' of platform '%s' is not available", info.name.c_str(),
                               pname.c_str());
        continue;
      }
      int32_t index = static_cast<int32_t>(out.devices.size());
      out.devices.push_back(std::make_unique<Device>(index, p, d, std::move(info)));
    }
  }
  if (out.devices.empty())
    out.reason =
        sdk::format("%u OpenCL platform(s) but no usable device%s", num_platforms, skipped.c_str());
  return out;
}

}  // namespace bp::opencl
