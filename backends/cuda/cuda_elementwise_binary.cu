// Binary arithmetic: add sub mul div pow maximum minimum, as a, b -> out or in the scalar form
// a -> out with attr SCALAR (and REVERSE = 1 for scalar OP a); add and sub with two inputs take
// ALPHA (out = a OP alpha*b in one pass). Integer arithmetic wraps; maximum/minimum propagate
// NaN from either side (like torch.maximum and the CPU backend).
#include "cuda_elementwise.cuh"

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

// a, b -> out in storage type S through compute functor Fn.
template <class S, class Fn>
struct BinaryF {
  static constexpr int kArity = 2;
  using Out = S;
  using In0 = S;
  using In1 = S;
  using In2 = None;
  Fn fn;
  __device__ S operator()(S a, S b) const { return store<S>(fn(load(a), load(b))); }
};

// a, b -> out as a OP alpha*b (add, sub with ALPHA).
template <class S, class Fn>
struct BinaryAlphaF {
  static constexpr int kArity = 2;
  using Out = S;
  using In0 = S;
  using In1 = S;
  using In2 = None;
  Fn fn;
  compute_of_t<S> alpha;
  __device__ S operator()(S a, S b) const {
    return store<S>(fn(load(a), wrap_mul(alpha, load(b))));
  }
};

// a -> out with the second operand a scalar in the compute type.
template <class S, class Fn>
struct BinaryScalarF {
  static constexpr int kArity = 1;
  using Out = S;
  using In0 = S;
  using In1 = None;
  using In2 = None;
  Fn fn;
  compute_of_t<S> scalar;
  int reverse;
  __device__ S operator()(S a) const {
    const compute_of_t<S> x = load(a);
    return store<S>(reverse ? fn(scalar, x) : fn(x, scalar));
  }
};

template <int D, class Fn>
void launch_binary(const LaunchArgs& a) {
  using S = storage_t<D>;
  if (a.nin == 1) {
    check_arity(a, 1, 1);
    const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
    const int32_t dt[2] = {D, D};
    check_elementwise(t, 2, dt);
    const bp_attr* sc = a.attrs->find(BP_ATTR_ID_SCALAR);
    if (!sc) invalid("one input given but no attr 'scalar' for the second operand");
    const BinaryScalarF<S, Fn> f{Fn{}, scalar_from_attr<D>(*sc),
                                 a.attrs->i(BP_ATTR_ID_REVERSE, 0) != 0 ? 1 : 0};
    run_elementwise(a, f, t);
  } else {
    check_arity(a, 2, 1);
    const bp_tensor_desc* t[3] = {&a.out[0], &a.in[0], &a.in[1]};
    const int32_t dt[3] = {D, D, D};
    check_elementwise(t, 3, dt);
    if constexpr (std::is_same_v<Fn, Add> || std::is_same_v<Fn, Sub>) {
      if (const bp_attr* al = a.attrs->find(BP_ATTR_ID_ALPHA)) {
        const compute_of_t<S> alpha = scalar_from_attr<D>(*al);
        if (!(alpha == compute_of_t<S>(1))) {
          run_elementwise(a, BinaryAlphaF<S, Fn>{Fn{}, alpha}, t);
          return;
        }
      }
    }
    run_elementwise(a, BinaryF<S, Fn>{Fn{}}, t);
  }
}

template <class Fn, bool kFloatingOnly>
LaunchFn for_dtype(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return &launch_binary<BP_DTYPE_F32, Fn>;
    case BP_DTYPE_F64:
      return &launch_binary<BP_DTYPE_F64, Fn>;
    case BP_DTYPE_F16:
      return &launch_binary<BP_DTYPE_F16, Fn>;
    case BP_DTYPE_BF16:
      return &launch_binary<BP_DTYPE_BF16, Fn>;
    default:
      break;
  }
  if constexpr (!kFloatingOnly) {
    switch (dtype) {
      case BP_DTYPE_I32:
        return &launch_binary<BP_DTYPE_I32, Fn>;
      case BP_DTYPE_I64:
        return &launch_binary<BP_DTYPE_I64, Fn>;
      case BP_DTYPE_U8:
        return &launch_binary<BP_DTYPE_U8, Fn>;
      default:
        break;
    }
  }
  return nullptr;
}

}  // namespace

LaunchFn binary_fn(Op op, int32_t dtype) {
  switch (op) {
    case Op::kAdd:
      return for_dtype<Add, false>(dtype);
    case Op::kSub:
      return for_dtype<Sub, false>(dtype);
    case Op::kMul:
      return for_dtype<Mul, false>(dtype);
    case Op::kDiv:
      return for_dtype<Div, true>(dtype);
    case Op::kPow:
      return for_dtype<Pow, true>(dtype);
    case Op::kMaximum:
      return for_dtype<Maximum, false>(dtype);
    case Op::kMinimum:
      return for_dtype<Minimum, false>(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
