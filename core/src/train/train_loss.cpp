// Losses and gradient clipping (Note [Training on a device] in train.hpp).
#include <backplane/functions.hpp>
#include <backplane/train.hpp>

#include "tensor/autocast_internal.hpp"

namespace bp::nn {

using detail::AutocastArgs;
using detail::AutocastPolicy;

Tensor mse_loss(const Tensor& prediction0, const Tensor& target0) {
  AutocastArgs<2> ac(AutocastPolicy::fp32, {&prediction0, &target0});
  const Tensor &prediction = ac[0], &target = ac[1];
  if (prediction.shape() != target.shape())
    throw ShapeError("mse_loss: prediction of shape " + prediction.dims().str() +
                     " and target of shape " + target.dims().str() +
                     " differ; reshape one (broadcasting them is almost always a bug)");
  Tensor d = prediction - target;
  return (d * d).mean();
}

Tensor cross_entropy(const Tensor& logits0, const Tensor& labels) {
  AutocastArgs<1> ac(AutocastPolicy::fp32, {&logits0});
  const Tensor& logits = ac[0];
  if (logits.rank() != 2)
    throw ShapeError("cross_entropy: logits must be [batch, classes], got shape " +
                     logits.dims().str());
  if (!is_floating(logits.dtype()))
    throw DTypeError("cross_entropy: logits must be floating, got " +
                     std::string(dtype_name(logits.dtype())));
  if (labels.rank() != 1 || labels.size(0) != logits.size(0))
    throw ShapeError("cross_entropy: labels must be [batch] = [" + std::to_string(logits.size(0)) +
                     "], got shape " + labels.dims().str());
  if (labels.dtype() != DType::i64 && labels.dtype() != DType::i32)
    throw DTypeError("cross_entropy: labels must be i64 or i32 class indices, got " +
                     std::string(dtype_name(labels.dtype())));
  const int64_t n = logits.size(0);
  // One fused, numerically stable log_softmax op (its backward is one op too), as PyTorch's
  // log_softmax + nll_loss: composed from max, sub, exp, sum and log it took four passes over
  // the logits forward and three backward, most of a GPT-2 step's loss time over 50,257
  // classes (docs/benchmarks.md).
  Tensor log_probs = bp::log_softmax(logits, 1);
  // Each row's log-probability of its label, picked with gather: a label outside [0, C) is then
  // an index error naming the value (found by the launch, or on the device and reported by the
  // next synchronisation: Note [Asynchronous errors] in plugin_abi.h), never a silently
  // ignored row.
  Tensor picked = bp::gather(log_probs, 1, labels.to(DType::i64).unsqueeze(1));
  return -picked.sum() / static_cast<double>(n);
}

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm) {
  if (!(max_norm > 0))
    throw Error("clip_grad_norm_: max_norm must be positive, got " + std::to_string(max_norm));
  NoGradGuard no_grad;
  Tensor sq;
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor s = g.sumsq();  // one pass over each gradient
    sq = sq.defined() ? sq + s : s;
  }
  if (!sq.defined()) return Tensor();
  Tensor norm = sq.sqrt();
  Tensor coef = minimum(max_norm / (norm + 1e-6), 1.0);
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    Tensor handle = p;  // a handle to the same tensor
    if (g.defined()) handle.set_grad(g * coef);
  }
  return norm;
}

}  // namespace bp::nn
