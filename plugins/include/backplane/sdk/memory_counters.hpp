// bp::sdk::MemoryCounters: the allocation statistics of one device (live bytes, their peak, live
// and total allocations), kept with relaxed atomics and no lock. Header-only.
//
// Note [Memory accounting]
//   libbackplane counts every buffer it allocates through a plugin itself, with one of these per
//   device: it passes every size to mem_alloc and mem_free, so it needs nothing from the plugin
//   to know what is live, and its MemoryStats::allocated, peak_allocated and num_allocs are the
//   same on every backend (requested bytes; imported buffers not counted). From a plugin it reads
//   only what the plugin alone knows: `reserved`, the bytes it holds from the system, caches
//   included (bp_memory_stats in plugin_abi.h). A plugin still fills allocated, peak_allocated
//   and num_allocs for hosts other than libbackplane and for bp-conformance; the backends of
//   this repository do it with this class, counting user allocations (mem_alloc/mem_free) only,
//   not their own scratch memory.
//
//   Cost: on_alloc is two relaxed fetch_adds on one cache line plus a load of the peak (a CAS
//   only when the peak grows); on_free two relaxed fetch_subs. Relaxed is enough: each counter
//   is exact by itself (every add and sub lands once in its modification order), and readers
//   want figures, not an ordering with other memory. A reader may see the counters of one
//   allocation half-applied (allocated grown, num_allocs not yet); once the allocating and
//   freeing threads are done, every value is exact. peak() never reads below allocated().
#ifndef BACKPLANE_MEMORY_COUNTERS_HPP_
#define BACKPLANE_MEMORY_COUNTERS_HPP_

#include <backplane/abi/plugin_abi.h>

#include <atomic>
#include <cstdint>

namespace bp::sdk {

class MemoryCounters {
 public:
  // A successful allocation of `size` requested bytes (0 counts as a live allocation of 0 bytes).
  void on_alloc(uint64_t size) noexcept {
    const uint64_t now = allocated_.fetch_add(size, std::memory_order_relaxed) + size;
    live_.fetch_add(1, std::memory_order_relaxed);
    total_.fetch_add(1, std::memory_order_relaxed);
    uint64_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  // The free of an allocation counted by on_alloc(size).
  void on_free(uint64_t size) noexcept {
    allocated_.fetch_sub(size, std::memory_order_relaxed);
    live_.fetch_sub(1, std::memory_order_relaxed);
  }

  uint64_t allocated() const noexcept { return allocated_.load(std::memory_order_relaxed); }
  // The high-water mark of allocated() since construction or the last reset_peak().
  uint64_t peak() const noexcept {
    const uint64_t a = allocated(), p = peak_.load(std::memory_order_relaxed);
    return p > a ? p : a;
  }
  uint64_t live() const noexcept { return live_.load(std::memory_order_relaxed); }
  // Allocations made since construction (frees do not lower it).
  uint64_t total() const noexcept { return total_.load(std::memory_order_relaxed); }
  // Starts the peak again from the current allocated().
  void reset_peak() noexcept { peak_.store(allocated(), std::memory_order_relaxed); }

  // Fills allocated, peak_allocated and num_allocs (live) of a bp_memory_stats.
  void fill(bp_memory_stats& s) const noexcept {
    s.allocated = allocated();
    s.peak_allocated = peak();
    s.num_allocs = live();
  }

 private:
  std::atomic<uint64_t> allocated_{0};
  std::atomic<uint64_t> live_{0};
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace bp::sdk

#endif  // BACKPLANE_MEMORY_COUNTERS_HPP_
