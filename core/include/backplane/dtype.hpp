// Element types and their host-side representation.
#pragma once

#include <backplane/plugin_abi.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace bp {

enum class DType : int32_t {
  f32 = BP_DTYPE_F32,
  f64 = BP_DTYPE_F64,
  f16 = BP_DTYPE_F16,
  bf16 = BP_DTYPE_BF16,
  i32 = BP_DTYPE_I32,
  i64 = BP_DTYPE_I64,
  u8 = BP_DTYPE_U8,
  boolean = BP_DTYPE_BOOL,
};
inline constexpr int kNumDTypes = BP_DTYPE_COUNT;

inline size_t dtype_size(DType t) {
  return bp_dtype_size(static_cast<int32_t>(t));
}
inline std::string_view dtype_name(DType t) {
  return bp_dtype_name(static_cast<int32_t>(t));
}
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
// Parses "f32", "float32", "bf16", "int64", "bool", ... Throws DTypeError listing the names.
DType dtype_from_name(std::string_view name);

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
double load_as_double(const void* data, DType t, size_t i);
void store_from_double(void* data, DType t, size_t i, double v);

}  // namespace bp
