// oneDNN glue of the CPU backend's primitive-based kernels (cpu_conv.cpp): the engine, a
// per-thread stream, OpenMP's thread count around a call, user-managed scratchpads, and the
// primitive cache.
//
// Note [CPU primitive cache]
//   Creating a oneDNN primitive (choosing an implementation, JIT-compiling its kernel) costs
//   from tens of microseconds to milliseconds, far more than a small convolution, so primitives
//   are created once per key and kept: the key is a string naming the op, the dtypes, every
//   shape and every attribute that the primitive depends on (two launches with equal keys are
//   served by the same primitive). The cache is bounded (kCapacity entries, least recently used
//   evicted) and thread-safe: a lookup holds the mutex only to find or insert the entry; the
//   entry is then built outside it under its own std::once_flag, so each key is created exactly
//   once even when several threads miss it together, and other keys are not held up meanwhile.
//   A build that throws leaves the flag unset and the next lookup tries again. Entries are
//   shared_ptr: an evicted primitive stays alive until the launches using it return.
//   Primitives are created with scratchpad_mode::user and each execution passes a scratchpad
//   of its own, so one primitive runs on several threads at once (oneDNN's library-managed
//   scratchpad is shared between primitives).
//   Each entry is created for one OpenMP thread count, part of its key, with OpenMP's count set
//   to it while it is built, and its calls run with that count (DnnlPrimitive::threads): oneDNN
//   2.x fixes a primitive's thread count when it is created (the building thread's
//   omp_get_max_threads()), so a primitive built on the launching thread (OpenMP's default:
//   every core) and run one-threaded on a oneTBB worker would start an OpenMP team of its own
//   on that worker. Once OpenMP has more threads than cores it stops spinning between parallel
//   regions, for the whole process: on 2 cores, f32 ResNet-18 inference at batch 1 went from
//   7.5 to 14 ms after one bf16 training step, whose convolutions' primitives had been probed
//   on the launching thread and run on the workers.
#ifndef BACKPLANE_CPU_DNNL_CACHE_HPP_
#define BACKPLANE_CPU_DNNL_CACHE_HPP_

#include "cpu_allocator.hpp"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

namespace bp::cpu {

// The CPU engine (one per process).
dnnl::engine& dnnl_engine();
// The calling thread's stream on it (oneDNN's CPU streams execute on the calling thread).
dnnl::stream& dnnl_stream();

// What a cached entry holds: the primitive and the memory descriptors its caller binds, in an
// order the caller defines (md[0..3]), the scratchpad's descriptor, and whether it computes in
// the launch's own dtype (native) or in f32 after conversion.
// A primitive created with blocked layouts (format_tag::any) also records, for up to three of
// its arguments, the layout it chose (impl[k]) for argument id arg[k]: the caller binds plain
// memory of md[k] and the execution reorders through impl[k] when they differ (inputs before,
// outputs after).
struct DnnlPrimitive {
  dnnl::primitive prim;
  int threads = 1;  // the OpenMP thread count it was created for: run it with that many
  dnnl::memory::desc md[4];
  dnnl::memory::desc scratchpad;
  bool native = true;
  int arg[3] = {0, 0, 0};
  bool output[3] = {false, false, false};
  dnnl::memory::desc impl[3];
  // The reorder between md[k] and impl[k] (plain to chosen for an input, back for an output),
  // created with the primitive, where they differ; a user scratchpad of reorder_scratch[k].
  dnnl::reorder reorder[3];
  dnnl::memory::desc reorder_scratch[3];
};

// The entry for `key` and `threads` OpenMP threads (at least 1), built by make() on first use
// with OpenMP's thread count set to `threads` (Note [CPU primitive cache]).
std::shared_ptr<const DnnlPrimitive> dnnl_cached(const std::string& key, int threads,
                                                 const std::function<DnnlPrimitive()>& make);
// A oneDNN memory over `p` (CPU memories wrap the caller's pointer; nothing is copied).
dnnl::memory dnnl_mem(const dnnl::memory::desc& md, const void* p);
// Runs p.prim with `args` and a user scratchpad of p.scratchpad on the calling thread, with the
// OpenMP thread count it was created for, and waits. Throws dnnl::error.
void dnnl_run(const DnnlPrimitive& p, std::unordered_map<int, dnnl::memory>& args);
// Note [oneDNN reference kernels] (cpu_conv.cpp): whether a primitive descriptor's
// implementation is oneDNN's reference kernel, far slower than converting to f32.
inline bool is_reference(const char* impl_info) {
  return std::string(impl_info).find("ref") != std::string::npos;
}
// Entries currently cached, and the bound (for tests).
size_t dnnl_cache_size();
inline constexpr size_t kDnnlCacheCapacity = 256;

// Sets OpenMP's thread count of the calling thread for one call, then restores it (Note [One
// thread pool] in cpu_matmul.cpp: oneDNN threads with OpenMP, the backend with oneTBB).
class OmpThreads {
 public:
  explicit OmpThreads(int n) : prev_(omp_get_max_threads()) {
    if (prev_ != n) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != prev_) omp_set_num_threads(prev_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int prev_;
};

// A 64-byte aligned host scratch buffer (scratchpads, converted operands, a convolution's
// operands in oneDNN's layouts); freed on scope exit. From host_allocate: tbbmalloc keeps
// freed large blocks for the next request, so a kernel that needs megabytes of scratch per call
// does not fault in fresh pages every time (operator new's large blocks were mmap'ed and
// unmapped per call).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { reset(bytes); }
  void reset(size_t bytes) { p_.reset(bytes ? static_cast<char*>(host_allocate(bytes)) : nullptr); }
  template <class T = void>
  T* get() const {
    return reinterpret_cast<T*>(p_.get());
  }

 private:
  struct Free {
    void operator()(char* p) const { host_free(p); }
  };
  std::unique_ptr<char, Free> p_;
};

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_DNNL_CACHE_HPP_
