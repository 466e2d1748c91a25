// The CPU allocator: 64-byte aligned blocks from oneTBB's scalable allocator (tbbmalloc), with
// the statistics of memory_stats in the SDK's MemoryCounters (Note [Memory accounting] in
// memory_counters.hpp).
//
// The block's address is the bp_buffer* handed to the host (Note [CPU buffers] in
// cpu_plugin.cpp). reserved equals allocated: tbbmalloc's own caches are not visible.
// AddressSanitizer builds use posix_memalign instead (Note [CPU allocator under
// AddressSanitizer] in cpu_allocator.cpp).
// Thread-safe: every member may be called from any thread at once.
#ifndef BACKPLANE_CPU_ALLOCATOR_HPP_
#define BACKPLANE_CPU_ALLOCATOR_HPP_

#include <backplane/abi/plugin_abi.h>
#include <backplane/sdk/memory_counters.hpp>

#include <cstdint>

namespace bp::cpu {

inline constexpr uint64_t kAlignment = 64;

// A 64-byte aligned host block from the allocator below's source (tbbmalloc, whose cache of
// freed large blocks gives a kernel's scratch memory back without fresh page faults), not
// counted in memory_stats: kernels' scratch memory (AlignedBuffer). Throws bp::sdk::Failure with
// BP_ERROR_OUT_OF_MEMORY as CpuAllocator::allocate does. host_free accepts NULL.
void* host_allocate(uint64_t size);
void host_free(void* p);
// Returns tbbmalloc's cached free memory to the system.
void release_host_cache();

class CpuAllocator {
 public:
  // Returns a 64-byte aligned block of `size` bytes; the caller frees it with deallocate(p,
  // size). size 0 returns a unique block that counts as 0 bytes. Throws bp::sdk::Failure with
  // BP_ERROR_OUT_OF_MEMORY naming the request and the free memory when tbbmalloc cannot
  // satisfy it even after releasing its caches.
  void* allocate(uint64_t size);
  // Frees a block from allocate; `size` is the size it was requested with. Accepts NULL.
  void deallocate(void* p, uint64_t size);

  bp_memory_stats stats() const;
  // Resets peak_allocated to the current allocated.
  void reset_peak() { counters_.reset_peak(); }
  // Returns tbbmalloc's cached free memory to the system.
  void release_cache();

 private:
  bp::sdk::MemoryCounters counters_;
};

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_ALLOCATOR_HPP_
