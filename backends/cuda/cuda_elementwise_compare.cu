// Comparisons eq ne lt le gt ge (a, b -> bool out, or the scalar form as for add) and
// where(cond, a, b). Comparisons run in the compute type, so f16/bf16 compare exactly.
#include "cuda_elementwise.cuh"

namespace bp::cuda {
namespace {

struct Eq {
  template <class C>
  __device__ bool operator()(C a, C b) const {
    return a == b;
  }
};
struct Ne {
  template <class C>
  __device__ bool operator()(C a, C b) const {
    return a != b;
  }
};
struct Lt {
  template <class C>
  __device__ bool operator()(C a, C b) const {
    return a < b;
  }
};
struct Le {
  template <class C>
  __device__ bool operator()(C a, C b) const {
    return a <= b;
  }
};
struct Gt {
  template <class C>
  __device__ bool operator()(C a, C b) const {
    return a > b;
  }
};
struct Ge {
  template <class C>
  __device__ bool operator()(C a, C b) const {
    return a >= b;
  }
};

template <class S, class Fn>
struct CompareF {
  static constexpr int kArity = 2;
  using Out = bool8;
  using In0 = S;
  using In1 = S;
  using In2 = None;
  Fn fn;
  __device__ bool8 operator()(S a, S b) const {
    return bool8{static_cast<uint8_t>(fn(load(a), load(b)) ? 1 : 0)};
  }
};

template <class S, class Fn>
struct CompareScalarF {
  static constexpr int kArity = 1;
  using Out = bool8;
  using In0 = S;
  using In1 = None;
  using In2 = None;
  Fn fn;
  compute_of_t<S> scalar;
  int reverse;
  __device__ bool8 operator()(S a) const {
    const compute_of_t<S> x = load(a);
    return bool8{static_cast<uint8_t>((reverse ? fn(scalar, x) : fn(x, scalar)) ? 1 : 0)};
  }
};

// where moves elements without looking at them, so it is instantiated per element size.
template <class S>
struct WhereF {
  static constexpr int kArity = 3;
  using Out = S;
  using In0 = bool8;
  using In1 = S;
  using In2 = S;
  __device__ S operator()(bool8 c, S x, S y) const { return c.v ? x : y; }
};

template <int D, class Fn>
void launch_compare(const LaunchArgs& a) {
  using S = storage_t<D>;
  if (a.nin == 1) {
    check_arity(a, 1, 1);
    const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
    const int32_t dt[2] = {BP_DTYPE_BOOL, D};
    check_elementwise(t, 2, dt);
    const bp_attr* sc = a.attrs->find(BP_ATTR_ID_SCALAR);
    if (!sc) invalid("one input given but no attr 'scalar' for the second operand");
    const CompareScalarF<S, Fn> f{Fn{}, scalar_from_attr<D>(*sc),
                                  a.attrs->i(BP_ATTR_ID_REVERSE, 0) != 0 ? 1 : 0};
    run_elementwise(a, f, t);
  } else {
    check_arity(a, 2, 1);
    const bp_tensor_desc* t[3] = {&a.out[0], &a.in[0], &a.in[1]};
    const int32_t dt[3] = {BP_DTYPE_BOOL, D, D};
    check_elementwise(t, 3, dt);
    run_elementwise(a, CompareF<S, Fn>{Fn{}}, t);
  }
}

template <int D>
void launch_where(const LaunchArgs& a) {
  check_arity(a, 3, 1);
  const bp_tensor_desc* t[4] = {&a.out[0], &a.in[0], &a.in[1], &a.in[2]};
  const int32_t dt[4] = {D, BP_DTYPE_BOOL, D, D};
  check_elementwise(t, 4, dt);
  run_elementwise(a, WhereF<sized_uint_t<sizeof(storage_t<D>)>>{}, t);
}

template <class Fn>
LaunchFn compare_for(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return &launch_compare<BP_DTYPE_F32, Fn>;
    case BP_DTYPE_F64:
      return &launch_compare<BP_DTYPE_F64, Fn>;
    case BP_DTYPE_F16:
      return &launch_compare<BP_DTYPE_F16, Fn>;
    case BP_DTYPE_BF16:
      return &launch_compare<BP_DTYPE_BF16, Fn>;
    case BP_DTYPE_I32:
      return &launch_compare<BP_DTYPE_I32, Fn>;
    case BP_DTYPE_I64:
      return &launch_compare<BP_DTYPE_I64, Fn>;
    case BP_DTYPE_U8:
      return &launch_compare<BP_DTYPE_U8, Fn>;
    case BP_DTYPE_BOOL:
      return &launch_compare<BP_DTYPE_BOOL, Fn>;
    default:
      return nullptr;
  }
}

LaunchFn where_for(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return &launch_where<BP_DTYPE_F32>;
    case BP_DTYPE_F64:
      return &launch_where<BP_DTYPE_F64>;
    case BP_DTYPE_F16:
      return &launch_where<BP_DTYPE_F16>;
    case BP_DTYPE_BF16:
      return &launch_where<BP_DTYPE_BF16>;
    case BP_DTYPE_I32:
      return &launch_where<BP_DTYPE_I32>;
    case BP_DTYPE_I64:
      return &launch_where<BP_DTYPE_I64>;
    case BP_DTYPE_U8:
      return &launch_where<BP_DTYPE_U8>;
    case BP_DTYPE_BOOL:
      return &launch_where<BP_DTYPE_BOOL>;
    default:
      return nullptr;
  }
}

}  // namespace

LaunchFn compare_fn(Op op, int32_t dtype) {
  switch (op) {
    case Op::kEq:
      return compare_for<Eq>(dtype);
    case Op::kNe:
      return compare_for<Ne>(dtype);
    case Op::kLt:
      return compare_for<Lt>(dtype);
    case Op::kLe:
      return compare_for<Le>(dtype);
    case Op::kGt:
      return compare_for<Gt>(dtype);
    case Op::kGe:
      return compare_for<Ge>(dtype);
    case Op::kWhere:
      return where_for(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
