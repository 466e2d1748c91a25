// Internal: the one hook point of the runtime layer (Note [Interceptors]). An upper layer (graph
// capture, graph.cpp) implements Interceptor and installs it on a device; the runtime and tensor
// layers call it without knowing what it is.
#pragma once

#include "runtime/device_state.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

namespace bp::detail {

// Note [Interceptors]
//   One pointer per device, DeviceState::interceptor, null unless an upper layer installed an
//   Interceptor there. Every launch, copy, memset, tensor allocation, constant upload, buffer
//   use (a descriptor built for an op) and free of the device, and every host-side operation
//   that could conflict with it (a synchronisation, an event, an allocation outside the
//   tensor path), tests it with one acquire load; the eager path pays that load and nothing
//   else (desc() tests a process-wide count first, so it does not touch the device's state).
//   When it is set, the caller pins it (InterceptorPin: a per-device count of calls in
//   progress, raised before the pointer is read again) and calls it; uninstall() clears the
//   pointer and then waits until no call is in progress, so the installer may free the
//   interceptor once uninstall returns, whichever threads were inside it. A pinned call may
//   pin again (a hook that allocates), and never waits for the installing thread.
//   PyTorch's VariableHooksInterface is the precedent: a lower layer calling an upper one
//   through an interface the lower layer owns.

// A copy or memset queued on `stream`.
struct Transfer {
  enum Kind : uint8_t { h2d, d2h, d2d, memset } kind = d2d;
  bp_stream* stream = nullptr;
  Buffer* dst = nullptr;           // h2d, d2d, memset
  const Buffer* src = nullptr;     // d2h, d2d
  const void* host_src = nullptr;  // h2d
  void* host_dst = nullptr;        // d2h
  uint64_t dst_off = 0, src_off = 0, n = 0;
  int value = 0;  // memset
};

class Interceptor {
 public:
  // Each returns true (or a buffer) when it took the operation: the caller then does nothing
  // more. false (or nullptr) sends the operation down the eager path. Each may throw to refuse
  // the operation before anything was done.
  virtual bool launch(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
                      std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) = 0;
  virtual bool transfer(const Transfer& t) = 0;
  // Storage of a new tensor (make_empty).
  virtual std::shared_ptr<Buffer> allocate(uint64_t bytes) = 0;
  // Storage of a new tensor holding `n` bytes of host data (a constant), already uploaded.
  virtual std::shared_ptr<Buffer> constant(const void* data, uint64_t n) = 0;
  // `b` is about to be used by an op whose descriptors were just built.
  virtual void use(const Buffer& b) = 0;
  // The free of a buffer allocated on `stream` (NULL: the default stream).
  virtual bool release(bp_buffer* b, uint64_t size, const StreamState* stream,
                       bool counted) noexcept = 0;
  // A host-side operation `what` on `stream` (NULL: on the whole device) that the interceptor
  // may refuse by throwing; `why` says why it could not be intercepted.
  virtual void host_op(bp_stream* stream, const char* what, const char* why) = 0;

 protected:
  ~Interceptor() = default;
};

// How many interceptors are installed in the process (desc() tests it, relaxed, before it looks
// at a device).
extern std::atomic<int> g_interceptors;

// Installs `i` on `ds`; false when another one is installed (nothing changed).
bool install_interceptor(DeviceState& ds, Interceptor* i) noexcept;
// Clears the device's interceptor and waits until no call pinned it (Note [Interceptors]).
void uninstall_interceptor(DeviceState& ds) noexcept;

// A pinned view of a device's interceptor (null when none is installed).
class InterceptorPin {
 public:
  explicit InterceptorPin(DeviceState& ds) noexcept : ds_(ds) {
    ds_.interceptor_pins.fetch_add(1, std::memory_order_seq_cst);
    i_ = ds_.interceptor.load(std::memory_order_seq_cst);
  }
  ~InterceptorPin() { ds_.interceptor_pins.fetch_sub(1, std::memory_order_release); }
  InterceptorPin(const InterceptorPin&) = delete;
  InterceptorPin& operator=(const InterceptorPin&) = delete;
  Interceptor* operator->() const noexcept { return i_; }
  explicit operator bool() const noexcept { return i_ != nullptr; }

 private:
  DeviceState& ds_;
  Interceptor* i_;
};

// The hooks the eager paths call: one acquire load when nothing is installed.
inline bool intercepted_launch(DeviceState& ds, const Kernel& k, bp_stream* stream,
                               std::span<const bp_tensor_desc> in,
                               std::span<const bp_tensor_desc> out,
                               std::span<const bp_attr> attrs) {
  if (!ds.interceptor.load(std::memory_order_acquire)) [[likely]]
    return false;
  InterceptorPin p(ds);
  return p && p->launch(k, stream, in, out, attrs);
}
inline bool intercepted_transfer(DeviceState& ds, const Transfer& t) {
  if (!ds.interceptor.load(std::memory_order_acquire)) [[likely]]
    return false;
  InterceptorPin p(ds);
  return p && p->transfer(t);
}
inline void intercepted_host_op(DeviceState& ds, bp_stream* stream, const char* what,
                                const char* why) {
  if (!ds.interceptor.load(std::memory_order_acquire)) [[likely]]
    return;
  InterceptorPin p(ds);
  if (p) p->host_op(stream, what, why);
}

}  // namespace bp::detail
