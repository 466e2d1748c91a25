// Losses, optimisers and safetensors files: the C++ implementations behind backplane.nn,
// backplane.optim and backplane.save / backplane.load.
#include "bp_python.hpp"

#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <optional>
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
  m.def(
      "cross_entropy",
      [](const Tensor& input, const Tensor& target, const std::string& reduction,
         int64_t ignore_index, double label_smoothing) {
        return nn::cross_entropy(input, target, {reduction, ignore_index, label_smoothing});
      },
      nb::arg("input"), nb::arg("target"), nb::arg("reduction") = "mean",
      nb::arg("ignore_index") = -100, nb::arg("label_smoothing") = 0.0,
      "torch.nn.functional.cross_entropy over class indices: input [N, C] or [N, C, d1, ...], "
      "target [N] or [N, d1, ...] int64/int32; one fused op where the device has it.");
  m.def(
      "clip_grad_norm_",
      [](nb::handle params, double max_norm) -> nb::object {
        Tensor n = nn::clip_grad_norm_(tensor_list(params, "clip_grad_norm_"), max_norm);
        if (!n.defined()) return nb::none();
        return nb::cast(std::move(n));
      },
      nb::arg("parameters"), nb::arg("max_norm"));

  nb::class_<optim::Optimizer>(
      m, "Optimizer",
      "Base of the optimisers: parameter groups (tensor handles) and each parameter's state.")
      .def("step", &optim::Optimizer::step,
           "Updates every parameter that has a gradient, in place on its device.")
      .def("zero_grad", &optim::Optimizer::zero_grad, "Drops every parameter's gradient.")
      .def_prop_rw("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_prop_ro("params", &optim::Optimizer::parameters)
      .def_prop_ro("_name", &optim::Optimizer::name)
      .def("_group_count", [](const optim::Optimizer& o) { return o.param_groups().size(); })
      .def("_group_params",
           [](const optim::Optimizer& o, size_t g) { return o.param_groups().at(g).params; })
      .def("_group_options",
           [](const optim::Optimizer& o, size_t g) { return o.param_groups().at(g).options; })
      .def("_set_group_option",
           [](optim::Optimizer& o, size_t g, const std::string& key, double value) {
             optim::Options& opts = o.param_groups().at(g).options;
             if (!opts.count(key))
               throw Error(o.name() + ": param group option '" + key + "' does not exist");
             opts[key] = value;
           })
      .def("_add_param_group",
           [](optim::Optimizer& o, nb::handle params, const optim::Options& options) {
             o.add_param_group({tensor_list(params, "add_param_group"), options});
           })
      .def("_state_dict",
           [](const optim::Optimizer& o) {
             optim::OptimizerStateDict d = o.state_dict();
             nb::dict state;
             for (const auto& [n, st] : d.state) {
               nb::dict e;
               e["step"] = st.step;
               for (const auto& [k, t] : st.buffers) e[nb::str(k.c_str())] = nb::cast(t);
               state[nb::int_(n)] = e;
             }
             nb::list groups;
             for (size_t g = 0; g < d.param_groups.size(); ++g) {
               nb::dict e;
               for (const auto& [k, v] : d.param_groups[g]) e[nb::str(k.c_str())] = v;
               e["params"] = nb::cast(d.params[g]);
               groups.append(e);
             }
             nb::dict out;
             out["state"] = state;
             out["param_groups"] = groups;
             return out;
           })
      .def("_load_state_dict", [](optim::Optimizer& o, nb::dict sd) {
        optim::OptimizerStateDict d;
        d.optimizer = o.name();
        if (!sd.contains("state") || !sd.contains("param_groups"))
          throw Error(o.name() + ".load_state_dict: expected 'state' and 'param_groups'");
        for (nb::handle g : sd["param_groups"]) {
          nb::dict group = nb::cast<nb::dict>(g);
          optim::Options opts;
          for (auto [k, v] : group) {
            std::string key = nb::cast<std::string>(k);
            if (key == "params")
              d.params.push_back(nb::cast<std::vector<int64_t>>(v));
            else
              opts[key] = nb::cast<double>(v);
          }
          d.param_groups.push_back(std::move(opts));
        }
        for (auto [k, v] : nb::cast<nb::dict>(sd["state"])) {
          optim::ParamState& st = d.state[nb::cast<int64_t>(k)];
          for (auto [name, value] : nb::cast<nb::dict>(v)) {
            std::string key = nb::cast<std::string>(name);
            if (key == "step")
              st.step = nb::isinstance<Tensor>(value)
                            ? static_cast<int64_t>(nb::cast<Tensor>(value).item<double>())
                            : nb::cast<int64_t>(value);
            else
              st.buffers[key] = nb::cast<Tensor>(value);
          }
        }
        o.load_state_dict(d);
      });

  // Parameters as a list of tensors or of dicts ({"params": [...], "lr": ...}), torch-style.
  auto groups_of = [](nb::handle params, const char* who) {
    std::vector<optim::ParamGroup> groups;
    nb::list items = nb::list(params);
    if (items.size() > 0 && nb::isinstance<nb::dict>(items[0])) {
      for (nb::handle h : items) {
        nb::dict d = nb::cast<nb::dict>(h);
        if (!d.contains("params"))
          throw Error(std::string(who) + ": a param group dict needs 'params'");
        optim::ParamGroup g;
        g.params = tensor_list(d["params"], who);
        check_params(g.params, who);
        for (auto [k, v] : d) {
          std::string key = nb::cast<std::string>(k);
          if (key != "params") g.options[key] = nb::cast<double>(v);
        }
        groups.push_back(std::move(g));
      }
    } else {
      std::vector<Tensor> ps = tensor_list(items, who);
      check_params(ps, who);
      groups.push_back({std::move(ps), {}});
    }
    return groups;
  };

  nb::class_<optim::SGD, optim::Optimizer>(
      m, "SGD", "torch.optim.SGD: momentum, dampening, weight decay and Nesterov momentum.")
      .def(
          "__init__",
          [groups_of](optim::SGD* self, nb::handle params, double lr, double momentum,
                      double dampening, double weight_decay, bool nesterov) {
            new (self)
                optim::SGD(groups_of(params, "SGD"),
                           optim::SGDOptions{lr, momentum, dampening, weight_decay, nesterov});
          },
          nb::arg("params"), nb::arg("lr") = 0.01, nb::arg("momentum") = 0.0,
          nb::arg("dampening") = 0.0, nb::arg("weight_decay") = 0.0, nb::arg("nesterov") = false)
      .def("__repr__", [](const optim::SGD& o) {
        const auto& s = o.options();
        return "SGD(lr=" + std::to_string(o.lr()) + ", momentum=" + std::to_string(s.momentum) +
               ", weight_decay=" + std::to_string(s.weight_decay) + ")";
      });

  nb::class_<optim::Adam, optim::Optimizer>(m, "Adam", "torch.optim.Adam (amsgrad off).")
      .def(
          "__init__",
          [groups_of](optim::Adam* self, nb::handle params, double lr, nb::handle betas, double eps,
                      double weight_decay, std::optional<bool> fused) {
            auto b = nb::cast<std::pair<double, double>>(betas);
            new (self) optim::Adam(groups_of(params, "Adam"),
                                   optim::AdamOptions{lr, b.first, b.second, eps, weight_decay,
                                                      fused.value_or(false)});
          },
          nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("betas") = nb::make_tuple(0.9, 0.999),
          nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.0, nb::kw_only(),
          nb::arg("fused").none() = nb::none())
      .def("__repr__", [](const optim::Adam& o) {
        const auto& s = o.options();
        return o.name() + "(lr=" + std::to_string(o.lr()) + ", betas=(" + std::to_string(s.beta1) +
               ", " + std::to_string(s.beta2) + "), eps=" + std::to_string(s.eps) + ")";
      });

  nb::class_<optim::AdamW, optim::Adam>(m, "AdamW",
                                        "torch.optim.AdamW: Adam with decoupled weight decay.")
      .def(
          "__init__",
          [groups_of](optim::AdamW* self, nb::handle params, double lr, nb::handle betas,
                      double eps, double weight_decay, std::optional<bool> fused) {
            auto b = nb::cast<std::pair<double, double>>(betas);
            new (self) optim::AdamW(groups_of(params, "AdamW"),
                                    optim::AdamWOptions{lr, b.first, b.second, eps, weight_decay,
                                                        fused.value_or(false)});
          },
          nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("betas") = nb::make_tuple(0.9, 0.999),
          nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.01, nb::kw_only(),
          nb::arg("fused").none() = nb::none(),
          "fused=True updates every parameter with the catalogue op adamw (a few multi-tensor "
          "launches on cuda) where the device's plugin has it, else op by op (C++ Note [Fused "
          "optimiser step]).");

  namespace sch = optim::lr_scheduler;
  nb::class_<sch::LRScheduler>(m, "LRScheduler", "Base of the learning-rate schedulers.")
      .def("step", &sch::LRScheduler::step)
      .def("get_last_lr", &sch::LRScheduler::get_last_lr)
      .def_prop_ro("last_epoch", &sch::LRScheduler::last_epoch)
      .def_prop_ro("base_lrs", &sch::LRScheduler::base_lrs)
      .def("state_dict", &sch::LRScheduler::state_dict)
      .def("load_state_dict", &sch::LRScheduler::load_state_dict, nb::arg("state_dict"));
  nb::class_<sch::StepLR, sch::LRScheduler>(m, "StepLR")
      .def(nb::init<optim::Optimizer&, int64_t, double>(), nb::arg("optimizer"),
           nb::arg("step_size"), nb::arg("gamma") = 0.1, nb::keep_alive<1, 2>());
  nb::class_<sch::LinearLR, sch::LRScheduler>(m, "LinearLR")
      .def(nb::init<optim::Optimizer&, double, double, int64_t>(), nb::arg("optimizer"),
           nb::arg("start_factor") = 1.0 / 3, nb::arg("end_factor") = 1.0,
           nb::arg("total_iters") = 5, nb::keep_alive<1, 2>());
  nb::class_<sch::CosineAnnealingLR, sch::LRScheduler>(m, "CosineAnnealingLR")
      .def(nb::init<optim::Optimizer&, int64_t, double>(), nb::arg("optimizer"), nb::arg("T_max"),
           nb::arg("eta_min") = 0.0, nb::keep_alive<1, 2>());
  nb::class_<sch::LambdaLR, sch::LRScheduler>(m, "LambdaLR")
      .def(
          "__init__",
          [](sch::LambdaLR* self, optim::Optimizer& opt, nb::callable fn, std::string name) {
            new (self) sch::LambdaLR(
                opt, [fn](int64_t e) { return nb::cast<double>(fn(e)); }, std::move(name));
          },
          nb::arg("optimizer"), nb::arg("lr_lambda"), nb::arg("name") = "LambdaLR",
          nb::keep_alive<1, 2>());
  nb::class_<sch::OneCycleLR, sch::LRScheduler>(m, "OneCycleLR")
      .def(
          "__init__",
          [](sch::OneCycleLR* self, optim::Optimizer& opt, nb::handle max_lr, int64_t total_steps,
             double pct_start, const std::string& anneal_strategy, bool cycle_momentum,
             double base_momentum, double max_momentum, double div_factor, double final_div_factor,
             bool three_phase) {
            if (anneal_strategy != "cos" && anneal_strategy != "linear")
              throw Error("OneCycleLR: anneal_strategy '" + anneal_strategy +
                          "' is not 'cos' or 'linear'");
            sch::OneCycleOptions o{total_steps,    pct_start,        anneal_strategy == "cos",
                                   cycle_momentum, base_momentum,    max_momentum,
                                   div_factor,     final_div_factor, three_phase};
            if (nb::isinstance<nb::float_>(max_lr) || nb::isinstance<nb::int_>(max_lr))
              new (self) sch::OneCycleLR(opt, nb::cast<double>(max_lr), o);
            else
              new (self) sch::OneCycleLR(opt, nb::cast<std::vector<double>>(max_lr), o);
          },
          nb::arg("optimizer"), nb::arg("max_lr"), nb::arg("total_steps"),
          nb::arg("pct_start") = 0.3, nb::arg("anneal_strategy") = "cos",
          nb::arg("cycle_momentum") = true, nb::arg("base_momentum") = 0.85,
          nb::arg("max_momentum") = 0.95, nb::arg("div_factor") = 25.0,
          nb::arg("final_div_factor") = 1e4, nb::arg("three_phase") = false,
          nb::keep_alive<1, 2>());
  m.def(
      "get_cosine_schedule_with_warmup",
      [](optim::Optimizer& opt, int64_t warmup, int64_t total) {
        return sch::get_cosine_schedule_with_warmup(opt, warmup, total);
      },
      nb::arg("optimizer"), nb::arg("num_warmup_steps"), nb::arg("num_training_steps"),
      nb::keep_alive<0, 1>());

  m.def(
      "_save_checkpoint",
      [](const std::string& path, const std::map<std::string, Tensor>& model,
         const optim::Optimizer& opt, const sch::LRScheduler* scheduler, int64_t step,
         const std::map<std::string, std::string>& metadata) {
        save_checkpoint(path, model, opt, scheduler, step, metadata);
      },
      nb::arg("path"), nb::arg("model"), nb::arg("optimizer"), nb::arg("scheduler").none(),
      nb::arg("step"), nb::arg("metadata"));
  m.def(
      "_load_checkpoint",
      [](const std::string& path, const std::map<std::string, Tensor>& model, optim::Optimizer& opt,
         sch::LRScheduler* scheduler) {
        CheckpointInfo info = load_checkpoint(path, model, opt, scheduler);
        return std::make_pair(info.step, info.metadata);
      },
      nb::arg("path"), nb::arg("model"), nb::arg("optimizer"), nb::arg("scheduler").none());

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
