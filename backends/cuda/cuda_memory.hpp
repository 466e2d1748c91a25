// Device memory of the CUDA backend: the per-stream cache of small freed blocks in front of a
// per-device stream-ordered pool, and the plugin-side statistics.
//
// Note [Stream-ordered pool]
//   Each device owns one cudaMemPool_t created by the plugin (not the device's default pool,
//   so our settings and statistics never mix with other CUDA users in the process), with
//   cudaMemPoolAttrReleaseThreshold = UINT64_MAX: memory freed into the pool stays reserved and
//   is reused by later cudaMallocFromPoolAsync calls instead of going back to the driver at
//   every synchronisation. memory_empty_cache trims it to zero.
//
// Note [Small-block cache]
//   cudaMallocFromPoolAsync + cudaFreeAsync cost about 0.7 us per pair, a fifth of the per-op
//   budget of a one-element op. Blocks of up to kMaxCachedBytes are therefore rounded up to a
//   size class (four classes per power of two) and, when freed, parked in a small cache owned
//   by the stream they were freed on. A later allocation of the same class on the same stream
//   takes the block back without calling CUDA. This is safe for the same reason the pool's own
//   reuse is: work queued on a stream runs in order, so anything queued after the free runs
//   after every use of the block that the free was ordered behind. Blocks never move between
//   streams. The cache is bounded (kPerClass blocks per class, kMaxCacheBytes per stream) and
//   is emptied by stream_destroy, memory_empty_cache and the out-of-memory retry.
//   Statistics stay exact: `allocated`/`num_allocs` count requested bytes of live user
//   allocations (cached blocks are not live), `reserved` is the pool's reserved memory (cached
//   blocks are part of it).
#ifndef BACKPLANE_CUDA_MEMORY_HPP_
#define BACKPLANE_CUDA_MEMORY_HPP_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace bp::cuda {

// Size classes of Note [Small-block cache].
constexpr uint64_t kMinClassBytes = 512;
constexpr uint64_t kMaxCachedBytes = uint64_t{1} << 20;
constexpr int kNumSizeClasses = 1 + 4 * 11;  // <=512 B, then 4 per octave up to 1 MiB

// Class index of a request, or -1 when it is too large to be cached. size must be > 0.
inline int size_class(uint64_t size) {
  if (size <= kMinClassBytes) return 0;
  if (size > kMaxCachedBytes) return -1;
  const int k = 63 - __builtin_clzll(size - 1);  // 2^k < size <= 2^(k+1), k >= 9
  const uint64_t quarter = uint64_t{1} << (k - 2);
  const int j = static_cast<int>((size - (uint64_t{1} << k) + quarter - 1) / quarter);  // 1..4
  return 1 + (k - 9) * 4 + (j - 1);
}

// Bytes of a block of class `cls`.
inline uint64_t class_bytes(int cls) {
  if (cls == 0) return kMinClassBytes;
  const int k = 9 + (cls - 1) / 4, j = 1 + (cls - 1) % 4;
  return (uint64_t{1} << k) + static_cast<uint64_t>(j) * (uint64_t{1} << (k - 2));
}

// Freed blocks of one stream (Note [Small-block cache]). Thread-safe: a stream has no owning
// thread (Note [Stream threading] in plugin_abi.h), so take and put come from every thread
// that allocates or frees on the stream, and drain from any thread (stream_destroy,
// empty_cache, the out-of-memory retry); every member runs under the cache's own lock. Reuse
// stays stream-ordered whichever thread takes a block: the free that parked it was queued on
// the stream before the take, so the new owner's work runs after the old owner's.
class BlockCache {
 public:
  static constexpr int kPerClass = 16;
  static constexpr uint64_t kMaxCacheBytes = uint64_t{64} << 20;

  // A cached block of class `cls`, or nullptr.
  void* take(int cls) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_[cls] == 0) return nullptr;
    bytes_ -= class_bytes(cls);
    return slots_[cls][--count_[cls]];
  }

  // Parks a block of class `cls`; false when the cache is full (the caller frees it).
  bool put(int cls, void* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t b = class_bytes(cls);
    if (count_[cls] == kPerClass || bytes_ + b > kMaxCacheBytes) return false;
    slots_[cls][count_[cls]++] = block;
    bytes_ += b;
    return true;
  }

  // Removes every block, calling release(ptr) for each (under the cache's lock).
  template <class F>
  void drain(F&& release) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int c = 0; c < kNumSizeClasses; ++c) {
      while (count_[c] > 0) release(slots_[c][--count_[c]]);
    }
    bytes_ = 0;
  }

 private:
  std::mutex mutex_;
  void* slots_[kNumSizeClasses][kPerClass] = {};
  int count_[kNumSizeClasses] = {};
  uint64_t bytes_ = 0;
};

// Plugin-side statistics of one device: requested bytes of live user allocations.
struct MemoryCounters {
  std::atomic<uint64_t> allocated{0};
  std::atomic<uint64_t> peak{0};
  std::atomic<uint64_t> num_allocs{0};

  void on_alloc(uint64_t size) {
    const uint64_t now = allocated.fetch_add(size, std::memory_order_relaxed) + size;
    num_allocs.fetch_add(1, std::memory_order_relaxed);
    uint64_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void on_free(uint64_t size) {
    allocated.fetch_sub(size, std::memory_order_relaxed);
    num_allocs.fetch_sub(1, std::memory_order_relaxed);
  }
};

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_MEMORY_HPP_
