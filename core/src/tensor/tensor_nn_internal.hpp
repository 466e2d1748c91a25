// Internal: the convolutional family's launches without checks or autograd, for the backward
// formulas (autograd/autograd_nn.cpp). Callers pass dense tensors of the right shapes.
//
// Note [Window attributes]
//   Autograd keeps a window op's attributes as a Shape, in this order:
//     convolution: {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups}
//     pooling:     {kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
//                   dilation_w, ceil_mode, count_include_pad}
#pragma once

#include <backplane/tensor.hpp>

#include <array>
#include <cstdint>

namespace bp::detail {

// Writes `src` (broadcast to dst's shape) into the view `dst` (tensor_ops.cpp).
void copy_into(const Tensor& dst, const Tensor& src);

Tensor conv2d_backward_input_raw(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                                 const Shape& conv_attrs);
Tensor conv2d_backward_weight_raw(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                                  const Shape& conv_attrs);
Tensor max_pool2d_backward_raw(const Tensor& dy, const Tensor& indices, const Shape& x_shape,
                               const Shape& pool_attrs);
Tensor avg_pool2d_backward_raw(const Tensor& dy, const Shape& x_shape, const Shape& pool_attrs);
Tensor adaptive_avg_pool2d_backward_raw(const Tensor& dy, const Shape& x_shape);
// dx, dweight, dbias of training-mode batch_norm over x [N, C, L].
std::array<Tensor, 3> batch_norm_backward_raw(const Tensor& dy, const Tensor& x, const Tensor& w,
                                              const Tensor& save_mean, const Tensor& save_invstd,
                                              double eps);
Tensor dropout_raw(const Tensor& x, double p, uint64_t seed, uint64_t offset);
// op: softmax_backward or log_softmax_backward.
Tensor softmax_backward_raw(Op op, const Tensor& y, const Tensor& dy, int axis);
Tensor gather_raw(const Tensor& x, int axis, const Tensor& index);
Tensor scatter_add_raw(const Tensor& base, int axis, const Tensor& index, const Tensor& src);
// scatter_add with INPLACE into `base` (dense, owned by the caller): gather's backward, whose
// base is a fresh zero tensor, saves scatter_add_raw's copy of it.
void scatter_add_into(const Tensor& base, int axis, const Tensor& index, const Tensor& src);

// The transformer family's backward launches (tensor_transformer_ops.cpp).
// dx, dweight, dbias of layer_norm over x [M, N] (dweight and dbias undefined without w).
std::array<Tensor, 3> layer_norm_backward_raw(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                              const Tensor& rstd, const Tensor& w);
// op: gelu_backward (approximate: bp_gelu_approximate) or silu_backward.
Tensor activation_backward_raw(Op op, const Tensor& x, const Tensor& dy, int64_t approximate);
// dweight [num_rows, D] from dy [M, D] and indices [M].
Tensor embedding_backward_raw(const Tensor& dy, const Tensor& indices, int64_t num_rows);
// dq, dk, dv of scaled_dot_product_attention over [B, H, *, *]; extra: {causal, the bits of the
// dropout probability, seed, offset}.
std::array<Tensor, 3> attention_backward_raw(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& dout,
                                             const Tensor& lse, double scale, const Shape& extra);
// op: triu or tril.
Tensor triangle_raw(Op op, const Tensor& x, int64_t diagonal);
Tensor cumsum_raw(const Tensor& x, int axis);

// The fused classification loss (tensor_loss_ops.cpp, Note [Fused cross entropy] in
// plugin_abi.h). x [N, C] floating, target [N] int64 on x's device, label_smoothing in [0, 1],
// every shape checked by the caller, x's device supporting the op. The per-row losses [N] (f32
// for f16/bf16 x), recorded for autograd; a target outside [0, C) that is not ignore_index is an
// IndexError (or, found on the device, an AsyncError at the next synchronisation).
Tensor cross_entropy_rows(const Tensor& x, const Tensor& target, int64_t ignore_index,
                          double label_smoothing);
// dx [N, C] in x's dtype from the forward's x, target and lse and the rows' gradient dloss [N].
Tensor cross_entropy_backward_raw(const Tensor& x, const Tensor& target, const Tensor& lse,
                                  const Tensor& dloss, int64_t ignore_index,
                                  double label_smoothing);

}  // namespace bp::detail
