// Element types of the CUDA kernels: one storage type per bp_dtype, the type arithmetic runs
// in, and the conversions every family shares (Note [CUDA conversions]).
//
// Internal to backends/cuda; device code (and host code where marked BP_HD).
#ifndef BACKPLANE_CUDA_TYPES_CUH_
#define BACKPLANE_CUDA_TYPES_CUH_

#include <backplane/abi/plugin_abi.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace bp::cuda {

// Storage of BP_DTYPE_BOOL: one byte, 0 or 1 when we write it, any non-zero byte reads true.
struct bool8 {
  uint8_t v;
};

// N elements of T loaded or stored as one aligned vector (16 bytes at most).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// TypeOf<dtype>: S is the storage type, C the compute type. f16/bf16 compute in float and
// round once on store; u8 computes in int32 and wraps on store (like C's promotions).
template <int D>
struct TypeOf;
template <>
struct TypeOf<BP_DTYPE_F32> {
  using S = float;
  using C = float;
};
template <>
struct TypeOf<BP_DTYPE_F64> {
  using S = double;
  using C = double;
};
template <>
struct TypeOf<BP_DTYPE_F16> {
  using S = __half;
  using C = float;
};
template <>
struct TypeOf<BP_DTYPE_BF16> {
  using S = __nv_bfloat16;
  using C = float;
};
template <>
struct TypeOf<BP_DTYPE_I32> {
  using S = int32_t;
  using C = int32_t;
};
template <>
struct TypeOf<BP_DTYPE_I64> {
  using S = int64_t;
  using C = int64_t;
};
template <>
struct TypeOf<BP_DTYPE_U8> {
  using S = uint8_t;
  using C = int32_t;
};
template <>
struct TypeOf<BP_DTYPE_BOOL> {
  using S = bool8;
  using C = bool;
};

template <int D>
using storage_t = typename TypeOf<D>::S;
template <int D>
using compute_t = typename TypeOf<D>::C;

template <int D>
inline constexpr bool kIsFloating = std::is_floating_point_v<compute_t<D>>;

// Compute type of a storage type.
template <class S>
struct ComputeOf {
  using type = S;
};
template <>
struct ComputeOf<__half> {
  using type = float;
};
template <>
struct ComputeOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct ComputeOf<uint8_t> {
  using type = int32_t;
};
template <>
struct ComputeOf<bool8> {
  using type = bool;
};
template <class S>
using compute_of_t = typename ComputeOf<S>::type;

// The unsigned integer type of N bytes (element moves that ignore the dtype).
template <size_t N>
struct SizedUint;
template <>
struct SizedUint<1> {
  using type = uint8_t;
};
template <>
struct SizedUint<2> {
  using type = uint16_t;
};
template <>
struct SizedUint<4> {
  using type = uint32_t;
};
template <>
struct SizedUint<8> {
  using type = uint64_t;
};
template <size_t N>
using sized_uint_t = typename SizedUint<N>::type;

// Storage -> compute.
template <class S>
__device__ __forceinline__ compute_of_t<S> load(S x) {
  if constexpr (std::is_same_v<S, __half>) {
    return __half2float(x);
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else if constexpr (std::is_same_v<S, bool8>) {
    return x.v != 0;
  } else {
    return static_cast<compute_of_t<S>>(x);
  }
}

// Compute -> storage (rounding to nearest even for f16/bf16, wrapping for u8).
template <class S>
__device__ __forceinline__ S store(compute_of_t<S> x) {
  if constexpr (std::is_same_v<S, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else if constexpr (std::is_same_v<S, bool8>) {
    return bool8{static_cast<uint8_t>(x ? 1 : 0)};
  } else {
    return static_cast<S>(x);
  }
}

// Note [CUDA conversions]
//   Note [Conversions] of plugin_abi.h, the rules every backend follows so that cast gives the
//   same bits everywhere, in device code: float -> integer through int64_t with the saturation
//   below, then a wrapping narrowing; to f16/bf16 through float, rounded as half.h does.
template <class F>
__host__ __device__ __forceinline__ int64_t float_to_int64(F v) {
  const double d = static_cast<double>(v);
  if (!(d == d)) return 0;
  if (d >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
  if (d <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(d);
}

// Converts a compute value of any type to storage type Dst.
template <class Dst, class Src>
__device__ __forceinline__ Dst convert(Src v) {
  using DC = compute_of_t<Dst>;
  if constexpr (std::is_same_v<Dst, bool8>) {
    return bool8{static_cast<uint8_t>(v != Src(0) ? 1 : 0)};
  } else if constexpr (std::is_floating_point_v<DC>) {
    if constexpr (std::is_same_v<Dst, __half> || std::is_same_v<Dst, __nv_bfloat16>) {
      return store<Dst>(static_cast<float>(v));
    } else {
      return static_cast<Dst>(v);
    }
  } else if constexpr (std::is_floating_point_v<Src>) {
    return static_cast<Dst>(float_to_int64(v));
  } else {
    return static_cast<Dst>(v);
  }
}

// Wrapping integer arithmetic (signed overflow is undefined in C++; two's complement here).
template <class C>
__device__ __forceinline__ C wrap_add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class C>
__device__ __forceinline__ C wrap_sub(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class C>
__device__ __forceinline__ C wrap_mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// Math in the compute type (float or double overloads of the CUDA math library).
__device__ __forceinline__ float m_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double m_exp(double x) {
  return exp(x);
}
__device__ __forceinline__ float m_log(float x) {
  return logf(x);
}
__device__ __forceinline__ double m_log(double x) {
  return log(x);
}
__device__ __forceinline__ float m_sqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double m_sqrt(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float m_tanh(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double m_tanh(double x) {
  return tanh(x);
}
__device__ __forceinline__ float m_pow(float a, float b) {
  return powf(a, b);
}
__device__ __forceinline__ double m_pow(double a, double b) {
  return pow(a, b);
}
__device__ __forceinline__ float m_fabs(float x) {
  return fabsf(x);
}
__device__ __forceinline__ double m_fabs(double x) {
  return fabs(x);
}

// A value of dtype D's compute type from a launch attribute holding `v` (FLOAT) or `i`
// (INT): integers convert to the dtype first (Note [CUDA conversions]), floats keep the
// compute precision, bool is v != 0. Host code.
template <int D>
inline compute_t<D> scalar_from_attr(const bp_attr& a) {
  using C = compute_t<D>;
  using S = storage_t<D>;
  if constexpr (D == BP_DTYPE_BOOL) {
    return a.kind == BP_ATTR_INT ? a.i != 0 : a.f != 0.0;
  } else if constexpr (std::is_floating_point_v<C>) {
    return a.kind == BP_ATTR_INT ? static_cast<C>(a.i) : static_cast<C>(a.f);
  } else {
    const int64_t i = a.kind == BP_ATTR_INT ? a.i : float_to_int64(a.f);
    return static_cast<C>(static_cast<S>(i));
  }
}

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_TYPES_CUH_
