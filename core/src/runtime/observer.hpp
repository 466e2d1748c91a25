// Internal: how the runtime layer reports launches, copies, allocations, frees and
// synchronisations to an observer above it, the profiler (Note [Observers]). Nothing here knows
// what the observer records.
#pragma once

#include "runtime/device_state.hpp"

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

namespace bp::detail {

// Note [Observers]
//   The profiler and the memory history (the profiler layer, profiler.hpp) see what the runtime
//   does through one process-wide Observer that profiler.cpp registers while libbackplane loads
//   (a static initialiser, before any user code runs). The runtime tests g_observe (one relaxed
//   load: Note [Profiler cost when off] in profiler.hpp) and calls the observer only when it is
//   set, which only the profiler does, after registering. Like the Interceptor of graph capture
//   (Note [Interceptors]), this lets a lower layer call an upper one through an interface the
//   lower layer owns.
inline constexpr uint32_t kObserveProfile = 1;  // a profiler session runs
inline constexpr uint32_t kObserveMemory = 2;   // record_memory_history(true)
extern std::atomic<uint32_t> g_observe;

// The one branch of the per-op path when nothing observes.
inline bool observing() noexcept {
  return g_observe.load(std::memory_order_relaxed) != 0;
}

int64_t clock_ns() noexcept;  // steady clock

// "1.50 MiB", "12 bytes".
std::string format_size(uint64_t bytes);

enum class CopyKind { h2d, d2h, d2d, peer, memset };

class Observer {
 public:
  // Runs `k` (through launch_unobserved) and records it.
  virtual void launch(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
                      std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) = 0;
  // Brackets one copy or memset queued on `stream`: copy_begin before the plugin call returns a
  // record (null when nothing is recorded), copy_end after it with `done` (false: the call
  // failed), which takes the record.
  virtual void* copy_begin(CopyKind kind, Device& dev, bp_stream* stream, uint64_t bytes,
                           const bp_buffer* dst) = 0;
  virtual void copy_end(void* record, bool done) noexcept = 0;
  virtual void alloc(Device& dev, const bp_buffer* b, uint64_t size, const StreamState* s) = 0;
  virtual void free(Device& dev, const bp_buffer* b, uint64_t size) = 0;
  // A stream synchronisation that began at host time `t0` (clock_ns()) just finished.
  virtual void sync(Device& dev, bp_stream* stream, int64_t t0) = 0;
  // The next synchronisation on this thread is an implicit one of `what`.
  virtual void implicit_sync(const Device& dev, const char* what) = 0;
  // Appends "; top users: ..." of `dev`'s live memory to an out-of-memory summary.
  virtual void oom_users(Device& dev, std::string& out) = 0;
  // The process is exiting (Note [Exit] in registry.cpp): every device's queued work has
  // finished and every plugin is still loaded. Called once, before any exit handler that a
  // plugin or its libraries registered (a whole-run trace is written here).
  virtual void process_exit() noexcept = 0;

 protected:
  ~Observer() = default;
};

// Registers the observer (once; profiler.cpp). Until then observing() stays false.
void set_observer(Observer* o) noexcept;
// The registered observer; call only when observing().
Observer& observer_hooks() noexcept;

// The launch itself, without recording (plugin_device.cpp): what Observer::launch calls.
void launch_unobserved(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
                       std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs);

// Brackets one copy or memset queued on `stream` of `dev`: construct before the plugin call,
// done() after it succeeded. Does nothing unless observing().
class ObservedCopy {
 public:
  ObservedCopy(CopyKind kind, Device& dev, bp_stream* stream, uint64_t bytes,
               const bp_buffer* dst) {
    if (observing()) [[unlikely]]
      record_ = observer_hooks().copy_begin(kind, dev, stream, bytes, dst);
  }
  void done() noexcept {
    if (record_) [[unlikely]]
      observer_hooks().copy_end(std::exchange(record_, nullptr), true);
  }
  ~ObservedCopy() {
    if (record_) [[unlikely]]
      observer_hooks().copy_end(record_, false);
  }
  ObservedCopy(const ObservedCopy&) = delete;
  ObservedCopy& operator=(const ObservedCopy&) = delete;

 private:
  void* record_ = nullptr;
};

// The allocator summary appended to out-of-memory errors (Note [Out-of-memory summary]).
std::string oom_summary(Device& dev);

}  // namespace bp::detail
