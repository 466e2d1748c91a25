// Binary arithmetic: add sub mul div pow maximum minimum, as a, b -> out or in the scalar form
// a -> out with attr SCALAR (and REVERSE = 1 for scalar OP a); add and sub with two inputs take
// ALPHA (out = a OP alpha*b in one pass). Integer arithmetic wraps; maximum/minimum propagate
// NaN from either side (like torch.maximum and the CPU backend). The launch wrappers are the
// shared ones of cuda_elementwise_ops.cuh.
#include "cuda_elementwise_ops.cuh"

namespace bp::cuda {
namespace {

struct Add {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return wrap_add(a, b);
  }
};
struct Sub {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return wrap_sub(a, b);
  }
};

}  // namespace

// add and sub take ALPHA (cuda_elementwise_ops.cuh).
template <>
inline constexpr bool takes_alpha_v<Add> = true;
template <>
inline constexpr bool takes_alpha_v<Sub> = true;

namespace {

struct Mul {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return wrap_mul(a, b);
  }
};
struct Div {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return a / b;
  }
};
struct Pow {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return m_pow(a, b);
  }
};
struct Maximum {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return (a > b || a != a) ? a : b;
  }
};
struct Minimum {
  template <class C>
  __device__ C operator()(C a, C b) const {
    return (a < b || a != a) ? a : b;
  }
};

}  // namespace

LaunchFn binary_fn(Op op, int32_t dtype) {
  constexpr Dtypes kAny = Dtypes::kArithmetic, kFloat = Dtypes::kFloating;
  switch (op) {
    case Op::kAdd:
      return op_for<kAny, Add, 2>(dtype);
    case Op::kSub:
      return op_for<kAny, Sub, 2>(dtype);
    case Op::kMul:
      return op_for<kAny, Mul, 2>(dtype);
    case Op::kDiv:
      return op_for<kFloat, Div, 2>(dtype);
    case Op::kPow:
      return op_for<kFloat, Pow, 2>(dtype);
    case Op::kMaximum:
      return op_for<kAny, Maximum, 2>(dtype);
    case Op::kMinimum:
      return op_for<kAny, Minimum, 2>(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
