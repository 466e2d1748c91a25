// bp::nn::functional: the convolutional family as functions, mirroring torch.nn.functional
// (names, argument order, defaults). Images are NCHW; a 3-d input [C, H, W] is one unbatched
// image, as in PyTorch. Every function records autograd (Note [Autograd] in tensor.hpp).
//
// Note [Convolution checks]
//   Everything about a call is checked before anything is allocated or launched, so a refused
//   call leaves the device untouched:
//   - operands on one device (DeviceMismatch), one floating dtype (DTypeError naming the
//     domain; batch_norm's per-channel tensors may be f32 for f16/bf16 inputs);
//   - ranks and the channel rules (ShapeError naming the function, the shapes and the rule):
//     input channels == weight.size(1) * groups, out channels a multiple of groups, bias of
//     out channels, batch_norm's per-channel tensors of input.size(1) elements;
//   - stride and dilation >= 1, padding >= 0 (pooling: <= half the kernel), kernel >= 1, and
//     every output size >= 1: an input smaller than the (dilated) kernel is a ShapeError
//     that gives the computed output size.
//   Pairs like stride/padding are given as one value for both sides or as {h, w}.
#pragma once

#include <backplane/export.hpp>
#include <backplane/functions.hpp>
#include <backplane/tensor.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace bp::nn::functional {

// One value for height and width, or {h, w}.
struct Pair2 {
  int64_t h = 0, w = 0;
  Pair2(int64_t v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor): as PyTorch's int
  Pair2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  Pair2(std::array<int64_t, 2> a) : h(a[0]), w(a[1]) {}  // NOLINT(google-explicit-constructor)
};

// torch.nn.functional.conv2d: input [N, C, H, W], weight [K, C/groups, R, S], bias [K] or
// undefined -> [N, K, P, Q] with P = floor((H + 2 pad - dilation (R - 1) - 1) / stride) + 1.
// Note [Convolution checks].
BP_API Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                     Pair2 stride = 1, Pair2 padding = 0, Pair2 dilation = 1, int64_t groups = 1);

// torch.nn.functional.max_pool2d: stride defaults to the kernel size; padding (<= kernel / 2)
// counts as -inf. With ceil_mode the output size rounds up (a window that would start in the
// right padding is dropped).
BP_API Tensor max_pool2d(const Tensor& input, Pair2 kernel_size, std::optional<Pair2> stride = {},
                         Pair2 padding = 0, Pair2 dilation = 1, bool ceil_mode = false);
// The same with the int64 positions h * W + w of each maximum (return_indices=True).
BP_API ValuesIndices max_pool2d_with_indices(const Tensor& input, Pair2 kernel_size,
                                             std::optional<Pair2> stride = {}, Pair2 padding = 0,
                                             Pair2 dilation = 1, bool ceil_mode = false);
// torch.nn.functional.avg_pool2d: count_include_pad divides by the window clipped to the
// padded input (true) or to the input (false).
BP_API Tensor avg_pool2d(const Tensor& input, Pair2 kernel_size, std::optional<Pair2> stride = {},
                         Pair2 padding = 0, bool ceil_mode = false, bool count_include_pad = true);
// torch.nn.functional.adaptive_avg_pool2d: output [N, C, output_size]; rows
// floor(p H / P) .. ceil((p + 1) H / P) - 1 (columns likewise) average into output row p.
BP_API Tensor adaptive_avg_pool2d(const Tensor& input, Pair2 output_size);

// torch.nn.functional.batch_norm over input [N, C, ...] (rank >= 2). training: the batch's
// per-channel mean and biased variance normalise, and running_mean / running_var (when
// defined) are updated in place with momentum (r = (1 - momentum) r + momentum b, b the
// unbiased variance); N * (spatial size) must be >= 2. Evaluation: the running statistics
// normalise (they must be defined). weight and bias may be undefined (1 and 0). For f16 and
// bf16 inputs the statistics are kept in f32.
BP_API Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                         const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                         bool training = false, double momentum = 0.1, double eps = 1e-5);

// torch.nn.functional.dropout: in training, each element is zeroed with probability p (the
// mask from the Philox stream of the default generator, the same on every device for one
// seed) and the rest scaled by 1 / (1 - p); p == 1 gives zeros. Outside training, or with
// p == 0, the input itself. bp::Error for p outside [0, 1]; CaptureError inside a graph capture.
BP_API Tensor dropout(const Tensor& input, double p = 0.5, bool training = true);

// torch.nn.functional.softmax / log_softmax (bp::softmax, bp::log_softmax).
BP_API Tensor softmax(const Tensor& input, int dim);
BP_API Tensor log_softmax(const Tensor& input, int dim);

// ---- The transformer family ----------------------------------------------------------------
// Note [Transformer checks]
//   As Note [Convolution checks]: devices, dtypes (floating, one for all operands) and shapes are
//   checked before anything is allocated or launched, with ShapeError naming the function and
//   every shape involved.

// torch.nn.functional.layer_norm: normalises over the last normalized_shape.size() dimensions
// of input (which must end in normalized_shape) with their mean and biased variance, then
// times weight and plus bias (each of normalized_shape, or undefined).
BP_API Tensor layer_norm(const Tensor& input, const Shape& normalized_shape,
                         const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                         double eps = 1e-5);
// torch.nn.functional.gelu: approximate "none" (x Phi(x)) or "tanh"; bp::Error for another
// string.
BP_API Tensor gelu(const Tensor& input, const std::string& approximate = "none");
// torch.nn.functional.silu: x sigmoid(x).
BP_API Tensor silu(const Tensor& input);
// torch.nn.functional.embedding: the rows of weight [V, D] at the int64 indices in `input` (any
// shape) -> [*input.shape, D]. An index outside [0, V) is an IndexError naming it and V (on
// devices that find it asynchronously, at the next synchronisation). The gradient flows to
// weight only, summed deterministically over repeated indices.
BP_API Tensor embedding(const Tensor& input, const Tensor& weight);
// torch.nn.functional.scaled_dot_product_attention: query [..., L, E], key [..., S, E], value
// [..., S, Ev] with equal leading dimensions (one batch dimension or more, or none) ->
// [..., L, Ev]. is_causal masks key j > query i; dropout_p drops attention weights (from the
// default generator's Philox stream); scale defaults to 1 / sqrt(E). attn_mask (bool: true
// keeps; or floating: added to the scores), broadcast to [..., L, S], runs the composite
// softmax(q k^T scale + mask) v instead of the fused op. ShapeError naming all three shapes when
// batch, head, sequence or head sizes disagree.
BP_API Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key,
                                           const Tensor& value, const Tensor& attn_mask = Tensor(),
                                           double dropout_p = 0.0, bool is_causal = false,
                                           std::optional<double> scale = std::nullopt);

// The output size of a convolution or pooling window along one axis (floor, or ceil with
// the right-padding rule); may be <= 0 for an input smaller than the window.
BP_API int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                int64_t dilation, bool ceil_mode = false);

}  // namespace bp::nn::functional
