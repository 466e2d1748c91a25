#include <backplane/abi/half.h>
#include <backplane/dtype.hpp>
#include <backplane/errors.hpp>

#include <cstring>
#include <string>

namespace bp {

DType dtype_from_name(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},   {"float32", DType::f32},   {"float", DType::f32},
      {"f64", DType::f64},   {"float64", DType::f64},   {"double", DType::f64},
      {"f16", DType::f16},   {"float16", DType::f16},   {"half", DType::f16},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16}, {"i32", DType::i32},
      {"int32", DType::i32}, {"i64", DType::i64},       {"int64", DType::i64},
      {"u8", DType::u8},     {"uint8", DType::u8},      {"bool", DType::boolean}};
  for (const auto& a : kAliases)
    if (a.name == name) return a.type;
  throw DTypeError("unknown dtype '" + std::string(name) +
                   "'; expected one of f32, f64, f16, bf16, i32, i64, u8, bool");
}

namespace {
template <class T>
T load(const void* data, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(data) + sizeof(T) * i, sizeof v);
  return v;
}
}  // namespace

double load_as_double(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::f32:
      return load<float>(data, i);
    case DType::f64:
      return load<double>(data, i);
    case DType::f16:
      return bp_f16_to_float(load<uint16_t>(data, i));
    case DType::bf16:
      return bp_bf16_to_float(load<uint16_t>(data, i));
    case DType::i32:
      return load<int32_t>(data, i);
    case DType::i64:
      return static_cast<double>(load<int64_t>(data, i));
    case DType::u8:
      return load<uint8_t>(data, i);
    case DType::boolean:
      return load<uint8_t>(data, i) != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

void store_from_double(void* data, DType t, size_t i, double v) {
  char* p = static_cast<char*>(data);
  switch (t) {
    case DType::f32: {
      float x = static_cast<float>(v);
      std::memcpy(p + 4 * i, &x, 4);
      break;
    }
    case DType::f64:
      std::memcpy(p + 8 * i, &v, 8);
      break;
    case DType::f16: {
      uint16_t x = bp_float_to_f16(static_cast<float>(v));
      std::memcpy(p + 2 * i, &x, 2);
      break;
    }
    case DType::bf16: {
      uint16_t x = bp_float_to_bf16(static_cast<float>(v));
      std::memcpy(p + 2 * i, &x, 2);
      break;
    }
    case DType::i32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p + 4 * i, &x, 4);
      break;
    }
    case DType::i64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p + 8 * i, &x, 8);
      break;
    }
    case DType::u8:
      p[i] = static_cast<char>(static_cast<uint8_t>(v));
      break;
    case DType::boolean:
      p[i] = v != 0.0 ? 1 : 0;
      break;
  }
}

}  // namespace bp
