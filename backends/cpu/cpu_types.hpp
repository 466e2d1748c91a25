// Element types of the CPU backend: one C++ storage type per bp_dtype, its compute type, and
// the conversions every kernel family shares, which implement Note [Conversions] of
// plugin_abi.h (the specification; nothing here adds to it).
//
// Internal to backends/cpu; header-only, no state, safe from any thread.
#ifndef BACKPLANE_CPU_TYPES_HPP_
#define BACKPLANE_CPU_TYPES_HPP_

#include <backplane/abi/half.h>
#include <backplane/abi/plugin_abi.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace bp::cpu {

// Storage types of the dtypes that have no native C++ type. Each is exactly its dtype's size.
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};
struct boolean {
  uint8_t v;  // 0 or 1 as written by us; any non-zero byte reads as true
};

// DType<T>: the dtype id of storage type T, the type arithmetic runs in (Compute), and
// load/store between the two. f16/bf16 compute in float and round once on store.
template <class T>
struct DType;

template <>
struct DType<float> {
  using Compute = float;
  static constexpr bp_dtype id = BP_DTYPE_F32;
  static Compute load(float x) { return x; }
  static float store(Compute x) { return x; }
};
template <>
struct DType<double> {
  using Compute = double;
  static constexpr bp_dtype id = BP_DTYPE_F64;
  static Compute load(double x) { return x; }
  static double store(Compute x) { return x; }
};
template <>
struct DType<f16> {
  using Compute = float;
  static constexpr bp_dtype id = BP_DTYPE_F16;
  static Compute load(f16 x) { return bp_f16_to_float(x.bits); }
  static f16 store(Compute x) { return {bp_float_to_f16(x)}; }
};
template <>
struct DType<bf16> {
  using Compute = float;
  static constexpr bp_dtype id = BP_DTYPE_BF16;
  static Compute load(bf16 x) { return bp_bf16_to_float(x.bits); }
  static bf16 store(Compute x) { return {bp_float_to_bf16(x)}; }
};
template <>
struct DType<int32_t> {
  using Compute = int32_t;
  static constexpr bp_dtype id = BP_DTYPE_I32;
  static Compute load(int32_t x) { return x; }
  static int32_t store(Compute x) { return x; }
};
template <>
struct DType<int64_t> {
  using Compute = int64_t;
  static constexpr bp_dtype id = BP_DTYPE_I64;
  static Compute load(int64_t x) { return x; }
  static int64_t store(Compute x) { return x; }
};
template <>
struct DType<uint8_t> {
  using Compute = int32_t;  // u8 arithmetic promotes like C and wraps on store
  static constexpr bp_dtype id = BP_DTYPE_U8;
  static Compute load(uint8_t x) { return x; }
  static uint8_t store(Compute x) { return static_cast<uint8_t>(x); }
};
template <>
struct DType<boolean> {
  using Compute = bool;
  static constexpr bp_dtype id = BP_DTYPE_BOOL;
  static Compute load(boolean x) { return x.v != 0; }
  static boolean store(Compute x) { return {static_cast<uint8_t>(x ? 1 : 0)}; }
};

template <class T>
using compute_t = typename DType<T>::Compute;

template <class T>
inline constexpr bool is_floating_v = std::is_floating_point_v<compute_t<T>>;

// Float to int64 as Note [Conversions] in plugin_abi.h says: truncation toward zero, NaN to 0,
// saturation at the int64 range (the cases C++ leaves undefined).
inline int64_t float_to_int64(double v) {
  if (!(v == v)) return 0;
  if (v >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
  if (v <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

// Converts a value of any compute type (or double) to storage type Dst (Note [Conversions]:
// integers wrap, x -> bool is x != 0, f16/bf16 round to nearest even through float).
template <class Dst, class Src>
inline Dst convert(Src v) {
  using DC = compute_t<Dst>;
  if constexpr (std::is_same_v<Dst, boolean>) {
    return {static_cast<uint8_t>(v != Src(0) ? 1 : 0)};
  } else if constexpr (std::is_floating_point_v<DC>) {
    return DType<Dst>::store(static_cast<DC>(v));
  } else if constexpr (std::is_floating_point_v<Src>) {
    return static_cast<Dst>(float_to_int64(static_cast<double>(v)));
  } else {
    return static_cast<Dst>(v);
  }
}

// Integer arithmetic that wraps (Note [Conversions]; signed overflow is undefined in C++).
template <class C>
inline C wrap_add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class C>
inline C wrap_sub(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class C>
inline C wrap_mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// Dispatches a dtype value to f.template operator()<T>() for its storage type T. `dtype` must
// be a valid bp_dtype (callers check; BOOL is the fallthrough).
template <class F>
inline decltype(auto) visit_dtype(bp_dtype dtype, F&& f) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return f.template operator()<float>();
    case BP_DTYPE_F64:
      return f.template operator()<double>();
    case BP_DTYPE_F16:
      return f.template operator()<f16>();
    case BP_DTYPE_BF16:
      return f.template operator()<bf16>();
    case BP_DTYPE_I32:
      return f.template operator()<int32_t>();
    case BP_DTYPE_I64:
      return f.template operator()<int64_t>();
    case BP_DTYPE_U8:
      return f.template operator()<uint8_t>();
    default:
      return f.template operator()<boolean>();
  }
}

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_TYPES_HPP_
