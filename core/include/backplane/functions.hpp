// torch.* functions beyond tensor.hpp's operators: reductions that return indices, indexing
// along a dimension, joining, clamping, statistics and softmax. PyTorch's names and argument
// order; every one records autograd (Note [Autograd] in tensor.hpp) except the index results.
//
// Every function checks its operands (device, dtype domain, shapes, dims) before it allocates
// or launches anything, and throws ShapeError / DTypeError / DeviceMismatch naming the function,
// the shapes and the rule broken. Inputs that are views are made dense first where the
// catalogue needs dense tensors (Note [Op catalogue] in plugin_abi.h).
#pragma once

#include <backplane/export.hpp>
#include <backplane/tensor.hpp>

#include <optional>
#include <vector>

namespace bp {

// torch.return_types.max / min: the extreme values along a dimension and their positions
// (int64; the first position on ties; a NaN counts as the extreme).
struct ValuesIndices {
  Tensor values;
  Tensor indices;
};

// torch.max(input, dim, keepdim) / torch.min: values and indices along `dim` (negative counts
// from the end; a 0-d input takes dim 0 or -1). ShapeError for an empty dimension. Dtypes
// f32 f64 f16 bf16 i32 i64. The values' gradient flows to the chosen positions.
BP_API ValuesIndices max(const Tensor& input, int dim, bool keepdim = false);
BP_API ValuesIndices min(const Tensor& input, int dim, bool keepdim = false);
// torch.argmax / argmin: the int64 position of the extreme along `dim`, or of the flattened
// input when `dim` is empty (then keepdim gives a tensor of the input's rank of size 1).
BP_API Tensor argmax(const Tensor& input, std::optional<int> dim = std::nullopt,
                     bool keepdim = false);
BP_API Tensor argmin(const Tensor& input, std::optional<int> dim = std::nullopt,
                     bool keepdim = false);

// torch.gather: out[i] = input[i with i_dim = index[i]]; index is int64 with input's rank
// and index.size(d) <= input.size(d) for d != dim; out has index's shape. An index outside
// [0, input.size(dim)) is reported by the device at the next synchronisation.
BP_API Tensor gather(const Tensor& input, int dim, const Tensor& index);
// torch.scatter_add: a copy of input with src[i] added at i with i_dim = index[i], for every
// position i of index (index.size(d) <= src.size(d) for every d, and <= input.size(d) for
// d != dim). Additions to one element happen in row-major order of index, so every device
// gives the same bits. Dtypes: every dtype but bool.
BP_API Tensor scatter_add(const Tensor& input, int dim, const Tensor& index, const Tensor& src);

// torch.cat is bp::cat (tensor.hpp). torch.stack: the tensors (one shape) joined along a new
// dimension `dim` (0 .. rank).
BP_API Tensor stack(const std::vector<Tensor>& tensors, int dim = 0);

// torch.clamp: min(max(input, min), max) with either bound optional (bp::Error when both are
// absent). The gradient passes where min <= input <= max.
BP_API Tensor clamp(const Tensor& input, std::optional<double> min, std::optional<double> max);

// torch.var / torch.std over `dim` (every element when empty): the sum of squared deviations
// from the mean divided by N - correction (correction 1: the unbiased estimate, 0: the
// population statistic). N - correction <= 0 gives inf or NaN, as PyTorch. Floating dtypes.
BP_API Tensor var(const Tensor& input, std::optional<int> dim = std::nullopt, double correction = 1,
                  bool keepdim = false);
BP_API Tensor std(const Tensor& input, std::optional<int> dim = std::nullopt, double correction = 1,
                  bool keepdim = false);

// torch.softmax / torch.log_softmax along `dim`, numerically stable (the maximum is
// subtracted first), with a backward from the output alone. Floating dtypes.
BP_API Tensor softmax(const Tensor& input, int dim);
BP_API Tensor log_softmax(const Tensor& input, int dim);

// torch.triu / torch.tril: the elements of the last two dimensions on and above (triu) or on and
// below (tril) the diagonal `diagonal` (0 the main one, > 0 above it), the others 0; input of
// rank >= 2 (ShapeError otherwise), any dtype.
BP_API Tensor triu(const Tensor& input, int64_t diagonal = 0);
BP_API Tensor tril(const Tensor& input, int64_t diagonal = 0);
// torch.cumsum along `dim` (the dtype kept; i32/i64 wrap, bool and u8 are a DTypeError: cast
// first).
BP_API Tensor cumsum(const Tensor& input, int dim);
// torch.Tensor.masked_fill: input where mask (bool, broadcast to input's shape) is false, `value`
// where it is true; a composite of where. DTypeError for a mask that is not bool.
BP_API Tensor masked_fill(const Tensor& input, const Tensor& mask, double value);

}  // namespace bp
