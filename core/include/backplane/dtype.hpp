// Element types and their host-side representation.
#pragma once

#include <backplane/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace bp {

// The values are the plugin ABI's dtype numbers (libbackplane checks that they agree).
enum class DType : int32_t {
  f32 = 0,
  f64 = 1,
  f16 = 2,
  bf16 = 3,
  i32 = 4,
  i64 = 5,
  u8 = 6,
  boolean = 7,  // one byte, 0 or 1
};
inline constexpr int kNumDTypes = 8;

// Bytes of one element; 0 for a value outside DType.
constexpr size_t dtype_size(DType t) {
  constexpr size_t kSizes[kNumDTypes] = {4, 8, 2, 2, 4, 8, 1, 1};
  const int i = static_cast<int>(t);
  return i >= 0 && i < kNumDTypes ? kSizes[i] : 0;
}
// Canonical lower-case name ("f32", "bool"), or "?" for a value outside DType.
constexpr std::string_view dtype_name(DType t) {
  constexpr std::string_view kNames[kNumDTypes] = {"f32", "f64", "f16", "bf16",
                                                   "i32", "i64", "u8",  "bool"};
  const int i = static_cast<int>(t);
  return i >= 0 && i < kNumDTypes ? kNames[i] : std::string_view("?");
}
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
// Parses "f32", "float32", "bf16", "int64", "bool", ... Throws DTypeError listing the names.
BP_API DType dtype_from_name(std::string_view name);

// Half-precision storage types (bit patterns); convert with to_float / from_float.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::boolean;
};
template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// Reads element `i` of a host array of dtype t as double / writes a double, rounding to t.
BP_API double load_as_double(const void* data, DType t, size_t i);
BP_API void store_from_double(void* data, DType t, size_t i, double v);

}  // namespace bp
