// Unary math: neg abs relu (floating and signed integer dtypes) and exp log sqrt sigmoid tanh
// (floating dtypes), computed in the compute type (float for f16/bf16) and rounded once.
// relu keeps NaN (NaN < 0 is false); integer neg/abs wrap (abs(INT_MIN) == INT_MIN).
#include "cuda_elementwise.cuh"

namespace bp::cuda {
namespace {

struct Neg {
  template <class C>
  __device__ C operator()(C x) const {
    return wrap_sub(C(0), x);
  }
};
struct Abs {
  template <class C>
  __device__ C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return x < 0 ? wrap_sub(C(0), x) : x;
    } else {
      return m_fabs(x);
    }
  }
};
struct Relu {
  template <class C>
  __device__ C operator()(C x) const {
    return x < C(0) ? C(0) : x;
  }
};
struct Exp {
  template <class C>
  __device__ C operator()(C x) const {
    return m_exp(x);
  }
};
struct Log {
  template <class C>
  __device__ C operator()(C x) const {
    return m_log(x);
  }
};
struct Sqrt {
  template <class C>
  __device__ C operator()(C x) const {
    return m_sqrt(x);
  }
};
struct Sigmoid {
  template <class C>
  __device__ C operator()(C x) const {
    return C(1) / (C(1) + m_exp(-x));
  }
};
struct Tanh {
  template <class C>
  __device__ C operator()(C x) const {
    return m_tanh(x);
  }
};

template <class S, class Fn>
struct UnaryF {
  static constexpr int kArity = 1;
  using Out = S;
  using In0 = S;
  using In1 = None;
  using In2 = None;
  Fn fn;
  __device__ S operator()(S x) const { return store<S>(fn(load(x))); }
};

template <int D, class Fn>
void launch_unary(const LaunchArgs& a) {
  check_arity(a, 1, 1);
  const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
  const int32_t dt[2] = {D, D};
  check_elementwise(t, 2, dt);
  run_elementwise(a, UnaryF<storage_t<D>, Fn>{Fn{}}, t);
}

template <class Fn, bool kFloatingOnly>
LaunchFn unary_for(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return &launch_unary<BP_DTYPE_F32, Fn>;
    case BP_DTYPE_F64:
      return &launch_unary<BP_DTYPE_F64, Fn>;
    case BP_DTYPE_F16:
      return &launch_unary<BP_DTYPE_F16, Fn>;
    case BP_DTYPE_BF16:
      return &launch_unary<BP_DTYPE_BF16, Fn>;
    default:
      break;
  }
  if constexpr (!kFloatingOnly) {
    switch (dtype) {
      case BP_DTYPE_I32:
        return &launch_unary<BP_DTYPE_I32, Fn>;
      case BP_DTYPE_I64:
        return &launch_unary<BP_DTYPE_I64, Fn>;
      default:
        break;
    }
  }
  return nullptr;
}

}  // namespace

LaunchFn unary_fn(Op op, int32_t dtype) {
  switch (op) {
    case Op::kNeg:
      return unary_for<Neg, false>(dtype);
    case Op::kAbs:
      return unary_for<Abs, false>(dtype);
    case Op::kRelu:
      return unary_for<Relu, false>(dtype);
    case Op::kExp:
      return unary_for<Exp, true>(dtype);
    case Op::kLog:
      return unary_for<Log, true>(dtype);
    case Op::kSqrt:
      return unary_for<Sqrt, true>(dtype);
    case Op::kSigmoid:
      return unary_for<Sigmoid, true>(dtype);
    case Op::kTanh:
      return unary_for<Tanh, true>(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
