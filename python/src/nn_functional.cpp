// The convolutional family and functions.hpp bound for backplane.nn.functional and the
// torch-like top-level functions (max/min with indices, gather, scatter_add, clamp, var/std,
// softmax). Python-level argument forms (tuples, None) are parsed here; the checks are the C++
// ones (Note [Convolution checks]).
#include "bp_python.hpp"

#include <backplane/nn_functional.hpp>
#include <backplane/ops.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

namespace bp::python {

namespace F = bp::nn::functional;

namespace {

// An int or a pair of ints (torch's _pair), as Pair2; TypeError naming the argument otherwise.
F::Pair2 pair_arg(nb::handle h, const char* op, const char* what) {
  if (PyIndex_Check(h.ptr())) return F::Pair2(nb::cast<int64_t>(h));
  if (nb::isinstance<nb::sequence>(h) && nb::len(h) == 2)
    return F::Pair2(nb::cast<int64_t>(h[0]), nb::cast<int64_t>(h[1]));
  throw nb::type_error((std::string(op) + ": " + what + " must be an int or a pair of ints, got " +
                        nb::repr(h).c_str())
                           .c_str());
}

std::optional<F::Pair2> opt_pair(nb::handle h, const char* op, const char* what) {
  if (h.is_none()) return std::nullopt;
  return pair_arg(h, op, what);
}

Tensor opt_tensor(nb::handle h) {
  return h.is_none() ? Tensor() : nb::cast<Tensor>(h);
}

std::optional<int> opt_dim(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return nb::cast<int>(h);
}

std::optional<double> opt_double(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return nb::cast<double>(h);
}

}  // namespace

void register_nn_functional(nb::module_& m) {
  // torch.nn.functional.linear: one fused op (cuBLASLt adds the bias in its epilogue on cuda;
  // Note [Fused linear]), so Linear's bias costs no separate pass and autocast runs it all in
  // the lower dtype.
  m.def(
      "linear",
      [](const Tensor& x, const Tensor& w, nb::handle bias) {
        return bp::linear(x, w, opt_tensor(bias));
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias").none() = nb::none());
  m.def(
      "conv2d",
      [](const Tensor& x, const Tensor& w, nb::handle bias, nb::handle stride, nb::handle padding,
         nb::handle dilation, int64_t groups) {
        return F::conv2d(x, w, opt_tensor(bias), pair_arg(stride, "conv2d", "stride"),
                         pair_arg(padding, "conv2d", "padding"),
                         pair_arg(dilation, "conv2d", "dilation"), groups);
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias").none() = nb::none(),
      nb::arg("stride") = 1, nb::arg("padding") = 0, nb::arg("dilation") = 1,
      nb::arg("groups") = 1);
  m.def(
      "max_pool2d",
      [](const Tensor& x, nb::handle kernel, nb::handle stride, nb::handle padding,
         nb::handle dilation, bool ceil_mode, bool return_indices) -> nb::object {
        const char* op = "max_pool2d";
        ValuesIndices r = F::max_pool2d_with_indices(
            x, pair_arg(kernel, op, "kernel_size"), opt_pair(stride, op, "stride"),
            pair_arg(padding, op, "padding"), pair_arg(dilation, op, "dilation"), ceil_mode);
        if (return_indices) return nb::make_tuple(r.values, r.indices);
        return nb::cast(r.values);
      },
      nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride").none() = nb::none(),
      nb::arg("padding") = 0, nb::arg("dilation") = 1, nb::arg("ceil_mode") = false,
      nb::arg("return_indices") = false);
  m.def(
      "avg_pool2d",
      [](const Tensor& x, nb::handle kernel, nb::handle stride, nb::handle padding, bool ceil_mode,
         bool count_include_pad) {
        const char* op = "avg_pool2d";
        return F::avg_pool2d(x, pair_arg(kernel, op, "kernel_size"), opt_pair(stride, op, "stride"),
                             pair_arg(padding, op, "padding"), ceil_mode, count_include_pad);
      },
      nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride").none() = nb::none(),
      nb::arg("padding") = 0, nb::arg("ceil_mode") = false, nb::arg("count_include_pad") = true);
  m.def(
      "adaptive_avg_pool2d",
      [](const Tensor& x, nb::handle size) {
        return F::adaptive_avg_pool2d(x, pair_arg(size, "adaptive_avg_pool2d", "output_size"));
      },
      nb::arg("input"), nb::arg("output_size"));
  m.def(
      "batch_norm",
      [](const Tensor& x, nb::handle rm, nb::handle rv, nb::handle w, nb::handle b, bool training,
         double momentum, double eps) {
        return F::batch_norm(x, opt_tensor(rm), opt_tensor(rv), opt_tensor(w), opt_tensor(b),
                             training, momentum, eps);
      },
      nb::arg("input"), nb::arg("running_mean").none(), nb::arg("running_var").none(),
      nb::arg("weight").none() = nb::none(), nb::arg("bias").none() = nb::none(),
      nb::arg("training") = false, nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5);
  m.def("dropout", &F::dropout, nb::arg("input"), nb::arg("p") = 0.5, nb::arg("training") = true);
  m.def("softmax", &bp::softmax, nb::arg("input"), nb::arg("dim"));
  m.def("log_softmax", &bp::log_softmax, nb::arg("input"), nb::arg("dim"));

  // ---- the transformer family (Note [Transformer checks]) ----
  m.def(
      "layer_norm",
      [](const Tensor& x, nb::handle shape, nb::handle w, nb::handle b, double eps) {
        Shape s;
        if (PyIndex_Check(shape.ptr()))
          s.push_back(nb::cast<int64_t>(shape));
        else
          for (nb::handle d : shape) s.push_back(nb::cast<int64_t>(d));
        return F::layer_norm(x, s, opt_tensor(w), opt_tensor(b), eps);
      },
      nb::arg("input"), nb::arg("normalized_shape"), nb::arg("weight").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("eps") = 1e-5);
  m.def("gelu", &F::gelu, nb::arg("input"), nb::kw_only(), nb::arg("approximate") = "none");
  m.def("silu", &F::silu, nb::arg("input"));
  m.def("embedding", &F::embedding, nb::arg("input"), nb::arg("weight"));
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, nb::handle mask, double p,
         bool is_causal, nb::handle scale) {
        return F::scaled_dot_product_attention(q, k, v, opt_tensor(mask), p, is_causal,
                                               opt_double(scale));
      },
      nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("attn_mask").none() = nb::none(),
      nb::arg("dropout_p") = 0.0, nb::arg("is_causal") = false, nb::kw_only(),
      nb::arg("scale").none() = nb::none());
  m.def("triu", &bp::triu, nb::arg("input"), nb::arg("diagonal") = 0);
  m.def("tril", &bp::tril, nb::arg("input"), nb::arg("diagonal") = 0);
  m.def("cumsum", &bp::cumsum, nb::arg("input"), nb::arg("dim"));
  m.def("masked_fill", &bp::masked_fill, nb::arg("input"), nb::arg("mask"), nb::arg("value"));

  m.def(
      "_supports",
      [](Device& d, const std::string& op, DType dtype) {
        std::optional<Op> o = op_from_name(op);
        if (!o) throw Error("supports: '" + op + "' is not an op of the catalogue");
        return d.supports(*o, dtype);
      },
      nb::arg("device"), nb::arg("op"), nb::arg("dtype"));

  // ---- torch.* functions ----
  m.def(
      "_max_dim",
      [](const Tensor& x, int dim, bool keepdim) {
        ValuesIndices r = bp::max(x, dim, keepdim);
        return std::make_pair(r.values, r.indices);
      },
      nb::arg("input"), nb::arg("dim"), nb::arg("keepdim") = false);
  m.def(
      "_min_dim",
      [](const Tensor& x, int dim, bool keepdim) {
        ValuesIndices r = bp::min(x, dim, keepdim);
        return std::make_pair(r.values, r.indices);
      },
      nb::arg("input"), nb::arg("dim"), nb::arg("keepdim") = false);
  m.def(
      "argmax",
      [](const Tensor& x, nb::handle dim, bool keepdim) {
        return bp::argmax(x, opt_dim(dim), keepdim);
      },
      nb::arg("input"), nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false);
  m.def(
      "argmin",
      [](const Tensor& x, nb::handle dim, bool keepdim) {
        return bp::argmin(x, opt_dim(dim), keepdim);
      },
      nb::arg("input"), nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false);
  m.def("gather", &bp::gather, nb::arg("input"), nb::arg("dim"), nb::arg("index"));
  m.def("scatter_add", &bp::scatter_add, nb::arg("input"), nb::arg("dim"), nb::arg("index"),
        nb::arg("src"));
  m.def(
      "clamp",
      [](const Tensor& x, nb::handle lo, nb::handle hi) {
        return bp::clamp(x, opt_double(lo), opt_double(hi));
      },
      nb::arg("input"), nb::arg("min").none() = nb::none(), nb::arg("max").none() = nb::none());
  // var / std: correction wins over unbiased when both are given (torch's rule).
  auto stat = [](bool is_std) {
    return [is_std](const Tensor& x, nb::handle dim, nb::handle unbiased, nb::handle correction,
                    bool keepdim) {
      double c = 1.0;
      if (!unbiased.is_none()) c = nb::cast<bool>(unbiased) ? 1.0 : 0.0;
      if (!correction.is_none()) c = nb::cast<double>(correction);
      return is_std ? bp::std(x, opt_dim(dim), c, keepdim) : bp::var(x, opt_dim(dim), c, keepdim);
    };
  };
  m.def("var", stat(false), nb::arg("input"), nb::arg("dim").none() = nb::none(),
        nb::arg("unbiased").none() = nb::none(), nb::kw_only(),
        nb::arg("correction").none() = nb::none(), nb::arg("keepdim") = false);
  m.def("std", stat(true), nb::arg("input"), nb::arg("dim").none() = nb::none(),
        nb::arg("unbiased").none() = nb::none(), nb::kw_only(),
        nb::arg("correction").none() = nb::none(), nb::arg("keepdim") = false);
}

}  // namespace bp::python
