// The launch wrappers of the binary, compare and unary families, written once (Note [Elementwise
// op families]). Internal to backends/cuda; include from .cu files only.
//
// Note [Elementwise op families]
//   A family is a set of compute functors (Add, Lt, Exp, ...: operator() on values of the
//   compute type, Note [CUDA conversions]) with an output dtype: the input's (binary, unary) or
//   bool (compare). OpF wraps a functor for the tensor form (a, b -> out or a -> out),
//   ScalarOpF for the scalar form of binary ops (a -> out with attr SCALAR standing for b,
//   REVERSE = 1 for scalar OP a; the scalar is converted to the input's dtype first).
//   launch_op checks the descriptors and runs one form through run_elementwise
//   (Note [Elementwise kernels]); for_dtypes picks the launch_op instantiation of a dtype when
//   the dtype is in the family's set.
#ifndef BACKPLANE_CUDA_ELEMENTWISE_OPS_CUH_
#define BACKPLANE_CUDA_ELEMENTWISE_OPS_CUH_

#include "cuda_elementwise.cuh"

#include <type_traits>

namespace bp::cuda {

// Tensor form: Arity inputs of storage S -> Out (S, or bool8 for comparisons).
template <class O, class S, class Fn, int Arity>
struct OpF;

template <class O, class S, class Fn>
struct OpF<O, S, Fn, 1> {
  static constexpr int kArity = 1;
  using Out = O;
  using In0 = S;
  using In1 = None;
  using In2 = None;
  Fn fn;
  __device__ O operator()(S a) const { return store<O>(fn(load(a))); }
};

template <class O, class S, class Fn>
struct OpF<O, S, Fn, 2> {
  static constexpr int kArity = 2;
  using Out = O;
  using In0 = S;
  using In1 = S;
  using In2 = None;
  Fn fn;
  __device__ O operator()(S a, S b) const { return store<O>(fn(load(a), load(b))); }
};

// Scalar form of a binary op: a -> out, the other operand a scalar in the compute type.
template <class O, class S, class Fn>
struct ScalarOpF {
  static constexpr int kArity = 1;
  using Out = O;
  using In0 = S;
  using In1 = None;
  using In2 = None;
  Fn fn;
  compute_of_t<S> scalar;
  int reverse;
  __device__ O operator()(S a) const {
    const compute_of_t<S> x = load(a);
    return store<O>(reverse ? fn(scalar, x) : fn(x, scalar));
  }
};

// Tensor form of add and sub with ALPHA: a, b -> a OP alpha*b in one pass.
template <class O, class S, class Fn>
struct AlphaOpF {
  static constexpr int kArity = 2;
  using Out = O;
  using In0 = S;
  using In1 = S;
  using In2 = None;
  Fn fn;
  compute_of_t<S> alpha;
  __device__ O operator()(S a, S b) const {
    return store<O>(fn(load(a), wrap_mul(alpha, load(b))));
  }
};

// Whether a binary functor reads attr ALPHA (specialised to true by add and sub).
template <class Fn>
inline constexpr bool takes_alpha_v = false;

// Launches functor Fn over Arity inputs of dtype D into an output of dtype OutD; binary ops
// also accept the scalar form (one input and attr SCALAR); add and sub also take ALPHA.
template <int D, int OutD, class Fn, int Arity>
void launch_op(const LaunchArgs& a) {
  using S = storage_t<D>;
  using O = storage_t<OutD>;
  if constexpr (Arity == 2) {
    if (a.nin == 1) {
      check_arity(a, 1, 1);
      const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
      const int32_t dt[2] = {OutD, D};
      check_elementwise(t, 2, dt);
      const bp_attr* sc = a.attrs->find(BP_ATTR_ID_SCALAR);
      if (!sc) invalid("one input given but no attr 'scalar' for the second operand");
      const ScalarOpF<O, S, Fn> f{Fn{}, scalar_from_attr<D>(*sc),
                                  a.attrs->i(BP_ATTR_ID_REVERSE, 0) != 0 ? 1 : 0};
      run_elementwise(a, f, t);
      return;
    }
  }
  check_arity(a, Arity, 1);
  const bp_tensor_desc* t[Arity + 1];
  int32_t dt[Arity + 1];
  t[0] = &a.out[0];
  dt[0] = OutD;
  for (int k = 0; k < Arity; ++k) {
    t[k + 1] = &a.in[k];
    dt[k + 1] = D;
  }
  check_elementwise(t, Arity + 1, dt);
  if constexpr (Arity == 2 && takes_alpha_v<Fn>) {
    if (const bp_attr* al = a.attrs->find(BP_ATTR_ID_ALPHA)) {
      const compute_of_t<S> alpha = scalar_from_attr<D>(*al);
      if (!(alpha == compute_of_t<S>(1))) {
        run_elementwise(a, AlphaOpF<O, S, Fn>{Fn{}, alpha}, t);
        return;
      }
    }
  }
  run_elementwise(a, OpF<O, S, Fn, Arity>{Fn{}}, t);
}

// The dtypes a family serves.
enum class Dtypes {
  kFloating,    // f32 f64 f16 bf16
  kSigned,      // and i32 i64
  kArithmetic,  // and u8
  kAll,         // and bool
};

template <int D>
using dtype_c = std::integral_constant<int, D>;

// make(dtype_c<D>{}) for `dtype` when it is in kSet, else nullptr.
template <Dtypes kSet, class Make>
LaunchFn for_dtypes(int32_t dtype, Make make) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return make(dtype_c<BP_DTYPE_F32>{});
    case BP_DTYPE_F64:
      return make(dtype_c<BP_DTYPE_F64>{});
    case BP_DTYPE_F16:
      return make(dtype_c<BP_DTYPE_F16>{});
    case BP_DTYPE_BF16:
      return make(dtype_c<BP_DTYPE_BF16>{});
    case BP_DTYPE_I32:
      if constexpr (kSet != Dtypes::kFloating) return make(dtype_c<BP_DTYPE_I32>{});
      break;
    case BP_DTYPE_I64:
      if constexpr (kSet != Dtypes::kFloating) return make(dtype_c<BP_DTYPE_I64>{});
      break;
    case BP_DTYPE_U8:
      if constexpr (kSet == Dtypes::kArithmetic || kSet == Dtypes::kAll)
        return make(dtype_c<BP_DTYPE_U8>{});
      break;
    case BP_DTYPE_BOOL:
      if constexpr (kSet == Dtypes::kAll) return make(dtype_c<BP_DTYPE_BOOL>{});
      break;
    default:
      break;
  }
  return nullptr;
}

// launch_op for every dtype of kSet; the output has the input's dtype, or bool (kBoolOut).
template <Dtypes kSet, class Fn, int Arity, bool kBoolOut = false>
LaunchFn op_for(int32_t dtype) {
  return for_dtypes<kSet>(dtype, [](auto d) -> LaunchFn {
    constexpr int D = decltype(d)::value;
    return &launch_op < D, kBoolOut ? BP_DTYPE_BOOL : D, Fn, Arity > ;
  });
}

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_ELEMENTWISE_OPS_CUH_
