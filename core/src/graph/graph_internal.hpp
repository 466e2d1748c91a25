// Internal: the capture hooks that the eager paths call while a capture is open on a device
// (graph.cpp; Note [Graph semantics] in graph.hpp). Every hook is reached only after one acquire
// load of DeviceState::capture found a capture, so the eager path pays that load and nothing
// else.
#pragma once

#include "runtime/device_state.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

namespace bp::detail {

// How many captures are open in the process: desc() tests it (relaxed) before it notes a tensor
// a captured op uses.
extern std::atomic<int> g_open_captures;

inline CaptureState* capture_of(const Device& dev) {
  return state(dev).capture.load(std::memory_order_acquire);
}

// The captured stream of a capture (the device's default stream).
bp_stream* capture_stream(const CaptureState& c) noexcept;

// Throws CaptureError: "<device>: <what> cannot be captured in a graph: <why>; ...".
[[noreturn]] void refuse_capture(const Device& dev, const char* what, const char* why);
// Refuses `what` when a capture is open on `dev` (any stream of it).
inline void refuse_if_capturing(const Device& dev, const char* what, const char* why) {
  if (capture_of(dev)) [[unlikely]]
    refuse_capture(dev, what, why);
}

// A kernel launch on a capturing device. Returns false when `stream` is not the captured one
// (the launch then runs eagerly); otherwise the launch was captured (native: queued on the
// capturing stream; recorded: appended to the list).
bool capture_launch(CaptureState& c, const Kernel& k, bp_stream* stream,
                    std::span<const bp_tensor_desc> in, std::span<const bp_tensor_desc> out,
                    std::span<const bp_attr> attrs);

// Copies and memsets on a capturing device's stream `s`: false when `s` is not the captured
// stream. Copies from or to host memory that Device::host_alloc did not hand out are refused.
bool capture_h2d(CaptureState& c, bp_stream* s, Buffer& dst, uint64_t off, const void* src,
                 uint64_t n);
bool capture_d2h(CaptureState& c, bp_stream* s, void* dst, const Buffer& src, uint64_t off,
                 uint64_t n);
bool capture_d2d(CaptureState& c, bp_stream* s, Buffer& dst, uint64_t dst_off, const Buffer& src,
                 uint64_t src_off, uint64_t n);
bool capture_memset(CaptureState& c, bp_stream* s, Buffer& dst, uint64_t off, int value,
                    uint64_t n);

// A tensor's storage from the graph's private pool.
std::shared_ptr<Buffer> capture_allocate(CaptureState& c, uint64_t bytes);
// A pool buffer holding `n` bytes of host data, uploaded now (outside the captured stream) and
// never reused for anything else: a constant of the graph.
std::shared_ptr<Buffer> capture_constant(CaptureState& c, const void* data, uint64_t n);
// Keeps `b` alive as long as the graph (a buffer captured work uses; pool buffers are kept by
// the pool).
void capture_keep(CaptureState& c, const Buffer& b);
// Defers the free of a buffer during a native capture until the capture has ended (a free on the
// capturing stream would be captured). False: free it now.
bool capture_defer_free(CaptureState& c, bp_buffer* b, uint64_t size, const StreamState* stream,
                        bool counted) noexcept;

// Page-locked host memory handed out by Device::host_alloc (tracked for the capture checks).
void note_host_alloc(DeviceState& s, void* p, uint64_t n);
void note_host_free(DeviceState& s, void* p) noexcept;

}  // namespace bp::detail
