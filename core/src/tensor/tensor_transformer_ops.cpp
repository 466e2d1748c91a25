// The transformer family: layer_norm, gelu, silu, embedding, scaled_dot_product_attention
// (bp::nn::functional), triu, tril, cumsum, masked_fill (functions.hpp). Checked before anything
// is allocated (Note [Transformer checks] in nn_functional.hpp), launched through the per-op path
// on dense tensors, recorded for autograd (autograd/autograd_nn.cpp).
#include <backplane/functions.hpp>
#include <backplane/nn_functional.hpp>
#include <backplane/runtime.hpp>

#include "tensor/autocast_internal.hpp"
#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"
#include "tensor/tensor_sizes.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <string>

namespace bp {

using namespace detail;
using autograd::GradKind;
using autograd::record;

namespace {

std::string shape_of(const Tensor& t) {
  return "[" + impl(t).shape.str() + "]";
}

void check_floating_operand(const char* op, const Tensor& input, const Tensor& t,
                            const char* what) {
  if (!t.defined()) return;
  check_same_device(op, {&input, &t});
  if (t.dtype() != input.dtype())
    throw DTypeError(std::string(op) + ": " + what + " has dtype " +
                     std::string(dtype_name(t.dtype())) + " but input has " +
                     std::string(dtype_name(input.dtype())) + " (cast one of them)");
}

Tensor pointwise_raw(Op op, const Tensor& x, std::initializer_list<const Tensor*> more,
                     std::span<const bp_attr> attrs) {
  Tensor y = make_empty(x.device(), impl(x).shape, x.dtype());
  if (y.numel() == 0) return y;
  bp_tensor_desc in[2];
  uint32_t n = 0;
  in[n++] = desc(x);
  for (const Tensor* t : more) in[n++] = desc(*t);
  bp_tensor_desc out = desc(y);
  launch(x.device(), op, x.dtype(), {in, n}, {&out, 1}, attrs);
  return y;
}

int64_t product(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

}  // namespace

// ---- raw launches (tensor_nn_internal.hpp) ----------------------------------------------------

namespace detail {

std::array<Tensor, 3> layer_norm_backward_raw(const Tensor& dy0, const Tensor& x,
                                              const Tensor& mean, const Tensor& rstd,
                                              const Tensor& w) {
  Tensor dy = dy0.contiguous();
  Device& dev = x.device();
  Tensor dx = make_empty(dev, impl(x).shape, x.dtype()), dw, db;
  if (w.defined()) {
    dw = make_empty(dev, impl(w).shape, x.dtype());
    db = make_empty(dev, impl(w).shape, x.dtype());
  }
  if (x.numel() == 0) {
    if (w.defined()) {
      dw = zeros(w.shape(), dev, x.dtype());
      db = zeros(w.shape(), dev, x.dtype());
    }
    return {dx, dw, db};
  }
  bp_tensor_desc in[5] = {desc(dy), desc(x), desc(mean), desc(rstd)}, out[3] = {desc(dx)};
  uint32_t ni = 4, no = 1;
  if (w.defined()) {
    in[ni++] = desc(w);
    out[no++] = desc(dw);
    out[no++] = desc(db);
  }
  launch(dev, Op::layer_norm_backward, x.dtype(), {in, ni}, {out, no}, {});
  return {dx, dw, db};
}

Tensor activation_backward_raw(Op op, const Tensor& x, const Tensor& dy, int64_t approximate) {
  bp_attr a = attr_i(BP_ATTR_ID_APPROXIMATE, approximate);
  Tensor g = dy.contiguous();
  return pointwise_raw(op, x, {&g}, {&a, op == Op::gelu_backward ? 1u : 0u});
}

Tensor embedding_backward_raw(const Tensor& dy0, const Tensor& indices, int64_t num_rows) {
  Tensor dy = dy0.contiguous();
  const int64_t D = dy.size(1);
  Tensor dw = make_empty(dy.device(), Dims{num_rows, D}, dy.dtype());
  if (dw.numel() == 0) return dw;
  bp_tensor_desc in[2] = {desc(dy), desc(indices)}, out = desc(dw);
  launch(dy.device(), Op::embedding_backward, dy.dtype(), in, {&out, 1}, {});
  return dw;
}

std::array<Tensor, 3> attention_backward_raw(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& dout0,
                                             const Tensor& lse, double scale, const Shape& extra) {
  Tensor dout = dout0.contiguous();
  Device& dev = q.device();
  Tensor dq = make_empty(dev, impl(q).shape, q.dtype());
  Tensor dk = make_empty(dev, impl(k).shape, q.dtype());
  Tensor dv = make_empty(dev, impl(v).shape, q.dtype());
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) {
    // No query or no key: nothing flows between them.
    if (q.numel()) dq = zeros(q.shape(), dev, q.dtype());
    if (k.numel()) dk = zeros(k.shape(), dev, q.dtype());
    if (v.numel()) dv = zeros(v.shape(), dev, q.dtype());
    return {dq, dk, dv};
  }
  bp_tensor_desc in[6] = {desc(q), desc(k), desc(v), desc(out), desc(dout), desc(lse)};
  bp_tensor_desc o[3] = {desc(dq), desc(dk), desc(dv)};
  bp_attr a[5] = {attr_f(BP_ATTR_ID_SCALE, scale), attr_i(BP_ATTR_ID_CAUSAL, extra[0]),
                  attr_f(BP_ATTR_ID_P, std::bit_cast<double>(extra[1])),
                  attr_i(BP_ATTR_ID_SEED, extra[2]), attr_i(BP_ATTR_ID_OFFSET, extra[3])};
  launch(dev, Op::scaled_dot_product_attention_backward, q.dtype(), in, o, a);
  return {dq, dk, dv};
}

Tensor triangle_raw(Op op, const Tensor& x0, int64_t diagonal) {
  Tensor x = x0.contiguous();
  bp_attr a = attr_i(BP_ATTR_ID_DIAGONAL, diagonal);
  return pointwise_raw(op, x, {}, {&a, 1});
}

Tensor cumsum_raw(const Tensor& x0, int axis) {
  Tensor x = x0.contiguous();
  bp_attr a = attr_i(BP_ATTR_ID_AXIS, axis);
  return pointwise_raw(Op::cumsum, x, {}, {&a, 1});
}

}  // namespace detail

// ---- triu, tril, cumsum, masked_fill (functions.hpp) ------------------------------------------

namespace {

Tensor triangle(Op op, GradKind kind, const Tensor& input, int64_t diagonal) {
  const char* name = op_name(op).data();
  check_same_device(name, {&input});
  check_domain(op, input.dtype());
  if (input.rank() < 2)
    throw ShapeError(std::string(name) +
                     ": input must have rank >= 2 (a matrix or a batch of "
                     "them), got " +
                     shape_of(input));
  Tensor y = triangle_raw(op, input, diagonal);
  if (autograd::needs_grad({&input})) record(kind, y, {input}, {}, 0.0, diagonal);
  return y;
}

}  // namespace

Tensor triu(const Tensor& input, int64_t diagonal) {
  return triangle(Op::triu, GradKind::triu, input, diagonal);
}
Tensor tril(const Tensor& input, int64_t diagonal) {
  return triangle(Op::tril, GradKind::tril, input, diagonal);
}

Tensor cumsum(const Tensor& input0, int dim) {
  AutocastArgs<1> ac(AutocastPolicy::fp32, {&input0});
  const Tensor& input = ac[0];
  check_same_device("cumsum", {&input});
  check_domain(Op::cumsum, input.dtype());
  if (input.rank() == 0) {
    normalize_axis(dim, 0, "cumsum");
    return cumsum(input.reshape({1}), 0).reshape({});
  }
  const int axis = normalize_axis(dim, input.rank(), "cumsum");
  Tensor y = cumsum_raw(input, axis);
  if (autograd::needs_grad({&input})) record(GradKind::cumsum, y, {input}, {}, 0.0, axis);
  return y;
}

Tensor masked_fill(const Tensor& input, const Tensor& mask, double value) {
  check_same_device("masked_fill", {&input, &mask});
  if (mask.dtype() != DType::boolean)
    throw DTypeError("masked_fill: mask must be bool, got " +
                     std::string(dtype_name(mask.dtype())));
  if (!(broadcast_shapes(impl(mask).shape, impl(input).shape, "masked_fill") == impl(input).shape))
    throw ShapeError("masked_fill: mask " + shape_of(mask) + " must broadcast to input " +
                     shape_of(input) + " without growing it");
  return where(mask, full({}, value, input.device(), input.dtype()), input);
}

namespace nn::functional {

// ---- layer_norm --------------------------------------------------------------------------------

Tensor layer_norm(const Tensor& input0, const Shape& normalized_shape, const Tensor& weight0,
                  const Tensor& bias0, double eps) {
  AutocastArgs<3> ac(AutocastPolicy::fp32, {&input0, &weight0, &bias0});
  const Tensor &input = ac[0], &weight = ac[1], &bias = ac[2];
  const char* op = "layer_norm";
  check_same_device(op, {&input});
  check_domain(Op::layer_norm, input.dtype());
  check_floating_operand(op, input, weight, "weight");
  check_floating_operand(op, input, bias, "bias");
  const size_t k = normalized_shape.size(), r = static_cast<size_t>(input.rank());
  const Shape in_shape = input.shape();
  bool ends = k >= 1 && k <= r;
  for (size_t i = 0; ends && i < k; ++i) ends = in_shape[r - k + i] == normalized_shape[i];
  if (!ends)
    throw ShapeError(std::string(op) + ": input " + shape_of(input) +
                     " must end in normalized_shape " + detail::shape_list(normalized_shape) +
                     " (one dimension or more)");
  for (const Tensor* t : {&weight, &bias})
    if (t->defined() && t->shape() != normalized_shape)
      throw ShapeError(std::string(op) + ": " + (t == &weight ? "weight " : "bias ") +
                       shape_of(*t) + " must have normalized_shape " +
                       detail::shape_list(normalized_shape));
  if (!(eps > 0))
    throw ShapeError(std::string(op) + ": eps must be > 0, got " + std::to_string(eps));
  const int64_t N = product(normalized_shape, 0, k);
  if (input.numel() == 0 || N == 0) return zeros(in_shape, input.device(), input.dtype());
  const int64_t M = input.numel() / N;
  Device& dev = input.device();
  Tensor x = input.contiguous().reshape({M, N});
  Tensor w = weight.defined() ? weight.contiguous().reshape({N}) : Tensor();
  Tensor b = bias.defined() ? bias.contiguous().reshape({N}) : Tensor();
  if (b.defined() && !w.defined()) {
    NoGradGuard no_grad;
    w = ones({N}, dev, input.dtype());
  }
  const bool grad = autograd::needs_grad({&x}) ||
                    (weight.defined() && autograd::needs_grad({&weight})) ||
                    (bias.defined() && autograd::needs_grad({&bias}));
  Tensor y = make_empty(dev, Dims{M, N}, x.dtype()), mean, rstd;
  if (grad) {
    mean = make_empty(dev, Dims{M}, stat_dtype(x.dtype()));
    rstd = make_empty(dev, Dims{M}, stat_dtype(x.dtype()));
  }
  bp_tensor_desc in[3] = {desc(x)}, out[3] = {desc(y)};
  uint32_t ni = 1, no = 1;
  if (w.defined()) in[ni++] = desc(w);
  if (b.defined()) in[ni++] = desc(b);
  if (grad) {
    out[no++] = desc(mean);
    out[no++] = desc(rstd);
  }
  bp_attr a = attr_f(BP_ATTR_ID_EPS, eps);
  launch(dev, Op::layer_norm, x.dtype(), {in, ni}, {out, no}, {&a, 1});
  if (grad) {
    // param bit 0: weight is an input; bit 1: bias is. Saved: x, mean, rstd (, weight).
    std::vector<Tensor> inputs = {x}, saved = {x, mean, rstd};
    if (weight.defined()) {
      inputs.push_back(w);
      saved.push_back(w);
    }
    if (bias.defined()) inputs.push_back(b);
    record(GradKind::layer_norm, y, inputs, saved, eps,
           (weight.defined() ? 1 : 0) | (bias.defined() ? 2 : 0));
  }
  return y.reshape(in_shape);
}

// ---- gelu, silu --------------------------------------------------------------------------------

Tensor gelu(const Tensor& input, const std::string& approximate) {
  int64_t form;
  if (approximate == "none")
    form = BP_GELU_EXACT;
  else if (approximate == "tanh")
    form = BP_GELU_TANH;
  else
    throw Error("gelu: approximate must be \"none\" or \"tanh\", got \"" + approximate + "\"");
  check_same_device("gelu", {&input});
  check_domain(Op::gelu, input.dtype());
  Tensor x = input.contiguous();
  bp_attr a = attr_i(BP_ATTR_ID_APPROXIMATE, form);
  Tensor y = pointwise_raw(Op::gelu, x, {}, {&a, 1});
  if (autograd::needs_grad({&x})) record(GradKind::gelu, y, {x}, {x}, 0.0, form);
  return y;
}

Tensor silu(const Tensor& input) {
  check_same_device("silu", {&input});
  check_domain(Op::silu, input.dtype());
  Tensor x = input.contiguous();
  Tensor y = pointwise_raw(Op::silu, x, {}, {});
  if (autograd::needs_grad({&x})) record(GradKind::silu, y, {x}, {x});
  return y;
}

// ---- embedding ---------------------------------------------------------------------------------

Tensor embedding(const Tensor& input, const Tensor& weight) {
  const char* op = "embedding";
  check_same_device(op, {&weight, &input});
  if (input.dtype() != DType::i64)
    throw DTypeError(std::string(op) + ": indices must be int64, got " +
                     std::string(dtype_name(input.dtype())));
  check_domain(Op::embedding, weight.dtype());
  if (weight.rank() != 2)
    throw ShapeError(std::string(op) + ": weight must be [num_embeddings, embedding_dim], got " +
                     shape_of(weight));
  const int64_t V = weight.size(0), D = weight.size(1), M = input.numel();
  Shape out_shape = input.shape();
  out_shape.push_back(D);
  Tensor w = weight.contiguous();
  Tensor idx = input.contiguous().reshape({M});
  Tensor out = make_empty(weight.device(), Dims{M, D}, weight.dtype());
  if (M != 0) {
    bp_tensor_desc in[2] = {desc(w), desc(idx)}, o = desc(out);
    launch_indexed(weight.device(), Op::embedding, w.dtype(), in, {&o, 1}, {}, [&] {
      return " (embedding of a [" + std::to_string(V) + ", " + std::to_string(D) +
             "] table; valid indices are 0 to " + std::to_string(V - 1) + ")";
    });
  }
  if (autograd::needs_grad({&w})) record(GradKind::embedding, out, {w}, {idx});
  return out.reshape(out_shape);
}

// ---- scaled_dot_product_attention --------------------------------------------------------------

namespace {

[[noreturn]] void attention_shape_error(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const std::string& rule) {
  throw ShapeError("scaled_dot_product_attention: query " + shape_of(q) + ", key " + shape_of(k) +
                   " and value " + shape_of(v) + " do not fit: " + rule +
                   " (query [..., L, E], key [..., S, E], value [..., S, Ev])");
}

// softmax(q k^T scale + mask) v, with the causal mask and dropout as the fused op has them.
Tensor attention_composite(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           double p, bool causal, double scale) {
  Tensor s = matmul(q, k.transpose(-2, -1)) * scale;
  const double ninf = -std::numeric_limits<double>::infinity();
  if (causal) {
    Tensor keep = tril(ones({q.size(-2), k.size(-2)}, q.device(), DType::boolean));
    s = where(keep, s, full({}, ninf, q.device(), s.dtype()));
  }
  if (mask.defined()) {
    if (mask.dtype() == DType::boolean)
      s = where(mask, s, full({}, ninf, q.device(), s.dtype()));
    else
      s = s + mask;
  }
  Tensor w = bp::softmax(s, -1);
  if (p > 0) w = dropout(w, p, true);
  return matmul(w, v);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query0, const Tensor& key0, const Tensor& value0,
                                    const Tensor& attn_mask0, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  AutocastArgs<4> ac(AutocastPolicy::lower, {&query0, &key0, &value0, &attn_mask0});
  const Tensor &query = ac[0], &key = ac[1], &value = ac[2], &attn_mask = ac[3];
  const char* op = "scaled_dot_product_attention";
  check_same_device(op, {&query, &key, &value});
  check_domain(Op::scaled_dot_product_attention, query.dtype());
  check_floating_operand(op, query, key, "key");
  check_floating_operand(op, query, value, "value");
  const Tensor &q = query, &k = key, &v = value;
  const int r = q.rank();
  if (r < 2 || k.rank() != r || v.rank() != r)
    attention_shape_error(q, k, v, "all three need the same rank, at least 2");
  for (int d = 0; d < r - 2; ++d)
    if (k.size(d) != q.size(d) || v.size(d) != q.size(d))
      attention_shape_error(
          q, k, v, "batch and head dimensions differ (dimension " + std::to_string(d) + ")");
  if (k.size(-1) != q.size(-1))
    attention_shape_error(q, k, v,
                          "key's head size " + std::to_string(k.size(-1)) + " is not query's " +
                              std::to_string(q.size(-1)));
  if (v.size(-2) != k.size(-2))
    attention_shape_error(q, k, v,
                          "value's sequence length " + std::to_string(v.size(-2)) +
                              " is not key's " + std::to_string(k.size(-2)));
  if (!(dropout_p >= 0.0 && dropout_p < 1.0))
    throw Error(std::string(op) + ": dropout_p must be in [0, 1), got " +
                std::to_string(dropout_p));
  if (attn_mask.defined()) {
    check_same_device(op, {&query, &attn_mask});
    if (attn_mask.dtype() != DType::boolean)
      check_floating_operand(op, query, attn_mask, "attn_mask");
  }
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  const double sc = scale ? *scale : (E > 0 ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0);
  if (attn_mask.defined()) return attention_composite(q, k, v, attn_mask, dropout_p, is_causal, sc);

  const Shape qs = q.shape();
  const int64_t lead = product(qs, 0, static_cast<size_t>(r - 2));
  Device& dev = q.device();
  Tensor q4 = q.contiguous().reshape({lead, 1, L, E});
  Tensor k4 = k.contiguous().reshape({lead, 1, S, E});
  Tensor v4 = v.contiguous().reshape({lead, 1, S, Ev});
  Tensor out = make_empty(dev, Dims{lead, 1, L, Ev}, q.dtype());
  Tensor lse = make_empty(dev, Dims{lead, 1, L}, stat_dtype(q.dtype()));
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0)
    draw_philox(dev, op, nullptr, static_cast<uint64_t>(lead * L * S), seed, offset);
  if (out.numel() != 0 || lse.numel() != 0) {
    bp_tensor_desc in[3] = {desc(q4), desc(k4), desc(v4)}, o[2] = {desc(out), desc(lse)};
    bp_attr a[5] = {attr_f(BP_ATTR_ID_SCALE, sc), attr_i(BP_ATTR_ID_CAUSAL, is_causal ? 1 : 0),
                    attr_f(BP_ATTR_ID_P, dropout_p),
                    attr_i(BP_ATTR_ID_SEED, static_cast<int64_t>(seed)),
                    attr_i(BP_ATTR_ID_OFFSET, static_cast<int64_t>(offset))};
    launch(dev, Op::scaled_dot_product_attention, q.dtype(), in, o, a);
  }
  if (autograd::needs_grad({&q4, &k4, &v4}))
    record(GradKind::attention, out, {q4, k4, v4}, {q4, k4, v4, out, lse}, sc, 0,
           {is_causal ? 1 : 0, std::bit_cast<int64_t>(dropout_p), static_cast<int64_t>(seed),
            static_cast<int64_t>(offset)});
  Shape os(qs.begin(), qs.end() - 2);
  os.push_back(L);
  os.push_back(Ev);
  return out.reshape(os);
}

}  // namespace nn::functional

}  // namespace bp
