// bp::sdk::SizeClassCache: freed device blocks parked by size class for reuse without asking the
// driver, with no lock (Note [Size-class cache]). Header-only; used by the CUDA and OpenCL
// backends, one cache per stream.
//
// Note [Size classes]
//   A request is rounded up to a class: one class for everything up to 512 bytes, then four
//   classes per power of two (2^k + j * 2^(k-2) for j = 1..4), so a block is at most 25% larger
//   than the request it serves and a freed block serves every request of its class. Blocks are
//   never split or merged.
//
// Note [Size-class cache]
//   A cache holds, for each class up to 2^MaxClassLog2 bytes, PerClass slots, each an atomic
//   pointer that is NULL or a parked block. put(cls, b) claims a NULL slot of the class with a
//   compare-exchange (NULL -> b); take(cls) empties a non-NULL slot with an exchange (-> NULL)
//   and owns whatever the exchange returned. Both scan the class's few slots with plain loads
//   first and touch only slots that look right. Correctness rests on one fact: a slot changes
//   only by these two atomic read-modify-writes, so a block parked once is returned by exactly
//   one exchange; there is no "read the head, then swing it" step, hence no ABA problem and no
//   tag. drain() empties every slot the same way, so it may run while other threads put and
//   take. The parked bytes are bounded by `max_bytes`: put reserves the block's bytes in an
//   atomic total before claiming a slot (and gives them back when no slot is free), take gives
//   them back after emptying a slot, so the total never reads below what is parked; a put may
//   fail spuriously while another thread's put or take is half-way, and then its caller frees
//   the block for real, which is always allowed. put publishes with release and take acquires,
//   so whatever the parking thread wrote into the block's bookkeeping is visible to the taker.
//
//   Stream order is the caller's business: CUDA and OpenCL keep one cache per stream and park a
//   block in the cache of the stream it was freed on; a later allocation on that stream queues
//   its work after the free, so after every use of the block. Blocks never move between
//   streams. A cache never calls the driver; the owner empties it (drain) when a stream is
//   destroyed, on empty_cache and before retrying an allocation that ran out of memory.
#ifndef BACKPLANE_SIZE_CLASS_CACHE_HPP_
#define BACKPLANE_SIZE_CLASS_CACHE_HPP_

#include <atomic>
#include <cstdint>

namespace bp::sdk {

inline constexpr uint64_t kMinClassBytes = 512;

// The class of a request of `size` bytes (Note [Size classes]); 0 for size <= 512. Any size up
// to 2^62 has a class.
inline int size_class(uint64_t size) {
  if (size <= kMinClassBytes) return 0;
  const int k = 63 - __builtin_clzll(size - 1);  // 2^k < size <= 2^(k+1), k >= 9
  const uint64_t quarter = uint64_t{1} << (k - 2);
  const int j = static_cast<int>((size - (uint64_t{1} << k) + quarter - 1) / quarter);  // 1..4
  return 1 + (k - 9) * 4 + (j - 1);
}

// The bytes of a block of class `cls` (at least every size that maps to it).
inline uint64_t class_bytes(int cls) {
  if (cls == 0) return kMinClassBytes;
  const int k = 9 + (cls - 1) / 4, j = 1 + (cls - 1) % 4;
  return (uint64_t{1} << k) + static_cast<uint64_t>(j) * (uint64_t{1} << (k - 2));
}

// Blocks (Block*, never NULL) parked per class. Every member may be called from any thread at
// once; the cache owns no block, it only holds pointers between put and take or drain.
template <class Block, int MaxClassLog2, int PerClass>
class SizeClassCache {
  static_assert(MaxClassLog2 >= 10 && MaxClassLog2 <= 62 && PerClass >= 1);

 public:
  // Classes 0 .. kNumClasses-1: up to 512 bytes, then four per power of two up to 2^MaxClassLog2.
  static constexpr int kNumClasses = 1 + 4 * (MaxClassLog2 - 9);
  static constexpr uint64_t kMaxBlockBytes = uint64_t{1} << MaxClassLog2;

  explicit SizeClassCache(uint64_t max_bytes) noexcept : max_bytes_(max_bytes) {}
  SizeClassCache(const SizeClassCache&) = delete;
  SizeClassCache& operator=(const SizeClassCache&) = delete;

  // The class of a request this cache serves (size_class), or -1 when it is larger than
  // kMaxBlockBytes (allocate and free it without the cache).
  static int class_of(uint64_t size) { return size > kMaxBlockBytes ? -1 : size_class(size); }

  // A parked block of class `cls` (0 <= cls < kNumClasses), now the caller's, or nullptr.
  Block* take(int cls) noexcept {
    std::atomic<Block*>* slots = slots_[cls];
    for (int i = 0; i < PerClass; ++i) {
      if (!slots[i].load(std::memory_order_relaxed)) continue;
      if (Block* b = slots[i].exchange(nullptr, std::memory_order_acquire)) {
        bytes_.fetch_sub(class_bytes(cls), std::memory_order_relaxed);
        return b;
      }
    }
    return nullptr;
  }

  // Parks `block` (of class `cls`, class_bytes(cls) bytes). False when the class's slots are
  // all taken or the cache would exceed max_bytes: the block stays the caller's to free.
  bool put(int cls, Block* block) noexcept {
    const uint64_t b = class_bytes(cls);
    if (bytes_.fetch_add(b, std::memory_order_relaxed) + b > max_bytes_) {
      bytes_.fetch_sub(b, std::memory_order_relaxed);
      return false;
    }
    std::atomic<Block*>* slots = slots_[cls];
    for (int i = 0; i < PerClass; ++i) {
      if (slots[i].load(std::memory_order_relaxed)) continue;
      Block* expected = nullptr;
      if (slots[i].compare_exchange_strong(expected, block, std::memory_order_release,
                                           std::memory_order_relaxed))
        return true;
    }
    bytes_.fetch_sub(b, std::memory_order_relaxed);
    return false;
  }

  // Takes every parked block out and calls release(block, cls) for each; returns how many.
  template <class F>
  int drain(F&& release) {
    int n = 0;
    for (int c = 0; c < kNumClasses; ++c) {
      while (Block* b = take(c)) {
        release(b, c);
        ++n;
      }
    }
    return n;
  }

  // Bytes parked now (of class sizes; may briefly include a put in progress).
  uint64_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  uint64_t max_bytes() const noexcept { return max_bytes_; }

 private:
  const uint64_t max_bytes_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<Block*> slots_[kNumClasses][PerClass] = {};
};

}  // namespace bp::sdk

#endif  // BACKPLANE_SIZE_CLASS_CACHE_HPP_
