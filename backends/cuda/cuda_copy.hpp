// Host <-> device copies of the CUDA backend, with staging of large pageable copies.
//
// Note [Pageable staging]
//   cudaMemcpyAsync from or to pageable (not page-locked) host memory makes the driver copy
//   through its own small pinned buffers with one CPU thread (about 9 GB/s h2d on the H100
//   machine). For pageable copies above kStageThreshold we instead stage through kChunks
//   pinned chunks of kChunkBytes per device: host threads of a small persistent pool
//   (HostWorkers) copy one chunk while the copy engine moves the previous one; each chunk has
//   an event recorded after the DMA that uses it, and the chunk is refilled only after that
//   event completes. Contract of plugin_abi.h:
//     h2d: returns once the source has been copied into pinned chunks, so the caller may
//          reuse its memory at once; the DMA of the last chunks is still queued on the stream.
//     d2h: returns only after the data is in the destination (it has to: the host thread
//          writes it), like the driver's own pageable path.
//   Pinned (page-locked) or device memory goes straight to cudaMemcpyAsync, fully async.
//   Staging of one device is serialised by a mutex (the chunks are shared by its streams).
#ifndef BACKPLANE_CUDA_COPY_HPP_
#define BACKPLANE_CUDA_COPY_HPP_

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace bp::cuda {

struct CudaStream;

constexpr uint64_t kStageThreshold = uint64_t{1} << 20;
constexpr size_t kChunkBytes = size_t{8} << 20;
constexpr int kChunks = 4;

// A persistent pool of host threads that run one parallel memcpy at a time (Note [Host
// workers]). Thread-safe: concurrent callers are serialised. Threads start on first use and
// stop in stop().
//
// Note [Host workers]
//   A staged copy posts one job per chunk, every ~200 us. Waking sleeping threads through a
//   condition variable for each job measured at half the throughput of threads that spin, so
//   a worker spins (with a pause instruction) for kSpinMicros after each job and only then
//   sleeps on the condition variable; an idle pool costs nothing. The job's fields are
//   written before `generation_` is bumped (release) and stay unchanged until `remaining_`
//   drops to zero, so workers read them without the lock. The bump happens under `mutex_`,
//   so a worker going to sleep cannot miss it.
class HostWorkers {
 public:
  HostWorkers();
  ~HostWorkers();
  HostWorkers(const HostWorkers&) = delete;
  HostWorkers& operator=(const HostWorkers&) = delete;

  // Copies n bytes with every worker plus the calling thread; returns when all are done.
  void memcpy(void* dst, const void* src, size_t n);
  // Joins the threads; memcpy afterwards runs on the calling thread alone.
  void stop();

 private:
  void start();
  // Runs part `id` of every job posted after generation `seen`.
  void worker(int id, uint64_t seen);

  std::mutex submit_mutex_;  // one job at a time; guards threads_ and started_
  std::mutex mutex_;         // pairs with wake_ (Note [Host workers])
  std::condition_variable wake_;
  std::vector<std::thread> threads_;
  bool started_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};  // workers still busy with the current job
  // The current job (Note [Host workers]).
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  size_t n_ = 0;
  int parts_ = 1;
};

// The process-wide worker pool.
HostWorkers& host_workers();

// The pinned chunks of one device (Note [Pageable staging]).
class Staging {
 public:
  explicit Staging(int device);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Staged copies; false when pinned chunks could not be allocated (the caller then uses the
  // driver's path). `s` must belong to this device.
  bool h2d(CudaStream& s, char* dst, const char* src, uint64_t size);
  bool d2h(CudaStream& s, char* dst, const char* src, uint64_t size);

 private:
  bool ensure_chunks();  // under mutex_

  struct Chunk {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  int device_;
  std::mutex mutex_;
  bool tried_ = false, ok_ = false;
  Chunk chunks_[kChunks];
};

// True when `p` is ordinary pageable host memory (not pinned, registered, managed or device).
bool is_pageable(const void* p);

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_COPY_HPP_
