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

struct Node {
  virtual ~Node() = default;
  // Gradients with respect to each input (undefined where an input needs none).
  virtual std::vector<Tensor> apply(const Tensor& grad) = 0;
  virtual const char* name() const = 0;
  std::vector<std::shared_ptr<Node>> next;  // per input: where its gradient goes, or null
};

}  // namespace bp::autograd
