// The pointwise ops of the transformer family (ABI 1.5): gelu (exact and tanh forms), silu and
// their backward ops, sin, cos and rsqrt, as functors of the elementwise machinery (Note
// [Elementwise op families]): one fused pass, any strides and broadcasts, in the compute type
// (f32 for f16/bf16, f64 for f64), rounded once on store. The backward ops take (x, dy).
#include "cuda_elementwise_ops.cuh"

namespace bp::cuda {
namespace {

__device__ __forceinline__ float m_erf(float x) {
  return erff(x);
}
__device__ __forceinline__ double m_erf(double x) {
  return erf(x);
}
__device__ __forceinline__ float m_sin(float x) {
  return sinf(x);
}
__device__ __forceinline__ double m_sin(double x) {
  return sin(x);
}
__device__ __forceinline__ float m_cos(float x) {
  return cosf(x);
}
__device__ __forceinline__ double m_cos(double x) {
  return cos(x);
}

// sqrt(2 / pi), 1 / sqrt(2), 1 / sqrt(2 pi) and the cubic coefficient of the tanh form.
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kGeluCubic = 0.044715;

struct GeluExact {
  template <class C>
  __device__ C operator()(C x) const {
    return C(0.5) * x * (C(1) + m_erf(x * C(kInvSqrt2)));
  }
};
struct GeluTanh {
  template <class C>
  __device__ C operator()(C x) const {
    return C(0.5) * x * (C(1) + m_tanh(C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x)));
  }
};
struct GeluExactBackward {
  template <class C>
  __device__ C operator()(C x, C dy) const {
    const C cdf = C(0.5) * (C(1) + m_erf(x * C(kInvSqrt2)));
    return dy * (cdf + x * C(kInvSqrt2Pi) * m_exp(C(-0.5) * x * x));
  }
};
struct GeluTanhBackward {
  template <class C>
  __device__ C operator()(C x, C dy) const {
    const C t = m_tanh(C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x));
    const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
    return dy * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * du);
  }
};
struct Silu {
  template <class C>
  __device__ C operator()(C x) const {
    return x / (C(1) + m_exp(-x));
  }
};
struct SiluBackward {
  template <class C>
  __device__ C operator()(C x, C dy) const {
    const C s = C(1) / (C(1) + m_exp(-x));
    return dy * s * (C(1) + x * (C(1) - s));
  }
};
struct Sin {
  template <class C>
  __device__ C operator()(C x) const {
    return m_sin(x);
  }
};
struct Cos {
  template <class C>
  __device__ C operator()(C x) const {
    return m_cos(x);
  }
};
struct Rsqrt {
  template <class C>
  __device__ C operator()(C x) const {
    return C(1) / m_sqrt(x);
  }
};

// APPROXIMATE picks the functor (bp_gelu_approximate).
template <int D, bool kBackward>
void launch_gelu(const LaunchArgs& a) {
  const int64_t approx = a.attrs->i(BP_ATTR_ID_APPROXIMATE, BP_GELU_EXACT);
  if (approx != BP_GELU_EXACT && approx != BP_GELU_TANH)
    invalid(bp::sdk::format("attribute approximate = %lld is neither 0 (exact) nor 1 (tanh)",
                            static_cast<long long>(approx)));
  if constexpr (kBackward) {
    check_arity(a, 2, 1);  // (x, dy): no scalar form
    if (approx == BP_GELU_TANH)
      launch_op<D, D, GeluTanhBackward, 2>(a);
    else
      launch_op<D, D, GeluExactBackward, 2>(a);
  } else {
    if (approx == BP_GELU_TANH)
      launch_op<D, D, GeluTanh, 1>(a);
    else
      launch_op<D, D, GeluExact, 1>(a);
  }
}

template <int D>
void launch_silu_backward(const LaunchArgs& a) {
  check_arity(a, 2, 1);
  launch_op<D, D, SiluBackward, 2>(a);
}

}  // namespace

LaunchFn activation_fn(Op op, int32_t dtype) {
  constexpr Dtypes kFloat = Dtypes::kFloating;
  switch (op) {
    case Op::kGelu:
      return for_dtypes<kFloat>(
          dtype, [](auto d) -> LaunchFn { return &launch_gelu<decltype(d)::value, false>; });
    case Op::kGeluBackward:
      return for_dtypes<kFloat>(
          dtype, [](auto d) -> LaunchFn { return &launch_gelu<decltype(d)::value, true>; });
    case Op::kSilu:
      return op_for<kFloat, Silu, 1>(dtype);
    case Op::kSiluBackward:
      return for_dtypes<kFloat>(
          dtype, [](auto d) -> LaunchFn { return &launch_silu_backward<decltype(d)::value>; });
    case Op::kSin:
      return op_for<kFloat, Sin, 1>(dtype);
    case Op::kCos:
      return op_for<kFloat, Cos, 1>(dtype);
    case Op::kRsqrt:
      return op_for<kFloat, Rsqrt, 1>(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
