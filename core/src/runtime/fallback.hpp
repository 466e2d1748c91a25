// Internal: the fallback policy, its warnings and its counters (Note [Fallback policy] in
// runtime.hpp), and the launch-level fallback that runs an op on another device.
#pragma once

#include "runtime/device_state.hpp"

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace bp::detail {

// One fallback of `op` with `dtype` on `dev`, from the policy check to its end. The constructor
// throws UnsupportedError when the policy for `op` is error (naming the op, dtype, device, what
// would have been done and how to allow it) and CaptureError while the calling thread captures
// a graph on `dev`; under warn it prints one warning per op, dtype, device and action. The
// destructor adds the count, the bytes copied and the time to the counters. `action` says what
// is done instead: "decomposed into mul and sum", "ran on cpu:0".
class FallbackScope {
 public:
  FallbackScope(Device& dev, Op op, DType dtype, std::string action);
  ~FallbackScope();
  FallbackScope(const FallbackScope&) = delete;
  FallbackScope& operator=(const FallbackScope&) = delete;
  void add_bytes(uint64_t n) noexcept { bytes_ += n; }

 private:
  Device& dev_;
  Op op_;
  DType dtype_;
  std::string action_;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// The policy for `op` (Note [Fallback policy]).
FallbackPolicy policy_for(Op op);
// Registers the exit report when BACKPLANE_FALLBACK_REPORT=1 (once, by the process default
// registry).
void arm_fallback_report();

// BACKPLANE_LAUNCH_BLOCKING (Note [Launch blocking] in plugin_device.cpp), read once.
bool launch_blocking() noexcept;

}  // namespace bp::detail
