// The convolutional family: convolution, pooling, batch normalisation and dropout
// (bp::nn::functional), checked before anything is allocated (Note [Convolution checks] in
// nn_functional.hpp), launched through the per-op path, recorded for autograd.
#include <backplane/nn_functional.hpp>
#include <backplane/runtime.hpp>

#include "runtime/fallback.hpp"
#include "tensor/autocast_internal.hpp"
#include "tensor/composites.hpp"
#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"

#include <cmath>
#include <string>

namespace bp {

using namespace detail;
using autograd::GradKind;
using autograd::record;

namespace {

std::string shape_of(const Tensor& t) {
  return "[" + impl(t).shape.str() + "]";
}
std::string pair_str(int64_t h, int64_t w) {
  std::string s = "(";  // appended, not "(" + ...: GCC 12 warns falsely (-Wrestrict) on that
  s += std::to_string(h);
  s += ", ";
  s += std::to_string(w);
  s += ")";
  return s;
}

// Launches `op` over dense descriptors of the given tensors (undefined ones are skipped).
void launch_dense(Op op, DType dtype, std::initializer_list<const Tensor*> ins,
                  std::initializer_list<const Tensor*> outs, std::span<const bp_attr> attrs) {
  bp_tensor_desc in[6], out[4];
  uint32_t ni = 0, no = 0;
  Device* dev = nullptr;
  for (const Tensor* t : ins)
    if (t->defined()) {
      in[ni++] = desc(*t);
      dev = &t->device();
    }
  for (const Tensor* t : outs)
    if (t->defined()) {
      out[no++] = desc(*t);
      dev = &t->device();
    }
  launch(*dev, op, dtype, {in, ni}, {out, no}, attrs);
}

Dims dims_of(const Shape& s) {
  return Dims(std::span<const int64_t>(s));
}

void check_window_arg(const char* op, const char* what, nn::functional::Pair2 v, int64_t least) {
  if (v.h < least || v.w < least)
    throw ShapeError(std::string(op) + ": " + what + " must be >= " + std::to_string(least) +
                     ", got " + pair_str(v.h, v.w));
}

// The image operand: rank 4, or rank 3 for one unbatched image (`batched` false).
void check_image(const char* op, const Tensor& x, bool& batched) {
  if (x.rank() != 3 && x.rank() != 4)
    throw ShapeError(std::string(op) +
                     ": input must be [N, C, H, W] (or [C, H, W] unbatched), got " + shape_of(x));
  batched = x.rank() == 4;
}

bp_attr conv_attr(int k, int64_t v) {
  static constexpr bp_attr_id ids[7] = {
      BP_ATTR_ID_STRIDE_H,   BP_ATTR_ID_STRIDE_W,   BP_ATTR_ID_PAD_H, BP_ATTR_ID_PAD_W,
      BP_ATTR_ID_DILATION_H, BP_ATTR_ID_DILATION_W, BP_ATTR_ID_GROUPS};
  return attr_i(ids[k], v);
}

// Attribute list of a convolution (Note [Window attributes]) plus ALLOW_TF32.
struct ConvAttrList {
  bp_attr a[8];
  explicit ConvAttrList(const Shape& c) {
    for (int k = 0; k < 7; ++k) a[k] = conv_attr(k, c[static_cast<size_t>(k)]);
    a[7] = attr_i(BP_ATTR_ID_ALLOW_TF32, allow_tf32() ? 1 : 0);
  }
};

struct PoolAttrList {
  bp_attr a[10];
  uint32_t n = 0;
  PoolAttrList(const Shape& p, bool with_dilation, bool with_count) {
    a[n++] = attr_i(BP_ATTR_ID_KERNEL_H, p[0]);
    a[n++] = attr_i(BP_ATTR_ID_KERNEL_W, p[1]);
    a[n++] = attr_i(BP_ATTR_ID_STRIDE_H, p[2]);
    a[n++] = attr_i(BP_ATTR_ID_STRIDE_W, p[3]);
    a[n++] = attr_i(BP_ATTR_ID_PAD_H, p[4]);
    a[n++] = attr_i(BP_ATTR_ID_PAD_W, p[5]);
    if (with_dilation) {
      a[n++] = attr_i(BP_ATTR_ID_DILATION_H, p[6]);
      a[n++] = attr_i(BP_ATTR_ID_DILATION_W, p[7]);
    }
    a[n++] = attr_i(BP_ATTR_ID_CEIL_MODE, p[8]);
    if (with_count) a[n++] = attr_i(BP_ATTR_ID_COUNT_INCLUDE_PAD, p[9]);
  }
  std::span<const bp_attr> span() const { return {a, n}; }
};

}  // namespace

// ---- raw launches (tensor_nn_internal.hpp) ---------------------------------------------------

namespace detail {

Tensor conv2d_backward_input_raw(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                                 const Shape& c) {
  Tensor dx = make_empty(dy.device(), dims_of(x_shape), dy.dtype());
  if (dx.numel() == 0) return dx;
  if (dy.numel() == 0 || w.numel() == 0) return dx.zero_();
  if (!dy.device().supports(Op::conv2d_backward_input, dy.dtype())) [[unlikely]] {
    FallbackScope fallback(dy.device(), Op::conv2d_backward_input, dy.dtype(),
                           "decomposition into matmul and col2im (strided adds)");
    return conv2d_backward_input_decomposed(dy, w, x_shape, c);
  }
  ConvAttrList attrs(c);
  launch_dense(Op::conv2d_backward_input, dy.dtype(), {&dy, &w}, {&dx}, attrs.a);
  return dx;
}

Tensor conv2d_backward_weight_raw(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                                  const Shape& c) {
  Tensor dw = make_empty(dy.device(), dims_of(w_shape), dy.dtype());
  if (dw.numel() == 0) return dw;
  if (dy.numel() == 0 || x.numel() == 0) return dw.zero_();
  if (!dy.device().supports(Op::conv2d_backward_weight, dy.dtype())) [[unlikely]] {
    FallbackScope fallback(dy.device(), Op::conv2d_backward_weight, dy.dtype(),
                           "decomposition into im2col, matmul and sum");
    return conv2d_backward_weight_decomposed(x, dy, w_shape, c);
  }
  ConvAttrList attrs(c);
  launch_dense(Op::conv2d_backward_weight, dy.dtype(), {&x, &dy}, {&dw}, attrs.a);
  return dw;
}

Tensor max_pool2d_backward_raw(const Tensor& dy, const Tensor& indices, const Shape& x_shape,
                               const Shape& p) {
  Tensor dx = make_empty(dy.device(), dims_of(x_shape), dy.dtype());
  if (dx.numel() == 0) return dx;
  if (dy.numel() == 0) return dx.zero_();
  PoolAttrList attrs(p, true, false);
  launch_dense(Op::max_pool2d_backward, dy.dtype(), {&dy, &indices}, {&dx}, attrs.span());
  return dx;
}

Tensor avg_pool2d_backward_raw(const Tensor& dy, const Shape& x_shape, const Shape& p) {
  Tensor dx = make_empty(dy.device(), dims_of(x_shape), dy.dtype());
  if (dx.numel() == 0) return dx;
  if (dy.numel() == 0) return dx.zero_();
  PoolAttrList attrs(p, false, true);
  launch_dense(Op::avg_pool2d_backward, dy.dtype(), {&dy}, {&dx}, attrs.span());
  return dx;
}

Tensor adaptive_avg_pool2d_backward_raw(const Tensor& dy, const Shape& x_shape) {
  Tensor dx = make_empty(dy.device(), dims_of(x_shape), dy.dtype());
  if (dx.numel() == 0) return dx;
  if (dy.numel() == 0) return dx.zero_();
  launch_dense(Op::adaptive_avg_pool2d_backward, dy.dtype(), {&dy}, {&dx}, {});
  return dx;
}

std::array<Tensor, 3> batch_norm_backward_raw(const Tensor& dy, const Tensor& x, const Tensor& w,
                                              const Tensor& save_mean, const Tensor& save_invstd,
                                              double eps) {
  Device& dev = dy.device();
  Tensor dx = make_empty(dev, impl(x).shape, x.dtype());
  Tensor dw = make_empty(dev, impl(w).shape, w.dtype());
  Tensor db = make_empty(dev, impl(w).shape, w.dtype());
  bp_attr a = attr_f(BP_ATTR_ID_EPS, eps);
  launch_dense(Op::batch_norm_backward, x.dtype(), {&dy, &x, &w, &save_mean, &save_invstd},
               {&dx, &dw, &db}, {&a, 1});
  return {dx, dw, db};
}

Tensor dropout_raw(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  Tensor y = make_empty(x.device(), impl(x).shape, x.dtype());
  if (y.numel() == 0) return y;
  bp_attr a[3] = {attr_f(BP_ATTR_ID_P, p), attr_i(BP_ATTR_ID_SEED, static_cast<int64_t>(seed)),
                  attr_i(BP_ATTR_ID_OFFSET, static_cast<int64_t>(offset))};
  launch_dense(Op::dropout, x.dtype(), {&x}, {&y}, a);
  return y;
}

}  // namespace detail

namespace nn::functional {

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                         bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  if (span < 0) return span / stride + (span % stride != 0 ? 0 : 1);  // <= 0: no window fits
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // Note [Op catalogue]: with ceil_mode the last window must start inside the input or the
  // left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// ---- convolution ------------------------------------------------------------------------------

Tensor conv2d(const Tensor& input0, const Tensor& weight0, const Tensor& bias0, Pair2 stride,
              Pair2 padding, Pair2 dilation, int64_t groups) {
  AutocastArgs<3> ac(AutocastPolicy::lower, {&input0, &weight0, &bias0});
  const Tensor &input = ac[0], &weight = ac[1], &bias = ac[2];
  const char* op = "conv2d";
  const bool has_bias = bias.defined();
  if (has_bias)
    check_same_device(op, {&input, &weight, &bias});
  else
    check_same_device(op, {&input, &weight});
  check_same_dtype(op, input, weight);
  if (has_bias) check_same_dtype(op, input, bias);
  check_domain(Op::conv2d, input.dtype());
  bool batched = true;
  check_image(op, input, batched);
  if (weight.rank() != 4)
    throw ShapeError(std::string(op) +
                     ": weight must be [out_channels, in_channels / groups, kH, kW], got " +
                     shape_of(weight));
  check_window_arg(op, "stride", stride, 1);
  check_window_arg(op, "dilation", dilation, 1);
  check_window_arg(op, "padding", padding, 0);
  if (groups < 1)
    throw ShapeError(std::string(op) + ": groups must be >= 1, got " + std::to_string(groups));
  const int c_axis = batched ? 1 : 0;
  const int64_t C = input.size(c_axis), H = input.size(c_axis + 1), W = input.size(c_axis + 2);
  const int64_t K = weight.size(0), R = weight.size(2), S = weight.size(3);
  if (K % groups != 0)
    throw ShapeError(
        std::string(op) + ": weight " + shape_of(weight) + " has " + std::to_string(K) +
        " output channels, which is not a multiple of groups=" + std::to_string(groups));
  if (weight.size(1) * groups != C)
    throw ShapeError(std::string(op) + ": input " + shape_of(input) + " has " + std::to_string(C) +
                     " channels but weight " + shape_of(weight) +
                     " with groups=" + std::to_string(groups) + " expects " +
                     std::to_string(weight.size(1) * groups) +
                     " (the rule: input channels = weight.size(1) * groups)");
  if (R < 1 || S < 1)
    throw ShapeError(std::string(op) + ": the kernel of weight " + shape_of(weight) +
                     " must be at least 1x1");
  if (has_bias && (bias.rank() != 1 || bias.size(0) != K))
    throw ShapeError(std::string(op) + ": bias must be [" + std::to_string(K) +
                     "] (out_channels of weight " + shape_of(weight) + "), got " + shape_of(bias));
  const int64_t P = conv_output_size(H, R, stride.h, padding.h, dilation.h);
  const int64_t Q = conv_output_size(W, S, stride.w, padding.w, dilation.w);
  if (P < 1 || Q < 1)
    throw ShapeError(std::string(op) + ": input " + shape_of(input) + " with padding " +
                     pair_str(padding.h, padding.w) + " is smaller than the kernel of weight " +
                     shape_of(weight) + " dilated by " + pair_str(dilation.h, dilation.w) +
                     ": the output would be " + std::to_string(P) + "x" + std::to_string(Q) +
                     " (each output size must be >= 1)");
  if (!batched)
    return conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);

  Tensor x = input.contiguous(), w = weight.contiguous();
  Tensor b = has_bias ? bias.contiguous() : Tensor();
  const int64_t N = input.size(0);
  Tensor out = make_empty(input.device(), Dims{N, K, P, Q}, input.dtype());
  Shape c = {stride.h, stride.w, padding.h, padding.w, dilation.h, dilation.w, groups};
  if (out.numel() != 0) {
    if (x.numel() == 0) {
      // No input channels: the output is the bias (or zero).
      out.zero_();
      if (has_bias) {
        NoGradGuard no_grad;
        out.add_(b.reshape({1, K, 1, 1}));
      }
    } else if (!x.device().supports(Op::conv2d, x.dtype())) [[unlikely]] {
      FallbackScope fallback(x.device(), Op::conv2d, x.dtype(),
                             "decomposition into im2col and matmul");
      out = conv2d_decomposed(x, w, b, c);
    } else {
      ConvAttrList attrs(c);
      launch_dense(Op::conv2d, x.dtype(), {&x, &w, &b}, {&out}, attrs.a);
    }
  }
  if (has_bias ? autograd::needs_grad({&x, &w, &b}) : autograd::needs_grad({&x, &w})) {
    std::vector<Tensor> inputs = {x, w};
    if (has_bias) inputs.push_back(b);
    record(GradKind::conv2d, out, std::move(inputs), {x, w}, 0.0, has_bias ? 1 : 0, std::move(c));
  }
  return out;
}

// ---- pooling ----------------------------------------------------------------------------------

namespace {

struct PoolGeometry {
  Shape attrs;  // Note [Window attributes]
  int64_t P, Q;
};

PoolGeometry check_pool(const char* op, const Tensor& input, Pair2 kernel,
                        std::optional<Pair2> stride0, Pair2 padding, Pair2 dilation, bool ceil_mode,
                        bool count_include_pad, Op kernel_op) {
  check_same_device(op, {&input});
  check_domain(kernel_op, input.dtype());
  bool batched = true;
  check_image(op, input, batched);
  Pair2 stride = stride0.value_or(kernel);
  check_window_arg(op, "kernel_size", kernel, 1);
  check_window_arg(op, "stride", stride, 1);
  check_window_arg(op, "dilation", dilation, 1);
  check_window_arg(op, "padding", padding, 0);
  if (padding.h > kernel.h / 2 || padding.w > kernel.w / 2)
    throw ShapeError(std::string(op) + ": padding " + pair_str(padding.h, padding.w) +
                     " must be at most half the kernel size " + pair_str(kernel.h, kernel.w));
  const int64_t H = input.size(-2), W = input.size(-1);
  const int64_t P = conv_output_size(H, kernel.h, stride.h, padding.h, dilation.h, ceil_mode);
  const int64_t Q = conv_output_size(W, kernel.w, stride.w, padding.w, dilation.w, ceil_mode);
  if (P < 1 || Q < 1)
    throw ShapeError(std::string(op) + ": input " + shape_of(input) + " with padding " +
                     pair_str(padding.h, padding.w) + " is smaller than the kernel " +
                     pair_str(kernel.h, kernel.w) + ": the output would be " + std::to_string(P) +
                     "x" + std::to_string(Q) + " (each output size must be >= 1)");
  return {{kernel.h, kernel.w, stride.h, stride.w, padding.h, padding.w, dilation.h, dilation.w,
           ceil_mode ? 1 : 0, count_include_pad ? 1 : 0},
          P,
          Q};
}

Dims pooled_shape(const Tensor& x, int64_t P, int64_t Q) {
  Dims s = impl(x).shape;
  s.d[s.rank - 2] = P;
  s.d[s.rank - 1] = Q;
  return s;
}

}  // namespace

ValuesIndices max_pool2d_with_indices(const Tensor& input, Pair2 kernel_size,
                                      std::optional<Pair2> stride, Pair2 padding, Pair2 dilation,
                                      bool ceil_mode) {
  PoolGeometry g = check_pool("max_pool2d", input, kernel_size, stride, padding, dilation,
                              ceil_mode, true, Op::max_pool2d);
  Tensor x = input.contiguous();
  Dims os = pooled_shape(x, g.P, g.Q);
  Tensor out = make_empty(x.device(), os, x.dtype());
  Tensor idx = make_empty(x.device(), os, DType::i64);
  if (out.numel() != 0) {
    PoolAttrList attrs(g.attrs, true, false);
    launch_dense(Op::max_pool2d, x.dtype(), {&x}, {&out, &idx}, attrs.span());
  }
  if (autograd::needs_grad({&x}))
    record(GradKind::max_pool2d, out, {x}, {idx}, 0.0, 0, std::move(g.attrs));
  return {out, idx};
}

Tensor max_pool2d(const Tensor& input, Pair2 kernel_size, std::optional<Pair2> stride,
                  Pair2 padding, Pair2 dilation, bool ceil_mode) {
  return max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode).values;
}

Tensor avg_pool2d(const Tensor& input, Pair2 kernel_size, std::optional<Pair2> stride,
                  Pair2 padding, bool ceil_mode, bool count_include_pad) {
  PoolGeometry g = check_pool("avg_pool2d", input, kernel_size, stride, padding, 1, ceil_mode,
                              count_include_pad, Op::avg_pool2d);
  Tensor x = input.contiguous();
  Tensor out = make_empty(x.device(), pooled_shape(x, g.P, g.Q), x.dtype());
  if (out.numel() != 0) {
    PoolAttrList attrs(g.attrs, false, true);
    launch_dense(Op::avg_pool2d, x.dtype(), {&x}, {&out}, attrs.span());
  }
  if (autograd::needs_grad({&x}))
    record(GradKind::avg_pool2d, out, {x}, {}, 0.0, 0, std::move(g.attrs));
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& input, Pair2 output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_same_device(op, {&input});
  check_domain(Op::adaptive_avg_pool2d, input.dtype());
  bool batched = true;
  check_image(op, input, batched);
  check_window_arg(op, "output_size", output_size, 1);
  if (input.size(-2) < 1 || input.size(-1) < 1)
    throw ShapeError(std::string(op) + ": input " + shape_of(input) +
                     " has an empty spatial dimension (height and width must be >= 1)");
  Tensor x = input.contiguous();
  Tensor out = make_empty(x.device(), pooled_shape(x, output_size.h, output_size.w), x.dtype());
  if (out.numel() != 0) launch_dense(Op::adaptive_avg_pool2d, x.dtype(), {&x}, {&out}, {});
  if (autograd::needs_grad({&x})) record(GradKind::adaptive_avg_pool2d, out, {x}, {});
  return out;
}

// ---- batch normalisation ----------------------------------------------------------------------

// Note [Batch norm statistics]
//   The kernel takes x as [N, C, L] and per-channel tensors in the statistics dtype (f32 for
//   f16/bf16 inputs, else the input's dtype), updating running_mean / running_var in place.
//   Running statistics of another dtype or layout (a model cast with to(bf16)) are updated
//   through an f32 copy written back after the launch; absent ones (training without tracked
//   statistics) through scratch tensors. weight and bias are cast to the statistics dtype with
//   autograd, so their gradients come back in their own dtype.
Tensor batch_norm(const Tensor& input0, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight0, const Tensor& bias0, bool training, double momentum,
                  double eps) {
  // Not on an autocast list (as in PyTorch): an f16/bf16 input stays in its dtype, since the op
  // keeps its statistics, weight and bias in f32 for them (Note [Autocast op lists]).
  const Tensor &input = input0, &weight = weight0, &bias = bias0;
  const char* op = "batch_norm";
  check_same_device(op, {&input});
  check_domain(Op::batch_norm, input.dtype());
  if (input.rank() < 2)
    throw ShapeError(std::string(op) + ": input must be [N, C, ...] (rank >= 2), got " +
                     shape_of(input));
  const int64_t N = input.size(0), C = input.size(1);
  const int64_t L = C == 0 || N == 0 ? 0 : input.numel() / (N * C);
  const DType st = stat_dtype(input.dtype());
  auto check_channel = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    check_same_device(op, {&input, &t});
    if (!is_floating(t.dtype()))
      throw DTypeError(std::string(op) + ": " + what + " must be floating, got " +
                       std::string(dtype_name(t.dtype())));
    if (t.rank() != 1 || t.size(0) != C)
      throw ShapeError(std::string(op) + ": " + what + " must be [" + std::to_string(C) +
                       "] (the channels of input " + shape_of(input) + "), got " + shape_of(t));
  };
  check_channel(running_mean, "running_mean");
  check_channel(running_var, "running_var");
  check_channel(weight, "weight");
  check_channel(bias, "bias");
  if (running_mean.defined() != running_var.defined())
    throw ShapeError(std::string(op) +
                     ": running_mean and running_var go together (one is absent)");
  if (!training && !running_mean.defined())
    throw ShapeError(std::string(op) +
                     ": evaluation mode normalises with running_mean and running_var, which are "
                     "absent (pass them, or training=true)");
  if (training && N * L < 2)
    throw ShapeError(std::string(op) +
                     ": training needs more than one value per channel, got input " +
                     shape_of(input));
  if (!(eps > 0))
    throw ShapeError(std::string(op) + ": eps must be > 0, got " + std::to_string(eps));

  Device& dev = input.device();
  Tensor x = input.contiguous().reshape({N, C, L});
  Tensor w = weight.defined() ? weight.to(st).contiguous() : ones({C}, dev, st);
  Tensor b = bias.defined() ? bias.to(st).contiguous() : zeros({C}, dev, st);
  auto stat = [&](const Tensor& r, double fill) {
    if (!r.defined()) return full({C}, fill, dev, st);
    if (r.dtype() == st && r.is_contiguous()) return r.detach();
    NoGradGuard no_grad;
    return r.to(st).contiguous().clone();
  };
  Tensor rm = stat(running_mean, 0.0), rv = stat(running_var, 1.0);
  Tensor y = make_empty(dev, impl(x).shape, x.dtype());
  Tensor save_mean, save_invstd;
  if (training) {
    save_mean = make_empty(dev, Dims{C}, st);
    save_invstd = make_empty(dev, Dims{C}, st);
  }
  if (C != 0) {
    bp_attr a[3] = {attr_f(BP_ATTR_ID_EPS, eps), attr_i(BP_ATTR_ID_TRAINING, training ? 1 : 0),
                    attr_f(BP_ATTR_ID_MOMENTUM, momentum)};
    if (y.numel() != 0 || training)
      launch_dense(Op::batch_norm, x.dtype(), {&x, &w, &b, &rm, &rv},
                   {&y, &save_mean, &save_invstd}, a);
    if (training && running_mean.defined()) {
      NoGradGuard no_grad;
      Tensor rm_dst = running_mean, rv_dst = running_var;  // handles to the caller's buffers
      if (!rm.shares_storage(rm_dst)) rm_dst.copy_(rm);
      if (!rv.shares_storage(rv_dst)) rv_dst.copy_(rv);
    }
  }
  if (autograd::needs_grad({&x, &w, &b})) {
    if (training)
      record(GradKind::batch_norm, y, {x, w, b}, {x, w, save_mean, save_invstd}, eps);
    else
      record(GradKind::batch_norm_eval, y, {x, w, b}, {x, w, rm, rv}, eps);
  }
  return y.reshape(input.shape());
}

// ---- dropout ----------------------------------------------------------------------------------

Tensor dropout(const Tensor& input, double p, bool training) {
  if (!(p >= 0.0 && p <= 1.0))
    throw Error("dropout: probability p must be in [0, 1], got " + std::to_string(p));
  check_same_device("dropout", {&input});
  check_domain(Op::dropout, input.dtype());
  if (!training || p == 0.0) return input;
  if (p == 1.0) return input * 0.0;
  uint64_t seed = 0, offset = 0;
  draw_philox(input.device(), "dropout", nullptr, static_cast<uint64_t>(input.numel()), seed,
              offset);
  Tensor x = input.contiguous();
  Tensor y = dropout_raw(x, p, seed, offset);
  if (autograd::needs_grad({&x}))
    record(GradKind::dropout, y, {x}, {}, p, 0,
           {static_cast<int64_t>(seed), static_cast<int64_t>(offset)});
  return y;
}

Tensor softmax(const Tensor& input, int dim) {
  return bp::softmax(input, dim);
}
Tensor log_softmax(const Tensor& input, int dim) {
  return bp::log_softmax(input, dim);
}

}  // namespace nn::functional

}  // namespace bp
