// Internal: how the tensor layer records differentiable ops for the autograd layer above it
// (Note [Autograd hook]). The tensor layer owns the per-tensor autograd data (Meta), the grad
// mode and the list of derivative kinds; the autograd layer owns the nodes and their formulas and
// registers the one function that builds a node.
//
// Note [Autograd hook]
//   Ops are defined in the tensor layer and record a node when an operand requires a gradient;
//   the nodes' formulas are written with those same ops. So that the tensor layer does not depend
//   on the autograd layer above it, it calls the autograd layer through one function pointer that
//   autograd.cpp sets while libbackplane is loaded (a static initialiser, before any user code
//   can run an op): the pattern of PyTorch's VariableHooksInterface, by which ATen reaches
//   autograd. needs_grad, on every op's path, is a thread-local read and a pointer test here; the
//   call through the pointer happens only when a node is recorded.
#pragma once

#include <backplane/tensor.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

// Every derivative a recorded node applies, once: X(kind, Name) gives GradKind::kind and the
// node name "<Name>Backward".
// clang-format off
#define BP_GRAD_KINDS(X)                                                                  \
  X(add, Add) X(sub, Sub) X(mul, Mul) X(div, Div) X(pow, Pow) X(maximum, Maximum)          \
  X(minimum, Minimum) X(where, Where) X(matmul, Matmul) X(add_scalar, AddScalar)           \
  X(rsub_scalar, RsubScalar) X(mul_scalar, MulScalar) X(div_scalar, DivScalar)             \
  X(rdiv_scalar, RdivScalar) X(pow_scalar, PowScalar) X(clamp_scalar, ClampScalar)         \
  X(neg, Neg) X(exp, Exp) X(log, Log) X(sqrt, Sqrt) X(relu, Relu) X(sigmoid, Sigmoid)      \
  X(tanh, Tanh) X(abs, Abs) X(sum, Sum) X(mean, Mean) X(max, Max) X(cast, Cast)            \
  X(identity, Identity) X(reshape, Reshape) X(permute, Permute) X(slice, Slice)            \
  X(expand, Expand) X(to_device, ToDevice) X(sumsq, Sumsq) X(norm, Norm) X(linear, Linear)  \
  /* the convolutional family (autograd_nn.cpp, nn_backward) */                          \
  X(conv2d, Conv2d) X(max_pool2d, MaxPool2d) X(avg_pool2d, AvgPool2d)                     \
  X(adaptive_avg_pool2d, AdaptiveAvgPool2d) X(batch_norm, BatchNorm)                      \
  X(batch_norm_eval, BatchNormEval) X(dropout, Dropout) X(index_reduce, MaxMinDim)        \
  X(gather, Gather) X(scatter_add, ScatterAdd) X(softmax, Softmax)                        \
  X(log_softmax, LogSoftmax) X(cat, Cat)                                                 \
  /* the transformer family (autograd_nn.cpp, nn_backward; sin cos rsqrt in autograd.cpp) */ \
  X(sin, Sin) X(cos, Cos) X(rsqrt, Rsqrt) X(layer_norm, NativeLayerNorm) X(gelu, Gelu)     \
  X(silu, Silu) X(embedding, Embedding) X(attention, ScaledDotProductAttention)            \
  X(triu, Triu) X(tril, Tril) X(cumsum, Cumsum)                                          \
  /* the fused classification loss (autograd_nn.cpp, nn_backward) */                      \
  X(cross_entropy, CrossEntropy)
// clang-format on

namespace bp::autograd {

enum class GradKind {
#define BP_GRAD_X_ENUM(kind, Name) kind,
  BP_GRAD_KINDS(BP_GRAD_X_ENUM)
#undef BP_GRAD_X_ENUM
};

// "AddBackward", ... (the name PyTorch gives the node of that op).
const char* grad_kind_name(GradKind kind);

// A recorded op: the autograd layer's (autograd_internal.hpp).
struct Node;

// The autograd data of one tensor (TensorImpl::autograd), made on first need.
struct Meta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::weak_ptr<Node> accumulator;  // the AccumulateGrad node of a leaf
  // register_post_accumulate_grad_hook: (id, hook), called by AccumulateGrad.
  std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> post_accumulate_hooks;
};

// True when gradient recording is on (grad_enabled()) and any operand requires a gradient.
bool needs_grad(std::initializer_list<const Tensor*> operands);

// Makes `out` the result of a node of `kind` over `inputs`, saving `saved` (stored detached, so
// that no reference cycle through the output forms). `scalar`, `param` and `extra` carry the op's
// constants (the scalar operand, reduced-axes bits, a permutation, slice bounds). Calls the
// autograd layer's recorder (Note [Autograd hook]).
void record(GradKind kind, const Tensor& out, std::vector<Tensor> inputs, std::vector<Tensor> saved,
            double scalar = 0.0, int64_t param = 0, Shape extra = {});

// The autograd layer's node builder, with record's arguments.
using Recorder = void (*)(GradKind, const Tensor&, std::vector<Tensor>, std::vector<Tensor>, double,
                          int64_t, Shape);
// Sets the recorder; called once, by autograd.cpp's static initialiser.
void set_recorder(Recorder r) noexcept;

}  // namespace bp::autograd
