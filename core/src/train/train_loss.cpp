// Losses and gradient clipping (Note [Training on a device] in train.hpp).
#include <backplane/functions.hpp>
#include <backplane/train.hpp>

#include "runtime/fallback.hpp"
#include "tensor/autocast_internal.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"

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

namespace {

// The per-row losses without the fused op: log_softmax and a gather (and the rows' mean of the
// log-probabilities for label smoothing), in f32 under autocast. Gather checks the targets: an
// ignored row's target is replaced by 0 before and its loss by 0 after.
Tensor cross_entropy_rows_decomposed(const Tensor& x0, const Tensor& target,
                                     const CrossEntropyOptions& o) {
  AutocastArgs<1> ac(AutocastPolicy::fp32, {&x0});
  const Tensor& x = ac[0];
  detail::FallbackScope fallback(x.device(), Op::cross_entropy, x.dtype(),
                                 "decomposition into log_softmax, gather, mean and where");
  Tensor log_probs = bp::log_softmax(x, 1);
  Tensor ignore = full({}, static_cast<double>(o.ignore_index), target.device(), DType::i64);
  Tensor kept = ne(target, ignore);
  Tensor safe = where(kept, target, zeros({}, target.device(), DType::i64));
  Tensor rows = -bp::gather(log_probs, 1, safe.unsqueeze(1)).squeeze(1);
  if (o.label_smoothing != 0)
    rows = (1.0 - o.label_smoothing) * rows - o.label_smoothing * log_probs.mean(1);
  return where(kept, rows, zeros({}, rows.device(), rows.dtype()));
}

}  // namespace

Tensor CrossEntropyFn::operator()(const Tensor& logits, const Tensor& labels,
                                  const CrossEntropyOptions& o) const {
  const char* fn = "cross_entropy";
  if (o.reduction != "mean" && o.reduction != "sum" && o.reduction != "none")
    throw Error(std::string(fn) + ": reduction must be 'mean', 'sum' or 'none', got '" +
                o.reduction + "'");
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
    throw Error(std::string(fn) + ": label_smoothing must be in [0, 1], got " +
                std::to_string(o.label_smoothing));
  if (logits.rank() < 2)
    throw ShapeError(std::string(fn) + ": logits must be [N, C] or [N, C, d1, ...], got shape " +
                     logits.dims().str());
  if (!is_floating(logits.dtype()))
    throw DTypeError(std::string(fn) + ": logits must be floating, got " +
                     std::string(dtype_name(logits.dtype())));
  if (labels.dtype() != DType::i64 && labels.dtype() != DType::i32)
    throw DTypeError(std::string(fn) + ": labels must be i64 or i32 class indices, got " +
                     std::string(dtype_name(labels.dtype())));
  Shape want = logits.shape();
  want.erase(want.begin() + 1);  // logits' shape without the class dimension
  if (labels.shape() != want)
    throw ShapeError(std::string(fn) + ": labels must have shape " + Dims(want).str() +
                     " for logits of shape " + logits.dims().str() +
                     " (the classes on dim 1), got " + labels.dims().str());
  detail::check_same_device(fn, {&logits, &labels});
  if (logits.size(1) == 0)
    throw ShapeError(std::string(fn) + ": logits of shape " + logits.dims().str() +
                     " have no classes (C must be >= 1)");
  // [N, C, d1, ...] -> [N d1 ..., C]: the classes last, one row per labelled position.
  Tensor x = logits;
  if (logits.rank() > 2) {
    Shape order{0};
    for (int d = 2; d < logits.rank(); ++d) order.push_back(d);
    order.push_back(1);
    x = logits.permute(order).reshape({-1, logits.size(1)});
  }
  Tensor target = labels.reshape({-1}).to(DType::i64);
  Tensor rows = x.device().supports(Op::cross_entropy, x.dtype())
                    ? detail::cross_entropy_rows(x, target, o.ignore_index, o.label_smoothing)
                    : cross_entropy_rows_decomposed(x, target, o);
  if (o.reduction == "none") return rows.reshape(labels.shape());
  if (o.reduction == "sum") return rows.sum();
  // torch's mean: over the rows whose label is not ignore_index, counted on the device.
  Tensor ignore = full({}, static_cast<double>(o.ignore_index), target.device(), DType::i64);
  return rows.sum() / ne(target, ignore).sum().to(rows.dtype());
}

Tensor CrossEntropyFn::operator()(const Tensor& logits, const Tensor& labels) const {
  return (*this)(logits, labels, CrossEntropyOptions{});
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
