// The runtime's side of Note [Observers]: the flag, the registered observer, and what every layer
// shares of it (the clock, sizes as text, the out-of-memory summary).
#include "runtime/observer.hpp"

#include <chrono>
#include <cstdio>

namespace bp::detail {

std::atomic<uint32_t> g_observe{0};

namespace {
std::atomic<Observer*> g_observer{nullptr};
}  // namespace

void set_observer(Observer* o) noexcept {
  g_observer.store(o, std::memory_order_release);
}

Observer& observer_hooks() noexcept {
  return *g_observer.load(std::memory_order_acquire);
}

int64_t clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string format_size(uint64_t n) {
  char buf[64];
  if (n >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / double(1ull << 30));
  else if (n >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / double(1ull << 20));
  else if (n >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(n) / double(1ull << 10));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  return buf;
}

// Note [Out-of-memory summary]
//   An allocation the plugin refuses with BP_ERROR_OUT_OF_MEMORY throws OutOfMemory whose message
//   ends with the allocator's state, like PyTorch's: bytes allocated and reserved (with what the
//   cache holds), the device's free memory, the largest free block when the allocator knows it
//   (the plugin ABI does not report one, so the message says so), and the five largest users by
//   op when the memory history records (otherwise how to turn it on).
std::string oom_summary(Device& dev) {
  DeviceState& s = state(dev);
  std::string out = "allocator summary for " + dev.str() + ": ";
  bp_memory_stats m{};
  m.struct_size = sizeof m;
  if (bp_error* e = s.api->memory_stats(s.index, &m)) {
    s.api->error_free(e);
    out += "memory statistics unavailable";
  } else {  // counts from libbackplane, `reserved` from the plugin (Note [Memory accounting])
    const uint64_t allocated = s.memory.allocated();
    out += format_size(allocated) + " allocated in " + std::to_string(s.memory.live()) +
           " blocks, " + format_size(m.reserved) + " reserved (" +
           format_size(m.reserved > allocated ? m.reserved - allocated : 0) +
           " reserved but unallocated), peak " + format_size(s.memory.peak());
  }
  out += "; device memory free " + format_size(dev.free_memory()) + " of " +
         format_size(dev.properties().total_memory);
  out += "; largest free block: not reported by the " + dev.backend_name() + " plugin";
  if (!observing()) {
    out += "; top users: not recorded (bp::record_memory_history(true) records them)";
    return out;
  }
  observer_hooks().oom_users(dev, out);
  return out;
}

}  // namespace bp::detail
