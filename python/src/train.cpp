// Losses, optimisers and safetensors files: the C++ implementations behind backplane.nn,
// backplane.optim and backplane.save / backplane.load.
#include "bp_python.hpp"

#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <string>
#include <vector>

namespace bp::python {

namespace {

std::vector<Tensor> tensor_list(nb::handle params, const char* what) {
  std::vector<Tensor> out;
  for (nb::handle h : params) {
    Tensor t;
    if (!nb::try_cast<Tensor>(h, t, false))
      throw nb::type_error((std::string(what) + ": expected an iterable of tensors, found " +
                            nb::type_name(h.type()).c_str())
                               .c_str());
    out.push_back(t);
  }
  return out;
}

void check_params(const std::vector<Tensor>& ps, const char* what) {
  if (ps.empty())
    throw Error(std::string(what) +
                ": got an empty parameter list (a LazyLinear that has not run yet has no "
                "parameters: run the model once on an example batch first)");
  for (const Tensor& p : ps)
    if (!p.requires_grad())
      throw Error(std::string(what) + ": a parameter of shape " +
                  Dims(std::span<const int64_t>(p.shape())).str() +
                  " does not require grad; optimise leaf tensors created with "
                  "requires_grad=True or nn parameters");
}

}  // namespace

void register_train(nb::module_& m) {
  m.def("mse_loss", &nn::mse_loss, nb::arg("input"), nb::arg("target"),
        "mean((input - target)^2) as a 0-d tensor; the shapes must be equal.");
  m.def("cross_entropy", &nn::cross_entropy, nb::arg("input"), nb::arg("target"),
        "Mean over the batch of -log softmax(input)[target]; input [N, C], target [N] int64.");
  m.def(
      "clip_grad_norm_",
      [](nb::handle params, double max_norm) -> nb::object {
        Tensor n = nn::clip_grad_norm_(tensor_list(params, "clip_grad_norm_"), max_norm);
        if (!n.defined()) return nb::none();
        return nb::cast(std::move(n));
      },
      nb::arg("parameters"), nb::arg("max_norm"));

  nb::class_<optim::Optimizer>(m, "Optimizer",
                               "Base of the optimisers: holds the parameter tensors it was given.")
      .def("step", &optim::Optimizer::step,
           "Updates every parameter that has a gradient, in place on its device.")
      .def("zero_grad", &optim::Optimizer::zero_grad, "Drops every parameter's gradient.")
      .def_prop_rw("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_prop_ro("params", &optim::Optimizer::parameters)
      .def("_state",
           [](const optim::Optimizer& o) {
             nb::dict out;
             for (const auto& [name, ts] : o.state()) {
               nb::list l;
               for (const Tensor& t : ts) {
                 if (t.defined())
                   l.append(nb::cast(t));
                 else
                   l.append(nb::none());
               }
               out[nb::str(name.c_str())] = l;
             }
             return out;
           })
      .def("_load_state", [](optim::Optimizer& o, nb::dict state) {
        optim::Optimizer::State s;
        for (auto [k, v] : state) {
          std::vector<Tensor>& ts = s[nb::cast<std::string>(k)];
          for (nb::handle h : v) ts.push_back(h.is_none() ? Tensor() : nb::cast<Tensor>(h));
        }
        o.load_state(s);
      });

  nb::class_<optim::SGD, optim::Optimizer>(
      m, "SGD", "torch.optim.SGD: momentum, dampening, weight decay and Nesterov momentum.")
      .def(
          "__init__",
          [](optim::SGD* self, nb::handle params, double lr, double momentum, double dampening,
             double weight_decay, bool nesterov) {
            std::vector<Tensor> ps = tensor_list(params, "SGD");
            check_params(ps, "SGD");
            new (self) optim::SGD(
                std::move(ps), optim::SGDOptions{lr, momentum, dampening, weight_decay, nesterov});
          },
          nb::arg("params"), nb::arg("lr") = 0.01, nb::arg("momentum") = 0.0,
          nb::arg("dampening") = 0.0, nb::arg("weight_decay") = 0.0, nb::arg("nesterov") = false)
      .def("_options",
           [](const optim::SGD& o) {
             const auto& s = o.options();
             nb::dict d;
             d["momentum"] = s.momentum;
             d["dampening"] = s.dampening;
             d["weight_decay"] = s.weight_decay;
             d["nesterov"] = s.nesterov;
             return d;
           })
      .def("__repr__", [](const optim::SGD& o) {
        const auto& s = o.options();
        return "SGD(lr=" + std::to_string(o.lr()) + ", momentum=" + std::to_string(s.momentum) +
               ", weight_decay=" + std::to_string(s.weight_decay) + ")";
      });

  nb::class_<optim::Adam, optim::Optimizer>(m, "Adam", "torch.optim.Adam (amsgrad off).")
      .def(
          "__init__",
          [](optim::Adam* self, nb::handle params, double lr, nb::handle betas, double eps,
             double weight_decay) {
            std::vector<Tensor> ps = tensor_list(params, "Adam");
            check_params(ps, "Adam");
            auto b = nb::cast<std::pair<double, double>>(betas);
            new (self) optim::Adam(std::move(ps),
                                   optim::AdamOptions{lr, b.first, b.second, eps, weight_decay});
          },
          nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("betas") = nb::make_tuple(0.9, 0.999),
          nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.0)
      .def("_options",
           [](const optim::Adam& o) {
             const auto& s = o.options();
             nb::dict d;
             d["betas"] = nb::make_tuple(s.beta1, s.beta2);
             d["eps"] = s.eps;
             d["weight_decay"] = s.weight_decay;
             return d;
           })
      .def("__repr__", [](const optim::Adam& o) {
        const auto& s = o.options();
        return "Adam(lr=" + std::to_string(o.lr()) + ", betas=(" + std::to_string(s.beta1) + ", " +
               std::to_string(s.beta2) + "), eps=" + std::to_string(s.eps) + ")";
      });

  m.def(
      "_save_tensors",
      [](const std::map<std::string, Tensor>& tensors, const std::string& path,
         const std::map<std::string, std::string>& metadata) {
        nb::gil_scoped_release nogil;
        save(tensors, path, metadata);
      },
      nb::arg("tensors"), nb::arg("path"), nb::arg("metadata"));
  m.def(
      "_load_file",
      [](const std::string& path, Device& device) {
        nb::gil_scoped_release nogil;
        return load_file(path, device);
      },
      nb::arg("path"), nb::arg("device"));
  m.def(
      "_load_metadata", [](const std::string& path) { return load_metadata(path); },
      nb::arg("path"));
}

}  // namespace bp::python
