// Elementwise kernels: binary arithmetic (add sub mul div pow maximum minimum), comparisons
// (eq ne lt le gt ge), where, and unary math (neg exp log sqrt relu sigmoid tanh abs); the
// transcendental ones (exp log sigmoid tanh pow) through SLEEF (Note [CPU vector math]).
//
// Note [Row loops]
//   Every kernel is a functor over compute values wrapped by one row loop per arity. The
//   iteration (cpu_strided.hpp) hands the loop rows of the coalesced shape; the loop then picks
//   a specialisation on the inner strides: all 1 (dense), 1 with one operand 0 (the scalar
//   form and row broadcasts, the operand hoisted out of the loop), or general strides. The
//   first two are plain counted loops over pointers that GCC and Clang vectorise; in-place
//   launches (out == a) are safe because each element is read before it is written and never
//   read again.
#include "cpu_kernels.hpp"
#include "cpu_strided.hpp"
#include "cpu_types.hpp"
#include "cpu_vmath.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace bp::cpu {
namespace {

// ---- Functors --------------------------------------------------------------------------------

struct Add {
  template <class C>
  C operator()(C a, C b) const {
    return wrap_add(a, b);
  }
};
struct Sub {
  template <class C>
  C operator()(C a, C b) const {
    return wrap_sub(a, b);
  }
};
struct Mul {
  template <class C>
  C operator()(C a, C b) const {
    return wrap_mul(a, b);
  }
};
struct Div {
  template <class C>
  C operator()(C a, C b) const {
    return a / b;
  }
};
// maximum/minimum propagate NaN from either side, like torch.maximum.
struct Maximum {
  template <class C>
  C operator()(C a, C b) const {
    return (a > b || a != a) ? a : b;
  }
};
struct Minimum {
  template <class C>
  C operator()(C a, C b) const {
    return (a < b || a != a) ? a : b;
  }
};

struct Eq {
  template <class C>
  bool operator()(C a, C b) const {
    return a == b;
  }
};
struct Ne {
  template <class C>
  bool operator()(C a, C b) const {
    return a != b;
  }
};
struct Lt {
  template <class C>
  bool operator()(C a, C b) const {
    return a < b;
  }
};
struct Le {
  template <class C>
  bool operator()(C a, C b) const {
    return a <= b;
  }
};
struct Gt {
  template <class C>
  bool operator()(C a, C b) const {
    return a > b;
  }
};
struct Ge {
  template <class C>
  bool operator()(C a, C b) const {
    return a >= b;
  }
};

struct Neg {
  template <class C>
  C operator()(C x) const {
    return wrap_sub(C(0), x);
  }
};
struct Abs {
  template <class C>
  C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return x < 0 ? wrap_sub(C(0), x) : x;
    } else {
      return std::fabs(x);
    }
  }
};
// relu keeps NaN (NaN < 0 is false).
struct Relu {
  template <class C>
  C operator()(C x) const {
    return x < C(0) ? C(0) : x;
  }
};
struct Sqrt {
  template <class C>
  C operator()(C x) const {
    return std::sqrt(x);
  }
};
struct Rsqrt {
  template <class C>
  C operator()(C x) const {
    return C(1) / std::sqrt(x);
  }
};

// ---- Row loops (Note [Row loops]) ------------------------------------------------------------

// out[i] = f(a[i], b[i]) on one row; f maps loaded compute values to a stored value.
template <class O, class A, class B, class F>
inline void binary_row(O* o, const A* a, const B* b, int64_t n, int64_t so, int64_t sa, int64_t sb,
                       const F& f) {
  if (so == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (so == 1 && sa == 1 && sb == 0) {
    const B bv = *b;
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (so == 1 && sa == 0 && sb == 1) {
    const A av = *a;
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i * so] = f(a[i * sa], b[i * sb]);
  }
}

template <class O, class A, class F>
inline void unary_row(O* o, const A* a, int64_t n, int64_t so, int64_t sa, const F& f) {
  if (so == 1 && sa == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
  } else if (so == 1 && sa == 0) {
    const O v = f(*a);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) o[i * so] = f(a[i * sa]);
  }
}

// Converts an attribute (SCALAR, ALPHA) to the tensor's dtype (Note [Conversions]) and
// loads it as a compute value, so `x == 0.1` on f16 compares with f16(0.1) as PyTorch does.
template <class T>
compute_t<T> attr_operand(const bp_attr& s) {
  return DType<T>::load(s.kind == BP_ATTR_INT ? convert<T>(s.i) : convert<T>(s.f));
}
template <class T>
compute_t<T> scalar_operand(const Launch& l) {
  const bp_attr* s = l.attrs.find(BP_ATTR_ID_SCALAR);
  if (!s) launch_error(l, "one input needs attribute 'scalar'");
  return attr_operand<T>(*s);
}

// Binary op on (a, b) or (a, scalar): storage T in, storage O out, g(C, C) -> compute of O.
template <class T, class O, class G>
void run_binary(const Launch& l, const G& g, Cost cost) {
  using C = compute_t<T>;
  if (l.num_inputs != 1 && l.num_inputs != 2)
    launch_error(l, bp::sdk::format("expects 2 inputs, or 1 input and attribute 'scalar'; got %d",
                                    l.num_inputs));
  check_arity(l, l.num_inputs, 1);
  const bp_tensor_desc &a = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, a, DType<T>::id, "input 0");
  check_dtype(l, out, DType<O>::id, "output");
  check_same_shape(l, a, out, "input 0");
  O* po = data<O>(out);
  const T* pa = data<const T>(a);
  if (l.num_inputs == 2) {
    const bp_tensor_desc& b = l.inputs[1];
    check_dtype(l, b, DType<T>::id, "input 1");
    check_same_shape(l, b, out, "input 1");
    if (numel(out) == 0) return;
    const T* pb = data<const T>(b);
    const bp_tensor_desc* ts[3] = {&out, &a, &b};
    const Layout<3> lay = make_layout<3>(ts);
    auto f = [&g](T x, T y) { return DType<O>::store(g(DType<T>::load(x), DType<T>::load(y))); };
    parallel_rows(lay, cost, [&](const int64_t* off, int64_t n) {
      binary_row(po + off[0], pa + off[1], pb + off[2], n, lay.inner(0), lay.inner(1), lay.inner(2),
                 f);
    });
    return;
  }
  const C s = scalar_operand<T>(l);
  const bool reverse = l.attrs.i(BP_ATTR_ID_REVERSE, 0) != 0;
  if (numel(out) == 0) return;
  const bp_tensor_desc* ts[2] = {&out, &a};
  const Layout<2> lay = make_layout<2>(ts);
  if (reverse) {
    auto f = [&g, s](T x) { return DType<O>::store(g(s, DType<T>::load(x))); };
    parallel_rows(lay, cost, [&](const int64_t* off, int64_t n) {
      unary_row(po + off[0], pa + off[1], n, lay.inner(0), lay.inner(1), f);
    });
  } else {
    auto f = [&g, s](T x) { return DType<O>::store(g(DType<T>::load(x), s)); };
    parallel_rows(lay, cost, [&](const int64_t* off, int64_t n) {
      unary_row(po + off[0], pa + off[1], n, lay.inner(0), lay.inner(1), f);
    });
  }
}

// add and sub with two inputs take ALPHA: out = a OP alpha*b in one pass (plugin_abi.h, Note
// [Op catalogue]); alpha 1 (or absent) is the plain op.
template <class T, class F>
void binary_kernel(const Launch& l) {
  if constexpr (std::is_same_v<F, Add> || std::is_same_v<F, Sub>) {
    const bp_attr* al = l.num_inputs == 2 ? l.attrs.find(BP_ATTR_ID_ALPHA) : nullptr;
    if (al) {
      using C = compute_t<T>;
      const C alpha = attr_operand<T>(*al);
      if (!(alpha == C(1))) {
        run_binary<T, T>(
            l, [alpha](C x, C y) { return F{}(x, wrap_mul(alpha, y)); }, Cost::kCheap);
        return;
      }
    }
  }
  run_binary<T, T>(l, F{}, Cost::kCheap);
}

template <class T, class F>
void compare_kernel(const Launch& l) {
  run_binary<T, boolean>(l, F{}, Cost::kCheap);
}

template <class T, class F>
void unary_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &a = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, a, DType<T>::id, "input 0");
  check_dtype(l, out, DType<T>::id, "output");
  check_same_shape(l, a, out, "input 0");
  if (numel(out) == 0) return;
  T* po = data<T>(out);
  const T* pa = data<const T>(a);
  const bp_tensor_desc* ts[2] = {&out, &a};
  const Layout<2> lay = make_layout<2>(ts);
  auto f = [](T x) { return DType<T>::store(F{}(DType<T>::load(x))); };
  parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
    unary_row(po + off[0], pa + off[1], n, lay.inner(0), lay.inner(1), f);
  });
}

// where(cond, a, b) selects storage values; T is the dtype of a, b and out.
template <class T>
void where_kernel(const Launch& l) {
  check_arity(l, 3, 1);
  const bp_tensor_desc &c = l.inputs[0], &a = l.inputs[1], &b = l.inputs[2], &out = l.outputs[0];
  check_dtype(l, c, BP_DTYPE_BOOL, "input 0 (cond)");
  check_dtype(l, a, DType<T>::id, "input 1");
  check_dtype(l, b, DType<T>::id, "input 2");
  check_dtype(l, out, DType<T>::id, "output");
  check_same_shape(l, c, out, "input 0 (cond)");
  check_same_shape(l, a, out, "input 1");
  check_same_shape(l, b, out, "input 2");
  if (numel(out) == 0) return;
  T* po = data<T>(out);
  const uint8_t* pc = data<const uint8_t>(c);
  const T* pa = data<const T>(a);
  const T* pb = data<const T>(b);
  const bp_tensor_desc* ts[4] = {&out, &c, &a, &b};
  const Layout<4> lay = make_layout<4>(ts);
  const int64_t so = lay.inner(0), sc = lay.inner(1), sa = lay.inner(2), sb = lay.inner(3);
  parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
    T* o = po + off[0];
    const uint8_t* q = pc + off[1];
    const T* x = pa + off[2];
    const T* y = pb + off[3];
    if (so == 1 && sc == 1 && sa == 1 && sb == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = q[i] ? x[i] : y[i];
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = q[i * sc] ? x[i * sa] : y[i * sb];
    }
  });
}

// ---- Transcendental functions (Note [CPU vector math]) ------------------------------------

constexpr int64_t kChunk = 256;  // elements gathered per vector-math call on strided rows

// out = f(a) for f32 f64 f16 bf16: dense f32/f64 rows go to SLEEF directly, anything else
// through a chunk of compute values.
template <class T, vmath::Fn fn>
void vmath_unary_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 1, 1);
  const bp_tensor_desc &a = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, a, DType<T>::id, "input 0");
  check_dtype(l, out, DType<T>::id, "output");
  check_same_shape(l, a, out, "input 0");
  if (numel(out) == 0) return;
  T* po = data<T>(out);
  const T* pa = data<const T>(a);
  const bp_tensor_desc* ts[2] = {&out, &a};
  const Layout<2> lay = make_layout<2>(ts);
  const int64_t so = lay.inner(0), sa = lay.inner(1);
  parallel_rows(lay, Cost::kTranscendental, [&](const int64_t* off, int64_t n) {
    T* o = po + off[0];
    const T* x = pa + off[1];
    if constexpr (std::is_same_v<T, C>) {
      if (so == 1 && sa == 1) return vmath::unary(fn, x, o, n);
    }
    C buf[kChunk];
    if (sa == 0) {  // a broadcast value: once
      buf[0] = DType<T>::load(*x);
      vmath::unary(fn, buf, buf, 1);
      const T v = DType<T>::store(buf[0]);
      for (int64_t i = 0; i < n; ++i) o[i * so] = v;
      return;
    }
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      for (int64_t j = 0; j < m; ++j) buf[j] = DType<T>::load(x[(i + j) * sa]);
      vmath::unary(fn, buf, buf, m);
      for (int64_t j = 0; j < m; ++j) o[(i + j) * so] = DType<T>::store(buf[j]);
    }
  });
}

// pow(a, b), or pow(a, scalar) and pow(scalar, a) (`reverse`). The exponents 0.5, 1, 2, 3 and
// -1 as scalars are sqrt, a copy, x*x, x*x*x and 1/x, as in PyTorch (so the walkthrough's
// y ** 2 is exactly [1 4 9]); everything else is SLEEF's pow.
template <class T>
void pow_kernel(const Launch& l) {
  using C = compute_t<T>;
  if (l.num_inputs != 1 && l.num_inputs != 2)
    launch_error(l, bp::sdk::format("expects 2 inputs, or 1 input and attribute 'scalar'; got %d",
                                    l.num_inputs));
  check_arity(l, l.num_inputs, 1);
  const bp_tensor_desc &a = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, a, DType<T>::id, "input 0");
  check_dtype(l, out, DType<T>::id, "output");
  check_same_shape(l, a, out, "input 0");
  T* po = data<T>(out);
  const T* pa = data<const T>(a);
  if (l.num_inputs == 2) {
    const bp_tensor_desc& b = l.inputs[1];
    check_dtype(l, b, DType<T>::id, "input 1");
    check_same_shape(l, b, out, "input 1");
    if (numel(out) == 0) return;
    const T* pb = data<const T>(b);
    const bp_tensor_desc* ts[3] = {&out, &a, &b};
    const Layout<3> lay = make_layout<3>(ts);
    const int64_t so = lay.inner(0), sa = lay.inner(1), sb = lay.inner(2);
    parallel_rows(lay, Cost::kTranscendental, [&](const int64_t* off, int64_t n) {
      T* o = po + off[0];
      const T* x = pa + off[1];
      const T* y = pb + off[2];
      if constexpr (std::is_same_v<T, C>) {
        if (so == 1 && sa == 1 && sb == 1) return vmath::pow(x, y, o, n);
      }
      C bx[kChunk], by[kChunk];
      for (int64_t i = 0; i < n; i += kChunk) {
        const int64_t m = std::min(kChunk, n - i);
        for (int64_t j = 0; j < m; ++j) {
          bx[j] = DType<T>::load(x[(i + j) * sa]);
          by[j] = DType<T>::load(y[(i + j) * sb]);
        }
        vmath::pow(bx, by, bx, m);
        for (int64_t j = 0; j < m; ++j) o[(i + j) * so] = DType<T>::store(bx[j]);
      }
    });
    return;
  }
  const C s = scalar_operand<T>(l);
  const bool reverse = l.attrs.i(BP_ATTR_ID_REVERSE, 0) != 0;
  if (numel(out) == 0) return;
  const bp_tensor_desc* ts[2] = {&out, &a};
  const Layout<2> lay = make_layout<2>(ts);
  const int64_t so = lay.inner(0), sa = lay.inner(1);
  if (!reverse && (s == C(0.5) || s == C(1) || s == C(2) || s == C(3) || s == C(-1))) {
    auto f = [s](T v) {
      const C x = DType<T>::load(v);
      C r = std::sqrt(x);
      if (s == C(1)) r = x;
      if (s == C(2)) r = x * x;
      if (s == C(3)) r = x * x * x;
      if (s == C(-1)) r = C(1) / x;
      return DType<T>::store(r);
    };
    parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
      unary_row(po + off[0], pa + off[1], n, so, sa, f);
    });
    return;
  }
  parallel_rows(lay, Cost::kTranscendental, [&](const int64_t* off, int64_t n) {
    T* o = po + off[0];
    const T* x = pa + off[1];
    C bx[kChunk], bs[kChunk];
    for (int64_t j = 0; j < kChunk; ++j) bs[j] = s;
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      for (int64_t j = 0; j < m; ++j) bx[j] = DType<T>::load(x[(i + j) * sa]);
      if (reverse)
        vmath::pow(bs, bx, bx, m);
      else
        vmath::pow(bx, bs, bx, m);
      for (int64_t j = 0; j < m; ++j) o[(i + j) * so] = DType<T>::store(bx[j]);
    }
  });
}

// ---- The family table ----------------------------------------------------------------------

template <class T>
KernelFn kernel_for(Op op) {
  constexpr bool kBool = std::is_same_v<T, boolean>;
  constexpr bool kSigned = !kBool && !std::is_same_v<T, uint8_t>;
  switch (op) {
    case Op::kEq:
      return &compare_kernel<T, Eq>;
    case Op::kNe:
      return &compare_kernel<T, Ne>;
    case Op::kLt:
      return &compare_kernel<T, Lt>;
    case Op::kLe:
      return &compare_kernel<T, Le>;
    case Op::kGt:
      return &compare_kernel<T, Gt>;
    case Op::kGe:
      return &compare_kernel<T, Ge>;
    case Op::kWhere:
      return &where_kernel<T>;
    default:
      break;
  }
  if constexpr (!kBool) {
    switch (op) {
      case Op::kAdd:
        return &binary_kernel<T, Add>;
      case Op::kSub:
        return &binary_kernel<T, Sub>;
      case Op::kMul:
        return &binary_kernel<T, Mul>;
      case Op::kMaximum:
        return &binary_kernel<T, Maximum>;
      case Op::kMinimum:
        return &binary_kernel<T, Minimum>;
      default:
        break;
    }
  }
  if constexpr (kSigned) {
    switch (op) {
      case Op::kNeg:
        return &unary_kernel<T, Neg>;
      case Op::kAbs:
        return &unary_kernel<T, Abs>;
      case Op::kRelu:
        return &unary_kernel<T, Relu>;
      default:
        break;
    }
  }
  if constexpr (is_floating_v<T>) {
    switch (op) {
      case Op::kDiv:
        return &binary_kernel<T, Div>;
      case Op::kPow:
        return &pow_kernel<T>;
      case Op::kExp:
        return &vmath_unary_kernel<T, vmath::kExp>;
      case Op::kLog:
        return &vmath_unary_kernel<T, vmath::kLog>;
      case Op::kSqrt:
        return &unary_kernel<T, Sqrt>;
      case Op::kSigmoid:
        return &vmath_unary_kernel<T, vmath::kSigmoid>;
      case Op::kTanh:
        return &vmath_unary_kernel<T, vmath::kTanh>;
      case Op::kSin:
        return &vmath_unary_kernel<T, vmath::kSin>;
      case Op::kCos:
        return &vmath_unary_kernel<T, vmath::kCos>;
      case Op::kRsqrt:
        return &unary_kernel<T, Rsqrt>;
      default:
        break;
    }
  }
  return nullptr;
}

}  // namespace

KernelFn elementwise_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() { return kernel_for<T>(op); });
}

}  // namespace bp::cpu
