// Unary math: neg abs relu (floating and signed integer dtypes) and exp log sqrt sigmoid tanh
// (floating dtypes), computed in the compute type (float for f16/bf16) and rounded once.
// relu keeps NaN (NaN < 0 is false); integer neg/abs wrap (abs(INT_MIN) == INT_MIN). The launch
// wrappers are the shared ones of cuda_elementwise_ops.cuh.
#include "cuda_elementwise_ops.cuh"

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

}  // namespace

LaunchFn unary_fn(Op op, int32_t dtype) {
  constexpr Dtypes kSigned = Dtypes::kSigned, kFloat = Dtypes::kFloating;
  switch (op) {
    case Op::kNeg:
      return op_for<kSigned, Neg, 1>(dtype);
    case Op::kAbs:
      return op_for<kSigned, Abs, 1>(dtype);
    case Op::kRelu:
      return op_for<kSigned, Relu, 1>(dtype);
    case Op::kExp:
      return op_for<kFloat, Exp, 1>(dtype);
    case Op::kLog:
      return op_for<kFloat, Log, 1>(dtype);
    case Op::kSqrt:
      return op_for<kFloat, Sqrt, 1>(dtype);
    case Op::kSigmoid:
      return op_for<kFloat, Sigmoid, 1>(dtype);
    case Op::kTanh:
      return op_for<kFloat, Tanh, 1>(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
