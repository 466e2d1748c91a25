// Comparisons eq ne lt le gt ge (a, b -> bool out, or the scalar form as for add) and
// where(cond, a, b). Comparisons run in the compute type, so f16/bf16 compare exactly. The launch
// wrappers are the shared ones of cuda_elementwise_ops.cuh.
#include "cuda_elementwise_ops.cuh"

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

template <int D>
void launch_where(const LaunchArgs& a) {
  check_arity(a, 3, 1);
  const bp_tensor_desc* t[4] = {&a.out[0], &a.in[0], &a.in[1], &a.in[2]};
  const int32_t dt[4] = {D, BP_DTYPE_BOOL, D, D};
  check_elementwise(t, 4, dt);
  run_elementwise(a, WhereF<sized_uint_t<sizeof(storage_t<D>)>>{}, t);
}

LaunchFn where_for(int32_t dtype) {
  return for_dtypes<Dtypes::kAll>(
      dtype, [](auto d) -> LaunchFn { return &launch_where<decltype(d)::value>; });
}

}  // namespace

LaunchFn compare_fn(Op op, int32_t dtype) {
  constexpr Dtypes kAll = Dtypes::kAll;
  constexpr bool kBool = true;  // comparisons write bool
  switch (op) {
    case Op::kEq:
      return op_for<kAll, Eq, 2, kBool>(dtype);
    case Op::kNe:
      return op_for<kAll, Ne, 2, kBool>(dtype);
    case Op::kLt:
      return op_for<kAll, Lt, 2, kBool>(dtype);
    case Op::kLe:
      return op_for<kAll, Le, 2, kBool>(dtype);
    case Op::kGt:
      return op_for<kAll, Gt, 2, kBool>(dtype);
    case Op::kGe:
      return op_for<kAll, Ge, 2, kBool>(dtype);
    case Op::kWhere:
      return where_for(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
