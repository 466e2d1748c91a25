// Device discovery, properties, execution state, streams, events and peer access.
#include "cuda_device.hpp"

#include "cuda_copy.hpp"
#include "cuda_cudnn.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bp::cuda {

// ---- Errors ----------------------------------------------------------------------------------

// Note [Sticky CUDA errors]
//   A kernel that faults (an illegal address, a device-side assert, a trap) leaves a sticky
//   error in the CUDA context: every later call on the device returns it until the process
//   exits, and nothing queued afterwards runs. The backend reports that as the device lost
//   (Note [Asynchronous errors] in plugin_abi.h): the first CUDA call that returns one marks
//   its Device lost with the error's name and text, every stream's record (stream_fault) then
//   says BP_FAULT_DEVICE_LOST, and libbackplane fails every later call on that device fast. CUDA
//   does not say which kernel faulted, so the record's op id is 0; the host names the ops queued
//   since the last synchronisation, and BACKPLANE_LAUNCH_BLOCKING=1 (or compute-sanitizer)
//   finds the one. Errors that are not sticky (an invalid argument, out of memory) stay errors
//   of the call.
namespace {
bool is_sticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}
}  // namespace

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clear the (non-sticky) error so later checks do not see it
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  forget_current_device();
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  if (is_sticky(err) && device >= 0 && device < runtime().device_count()) {
    const std::string what = bp::sdk::format(
        "cuda:%d: the device is lost: %s (%s), a sticky error of a kernel queued earlier, "
        "returned by %s at %s:%d",
        device, cudaGetErrorName(err), cudaGetErrorString(err), expr, base, line);
    runtime().device(device).mark_lost(what, cudaGetErrorName(err));
    bp::sdk::fail(BP_ERROR_DEVICE, what, cudaGetErrorName(err));
  }
  bp_error_code code = BP_ERROR_DEVICE;
  switch (err) {
    case cudaErrorMemoryAllocation:
      code = BP_ERROR_OUT_OF_MEMORY;
      break;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      code = BP_ERROR_UNAVAILABLE;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
      code = BP_ERROR_INVALID_ARGUMENT;
      break;
    default:
      break;
  }
  bp::sdk::fail(code,
                bp::sdk::format("cuda:%d: %s failed: %s (%s) at %s:%d", device, expr,
                                cudaGetErrorName(err), cudaGetErrorString(err), base, line),
                cudaGetErrorName(err));
}

// ---- Runtime ---------------------------------------------------------------------------------

namespace {

// Why there is no device, from the error of the first CUDA call.
std::string no_device_reason(cudaError_t e) {
  const char* name = cudaGetErrorName(e);
  const char* text = cudaGetErrorString(e);
  switch (e) {
    case cudaErrorInsufficientDriver:
      return bp::sdk::format(
          "CUDA driver not found or older than the CUDA %d.%d runtime this plugin was built with "
          "(%s: %s)",
          CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10, name, text);
    case cudaErrorNoDevice:
      return bp::sdk::format("the CUDA driver found no CUDA-capable device (%s: %s)", name, text);
    default:
      return bp::sdk::format("the CUDA driver could not be initialised (%s: %s)", name, text);
  }
}

std::string format_uuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[64];
  std::snprintf(s, sizeof s,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return s;
}

}  // namespace

void Runtime::init() {
  // nvidia-smi numbers GPUs by PCI bus; the runtime's default is "fastest first". Only
  // effective before the driver is initialised in this process; a user's setting wins.
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    reason_ = no_device_reason(e);
    return;
  }
  if (n <= 0) {
    reason_ = "the CUDA driver reports no devices";
    return;
  }
  std::vector<std::unique_ptr<Device>> devices;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop{};
    cudaError_t pe = cudaGetDeviceProperties(&prop, d);
    char bus[32] = {};
    if (pe == cudaSuccess) pe = cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), d);
    if (pe != cudaSuccess) {
      (void)cudaGetLastError();
      reason_ = bp::sdk::format("reading the properties of CUDA device %d failed (%s: %s)", d,
                                cudaGetErrorName(pe), cudaGetErrorString(pe));
      return;
    }
    DeviceInfo info;
    info.index = d;
    info.name = prop.name;
    info.uuid = format_uuid(prop.uuid);
    info.pci_bus_id = bus;
    info.total_memory = prop.totalGlobalMem;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    devices.push_back(std::make_unique<Device>(std::move(info)));
  }
  devices_ = std::move(devices);
  reason_.clear();
}

void Runtime::shutdown() {
  host_workers().stop();
  for (auto& d : devices_) {
    try {
      d->retire_releases(true);  // Note [CUDA imported memory]: every release runs once
    } catch (const bp::sdk::Failure&) {
      // The releases ran; a device error at exit has nobody to report to.
    }
    d->release_staging();
  }
}

void Runtime::bad_device(int32_t d) const {
  if (devices_.empty())
    bp::sdk::fail(BP_ERROR_UNAVAILABLE,
                  bp::sdk::format("cuda: no device %d: %s", d, reason_.c_str()));
  bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                bp::sdk::format("cuda: no device %d (devices are cuda:0..cuda:%d)", d,
                                static_cast<int>(devices_.size()) - 1));
}

Runtime& runtime() {
  static Runtime* rt = new Runtime();  // lives as long as the plugin
  return *rt;
}

// ---- Device ----------------------------------------------------------------------------------

Device::Device(DeviceInfo info) : info_(std::move(info)) {}

// Devices live as long as the plugin (runtime() is never destroyed), so no CUDA teardown here.
Device::~Device() = default;

void Device::make_ready() {
  std::lock_guard<std::mutex> lock(ready_mutex_);
  if (ready_.load(std::memory_order_relaxed)) return;
  use_device(index());
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = index();
  cudaMemPool_t pool = nullptr;
  BP_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  // Note [Stream-ordered pool]: keep freed memory for reuse instead of releasing it at syncs.
  uint64_t threshold = UINT64_MAX;
  BP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  pool_ = pool;
  internal_ = new_stream();
  peer_state_.assign(static_cast<size_t>(runtime().device_count()), 0);
  ready_.store(true, std::memory_order_release);
}

void Device::properties(bp_device_properties& props) {
  bp::sdk::copy_string(props.name, info_.name);
  bp::sdk::copy_string(props.vendor, "NVIDIA");
  bp::sdk::copy_string(props.uuid, info_.uuid);
  bp::sdk::copy_string(props.pci_bus_id, info_.pci_bus_id);
  props.total_memory = info_.total_memory;
  use_device(index());
  size_t free_bytes = 0, total_bytes = 0;
  BP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  props.free_memory = free_bytes;
  props.compute_major = info_.compute_major;
  props.compute_minor = info_.compute_minor;
  props.cores = info_.sm_count;
  props.supports_f64 = 1;
  props.unified_memory = 0;
  props.kind = BP_DEVICE_KIND_GPU;
}

// ---- Streams ---------------------------------------------------------------------------------

// Note [NULL streams]
//   Slots that name a device (mem_alloc, mem_free) accept a NULL stream and use the device's
//   internal stream with synchronous semantics: mem_alloc waits for the allocation, mem_free
//   synchronises the device before freeing. Slots that take only a stream (launch, copies,
//   memset, events) need a real one and reject NULL with BP_ERROR_INVALID_ARGUMENT.

CudaStream* Device::new_stream() {
  use_device(index());
  auto s = std::make_unique<CudaStream>();
  s->device = this;
  s->index = index();
  BP_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.push_back(s.get());
  return s.release();
}

CudaStream* Device::create_stream() {
  ensure_ready();
  return new_stream();
}

void Device::destroy_stream(CudaStream* s) {
  if (!s) return;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i] == s) {
        streams_[i] = streams_.back();
        streams_.pop_back();
        break;
      }
    }
  }
  // Note [Events and deferred index errors]: events recorded here may outlive the stream.
  std::exception_ptr failed;
  void* index_records = close_index_ledger(*s, failed);
  use_device(index());
  cudaError_t first = cudaSuccess;
  auto note = [&](cudaError_t e) {
    if (e != cudaSuccess && first == cudaSuccess) first = e;
  };
  if (s->cublas_workspace) note(cudaFreeAsync(s->cublas_workspace, s->stream));
  destroy_cudnn_handle(*s);
  if (index_records) note(cudaFreeAsync(index_records, s->stream));
  s->cache.drain([&](void* p, int) { note(cudaFreeAsync(p, s->stream)); });
  if (s->owned) note(cudaStreamDestroy(s->stream));  // an imported stream stays its owner's
  delete s;
  if (failed) std::rethrow_exception(failed);
  BP_CUDA_CHECK(first);
}

// ---- Peer access -----------------------------------------------------------------------------

bool Device::enable_peer_access(Device& peer) {
  if (&peer == this) return true;
  ensure_ready();
  peer.ensure_ready();
  std::lock_guard<std::mutex> lock(peer_mutex_);
  int8_t& state = peer_state_[static_cast<size_t>(peer.index())];
  if (state != 0) return state > 0;
  int can = 0;
  BP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, index(), peer.index()));
  if (!can) {
    state = -1;
    return false;
  }
  use_device(index());
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer.index(), 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    BP_CUDA_CHECK(e);
  }
  // cudaDeviceEnablePeerAccess does not cover memory pools: grant this device access to the
  // peer's pool as well.
  cudaMemAccessDesc desc{};
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = index();
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  BP_CUDA_CHECK(cudaMemPoolSetAccess(peer.pool(), &desc, 1));
  state = 1;
  return true;
}

}  // namespace bp::cuda
