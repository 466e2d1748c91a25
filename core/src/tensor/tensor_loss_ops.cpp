// The fused classification loss (catalogue ops cross_entropy and cross_entropy_backward, Note
// [Fused cross entropy] in plugin_abi.h): the launches, recorded for autograd. nn::cross_entropy
// (train/train_loss.cpp) checks the arguments, flattens the logits to [N, C] and reduces the
// per-row losses.
#include <backplane/runtime.hpp>

#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"

#include <string>

namespace bp::detail {

using autograd::GradKind;

namespace {

// The refusal of a conforming plugin is a target (launch_indexed).
auto target_rule(int64_t classes, int64_t ignore_index) {
  return [=] {
    return " (cross_entropy over " + std::to_string(classes) + " classes: targets must be in [0, " +
           std::to_string(classes - 1) + "] or equal ignore_index " + std::to_string(ignore_index) +
           ")";
  };
}

}  // namespace

Tensor cross_entropy_rows(const Tensor& x0, const Tensor& target0, int64_t ignore_index,
                          double label_smoothing) {
  Tensor x = x0.contiguous(), target = target0.contiguous();
  Device& dev = x.device();
  const int64_t n = x.size(0), c = x.size(1);
  const DType st = stat_dtype(x.dtype());
  Tensor loss = make_empty(dev, Dims{n}, st);
  Tensor lse = make_empty(dev, Dims{n}, st);
  if (n != 0) {
    bp_tensor_desc in[2] = {desc(x), desc(target)}, out[2] = {desc(loss), desc(lse)};
    bp_attr a[2] = {attr_i(BP_ATTR_ID_IGNORE_INDEX, ignore_index),
                    attr_f(BP_ATTR_ID_LABEL_SMOOTHING, label_smoothing)};
    launch_indexed(dev, Op::cross_entropy, x.dtype(), in, out, a, target_rule(c, ignore_index));
  }
  if (autograd::needs_grad({&x}))
    autograd::record(GradKind::cross_entropy, loss, {x}, {x, target, lse}, label_smoothing,
                     ignore_index);
  return loss;
}

Tensor cross_entropy_backward_raw(const Tensor& x, const Tensor& target, const Tensor& lse,
                                  const Tensor& dloss0, int64_t ignore_index,
                                  double label_smoothing) {
  Tensor dloss = dloss0.to(lse.dtype()).contiguous();
  Device& dev = x.device();
  Tensor dx = make_empty(dev, impl(x).shape, x.dtype());
  if (dx.numel() == 0) return dx;
  bp_tensor_desc in[4] = {desc(x), desc(target), desc(lse), desc(dloss)}, out = desc(dx);
  bp_attr a[2] = {attr_i(BP_ATTR_ID_IGNORE_INDEX, ignore_index),
                  attr_f(BP_ATTR_ID_LABEL_SMOOTHING, label_smoothing)};
  launch_indexed(dev, Op::cross_entropy_backward, x.dtype(), in, {&out, 1}, a,
                 target_rule(x.size(1), ignore_index));
  return dx;
}

}  // namespace bp::detail
