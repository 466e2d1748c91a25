// Parallel host memcpy and the staging of pageable copies (Note [Pageable staging]).
#include "cuda_copy.hpp"

#include "cuda_common.hpp"
#include "cuda_device.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>

namespace bp::cuda {

// ---- HostWorkers -----------------------------------------------------------------------------

namespace {

// Below this a single thread copies faster than waking the pool.
constexpr size_t kParallelMin = size_t{1} << 20;

// How long an idle worker spins before it sleeps (Note [Host workers]).
constexpr int kSpinMicros = 200;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

// Byte range [begin, end) of part `id` of `parts` over n bytes, split on 4 KiB pages.
void part_range(size_t n, int parts, int id, size_t& begin, size_t& end) {
  size_t per = (n + static_cast<size_t>(parts) - 1) / static_cast<size_t>(parts);
  per = (per + 4095) & ~size_t{4095};
  begin = std::min(n, per * static_cast<size_t>(id));
  end = std::min(n, begin + per);
}

}  // namespace

HostWorkers::HostWorkers() = default;

HostWorkers::~HostWorkers() {
  stop();
}

void HostWorkers::start() {
  started_ = true;
  const unsigned hw = std::thread::hardware_concurrency();
  const int total = std::clamp(static_cast<int>(hw / 2), 1, 8);
  // Workers start from the current generation (no job is posted while submit_mutex_ is held
  // here), so the first job cannot slip past a thread that starts late.
  const uint64_t gen0 = generation_.load(std::memory_order_acquire);
  for (int id = 1; id < total; ++id) {
    try {
      threads_.emplace_back([this, id, gen0] { worker(id, gen0); });
    } catch (const std::system_error&) {
      break;  // fewer threads: still correct
    }
  }
}

void HostWorkers::worker(int id, uint64_t seen) {
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    const auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    for (int k = 1; g == seen && !stopping_.load(std::memory_order_relaxed); ++k) {
      cpu_relax();
      if (k % 256 == 0 && std::chrono::steady_clock::now() > spin_end) break;
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_.load() || generation_.load(std::memory_order_acquire) != seen;
      });
      g = generation_.load(std::memory_order_acquire);
    }
    if (stopping_.load()) return;
    seen = g;
    size_t b, e;
    part_range(n_, parts_, id, b, e);
    if (e > b) std::memcpy(dst_ + b, src_ + b, e - b);
    remaining_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void HostWorkers::memcpy(void* dst, const void* src, size_t n) {
  if (n < kParallelMin) {
    std::memcpy(dst, src, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mutex_);
  if (!started_) start();
  const int workers = static_cast<int>(threads_.size());
  if (workers == 0) {
    std::memcpy(dst, src, n);
    return;
  }
  dst_ = static_cast<char*>(dst);
  src_ = static_cast<const char*>(src);
  n_ = n;
  parts_ = workers + 1;
  remaining_.store(workers, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  size_t b, e;
  part_range(n, workers + 1, 0, b, e);
  if (e > b) std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  for (int k = 1; remaining_.load(std::memory_order_acquire) != 0; ++k) {
    if (k % 1024 == 0) {
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
  }
}

void HostWorkers::stop() {
  std::lock_guard<std::mutex> submit(submit_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  started_ = true;  // never restart
}

HostWorkers& host_workers() {
  static HostWorkers* w = new HostWorkers();  // lives as long as the plugin; stop() joins
  return *w;
}

// ---- Staging ---------------------------------------------------------------------------------

bool is_pageable(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return attr.type == cudaMemoryTypeUnregistered;
}

Staging::Staging(int device) : device_(device) {}

Staging::~Staging() {
  for (Chunk& c : chunks_) {
    if (c.done) (void)cudaEventDestroy(c.done);
    if (c.host) (void)cudaFreeHost(c.host);
    c = Chunk{};
  }
  (void)cudaGetLastError();
}

bool Staging::ensure_chunks() {
  if (tried_) return ok_;
  tried_ = true;
  use_device(device_);
  for (Chunk& c : chunks_) {
    if (cudaHostAlloc(&c.host, kChunkBytes, cudaHostAllocPortable) != cudaSuccess ||
        cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;  // the driver path still works; ~Staging frees what was allocated
    }
  }
  ok_ = true;
  return true;
}

bool Staging::h2d(CudaStream& s, char* dst, const char* src, uint64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ensure_chunks()) return false;
  HostWorkers& workers = host_workers();
  uint64_t pos = 0;
  for (int i = 0; pos < size; ++i) {
    Chunk& c = chunks_[i % kChunks];
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, size - pos));
    BP_CUDA_CHECK(cudaEventSynchronize(c.done));  // the chunk's previous DMA is done
    workers.memcpy(c.host, src + pos, n);
    BP_CUDA_CHECK(cudaMemcpyAsync(dst + pos, c.host, n, cudaMemcpyHostToDevice, s.stream));
    BP_CUDA_CHECK(cudaEventRecord(c.done, s.stream));
    pos += n;
  }
  return true;
}

bool Staging::d2h(CudaStream& s, char* dst, const char* src, uint64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ensure_chunks()) return false;
  HostWorkers& workers = host_workers();
  const uint64_t pieces = (size + kChunkBytes - 1) / kChunkBytes;
  auto piece_bytes = [&](uint64_t k) {
    return static_cast<size_t>(std::min<uint64_t>(kChunkBytes, size - k * kChunkBytes));
  };
  uint64_t issued = 0;
  for (uint64_t k = 0; k < pieces; ++k) {
    // Keep up to kChunks DMAs in flight ahead of the host copies.
    for (; issued < pieces && issued < k + kChunks; ++issued) {
      Chunk& c = chunks_[issued % kChunks];
      BP_CUDA_CHECK(cudaEventSynchronize(c.done));  // free of earlier copies
      BP_CUDA_CHECK(cudaMemcpyAsync(c.host, src + issued * kChunkBytes, piece_bytes(issued),
                                    cudaMemcpyDeviceToHost, s.stream));
      BP_CUDA_CHECK(cudaEventRecord(c.done, s.stream));
    }
    Chunk& c = chunks_[k % kChunks];
    BP_CUDA_CHECK(cudaEventSynchronize(c.done));
    workers.memcpy(dst + k * kChunkBytes, c.host, piece_bytes(k));
  }
  return true;
}

Staging& Device::staging() {
  std::call_once(staging_once_, [&] { staging_ = std::make_unique<Staging>(index()); });
  return *staging_;
}

void Device::release_staging() {
  staging_.reset();
}

}  // namespace bp::cuda
