// Internal: how the ops of the autocast lists cast their operands (Note [Autocast op lists] in
// autocast.hpp). Each listed op opens with one AutocastArgs over its tensor operands and uses
// the tensors it hands back; outside every autocast scope that is one thread-local read.
#pragma once

#include <backplane/autocast.hpp>
#include <backplane/tensor.hpp>

#include <array>
#include <cstddef>
#include <initializer_list>

namespace bp::detail {

// The number of device types with autocast enabled on this thread (the hot path's test).
inline thread_local int autocast_enabled_types = 0;

enum class AutocastPolicy {
  lower,  // the scope's dtype
  fp32,   // f32
  none,   // not cast (an op that is on a list for some of its forms only)
};

// The dtype `policy` casts floating operands on `dev` to; false when autocast is off for `dev`'s
// type on this thread.
bool autocast_target(AutocastPolicy policy, const Device& dev, DType& out);
// `t` cast to `dtype` when it is f32, f16 or bf16 and not already `dtype` (else `t`), through the
// weight cache for parameters (Note [Autocast weight cache]).
Tensor autocast_cast(const Tensor& t, DType dtype);

// Runs an op's operands through an autocast policy: operator[] gives each operand, cast when a
// scope asks for it (undefined operands stay undefined).
template <size_t N>
class AutocastArgs {
 public:
  AutocastArgs(AutocastPolicy policy, std::array<const Tensor*, N> ts) : p_(ts) {
    if (autocast_enabled_types == 0) [[likely]]
      return;
    if (policy != AutocastPolicy::none) cast_slow(policy);
  }
  const Tensor& operator[](size_t k) const { return *p_[k]; }

 private:
  void cast_slow(AutocastPolicy policy) {
    const Tensor* first = nullptr;
    for (const Tensor* t : p_)
      if (t->defined()) {
        first = t;
        break;
      }
    DType to{};
    if (!first || !autocast_target(policy, first->device(), to)) return;
    for (size_t k = 0; k < N; ++k) {
      if (!p_[k]->defined()) continue;
      cast_[k] = autocast_cast(*p_[k], to);
      p_[k] = &cast_[k];
    }
  }

  std::array<const Tensor*, N> p_;
  std::array<Tensor, N> cast_;
};

// Turns autocast off on this thread for its lifetime (backward passes: Note [Autocast op lists]).
class AutocastOff {
 public:
  AutocastOff() noexcept;
  ~AutocastOff();
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  int saved_;
};

}  // namespace bp::detail
