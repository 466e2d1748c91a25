// Internal: the autograd layer's nodes (Note [Autograd] in tensor.hpp). Ops record them through
// tensor/grad_record.hpp (Note [Autograd hook]).
#pragma once

#include "tensor/grad_record.hpp"

#include <backplane/tensor.hpp>

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

namespace bp::autograd {

// Gradients of the convolutional family's nodes (kinds conv2d .. cat of BP_GRAD_KINDS), from
// what the forward op recorded: `saved` (detached), the inputs' shapes, the op's constants, and
// which inputs need a gradient (`needs[k]`; others may be left undefined). autograd_nn.cpp.
std::vector<Tensor> nn_backward(GradKind kind, const Tensor& grad, const std::vector<Tensor>& saved,
                                const std::vector<Shape>& in_shapes, double scalar, int64_t param,
                                const Shape& extra, const std::vector<bool>& needs);

struct Node {
  virtual ~Node() = default;
  // Gradients with respect to each input (undefined where an input needs none).
  virtual std::vector<Tensor> apply(const Tensor& grad) = 0;
  virtual const char* name() const = 0;
  // A slice's node (Note [Slice gradients]): true, with the region of its one input that the
  // output viewed (axis, start, end, step).
  struct SliceRegion {
    int axis;
    int64_t start, end, step;
  };
  virtual bool slice_region(SliceRegion&) const { return false; }
  std::vector<std::shared_ptr<Node>> next;  // per input: where its gradient goes, or null
};

}  // namespace bp::autograd
