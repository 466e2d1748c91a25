// Gradients of the convolutional family (autograd_internal.hpp, nn_backward). Each goes through
// the catalogue's backward op where there is one, so every device computes it the same way.
#include "autograd/autograd_internal.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"

namespace bp {

namespace detail {
Tensor reduce_raw(Op op, const Tensor& a, uint32_t axes, bool keepdim);
}  // namespace detail

namespace autograd {

using namespace detail;

namespace {

// Per-channel [C] as [1, C, 1] against [N, C, L].
Tensor per_channel(const Tensor& t) {
  return t.reshape({1, t.size(0), 1});
}

// Sum of [N, C, L] over N and L: [C].
Tensor channel_sum(const Tensor& t) {
  return reduce_raw(Op::sum, t, 0b101u, false);
}

// Note [Batch norm in evaluation]
//   With the running statistics fixed, y = (x - rm) * invstd * w + b is affine in x, so
//   dx = dy * w * invstd, dw = sum(dy * (x - rm) * invstd) and db = sum(dy) over N and L
//   (PyTorch's eval-mode formulas). The per-channel sums are taken in the statistics dtype.
std::vector<Tensor> batch_norm_eval_backward(const Tensor& g, const std::vector<Tensor>& saved,
                                             double eps, const std::vector<bool>& needs) {
  const Tensor &x = saved[0], &w = saved[1], &rm = saved[2], &rv = saved[3];
  const DType st = w.dtype();
  Tensor invstd = 1.0 / (rv + eps).sqrt();
  Tensor dx, dw, db;
  if (needs[0]) dx = g * per_channel(w * invstd).to(x.dtype());
  Tensor g32 = g.to(st);
  if (needs[1]) dw = channel_sum(g32 * ((x.to(st) - per_channel(rm)) * per_channel(invstd)));
  if (needs[2]) db = channel_sum(g32);
  return {dx, dw, db};
}

}  // namespace

std::vector<Tensor> nn_backward(GradKind kind, const Tensor& grad, const std::vector<Tensor>& saved,
                                const std::vector<Shape>& in_shapes, double scalar, int64_t param,
                                const Shape& extra, const std::vector<bool>& needs) {
  const Tensor g = grad.contiguous();
  const int axis = static_cast<int>(param);
  switch (kind) {
    case GradKind::conv2d: {
      // inputs x, w (, bias when param bit 0); saved x, w; extra: Note [Window attributes].
      Tensor dx, dw, db;
      if (needs[0]) dx = conv2d_backward_input_raw(g, saved[1], in_shapes[0], extra);
      if (needs[1]) dw = conv2d_backward_weight_raw(saved[0], g, in_shapes[1], extra);
      if ((param & 1) == 0) return {dx, dw};
      if (needs[2]) db = reduce_raw(Op::sum, g, 0b1101u, false);
      return {dx, dw, db};
    }
    case GradKind::max_pool2d:
      return {max_pool2d_backward_raw(g, saved[0], in_shapes[0], extra)};
    case GradKind::avg_pool2d:
      return {avg_pool2d_backward_raw(g, in_shapes[0], extra)};
    case GradKind::adaptive_avg_pool2d:
      return {adaptive_avg_pool2d_backward_raw(g, in_shapes[0])};
    case GradKind::batch_norm: {
      auto [dx, dw, db] =
          batch_norm_backward_raw(g, saved[0], saved[1], saved[2], saved[3], scalar);
      return {dx, dw, db};
    }
    case GradKind::batch_norm_eval:
      return batch_norm_eval_backward(g, saved, scalar, needs);
    case GradKind::dropout:
      return {
          dropout_raw(g, scalar, static_cast<uint64_t>(extra[0]), static_cast<uint64_t>(extra[1]))};
    case GradKind::index_reduce:
    case GradKind::gather: {
      Tensor z = zeros(in_shapes[0], g.device(), g.dtype());
      scatter_add_into(z, axis, saved[0], g);
      return {z};
    }
    case GradKind::scatter_add: {
      Tensor dsrc;
      if (needs[1]) dsrc = gather_raw(g, axis, saved[0]);
      return {g, dsrc};
    }
    case GradKind::softmax:
      return {softmax_backward_raw(Op::softmax_backward, saved[0], g, axis)};
    case GradKind::log_softmax:
      return {softmax_backward_raw(Op::log_softmax_backward, saved[0], g, axis)};
    case GradKind::layer_norm: {
      // inputs x (, weight when param bit 0) (, bias when bit 1); saved x, mean, rstd (, weight).
      const bool has_w = (param & 1) != 0, has_b = (param & 2) != 0;
      auto [dx, dw, db] =
          layer_norm_backward_raw(g, saved[0], saved[1], saved[2], has_w ? saved[3] : Tensor());
      std::vector<Tensor> out = {dx};
      if (has_w) out.push_back(dw);
      if (has_b) out.push_back(has_w ? db : reduce_raw(Op::sum, g, 0b01u, false));
      return out;
    }
    case GradKind::gelu:
      return {activation_backward_raw(Op::gelu_backward, saved[0], g, param)};
    case GradKind::silu:
      return {activation_backward_raw(Op::silu_backward, saved[0], g, 0)};
    case GradKind::embedding:
      return {embedding_backward_raw(g, saved[0], in_shapes[0][0])};
    case GradKind::attention: {
      auto [dq, dk, dv] = attention_backward_raw(saved[0], saved[1], saved[2], saved[3], g,
                                                 saved[4], scalar, extra);
      return {dq, dk, dv};
    }
    case GradKind::triu:
      return {triangle_raw(Op::triu, g, param)};
    case GradKind::tril:
      return {triangle_raw(Op::tril, g, param)};
    case GradKind::cumsum:
      // The gradient of a prefix sum is the suffix sum: total - prefix + own.
      return {g.sum(axis, true) - cumsum_raw(g, axis) + g};
    case GradKind::cross_entropy:
      // inputs x; saved x, target, lse; scalar label_smoothing, param ignore_index.
      return {cross_entropy_backward_raw(saved[0], saved[1], saved[2], g, param, scalar)};
    case GradKind::cat: {
      std::vector<Tensor> out;
      int64_t at = 0;
      for (size_t k = 0; k < extra.size(); ++k) {
        if (needs[k])
          out.push_back(grad.slice(axis, at, at + extra[k]));
        else
          out.emplace_back();
        at += extra[k];
      }
      return out;
    }
    default:
      break;
  }
  return {};
}

}  // namespace autograd
}  // namespace bp
