// Devices, streams and events of the CUDA backend.
//
// Objects: Runtime (one per plugin: the device list, or why there is none) -> Device (static
// facts read at init; execution state created on first use: memory pool, cuBLAS handle,
// staging buffers) -> CudaStream / CudaEvent (what bp_stream* / bp_event* point to).
//
// Internal to backends/cuda. Thread-safety is stated per member.
#ifndef BACKPLANE_CUDA_DEVICE_HPP_
#define BACKPLANE_CUDA_DEVICE_HPP_

#include "cuda_common.hpp"
#include "cuda_memory.hpp"

#include <backplane/abi/plugin_abi.h>
#include <backplane/sdk/fault_record.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bp::cuda {

class Device;
class Staging;
struct CudaStream;

// Static facts about one GPU, read once by Runtime::init without creating a context.
struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string uuid;        // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string pci_bus_id;  // "0000:17:00.0"
  uint64_t total_memory = 0;
  int compute_major = 0, compute_minor = 0;
  int sm_count = 0;
};

struct CudaGraph;  // cuda_graph.cpp

// ---- Deferred index errors (cuda_index.cu, Note [Events and deferred index errors]) ----

// The verdict on one event record's unchecked index launches: those numbered (from, to] on
// its stream. Resolved once, by the first check of that stream that covers them; `fault` is
// written before `resolved` is set (release) and never changes afterwards.
struct IndexWatch {
  uint64_t from = 0, to = 0;
  std::atomic<bool> resolved{false};
  std::shared_ptr<const bp_stream_fault> fault;  // null: no launch in range failed
};

// A stream's index-error state, shared with the watches on it so that it outlives the stream.
// Every member is guarded by `mu`, which a check holds while it waits for the stream.
struct IndexLedger {
  explicit IndexLedger(CudaStream* s) : stream(s) {}
  std::mutex mu;
  CudaStream* stream;       // null once the stream is destroyed
  void* records = nullptr;  // kIndexSlots device records, allocated on first use
  struct SlotOp {
    uint64_t op_id = 0;  // 0: not known (the slot was reused before a check)
    uint64_t seq = 0;    // the first launch's number since the last check; 0: unused
  };
  std::vector<SlotOp> ops;
  uint64_t seq = 0;      // index launches numbered so far (1, 2, ...)
  uint64_t checked = 0;  // launches numbered up to this one have been checked
  std::vector<std::weak_ptr<IndexWatch>> watches;  // the open ones (and expired)
  size_t prune_at = 64;                            // drop expired watches when there are this many
};

// An open watch that a waiting stream resolves at its next synchronisation or host read.
struct PendingWait {
  std::shared_ptr<IndexLedger> ledger;
  std::shared_ptr<IndexWatch> watch;
};

// What a bp_stream* points to. Created by Device::create_stream, destroyed by
// Device::destroy_stream. Several threads may use one stream at once (Note [Stream threading]
// in plugin_abi.h): `stream`, `device` and `index` never change after creation, `cache` is
// lock-free, and the cuBLAS workspace is set up and used under the device's cublas_mutex.
struct CudaStream {
  cudaStream_t stream = nullptr;
  Device* device = nullptr;
  int index = 0;  // device index, for use_device
  BlockCache cache{kMaxCacheBytes};
  // Note [cuBLAS per stream]: allocated on the first matmul; guarded by cublas_mutex().
  void* cublas_workspace = nullptr;
  size_t cublas_workspace_bytes = 0;
  bool owned = true;  // false for a stream_import wrapper: destroy never destroys `stream`
  // Note [cuDNN per stream] (cuda_cudnn.hpp): a cudnnHandle_t bound to `stream`, created on
  // the first cuDNN launch; created and used under cudnn_mutex.
  void* cudnn = nullptr;
  std::mutex cudnn_mutex;
  // Note [Deferred index errors] (cuda_index.cu): the records of out-of-range indices, their
  // launches' numbers and the events watching them; shared with those events and the streams
  // waiting on them (Note [Events and deferred index errors]). `index_armed` says a launch may
  // have written a record since the last check: set under the ledger's mutex by a launch,
  // cleared under it at the end of a check (so a reader that sees it clear also sees the
  // check's result in `fault`).
  std::shared_ptr<IndexLedger> index_ledger = std::make_shared<IndexLedger>(this);
  std::atomic<bool> index_armed{false};
  // Watches of events this stream waited on whose verdict was not known yet (Note [Events and
  // deferred index errors]); `has_waits` mirrors !waits.empty() for the lock-free fast path.
  std::mutex waits_mutex;
  std::vector<PendingWait> waits;
  std::atomic<bool> has_waits{false};
  // Note [Asynchronous errors] in plugin_abi.h: this stream's record (index errors found on
  // the device); a lost device's record is the Device's.
  bp::sdk::FaultRecord fault;
  // The graph being captured on this stream (Note [Scratch in graphs]), else null.
  std::atomic<CudaGraph*> capture{nullptr};
};

// ---- Graphs (cuda_graph.cpp; Note [Native graphs] in plugin_abi.h) ----
// Scratch memory of a graph's captured work: taken from the graph's own blocks, which live
// until the graph is destroyed.
void* graph_scratch(CudaGraph& g, uint64_t size);
void graph_scratch_free(CudaGraph& g, void* ptr, uint64_t size);
CudaGraph* graph_begin_capture(CudaStream& s);
CudaGraph* graph_end_capture(CudaStream& s);
void graph_instantiate(CudaGraph& g);
void graph_launch(CudaGraph& g, CudaStream& s);
void graph_destroy(CudaGraph* g);

// What a bp_event* points to.
struct CudaEvent {
  cudaEvent_t event = nullptr;
  int device = 0;
  // Note [Asynchronous errors] in plugin_abi.h: the record of the stream it was last recorded
  // on, at that time (severity NONE: not poisoned); guarded by `mu`.
  std::mutex mu;
  bp_stream_fault rec{};
  // Note [Events and deferred index errors]: the stream's index launches that were unchecked
  // when it was recorded, until their verdict is in `rec`; guarded by `mu`.
  std::shared_ptr<IndexLedger> ledger;
  std::shared_ptr<IndexWatch> watch;
};

// ---- Events and deferred index errors (cuda_index.cu) ----
// Note [Events and deferred index errors]. Each function is thread-safe.

// Records `event` on `s` and copies s's fault record into `rec`; returns a watch on the index
// launches still unchecked on `s` (null when there are none, when `rec` is already set or
// while `s` captures a graph).
std::shared_ptr<IndexWatch> record_event(CudaStream& s, cudaEvent_t event, bp_stream_fault& rec);
// The verdict of `w` (null: no launch in its range failed), running the check of its stream
// (which waits for that stream's work) when it is still open. Null, with `w` left open, while
// that stream captures a graph.
std::shared_ptr<const bp_stream_fault> resolve_watch(IndexLedger& ledger, IndexWatch& w);
// `s` waited on an event whose watch is open: its verdict joins s's record later.
void add_pending_wait(CudaStream& s, std::shared_ptr<IndexLedger> ledger,
                      std::shared_ptr<IndexWatch> watch);
// Merges into s's record, as BP_FAULT_STREAM_POISONED, the failed verdicts of the watches `s`
// waited on; with `block`, resolves open ones first (resolve_watch), else leaves them pending.
void resolve_waits(CudaStream& s, bool block);
// Gives every open watch on `s` its verdict (graph_begin_capture: no check runs in a capture).
void settle_index_watches(CudaStream& s);
// destroy_stream: settles the open watches on `s` (a failure of that check lands in `failed`),
// detaches s's ledger from it and returns the device records to free (or null).
void* close_index_ledger(CudaStream& s, std::exception_ptr& failed);

// One GPU. Thread-safe unless a member says otherwise.
class Device {
 public:
  explicit Device(DeviceInfo info);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  int index() const { return info_.index; }

  // Creates the execution state (memory pool, internal stream) on first call; later calls cost
  // one atomic load. Every entry point that takes a device index calls it.
  void ensure_ready() {
    if (!ready_.load(std::memory_order_acquire)) [[unlikely]]
      make_ready();
  }

  // Properties with free memory read now (cudaMemGetInfo; creates the context if needed).
  void properties(bp_device_properties& props);

  // ---- Streams and events (cuda_device.cpp) ----
  CudaStream* create_stream();
  // Releases the stream's cached blocks and workspace (stream-ordered) and destroys it.
  void destroy_stream(CudaStream* s);
  // The stream used when the host passes a NULL stream (Note [NULL streams]).
  CudaStream* internal_stream() { return internal_; }

  // ---- Memory (cuda_memory.cpp) ----
  // A user allocation of `size` bytes ordered on `s`, counted in the statistics. size 0 gives
  // nullptr. Throws BP_ERROR_OUT_OF_MEMORY after one retry with emptied caches.
  void* allocate(CudaStream& s, uint64_t size);
  // Frees a user allocation after the work queued on `s`; `size` is the requested size.
  void deallocate(CudaStream& s, void* ptr, uint64_t size);
  // Scratch memory for kernels (CUB temp storage, partial sums): like allocate, not counted;
  // from the graph's blocks while `s` is capturing.
  void* allocate_scratch(CudaStream& s, uint64_t size);
  void free_scratch(CudaStream& s, void* ptr, uint64_t size);
  // Sets up what captured matmuls need before a capture begins: the cuBLAS handle and the
  // stream's workspace (which must outlive any graph).
  void prepare_capture(CudaStream& s);
  void memory_stats(bp_memory_stats& out);
  void reset_peak();
  // Drains every stream cache, synchronises the device and trims the pool to zero.
  void empty_cache();

  // ---- Native handles (cuda_native.cpp, Note [CUDA imported memory]) ----
  // Wraps foreign device (or managed) memory of this device; validates it with
  // cudaPointerGetAttributes. Returns a tagged handle (Note [Tagged buffer handles]).
  bp_buffer* import_buffer(void* address, uint64_t size, bp_release_fn release, void* ctx);
  // Releases an imported buffer after the work queued on `s` (nullptr: the whole device).
  void free_imported(CudaStream* s, bp_buffer* handle);
  // Calls the release of every deferred import whose event has completed (all of them, after
  // waiting, when `wait`). Cheap when nothing is pending: one atomic load.
  void retire_releases(bool wait = false) {
    if (wait || pending_count_.load(std::memory_order_acquire) != 0) [[unlikely]]
      retire_pending(wait);
  }
  // A non-owning CudaStream over a cudaStream_t of this device (checked with
  // cudaStreamGetDevice; 0, cudaStreamLegacy and cudaStreamPerThread are accepted as is).
  CudaStream* import_stream(cudaStream_t native);

  // ---- cuBLAS (cuda_matmul.cpp) ----
  // The device's cuBLAS handle (created on first use) and the lock that serialises its use:
  // cublasSetStream/cublasSetWorkspace/cublasGemm* must run under cublas_mutex().
  void* cublas_handle();
  std::mutex& cublas_mutex() { return cublas_mutex_; }
  // Destroys the handle (shutdown only; no matmul may run concurrently).
  void destroy_cublas();

  // ---- Copies (cuda_copy.cpp) ----
  // The pinned staging chunks of this device (created on first use).
  Staging& staging();
  // Frees the staging chunks (shutdown only; no copy may run concurrently).
  void release_staging();

  // ---- Peer access ----
  // Enables access from this device to `peer`'s memory (and its pool) once; false when the
  // hardware cannot. Thread-safe.
  bool enable_peer_access(Device& peer);

  cudaMemPool_t pool() const { return pool_; }

  // ---- Loss (Note [Sticky CUDA errors] in cuda_device.cpp) ----
  // Marks the device lost with a sticky CUDA error; the first call wins. Thread-safe.
  void mark_lost(const std::string& message, const char* native) {
    lost_record_.set(BP_FAULT_DEVICE_LOST, BP_ERROR_DEVICE, 0, message, native);
  }
  bool lost() const noexcept { return lost_record_.failed(); }
  bp_stream_fault lost_record() { return lost_record_.read(false); }

 private:
  void make_ready();
  // Creates a stream and registers it (ensure_ready must have run or be running).
  CudaStream* new_stream();
  // The stream's block cache, else the pool (what allocate and scratch outside graphs use).
  void* cached_alloc(CudaStream& s, uint64_t size);
  void cached_free(CudaStream& s, void* ptr, uint64_t size);
  // Allocates `bytes` from the pool on `s`; retries once after emptying caches on OOM.
  void* pool_alloc(CudaStream& s, uint64_t bytes, uint64_t requested);
  // Drains the block caches of every registered stream (stream-ordered frees).
  void drain_caches();
  void retire_pending(bool wait);

  DeviceInfo info_;
  std::atomic<bool> ready_{false};
  std::mutex ready_mutex_;
  cudaMemPool_t pool_ = nullptr;
  CudaStream* internal_ = nullptr;

  bp::sdk::MemoryCounters counters_;  // user allocations, for memory_stats

  std::mutex streams_mutex_;  // guards streams_
  std::vector<CudaStream*> streams_;

  std::mutex cublas_mutex_;
  std::once_flag cublas_once_;
  void* cublas_ = nullptr;  // cublasHandle_t

  std::once_flag staging_once_;
  std::unique_ptr<Staging> staging_;

  std::mutex peer_mutex_;
  std::vector<int8_t> peer_state_;  // per peer: 0 unknown, 1 enabled, -1 impossible

  // Imported buffers freed while work on their stream was still queued (Note [CUDA imported
  // memory]): each waits for its event before its release is called.
  struct PendingRelease {
    cudaEvent_t event;
    bp_buffer* handle;
  };
  std::mutex pending_mutex_;  // guards pending_; never held while a release runs
  std::vector<PendingRelease> pending_;
  std::atomic<size_t> pending_count_{0};
  bp::sdk::FaultRecord lost_record_;
};

// The plugin's view of the machine. init() runs once (the ABI's init slot).
class Runtime {
 public:
  // Reads the device count and static properties. Never throws for a missing driver or
  // device: device_count() is then 0 and reason() says why.
  void init();
  // Stops helper threads and hands deferred imported memory back (the ABI's shutdown slot).
  void shutdown();

  int device_count() const { return static_cast<int>(devices_.size()); }
  const char* reason() const { return reason_.c_str(); }

  // The device with index d; throws BP_ERROR_INVALID_ARGUMENT naming the valid range.
  Device& device(int32_t d) {
    if (d < 0 || d >= static_cast<int32_t>(devices_.size())) [[unlikely]]
      bad_device(d);
    return *devices_[static_cast<size_t>(d)];
  }

 private:
  [[noreturn]] void bad_device(int32_t d) const;

  std::vector<std::unique_ptr<Device>> devices_;
  std::string reason_;
};

// The process-wide runtime (lives as long as the plugin).
Runtime& runtime();

// Maps a bp_stream* to its CudaStream; throws for NULL (Note [NULL streams]).
inline CudaStream& stream_of(bp_stream* s) {
  if (!s) [[unlikely]]
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "cuda: NULL stream passed where one is required");
  return *reinterpret_cast<CudaStream*>(s);
}

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_DEVICE_HPP_
