// Internal: recording of differentiable ops (Note [Autograd] in tensor.hpp).
#pragma once

#include <backplane/tensor.hpp>

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

namespace bp::autograd {

// Which derivative a recorded node applies.
enum class GradKind {
  add,
  sub,
  mul,
  div,
  pow,
  maximum,
  minimum,
  where,
  matmul,
  add_scalar,
  rsub_scalar,
  mul_scalar,
  div_scalar,
  rdiv_scalar,
  pow_scalar,
  clamp_scalar,
  neg,
  exp,
  log,
  sqrt,
  relu,
  sigmoid,
  tanh,
  abs,
  sum,
  mean,
  max,
  cast,
  identity,
  reshape,
  permute,
  slice,
  expand,
  to_device,
  sumsq,
  norm,
  linear,
  // The convolutional family (autograd_nn.cpp, nn_backward).
  conv2d,
  max_pool2d,
  avg_pool2d,
  adaptive_avg_pool2d,
  batch_norm,
  batch_norm_eval,
  dropout,
  index_reduce,
  gather,
  scatter_add,
  softmax,
  log_softmax,
  cat,
};

// Gradients of the convolutional family's nodes (kinds conv2d .. cat), from what the forward
// op recorded: `saved` (detached), the inputs' shapes, the op's constants, and which inputs
// need a gradient (`needs[k]`; others may be left undefined).
std::vector<Tensor> nn_backward(GradKind kind, const Tensor& grad, const std::vector<Tensor>& saved,
                                const std::vector<Shape>& in_shapes, double scalar, int64_t param,
                                const Shape& extra, const std::vector<bool>& needs);

struct Node {
  virtual ~Node() = default;
  // Gradients with respect to each input (undefined where an input needs none).
  virtual std::vector<Tensor> apply(const Tensor& grad) = 0;
  virtual const char* name() const = 0;
  std::vector<std::shared_ptr<Node>> next;  // per input: where its gradient goes, or null
};

struct Meta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::weak_ptr<Node> accumulator;  // the AccumulateGrad node of a leaf
  // register_post_accumulate_grad_hook: (id, hook), called by AccumulateGrad.
  std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> post_accumulate_hooks;
};

// True when gradient recording is on and any operand requires a gradient.
bool needs_grad(std::initializer_list<const Tensor*> operands);

// Makes `out` the result of a node of `kind` over `inputs`, saving `saved` (stored detached,
// so that no reference cycle through the output forms). `scalar`, `param` and `extra` carry
// the op's constants (the scalar operand, reduced-axes bits, a permutation, slice bounds).
void record(GradKind kind, const Tensor& out, std::vector<Tensor> inputs, std::vector<Tensor> saved,
            double scalar = 0.0, int64_t param = 0, Shape extra = {});

}  // namespace bp::autograd
