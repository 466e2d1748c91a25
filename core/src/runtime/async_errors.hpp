// Internal: errors of work that failed on the device after it was queued, and lost devices
// (Note [Asynchronous errors] in plugin_abi.h, Note [Device lost] in runtime.hpp).
#pragma once

#include "runtime/device_state.hpp"

#include <cstdint>
#include <string>

namespace bp::detail {

// Where a stream's failure was found, for the message: "stream synchronize", "copy
// device->host", "event synchronize".
struct FoundBy {
  const char* what;
  // The op whose own launch waited for it (BACKPLANE_LAUNCH_BLOCKING=1), else 0.
  uint64_t blocking_op = 0;
};

// Throws for `err`, an error of a call that waits for or reads the work of stream `s` of
// `ds` (`st`, its state, may be null): an AsyncError (DeviceLost for a lost device) naming the
// op that failed when the plugin's record says work failed on the device (Note [Asynchronous
// errors]), or for a plugin without the record when work was queued on the stream since its
// last synchronisation; else the plain plugin error. `mark` is the device's last op id before
// the call. A DeviceLost marks the device lost and runs the on_device_lost callbacks first.
[[noreturn]] void throw_stream_error(DeviceState& ds, StreamState* st, bp_stream* s, bp_error* err,
                                     FoundBy found, uint64_t mark);

// Throws for `err`, an error of a call that queues work on stream `s` (a launch, a copy): a
// DeviceLost when the plugin's record says the device is lost (Note [Device lost]), else the
// plain plugin error with `context`.
[[noreturn]] void throw_queue_error(DeviceState& ds, bp_stream* s, bp_error* err,
                                    const std::string& context);

// Records that the stream was synchronised without error with every op up to `mark` queued.
inline void note_synced(StreamState& st, uint64_t mark) noexcept {
  uint64_t prev = st.synced_through.load(std::memory_order_relaxed);
  while (prev < mark &&
         !st.synced_through.compare_exchange_weak(prev, mark, std::memory_order_relaxed)) {
  }
}

// stream_synchronize of stream `s` of `ds` for a caller that holds only the handle, throwing as
// throw_stream_error does ("<what>" found it).
void synchronize_handle(DeviceState& ds, bp_stream* s, const char* what);

}  // namespace bp::detail
