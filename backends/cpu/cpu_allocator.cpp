// The CPU allocator (cpu_allocator.hpp).
#include "cpu_allocator.hpp"

#include "cpu_device.hpp"

#include <backplane/sdk/plugin_sdk.hpp>

#include <stdlib.h>
#include <tbb/scalable_allocator.h>

#include <sys/mman.h>

#include <algorithm>

// Note [CPU allocator under AddressSanitizer]
//   ASan cannot see inside tbbmalloc's blocks, so an out-of-bounds kernel access to a device
//   buffer would go unnoticed; ThreadSanitizer cannot see a block freed by one thread and
//   handed to another by tbbmalloc (uninstrumented), and reports the two users as a race.
//   Sanitizer builds therefore take buffers from posix_memalign, which ASan poisons around
//   exactly the requested bytes and TSan tracks, and refuse requests above the physical memory
//   up front (both abort, rather than return NULL, on impossible sizes). There is no cache
//   then, and release_cache does nothing.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BP_CPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BP_CPU_ASAN 1
#endif
#endif

namespace bp::cpu {
namespace {

// No address space is this large; such requests fail without asking tbbmalloc, whose size
// arithmetic (size + alignment + header) must not wrap around.
constexpr uint64_t kMaxRequest = uint64_t{1} << 56;

// Note [Huge pages]: a fresh large block is first touched by the kernel that writes it; with
// 4 KiB pages those page faults cost about half the bandwidth of an elementwise op on a new
// output. Transparent huge pages (in "madvise" mode on most distributions) cut the faults
// 512-fold, as NumPy does for its large arrays.
void advise_huge_pages(void* p, size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (!p || bytes < 2 * kHuge) return;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

void* try_allocate(uint64_t size) {
  if (size > kMaxRequest) return nullptr;
  const size_t bytes = static_cast<size_t>(std::max<uint64_t>(size, 1));
#ifdef BP_CPU_ASAN
  void* p = nullptr;
  if (size > total_memory() || posix_memalign(&p, kAlignment, bytes) != 0) return nullptr;
  advise_huge_pages(p, bytes);
  return p;
#else
  void* p = scalable_aligned_malloc(bytes, kAlignment);
  advise_huge_pages(p, bytes);
  return p;
#endif
}

void release(void* p) {
#ifdef BP_CPU_ASAN
  free(p);
#else
  scalable_aligned_free(p);
#endif
}

}  // namespace

void* host_allocate(uint64_t size) {
  void* p = try_allocate(size);
  if (!p && size <= kMaxRequest) {
    release_host_cache();  // retry once after returning tbbmalloc's caches to the system
    p = try_allocate(size);
  }
  if (!p) {
    const uint64_t free_bytes = available_memory();
    bp::sdk::fail(BP_ERROR_OUT_OF_MEMORY,
                  bp::sdk::format("cpu:0: out of memory allocating %llu bytes (%.2f GiB); "
                                  "%llu bytes (%.2f GiB) of host memory are free",
                                  static_cast<unsigned long long>(size),
                                  static_cast<double>(size) / (1u << 30),
                                  static_cast<unsigned long long>(free_bytes),
                                  static_cast<double>(free_bytes) / (1u << 30)),
                  "ENOMEM");
  }
  return p;
}

void host_free(void* p) {
  if (p) release(p);
}

void* CpuAllocator::allocate(uint64_t size) {
  void* p = host_allocate(size);
  counters_.on_alloc(size);
  return p;
}

void CpuAllocator::deallocate(void* p, uint64_t size) {
  if (!p) return;
  host_free(p);
  counters_.on_free(size);
}

bp_memory_stats CpuAllocator::stats() const {
  bp_memory_stats s{};
  s.struct_size = sizeof(s);
  counters_.fill(s);
  s.reserved = s.allocated;
  return s;
}

void CpuAllocator::release_cache() {
  release_host_cache();
}

void release_host_cache() {
#ifndef BP_CPU_ASAN
  // tbbmalloc (oneTBB 2021.8) dereferences uninitialised state when asked to clean before it
  // has served any allocation (seen when ASan's runtime is loaded), so make sure it has.
  static const bool initialised = [] {
    scalable_free(scalable_malloc(1));
    return true;
  }();
  (void)initialised;
  scalable_allocation_command(TBBMALLOC_CLEAN_ALL_BUFFERS, nullptr);
#endif
}

}  // namespace bp::cpu
