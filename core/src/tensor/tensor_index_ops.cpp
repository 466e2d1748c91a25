// functions.hpp: reductions with indices, gather / scatter_add, cat / stack, clamp, var / std,
// softmax / log_softmax. Checked before anything is allocated, launched through the per-op
// path on dense inputs, recorded for autograd.
#include <backplane/functions.hpp>
#include <backplane/runtime.hpp>

#include "runtime/fallback.hpp"
#include "tensor/autocast_internal.hpp"
#include "tensor/composites.hpp"
#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"

#include <string>

namespace bp {

using namespace detail;
using autograd::GradKind;
using autograd::record;

namespace {

std::string shape_of(const Tensor& t) {
  return "[" + impl(t).shape.str() + "]";
}

void check_index(const char* op, const Tensor& input, const Tensor& index) {
  check_same_device(op, {&input, &index});
  if (index.dtype() != DType::i64)
    throw DTypeError(std::string(op) + ": index must be int64, got " +
                     std::string(dtype_name(index.dtype())));
  if (index.rank() != input.rank())
    throw ShapeError(std::string(op) + ": index " + shape_of(index) +
                     " must have the rank of input " + shape_of(input) + " (" +
                     std::to_string(input.rank()) + ")");
}

// Shape with size 1 on `axis`.
Dims keep_shape(const Tensor& x, int axis) {
  Dims s = impl(x).shape;
  s.d[axis] = 1;
  return s;
}

ValuesIndices extreme(Op op, const Tensor& input, int dim, bool keepdim) {
  const char* name = op == Op::max_dim ? "max" : "min";
  check_same_device(name, {&input});
  check_domain(op, input.dtype());
  if (input.rank() == 0) {
    normalize_axis(dim, 0, name);
    ValuesIndices r = extreme(op, input.reshape({1}), 0, false);
    return {r.values.reshape({}), r.indices.reshape({})};
  }
  const int axis = normalize_axis(dim, input.rank(), name);
  if (input.size(axis) == 0)
    throw ShapeError(std::string(name) + ": dim " + std::to_string(dim) + " of input " +
                     shape_of(input) + " is empty; the " +
                     (op == Op::max_dim ? "maximum" : "minimum") + " of no elements is undefined");
  Tensor x = input.contiguous();
  Dims os = keep_shape(x, axis);
  Tensor values = make_empty(x.device(), os, x.dtype());
  Tensor indices = make_empty(x.device(), os, DType::i64);
  if (values.numel() != 0) {
    bp_tensor_desc in = desc(x), out[2] = {desc(values), desc(indices)};
    bp_attr a = attr_i(BP_ATTR_ID_AXIS, axis);
    launch(x.device(), op, x.dtype(), {&in, 1}, out, {&a, 1});
  }
  if (autograd::needs_grad({&x})) record(GradKind::index_reduce, values, {x}, {indices}, 0.0, axis);
  if (keepdim) return {values, indices};
  return {values.squeeze(axis), indices.squeeze(axis)};
}

Tensor arg_extreme(Op op, const Tensor& input, std::optional<int> dim, bool keepdim) {
  NoGradGuard no_grad;
  if (dim) return extreme(op, input, *dim, keepdim).indices;
  Tensor i = extreme(op, input.reshape({-1}), 0, false).indices;
  if (!keepdim) return i;
  return i.reshape(Shape(static_cast<size_t>(input.rank()), 1));
}

Tensor softmax_op(Op op, GradKind kind, const Tensor& input0, int dim) {
  AutocastArgs<1> ac(AutocastPolicy::fp32, {&input0});
  const Tensor& input = ac[0];
  const char* name = op_name(op).data();
  check_same_device(name, {&input});
  check_domain(op, input.dtype());
  if (input.rank() == 0) {
    normalize_axis(dim, 0, name);
    return softmax_op(op, kind, input.reshape({1}), 0).reshape({});
  }
  const int axis = normalize_axis(dim, input.rank(), name);
  Tensor x = input.contiguous();
  Tensor y = make_empty(x.device(), impl(x).shape, x.dtype());
  if (y.numel() != 0 && !x.device().supports(op, x.dtype())) [[unlikely]] {
    FallbackScope fallback(x.device(), op, x.dtype(),
                           op == Op::softmax
                               ? "decomposition into max, sub, exp, sum and div"
                               : "decomposition into max, sub, exp, sum, log and sub");
    y = softmax_decomposed(op, x, axis);
  } else if (y.numel() != 0) {
    bp_tensor_desc in = desc(x), out = desc(y);
    bp_attr a = attr_i(BP_ATTR_ID_AXIS, axis);
    launch(x.device(), op, x.dtype(), {&in, 1}, {&out, 1}, {&a, 1});
  }
  if (autograd::needs_grad({&x})) record(kind, y, {x}, {y}, 0.0, axis);
  return y;
}

}  // namespace

// ---- raw launches (tensor_nn_internal.hpp) ---------------------------------------------------

namespace detail {

Tensor softmax_backward_raw(Op op, const Tensor& y, const Tensor& dy0, int axis) {
  Tensor dy = dy0.contiguous();
  Tensor dx = make_empty(y.device(), impl(y).shape, y.dtype());
  if (dx.numel() == 0) return dx;
  if (!y.device().supports(op, y.dtype())) [[unlikely]] {
    FallbackScope fallback(y.device(), op, y.dtype(),
                           op == Op::softmax_backward ? "decomposition into mul, sum and sub"
                                                      : "decomposition into exp, sum, mul and sub");
    return softmax_backward_decomposed(op, y, dy, axis);
  }
  bp_tensor_desc in[2] = {desc(y), desc(dy)}, out = desc(dx);
  bp_attr a = attr_i(BP_ATTR_ID_AXIS, axis);
  launch(y.device(), op, y.dtype(), in, {&out, 1}, {&a, 1});
  return dx;
}

Tensor gather_raw(const Tensor& x, int axis, const Tensor& index) {
  Tensor out = make_empty(x.device(), impl(index).shape, x.dtype());
  if (out.numel() == 0) return out;
  bp_tensor_desc in[2] = {desc(x), desc(index)}, o = desc(out);
  bp_attr a = attr_i(BP_ATTR_ID_AXIS, axis);
  launch(x.device(), Op::gather, x.dtype(), in, {&o, 1}, {&a, 1});
  return out;
}

Tensor scatter_add_raw(const Tensor& base, int axis, const Tensor& index, const Tensor& src) {
  Tensor out = make_empty(base.device(), impl(base).shape, base.dtype());
  if (out.numel() == 0) return out;
  if (index.numel() == 0) {
    copy_into(out, base);
    return out;
  }
  bp_tensor_desc in[3] = {desc(base), desc(index), desc(src)}, o = desc(out);
  bp_attr a = attr_i(BP_ATTR_ID_AXIS, axis);
  launch(base.device(), Op::scatter_add, base.dtype(), in, {&o, 1}, {&a, 1});
  return out;
}

void scatter_add_into(const Tensor& base, int axis, const Tensor& index, const Tensor& src) {
  if (base.numel() == 0 || index.numel() == 0) return;
  bp_tensor_desc in[3] = {desc(base), desc(index), desc(src)}, o = desc(base);
  bp_attr a[2] = {attr_i(BP_ATTR_ID_AXIS, axis), attr_i(BP_ATTR_ID_INPLACE, 1)};
  launch(base.device(), Op::scatter_add, base.dtype(), in, {&o, 1}, {a, 2});
}

}  // namespace detail

// ---- reductions with indices ------------------------------------------------------------------

ValuesIndices max(const Tensor& input, int dim, bool keepdim) {
  return extreme(Op::max_dim, input, dim, keepdim);
}
ValuesIndices min(const Tensor& input, int dim, bool keepdim) {
  return extreme(Op::min_dim, input, dim, keepdim);
}
Tensor argmax(const Tensor& input, std::optional<int> dim, bool keepdim) {
  return arg_extreme(Op::max_dim, input, dim, keepdim);
}
Tensor argmin(const Tensor& input, std::optional<int> dim, bool keepdim) {
  return arg_extreme(Op::min_dim, input, dim, keepdim);
}

// ---- gather / scatter_add ---------------------------------------------------------------------

Tensor gather(const Tensor& input, int dim, const Tensor& index) {
  const char* op = "gather";
  check_same_device(op, {&input});
  check_domain(Op::gather, input.dtype());
  check_index(op, input, index);
  const int axis = normalize_axis(dim, input.rank(), op);
  for (int d = 0; d < input.rank(); ++d)
    if (d != axis && index.size(d) > input.size(d))
      throw ShapeError(std::string(op) + ": index " + shape_of(index) + " is larger than input " +
                       shape_of(input) + " in dim " + std::to_string(d) +
                       " (the rule: index.size(d) <= input.size(d) for d != dim)");
  Tensor x = input.contiguous(), i = index.contiguous();
  Tensor out = gather_raw(x, axis, i);
  if (autograd::needs_grad({&x})) record(GradKind::gather, out, {x}, {i}, 0.0, axis);
  return out;
}

Tensor scatter_add(const Tensor& input, int dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  check_same_device(op, {&input, &src});
  check_same_dtype(op, input, src);
  check_domain(Op::scatter_add, input.dtype());
  check_index(op, input, index);
  if (src.rank() != input.rank())
    throw ShapeError(std::string(op) + ": src " + shape_of(src) + " must have the rank of input " +
                     shape_of(input));
  const int axis = normalize_axis(dim, input.rank(), op);
  for (int d = 0; d < input.rank(); ++d) {
    if (index.size(d) > src.size(d))
      throw ShapeError(std::string(op) + ": index " + shape_of(index) + " is larger than src " +
                       shape_of(src) + " in dim " + std::to_string(d) +
                       " (the rule: index.size(d) <= src.size(d))");
    if (d != axis && index.size(d) > input.size(d))
      throw ShapeError(std::string(op) + ": index " + shape_of(index) + " is larger than input " +
                       shape_of(input) + " in dim " + std::to_string(d) +
                       " (the rule: index.size(d) <= input.size(d) for d != dim)");
  }
  Tensor s = src;
  for (int d = 0; d < src.rank(); ++d)
    if (s.size(d) != index.size(d)) s = s.slice(d, 0, index.size(d));
  Tensor base = input.contiguous(), i = index.contiguous();
  s = s.contiguous();
  Tensor out = scatter_add_raw(base, axis, i, s);
  if (autograd::needs_grad({&base, &s}))
    record(GradKind::scatter_add, out, {base, s}, {i}, 0.0, axis);
  return out;
}

// ---- cat / stack ------------------------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& ts, int axis) {
  if (ts.empty()) throw ShapeError("cat: needs at least one tensor");
  const Tensor& first = ts[0];
  if (first.rank() == 0)
    throw ShapeError("cat: zero-dimensional tensors cannot be concatenated (use stack)");
  axis = normalize_axis(axis, first.rank(), "cat");
  Dims shape = impl(first).shape;
  shape.d[axis] = 0;
  bool grad = false;
  DType widest = first.dtype();
  for (const Tensor& t : ts) widest = promote_types(widest, t.dtype());
  if (widest != first.dtype() || std::any_of(ts.begin(), ts.end(), [&](const Tensor& t) {
        return t.dtype() != widest;
      })) [[unlikely]] {
    // Note [Autocast op lists]: cat runs in the widest dtype of its operands, as in PyTorch.
    std::vector<Tensor> promoted;
    promoted.reserve(ts.size());
    for (const Tensor& t : ts) {
      check_same_device("cat", {&first, &t});
      promoted.push_back(t.to(widest));
    }
    return cat(promoted, axis);
  }
  for (const Tensor& t : ts) {
    check_same_device("cat", {&first, &t});
    const Dims& s = impl(t).shape;
    bool ok = s.rank == shape.rank;
    for (int k = 0; ok && k < s.rank; ++k) ok = k == axis || s.d[k] == shape.d[k];
    if (!ok)
      throw ShapeError("cat: shape " + s.str() + " does not match " + impl(first).shape.str() +
                       " outside axis " + std::to_string(axis));
    shape.d[axis] += s.d[axis];
    grad = grad || autograd::needs_grad({&t});
  }
  Tensor out = make_empty(first.device(), shape, first.dtype());
  Shape sizes;
  int64_t at = 0;
  for (const Tensor& t : ts) {
    int64_t n = impl(t).shape.d[axis];
    copy_into(out.slice(axis, at, at + n), t);
    at += n;
    sizes.push_back(n);
  }
  if (grad) record(GradKind::cat, out, ts, {}, 0.0, axis, std::move(sizes));
  return out;
}

Tensor stack(const std::vector<Tensor>& ts, int dim) {
  if (ts.empty()) throw ShapeError("stack: needs at least one tensor");
  const Dims& s0 = impl(ts[0]).shape;
  for (size_t k = 1; k < ts.size(); ++k)
    if (!(impl(ts[k]).shape == s0))
      throw ShapeError("stack: every tensor must have one shape; tensor " + std::to_string(k) +
                       " is " + shape_of(ts[k]) + ", tensor 0 is " + shape_of(ts[0]));
  const int axis = normalize_axis(dim, s0.rank + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(ts.size());
  for (const Tensor& t : ts) parts.push_back(t.unsqueeze(axis));
  return cat(parts, axis);
}

// ---- clamp, statistics, softmax ---------------------------------------------------------------

Tensor clamp(const Tensor& input, std::optional<double> lo, std::optional<double> hi) {
  if (!lo && !hi) throw Error("clamp: at least one of min and max must be given");
  Tensor y = input;
  if (lo) y = maximum(y, *lo);
  if (hi) y = minimum(y, *hi);
  return y;
}

Tensor var(const Tensor& input, std::optional<int> dim, double correction, bool keepdim) {
  if (!is_floating(input.dtype()))
    throw DTypeError("var: needs a floating dtype, got " + std::string(dtype_name(input.dtype())) +
                     " (cast first)");
  if (dim) {
    const int axis = normalize_axis(*dim, input.rank(), "var");
    const double n = input.rank() == 0 ? 1.0 : static_cast<double>(input.size(axis));
    Tensor d = input - input.mean(axis, true);
    return (d * d).sum(axis, keepdim) / (n - correction);
  }
  const double n = static_cast<double>(input.numel());
  Tensor d = input - input.mean();
  Tensor v = (d * d).sum() / (n - correction);
  return keepdim ? v.reshape(Shape(static_cast<size_t>(input.rank()), 1)) : v;
}

Tensor std(const Tensor& input, std::optional<int> dim, double correction, bool keepdim) {
  return var(input, dim, correction, keepdim).sqrt();
}

Tensor softmax(const Tensor& input, int dim) {
  return softmax_op(Op::softmax, GradKind::softmax, input, dim);
}
Tensor log_softmax(const Tensor& input, int dim) {
  return softmax_op(Op::log_softmax, GradKind::log_softmax, input, dim);
}

}  // namespace bp
