// Op dispatch: checks -> cached kernel -> output allocation -> launch, then autograd recording.
//
// Note [Per-op hot path]
//   An op checks devices, dtypes and shapes with plain comparisons, takes its kernel from the
//   device's (op, dtype) cache (an atomic load), allocates only the output, and passes tensor
//   descriptors and attributes from the stack. No string is built unless an error is thrown,
//   no lock is taken, and nothing waits for the device.
#include <backplane/runtime.hpp>
#include <backplane/tensor.hpp>

#include "runtime/fallback.hpp"
#include "tensor/autocast_internal.hpp"
#include "tensor/composites.hpp"
#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace bp {

using namespace detail;

namespace detail {

Tensor unary_raw(Op op, const Tensor& a) {
  check_domain(op, a.dtype());
  Device& dev = a.device();
  Tensor out = make_empty(dev, impl(a).shape, a.dtype());
  if (out.numel() == 0) return out;
  bp_tensor_desc in = desc(a), o = desc(out);
  launch(dev, op, a.dtype(), {&in, 1}, {&o, 1}, {});
  return out;
}

Tensor binary_raw(Op op, const Tensor& a, const Tensor& b, DType out_dtype) {
  const char* name = op_name(op).data();
  check_same_device(name, {&a, &b});
  check_same_dtype(name, a, b);
  check_domain(op, a.dtype());
  Device& dev = a.device();
  Dims shape = broadcast_shapes(impl(a).shape, impl(b).shape, name);
  Tensor out = make_empty(dev, shape, out_dtype);
  if (out.numel() == 0) return out;
  bp_tensor_desc in[2] = {desc_broadcast(a, shape), desc_broadcast(b, shape)};
  bp_tensor_desc o = desc(out);
  launch(dev, op, a.dtype(), in, {&o, 1}, {});
  return out;
}

Tensor scalar_raw(Op op, const Tensor& a, double s, bool reverse, DType out_dtype) {
  check_domain(op, a.dtype());
  Device& dev = a.device();
  if (!is_floating(a.dtype()) && s != std::trunc(s))
    throw DTypeError(std::string(op_name(op)) + ": scalar " + std::to_string(s) +
                     " is not exact in a " + std::string(dtype_name(a.dtype())) +
                     " tensor; cast the tensor to a floating dtype first");
  Tensor out = make_empty(dev, impl(a).shape, out_dtype);
  if (out.numel() == 0) return out;
  bp_tensor_desc in = desc(a), o = desc(out);
  bp_attr attrs[2] = {attr_f(BP_ATTR_ID_SCALAR, s), attr_i(BP_ATTR_ID_REVERSE, reverse ? 1 : 0)};
  launch(dev, op, a.dtype(), {&in, 1}, {&o, 1}, {attrs, reverse ? 2u : 1u});
  return out;
}

Tensor reduce_raw(Op op, const Tensor& a, uint32_t axes, bool keepdim) {
  const char* name = op_name(op).data();
  check_domain(op, a.dtype());
  const TensorImpl& i = impl(a);
  Dims out_shape = i.shape;
  bool empty_reduced = false;
  for (int k = 0; k < i.shape.rank; ++k)
    if (axes & (1u << k)) {
      if (i.shape.d[k] == 0) empty_reduced = true;
      out_shape.d[k] = 1;
    }
  if (op == Op::max && (empty_reduced || i.shape.numel() == 0))
    throw ShapeError(std::string(name) + ": cannot take the maximum of an empty tensor (shape " +
                     i.shape.str() + ")");
  Device& dev = a.device();
  Tensor out = make_empty(dev, out_shape, a.dtype());
  if (out.numel() != 0) {
    bp_tensor_desc in = desc(a), o = desc(out);
    launch(dev, op, a.dtype(), {&in, 1}, {&o, 1}, {});
  }
  if (keepdim) return out;
  Dims s;
  for (int k = 0; k < out_shape.rank; ++k)
    if (!(axes & (1u << k))) s.d[s.rank++] = out_shape.d[k];
  return make_view(out, s, contiguous_strides(s), 0);
}

Tensor copy_raw(const Tensor& a) {  // dense copy on the same device
  Device& dev = a.device();
  Tensor out = make_empty(dev, impl(a).shape, a.dtype());
  if (out.numel() == 0) return out;
  bp_tensor_desc in = desc(a), o = desc(out);
  launch(dev, Op::copy, a.dtype(), {&in, 1}, {&o, 1}, {});
  return out;
}

Tensor cast_raw(const Tensor& a, DType t) {
  Device& dev = a.device();
  Tensor out = make_empty(dev, impl(a).shape, t);
  if (out.numel() == 0) return out;
  bp_tensor_desc in = desc(a), o = desc(out);
  launch(dev, Op::cast, a.dtype(), {&in, 1}, {&o, 1}, {});
  return out;
}

// Writes `src` (broadcast to dst's shape, same device and dtype) into the view `dst`.
void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  Device& dev = dst.device();
  bp_tensor_desc in = desc_broadcast(src, impl(dst).shape), o = desc(dst);
  launch(dev, Op::copy, dst.dtype(), {&in, 1}, {&o, 1}, {});
}

namespace {

// Makes a matmul operand's last two dims row- or column-major; returns [B, R, C] geometry.
struct MatOperand {
  Tensor t;
  bp_tensor_desc d;
};

MatOperand mat_operand(Tensor t, const Dims& batch, int64_t rows, int64_t cols) {
  // Expand batch dims to the broadcast batch shape.
  Shape full = batch.vec();
  full.push_back(rows);
  full.push_back(cols);
  t = t.expand(full);
  auto unit = [&](const Tensor& x) {
    const TensorImpl& i = impl(x);
    int r = i.shape.rank;
    bool row = i.strides.d[r - 1] == 1 || i.shape.d[r - 1] == 1;
    bool col = i.strides.d[r - 2] == 1 || i.shape.d[r - 2] == 1;
    return row || col;
  };
  // The batch dims must collapse into one stride.
  auto batch_stride = [&](const Tensor& x, int64_t& out) {
    const TensorImpl& i = impl(x);
    out = 0;
    int64_t expect = -1;
    for (int k = batch.rank - 1; k >= 0; --k) {
      if (i.shape.d[k] == 1) continue;
      if (expect < 0) {
        out = i.strides.d[k];
        expect = i.strides.d[k] * i.shape.d[k];
      } else if (i.strides.d[k] != expect && !(i.strides.d[k] == 0 && out == 0)) {
        return false;
      } else {
        expect = i.strides.d[k] * i.shape.d[k];
      }
    }
    return true;
  };
  int64_t bs = 0;
  if (!unit(t) || !batch_stride(t, bs)) {
    t = copy_raw(t);
    batch_stride(t, bs);
  }
  const TensorImpl& i = impl(t);
  bp_tensor_desc d = desc(t);
  int r = i.shape.rank;
  d.rank = 3;
  d.shape[0] = batch.numel();
  d.shape[1] = rows;
  d.shape[2] = cols;
  d.strides[0] = bs;
  d.strides[1] = i.strides.d[r - 2];
  d.strides[2] = i.strides.d[r - 1];
  // Size-1 dims may carry any stride; make the unit-stride dim explicit for the backend.
  if (rows == 1 && d.strides[2] != 1) d.strides[1] = 1;
  if (cols == 1 && d.strides[1] != 1) d.strides[2] = 1;
  return {t, d};
}

}  // namespace

Tensor matmul_raw(const Tensor& a0, const Tensor& b0) {
  check_same_device("matmul", {&a0, &b0});
  check_same_dtype("matmul", a0, b0);
  check_domain(Op::matmul, a0.dtype());
  if (a0.rank() == 0 || b0.rank() == 0)
    throw ShapeError("matmul: operands must have at least one dimension, got shapes " +
                     impl(a0).shape.str() + " and " + impl(b0).shape.str());
  Tensor a = a0.rank() == 1 ? a0.unsqueeze(0) : a0;
  Tensor b = b0.rank() == 1 ? b0.unsqueeze(1) : b0;
  const Dims &as = impl(a).shape, &bs = impl(b).shape;
  int64_t m = as.d[as.rank - 2], k = as.d[as.rank - 1];
  int64_t k2 = bs.d[bs.rank - 2], n = bs.d[bs.rank - 1];
  if (k != k2)
    throw ShapeError("matmul: inner dimensions differ, " + impl(a0).shape.str() + " @ " +
                     impl(b0).shape.str() + " (" + std::to_string(k) + " vs " + std::to_string(k2) +
                     ")");
  Dims ab{std::span<const int64_t>(as.d, as.d + as.rank - 2)};
  Dims bb{std::span<const int64_t>(bs.d, bs.d + bs.rank - 2)};
  Dims batch = broadcast_shapes(ab, bb, "matmul");
  Dims out_shape = batch;
  out_shape.d[out_shape.rank++] = m;
  out_shape.d[out_shape.rank++] = n;
  Device& dev = a.device();
  if (!dev.supports(Op::matmul, a.dtype()) && batch.numel() * m * n != 0) [[unlikely]] {
    FallbackScope fallback(dev, Op::matmul, a.dtype(), "decomposition into mul and sum");
    Tensor out = k == 0 ? zeros(Shape(out_shape.d, out_shape.d + out_shape.rank), dev, a.dtype())
                        : matmul_decomposed(a, b);
    if (a0.rank() == 1) out = out.squeeze(-2);
    if (b0.rank() == 1) out = out.squeeze(-1);
    return out;
  }
  Tensor out = make_empty(dev, out_shape, a.dtype());
  if (out.numel() != 0) {
    MatOperand ma = mat_operand(a, batch, m, k), mb = mat_operand(b, batch, k, n);
    bp_tensor_desc in[2] = {ma.d, mb.d};
    bp_tensor_desc o = desc(out);
    o.rank = 3;
    o.shape[0] = batch.numel();
    o.shape[1] = m;
    o.shape[2] = n;
    o.strides[0] = m * n;
    o.strides[1] = n;
    o.strides[2] = 1;
    bp_attr attr = attr_i(BP_ATTR_ID_ALLOW_TF32, allow_tf32() ? 1 : 0);
    launch(dev, Op::matmul, a.dtype(), in, {&o, 1}, {&attr, 1});
  }
  if (a0.rank() == 1) out = out.squeeze(-2);
  if (b0.rank() == 1) out = out.squeeze(-1);
  return out;
}

Tensor where_raw(const Tensor& c, const Tensor& a, const Tensor& b) {
  check_same_device("where", {&c, &a, &b});
  check_same_dtype("where", a, b);
  if (c.dtype() != DType::boolean)
    throw DTypeError("where: the condition must be bool, got " +
                     std::string(dtype_name(c.dtype())));
  Device& dev = a.device();
  Dims shape = broadcast_shapes(broadcast_shapes(impl(c).shape, impl(a).shape, "where"),
                                impl(b).shape, "where");
  Tensor out = make_empty(dev, shape, a.dtype());
  if (out.numel() == 0) return out;
  bp_tensor_desc in[3] = {desc_broadcast(c, shape), desc_broadcast(a, shape),
                          desc_broadcast(b, shape)};
  bp_tensor_desc o = desc(out);
  launch(dev, Op::where, a.dtype(), in, {&o, 1}, {});
  return out;
}

}  // namespace detail

// ---- public ops -----------------------------------------------------------------------------

namespace {
constexpr DType kDefaultFloat = DType::f32;

int category(DType t) {
  return t == DType::boolean ? 0 : is_floating(t) ? 2 : 1;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16))
      return DType::f32;
    return dtype_size(a) >= dtype_size(b) ? a : b;
  }
  return dtype_size(a) >= dtype_size(b) ? a : b;  // u8 < i32 < i64
}

DType result_type(const Tensor& a, const Tensor& b) {
  DType ta = a.dtype(), tb = b.dtype();
  bool za = a.rank() == 0, zb = b.rank() == 0;
  if (za != zb) {
    // Note [Type promotion]: a 0-d operand decides only from a higher category.
    DType dim_t = za ? tb : ta, zero_t = za ? ta : tb;
    return category(zero_t) > category(dim_t) ? zero_t : dim_t;
  }
  return promote_types(ta, tb);
}

using autograd::GradKind;
using autograd::record;

namespace {
// Integer and bool tensors as the default floating dtype (Note [Type promotion]): the inputs of
// true division and of the floating-only elementwise functions.
Tensor as_floating(const Tensor& a) {
  return is_floating(a.dtype()) ? a : a.to(kDefaultFloat);
}
bool floating_only(Op op) {
  return op == Op::exp || op == Op::log || op == Op::sqrt || op == Op::sigmoid || op == Op::tanh;
}

bool autocast_fp32(Op op) {  // the unary and scalar ops of the f32 list
  return op == Op::exp || op == Op::log || op == Op::rsqrt || op == Op::pow;
}

Tensor unary_op(Op op, GradKind kind, const Tensor& a0) {
  AutocastArgs<1> ac(autocast_fp32(op) ? AutocastPolicy::fp32 : AutocastPolicy::none, {&a0});
  const Tensor& a = ac[0];
  check_same_device(op_name(op).data(), {&a});
  if (!is_floating(a.dtype()) && floating_only(op)) [[unlikely]]
    return unary_op(op, kind, as_floating(a));
  Tensor out = unary_raw(op, a);
  if (autograd::needs_grad({&a})) record(kind, out, {a}, {a, out});
  return out;
}
Tensor binary_op(Op op, GradKind kind, const Tensor& a0, const Tensor& b0) {
  AutocastArgs<2> ac(op == Op::pow ? AutocastPolicy::fp32 : AutocastPolicy::none, {&a0, &b0});
  const Tensor &a = ac[0], &b = ac[1];
  if (a.dtype() != b.dtype() || (op == Op::div && !is_floating(a.dtype()))) [[unlikely]] {
    check_same_device(op_name(op).data(), {&a, &b});
    DType t = result_type(a, b);
    if (op == Op::div && !is_floating(t)) t = kDefaultFloat;
    Tensor pa = a.to(t), pb = b.to(t);
    return binary_op(op, kind, pa, pb);
  }
  Tensor out = binary_raw(op, a, b, a.dtype());
  if (autograd::needs_grad({&a, &b})) record(kind, out, {a, b}, {a, b});
  return out;
}
Tensor scalar_op(Op op, GradKind kind, const Tensor& a0, double s, bool reverse) {
  AutocastArgs<1> ac(op == Op::pow ? AutocastPolicy::fp32 : AutocastPolicy::none, {&a0});
  const Tensor& a = ac[0];
  check_same_device(op_name(op).data(), {&a});
  if (op == Op::div && !is_floating(a.dtype())) [[unlikely]]
    return scalar_op(op, kind, as_floating(a), s, reverse);
  Tensor out = scalar_raw(op, a, s, reverse, a.dtype());
  // param tells clamp_scalar which side passes the gradient: 0 maximum, 1 minimum.
  if (autograd::needs_grad({&a})) record(kind, out, {a}, {a, out}, s, op == Op::minimum ? 1 : 0);
  return out;
}
Tensor compare(Op op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) [[unlikely]] {
    check_same_device(op_name(op).data(), {&a, &b});
    DType t = result_type(a, b);
    return binary_raw(op, a.to(t), b.to(t), DType::boolean);
  }
  return binary_raw(op, a, b, DType::boolean);
}
uint32_t all_axes(int rank) {
  return rank >= 32 ? ~0u : ((1u << rank) - 1u);
}
}  // namespace

Tensor operator+(const Tensor& a, const Tensor& b) {
  return binary_op(Op::add, GradKind::add, a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return binary_op(Op::sub, GradKind::sub, a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return binary_op(Op::mul, GradKind::mul, a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return binary_op(Op::div, GradKind::div, a, b);
}
Tensor operator+(const Tensor& a, double b) {
  return scalar_op(Op::add, GradKind::add_scalar, a, b, false);
}
Tensor operator-(const Tensor& a, double b) {
  return scalar_op(Op::sub, GradKind::add_scalar, a, b, false);
}
Tensor operator*(const Tensor& a, double b) {
  return scalar_op(Op::mul, GradKind::mul_scalar, a, b, false);
}
Tensor operator/(const Tensor& a, double b) {
  return scalar_op(Op::div, GradKind::div_scalar, a, b, false);
}
Tensor operator+(double a, const Tensor& b) {
  return scalar_op(Op::add, GradKind::add_scalar, b, a, true);
}
Tensor operator-(double a, const Tensor& b) {
  return scalar_op(Op::sub, GradKind::rsub_scalar, b, a, true);
}
Tensor operator*(double a, const Tensor& b) {
  return scalar_op(Op::mul, GradKind::mul_scalar, b, a, true);
}
Tensor operator/(double a, const Tensor& b) {
  return scalar_op(Op::div, GradKind::rdiv_scalar, b, a, true);
}
Tensor operator-(const Tensor& a) {
  return unary_op(Op::neg, GradKind::neg, a);
}
namespace {
// Integer and bool tensors to a power (Note [Type promotion]): whole non-negative exponents keep
// the integer dtype (square-and-multiply with integer mul, wrapping like PyTorch), fractional
// ones compute in the default floating dtype.
Tensor integer_pow(const Tensor& a0, double e) {
  if (e != std::trunc(e)) return pow(as_floating(a0), e);
  if (e < 0)
    throw DTypeError("pow: integers to negative integer powers are not allowed (exponent " +
                     std::to_string(e) + " on a " + std::string(dtype_name(a0.dtype())) +
                     " tensor); cast the tensor to a floating dtype first");
  Tensor base = a0.dtype() == DType::boolean ? a0.to(DType::i64) : a0;
  Tensor result;
  for (auto n = static_cast<uint64_t>(std::min(e, 1e18)); n != 0; n >>= 1) {
    if (n & 1) result = result.defined() ? result * base : base.clone();
    if (n > 1) base = base * base;
  }
  return result.defined() ? result : full(base.shape(), 1.0, base.device(), base.dtype());
}
}  // namespace

Tensor pow(const Tensor& a, double b) {
  if (!is_floating(a.dtype())) [[unlikely]]
    return integer_pow(a, b);
  return scalar_op(Op::pow, GradKind::pow_scalar, a, b, false);
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return binary_op(Op::pow, GradKind::pow, a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary_op(Op::maximum, GradKind::maximum, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary_op(Op::minimum, GradKind::minimum, a, b);
}
Tensor maximum(const Tensor& a, double b) {
  return scalar_op(Op::maximum, GradKind::clamp_scalar, a, b, false);
}
Tensor minimum(const Tensor& a, double b) {
  return scalar_op(Op::minimum, GradKind::clamp_scalar, a, b, false);
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return compare(Op::eq, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return compare(Op::ne, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return compare(Op::lt, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return compare(Op::le, a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return compare(Op::gt, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return compare(Op::ge, a, b);
}
Tensor gt(const Tensor& a, double b) {
  return scalar_raw(Op::gt, a, b, false, DType::boolean);
}
Tensor lt(const Tensor& a, double b) {
  return scalar_raw(Op::lt, a, b, false, DType::boolean);
}
Tensor where(const Tensor& c, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) [[unlikely]] {
    check_same_device("where", {&c, &a, &b});
    DType t = result_type(a, b);
    return where(c, a.to(t), b.to(t));
  }
  Tensor out = where_raw(c, a, b);
  if (autograd::needs_grad({&a, &b})) record(GradKind::where, out, {a, b}, {c, a, b});
  return out;
}
// Note [Folded matmul]: a [..., M, K] with batch dims, dense, times a matrix b [K, N] (x @ W.t(),
// a tied output layer) is one [(...) M, K] x [K, N] product viewed back, as PyTorch folds it.
// Run as a batch with b broadcast, its backward would compute b's gradient one batch entry at a
// time, [batch, K, N], and then sum that over the batch; folded it is one GEMM over all rows.
Tensor matmul(const Tensor& a0, const Tensor& b0) {
  AutocastArgs<2> ac(AutocastPolicy::lower, {&a0, &b0});
  const Tensor &a = ac[0], &b = ac[1];
  if (a.rank() >= 3 && b.rank() == 2 && a.numel() != 0 && a.size(-1) == b.size(0) &&
      a.is_contiguous() && &a.device() == &b.device() && a.dtype() == b.dtype()) {
    Shape out_shape = a.shape();
    out_shape.back() = b.size(1);
    return matmul(a.reshape({-1, a.size(-1)}), b).reshape(out_shape);
  }
  Tensor out = matmul_raw(a, b);
  if (autograd::needs_grad({&a, &b})) record(GradKind::matmul, out, {a, b}, {a, b});
  return out;
}
// The differentiable unary ops: bp::NAME(a) and Tensor::NAME(), with Op::NAME and
// GradKind::NAME.
#define BP_UNARY_WITH_GRAD(NAME)                  \
  Tensor NAME(const Tensor& a) {                  \
    return unary_op(Op::NAME, GradKind::NAME, a); \
  }                                               \
  Tensor Tensor::NAME() const {                   \
    return bp::NAME(*this);                       \
  }
BP_UNARY_WITH_GRAD(exp)
BP_UNARY_WITH_GRAD(log)
BP_UNARY_WITH_GRAD(sqrt)
BP_UNARY_WITH_GRAD(relu)
BP_UNARY_WITH_GRAD(sigmoid)
BP_UNARY_WITH_GRAD(tanh)
BP_UNARY_WITH_GRAD(abs)
#undef BP_UNARY_WITH_GRAD

Tensor sin(const Tensor& a) {
  return unary_op(Op::sin, GradKind::sin, a);
}
Tensor cos(const Tensor& a) {
  return unary_op(Op::cos, GradKind::cos, a);
}
Tensor rsqrt(const Tensor& a) {
  return unary_op(Op::rsqrt, GradKind::rsqrt, a);
}
Tensor Tensor::pow(double e) const {
  return bp::pow(*this, e);
}
Tensor Tensor::pow(const Tensor& e) const {
  return bp::pow(*this, e);
}
Tensor Tensor::matmul(const Tensor& o) const {
  return bp::matmul(*this, o);
}

namespace {
Tensor reduce_op(Op op, GradKind kind, const Tensor& a0, uint32_t axes, bool keepdim) {
  // sum, norm and sumsq are on the f32 list; mean and max are not.
  const bool fp32 = op == Op::sum || op == Op::norm || op == Op::sumsq;
  AutocastArgs<1> ac(fp32 ? AutocastPolicy::fp32 : AutocastPolicy::none, {&a0});
  const Tensor& a = ac[0];
  check_same_device(op_name(op).data(), {&a});
  Tensor out = reduce_raw(op, a, axes, keepdim);
  if (autograd::needs_grad({&a}))
    record(kind, out, {a}, {a, out}, 0.0, static_cast<int64_t>(axes) | (keepdim ? 1ll << 40 : 0));
  return out;
}
}  // namespace

// Sums of bool and integer tensors are int64, as in PyTorch (so (pred == y).sum() counts).
Tensor Tensor::sum() const {
  if (!is_floating(dtype()) && dtype() != DType::i64) return to(DType::i64).sum();
  return reduce_op(Op::sum, GradKind::sum, *this, all_axes(rank()), false);
}
Tensor Tensor::mean() const {
  return reduce_op(Op::mean, GradKind::mean, *this, all_axes(rank()), false);
}
Tensor Tensor::max() const {
  return reduce_op(Op::max, GradKind::max, *this, all_axes(rank()), false);
}
Tensor Tensor::sum(int axis, bool keepdim) const {
  if (!is_floating(dtype()) && dtype() != DType::i64) return to(DType::i64).sum(axis, keepdim);
  return reduce_op(Op::sum, GradKind::sum, *this, 1u << normalize_axis(axis, rank(), "sum"),
                   keepdim);
}
Tensor Tensor::mean(int axis, bool keepdim) const {
  return reduce_op(Op::mean, GradKind::mean, *this, 1u << normalize_axis(axis, rank(), "mean"),
                   keepdim);
}
Tensor Tensor::max(int axis, bool keepdim) const {
  return reduce_op(Op::max, GradKind::max, *this, 1u << normalize_axis(axis, rank(), "max"),
                   keepdim);
}
// Note [One-pass norms]: sumsq and norm are catalogue ops that read the input once; on a
// device without them (a plugin built against an older catalogue) the same values come from
// x * x, sum and sqrt.
namespace {
Tensor sumsq_op(Op op, const Tensor& a0, uint32_t axes, bool keepdim) {
  AutocastArgs<1> ac(AutocastPolicy::fp32, {&a0});
  const Tensor& a = ac[0];
  if (!is_floating(a.dtype()))
    throw DTypeError(std::string(op_name(op)) + ": needs a floating dtype, got " +
                     std::string(dtype_name(a.dtype())) + " (cast first)");
  if (a.device().supports(op, a.dtype()))
    return reduce_op(op, op == Op::norm ? GradKind::norm : GradKind::sumsq, a, axes, keepdim);
  FallbackScope fallback(
      a.device(), op, a.dtype(),
      op == Op::norm ? "decomposition into mul, sum and sqrt" : "decomposition into mul and sum");
  Tensor s = reduce_op(Op::sum, GradKind::sum, a * a, axes, keepdim);
  return op == Op::norm ? s.sqrt() : s;
}
}  // namespace

Tensor Tensor::norm() const {
  return sumsq_op(Op::norm, *this, all_axes(rank()), false);
}
Tensor Tensor::norm(int axis, bool keepdim) const {
  return sumsq_op(Op::norm, *this, 1u << normalize_axis(axis, rank(), "norm"), keepdim);
}
Tensor Tensor::sumsq() const {
  return sumsq_op(Op::sumsq, *this, all_axes(rank()), false);
}
Tensor Tensor::sumsq(int axis, bool keepdim) const {
  return sumsq_op(Op::sumsq, *this, 1u << normalize_axis(axis, rank(), "sumsq"), keepdim);
}

// Note [Fused linear]: x [..., K] is viewed as [M, K] (the reshape recorded for autograd),
// the plugin's linear kernel writes act(x w^T + b) in one launch, and the result is viewed
// back as [..., N]. Backward: g' = g * (out > 0) with a ReLU, dx = g' w, dw = g'^T x,
// db = sum_rows g'. Devices without the kernel compute matmul, add and relu.
Tensor linear(const Tensor& x0, const Tensor& weight0, const Tensor& bias0, Activation activation) {
  AutocastArgs<3> ac(AutocastPolicy::lower, {&x0, &weight0, &bias0});
  const Tensor &x = ac[0], &weight = ac[1], &bias = ac[2];
  const bool has_bias = bias.defined();
  if (has_bias)
    check_same_device("linear", {&x, &weight, &bias});
  else
    check_same_device("linear", {&x, &weight});
  check_same_dtype("linear", x, weight);
  if (has_bias) check_same_dtype("linear", x, bias);
  check_domain(Op::linear, x.dtype());
  if (weight.rank() != 2)
    throw ShapeError("linear: weight must be [out_features, in_features], got shape " +
                     impl(weight).shape.str());
  const int64_t N = weight.size(0), K = weight.size(1);
  if (x.rank() == 0 || x.size(-1) != K)
    throw ShapeError("linear: input of shape " + impl(x).shape.str() +
                     " does not end in in_features=" + std::to_string(K) + " (weight " +
                     impl(weight).shape.str() + ")");
  if (has_bias && (bias.rank() != 1 || bias.size(0) != N))
    throw ShapeError("linear: bias must be [" + std::to_string(N) + "] (out_features), got " +
                     impl(bias).shape.str());
  const bool relu = activation == Activation::relu;
  Device& dev = x.device();
  if (!dev.supports(Op::linear, x.dtype())) {
    FallbackScope fallback(
        dev, Op::linear, x.dtype(),
        relu ? "decomposition into matmul, add and relu" : "decomposition into matmul and add");
    Tensor y = bp::matmul(x, weight.t());
    if (has_bias) y = y + bias;
    return relu ? y.relu() : y;
  }
  Shape out_shape = x.shape();
  out_shape.back() = N;
  int64_t M = 1;
  for (int d = 0; d + 1 < x.rank(); ++d) M *= x.size(d);
  Tensor x2 = x.rank() == 2 ? x : x.reshape({M, K});
  // Each operand needs a unit stride in one of its two dims (Note [Op catalogue]).
  auto unit = [](const Tensor& t) {
    const TensorImpl& i = impl(t);
    return i.strides.d[0] == 1 || i.strides.d[1] == 1 || i.shape.d[0] == 1 || i.shape.d[1] == 1;
  };
  if (!unit(x2)) x2 = x2.contiguous();
  Tensor w = unit(weight) ? weight : weight.contiguous();
  Dims od;
  od.d[od.rank++] = M;
  od.d[od.rank++] = N;
  Tensor out = make_empty(dev, od, x.dtype());
  if (out.numel() != 0) {
    auto mat = [](const Tensor& t) {
      bp_tensor_desc d = desc(t);
      // Size-1 dims may carry any stride; make the unit-stride dim explicit for the backend.
      if (d.shape[0] == 1 && d.strides[1] != 1) d.strides[0] = 1;
      if (d.shape[1] == 1 && d.strides[0] != 1) d.strides[1] = 1;
      return d;
    };
    bp_tensor_desc in[3] = {mat(x2), mat(w), has_bias ? desc(bias) : bp_tensor_desc{}};
    bp_tensor_desc o = desc(out);
    bp_attr attrs[2] = {attr_i(BP_ATTR_ID_ACTIVATION, relu ? BP_ACTIVATION_RELU : 0),
                        attr_i(BP_ATTR_ID_ALLOW_TF32, allow_tf32() ? 1 : 0)};
    launch(dev, Op::linear, x.dtype(), {in, has_bias ? 3u : 2u}, {&o, 1}, {attrs, 2});
  }
  if (has_bias ? autograd::needs_grad({&x2, &w, &bias}) : autograd::needs_grad({&x2, &w})) {
    std::vector<Tensor> inputs = {x2, w};
    std::vector<Tensor> saved = {x2, w};
    if (has_bias) inputs.push_back(bias);
    if (relu) saved.push_back(out);
    record(GradKind::linear, out, std::move(inputs), std::move(saved), 0.0,
           (relu ? 1 : 0) | (has_bias ? 2 : 0));
  }
  return x.rank() == 2 ? out : out.reshape(out_shape);
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = cast_raw(*this, t);
  if (autograd::needs_grad({this}) && is_floating(t)) record(GradKind::cast, out, {*this}, {*this});
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = copy_raw(*this);
  if (autograd::needs_grad({this})) record(GradKind::identity, out, {*this}, {});
  return out;
}

Tensor& Tensor::fill_(double value) {
  if (numel() == 0) return *this;
  Device& dev = device();
  if (!is_contiguous()) {
    copy_into(*this, full({}, value, dev, dtype()));
    return *this;
  }
  bp_tensor_desc o = desc(*this);
  bp_attr a = (dtype() == DType::i64) ? attr_i(BP_ATTR_ID_VALUE, static_cast<int64_t>(value))
                                      : attr_f(BP_ATTR_ID_VALUE, value);
  launch(dev, Op::fill, dtype(), {}, {&o, 1}, {&a, 1});
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src0) {
  Tensor src = src0.to(device());
  if (src.dtype() != dtype()) src = cast_raw(src, dtype());
  Dims s = broadcast_shapes(impl_->shape, impl(src).shape, "copy_");
  if (!(s == impl_->shape))
    throw ShapeError("copy_: source of shape " + impl(src).shape.str() +
                     " does not broadcast to the destination shape " + impl_->shape.str());
  copy_into(*this, src);
  return *this;
}

// this += alpha * other as one kernel with attribute ALPHA (plugins of minor >= 2), else as
// mul then add (plugin_abi.h, Note [Op catalogue]).
Tensor& Tensor::add_(const Tensor& other0, double alpha) {
  check_same_device("add_", {this, &other0});
  check_same_dtype("add_", *this, other0);
  check_domain(Op::add, dtype());
  Device& dev = device();
  const bool scaled = alpha != 1.0;
  if (scaled && !is_floating(dtype()) && alpha != std::trunc(alpha))
    throw DTypeError("add_: alpha " + std::to_string(alpha) + " is not exact in a " +
                     std::string(dtype_name(dtype())) +
                     " tensor; cast the tensor to a floating dtype first");
  const bool fused = scaled && takes_alpha(dev);
  Tensor other = scaled && !fused ? scalar_raw(Op::mul, other0, alpha, false, dtype()) : other0;
  Dims s = broadcast_shapes(impl_->shape, impl(other).shape, "add_");
  if (!(s == impl_->shape))
    throw ShapeError("add_: shape " + impl(other).shape.str() +
                     " does not broadcast to the destination shape " + impl_->shape.str());
  if (numel() == 0) return *this;
  bp_attr a[2] = {attr_i(BP_ATTR_ID_INPLACE, 1),
                  is_floating(dtype()) ? attr_f(BP_ATTR_ID_ALPHA, alpha)
                                       : attr_i(BP_ATTR_ID_ALPHA, static_cast<int64_t>(alpha))};
  bp_tensor_desc in[2] = {desc(*this), desc_broadcast(other, s)};
  if (!is_contiguous()) {
    Tensor sum = make_empty(dev, impl_->shape, dtype());
    bp_tensor_desc o = desc(sum);
    launch(dev, Op::add, dtype(), in, {&o, 1}, {a + 1, fused ? 1u : 0u});
    copy_into(*this, sum);
    return *this;
  }
  bp_tensor_desc o = desc(*this);
  launch(dev, Op::add, dtype(), in, {&o, 1}, {a, fused ? 2u : 1u});
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  check_domain(Op::mul, dtype());
  if (numel() == 0) return *this;
  if (!is_contiguous()) {
    copy_into(*this, scalar_raw(Op::mul, *this, factor, false, dtype()));
    return *this;
  }
  Device& dev = device();
  bp_tensor_desc in = desc(*this), o = desc(*this);
  bp_attr a[2] = {attr_f(BP_ATTR_ID_SCALAR, factor), attr_i(BP_ATTR_ID_INPLACE, 1)};
  launch(dev, Op::mul, dtype(), {&in, 1}, {&o, 1}, a);
  return *this;
}

// cat: tensor_index_ops.cpp.

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  check_same_device("allclose", {&a, &b});  // like every op: moving data is the caller's choice
  if (!(impl(a).shape == impl(b).shape)) return false;
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t k = 0; k < x.size(); ++k) {
    if (std::isnan(x[k]) || std::isnan(y[k])) return false;
    if (std::fabs(x[k] - y[k]) > atol + rtol * std::fabs(y[k])) return false;
  }
  return true;
}

}  // namespace bp
