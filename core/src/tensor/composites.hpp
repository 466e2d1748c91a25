// Internal: decompositions of catalogue ops into other catalogue ops, written once for every
// device whose plugin lacks the op (Note [Fallback policy] in runtime.hpp; Note [Composite
// decompositions] in composites.cpp). Raw: no checks, no autograd recording; callers pass dense
// (contiguous) operands of the right shapes, and each op they launch may itself fall back.
#pragma once

#include <backplane/tensor.hpp>

#include <cstdint>

namespace bp::detail {

// a [..., m, k] @ b [..., k, n] (rank >= 2, batch dims broadcast) as mul and sum.
Tensor matmul_decomposed(const Tensor& a, const Tensor& b);
// conv2d of x [N, C, H, W] with w [K, C / groups, R, S] (and bias [K] when defined) into
// [N, K, P, Q] by im2col and matmul. `conv` holds Note [Window attributes]'s convolution order.
Tensor conv2d_decomposed(const Tensor& x, const Tensor& w, const Tensor& bias, const Shape& conv);
// The gradients of conv2d_decomposed: by matmul and col2im (adds of strided views), and by
// im2col, matmul and sum.
Tensor conv2d_backward_input_decomposed(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                                        const Shape& conv);
Tensor conv2d_backward_weight_decomposed(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                                         const Shape& conv);
// softmax or log_softmax of x over `axis` as max, sub, exp, sum and div (or log and sub).
Tensor softmax_decomposed(Op op, const Tensor& x, int axis);
// softmax_backward or log_softmax_backward from y and dy as mul, sum, sub (and exp).
Tensor softmax_backward_decomposed(Op op, const Tensor& y, const Tensor& dy, int axis);

}  // namespace bp::detail
