// Optimisers (Note [Training on a device] in train.hpp, Note [Parameter groups] and Note
// [Optimiser state] in optim.hpp): in-place updates on each parameter's device, state created
// on a parameter's first step.
#include <backplane/graph.hpp>
#include <backplane/optim.hpp>
#include <backplane/train.hpp>

#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_sizes.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace bp::optim {

namespace {

std::string known_keys(const Options& defaults) {
  std::string s;
  for (const auto& [k, v] : defaults) s += (s.empty() ? "" : ", ") + k;
  return s;
}

void require(bool ok, const std::string& opt, size_t group, const char* key, double v,
             const char* rule) {
  if (!ok)
    throw Error(opt + ": group " + std::to_string(group) + " has " + key + " " + std::to_string(v) +
                "; it must be " + rule);
}

}  // namespace

Optimizer::Optimizer(Options defaults) : defaults_(std::move(defaults)) {}

void Optimizer::add_param_groups(std::vector<ParamGroup> groups) {
  if (groups.empty()) throw Error(name() + ": no parameter groups given");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::complete(ParamGroup& g, size_t index) {
  for (const auto& [key, value] : g.options)
    if (!defaults_.count(key))
      throw Error(name() + ": group " + std::to_string(index) + " sets unknown option '" + key +
                  "' (known: " + known_keys(defaults_) + ")");
  for (const auto& [key, value] : defaults_) g.options.emplace(key, value);
}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t index = groups_.size();
  complete(group, index);
  check_options(index, group.options);
  auto held = [&](const Tensor& p, size_t upto) {
    for (const ParamGroup& g : groups_)
      for (const Tensor& q : g.params)
        if (q.is_same(p)) return true;
    for (size_t j = 0; j < upto; ++j)
      if (group.params[j].is_same(p)) return true;
    return false;
  };
  for (size_t k = 0; k < group.params.size(); ++k) {
    const Tensor& p = group.params[k];
    const std::string where =
        name() + ": group " + std::to_string(index) + " parameter " + std::to_string(k);
    if (!p.defined()) throw Error(where + " is undefined (a lazy layer that has not run?)");
    if (!is_floating(p.dtype()))
      throw DTypeError(where + " is " + std::string(dtype_name(p.dtype())) + ", not floating");
    if (held(p, k))
      throw Error(where + " already belongs to a group (a parameter may appear once)");
  }
  state_.resize(state_.size() + group.params.size());
  groups_.push_back(std::move(group));
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> all;
  for (const ParamGroup& g : groups_) all.insert(all.end(), g.params.begin(), g.params.end());
  return all;
}

void Optimizer::set_lr(double lr) {
  for (ParamGroup& g : groups_) g.set_lr(lr);
}

void Optimizer::zero_grad() {
  for (ParamGroup& g : groups_)
    for (Tensor& p : g.params) p.zero_grad();
}

OptimizerStateDict Optimizer::state_dict() const {
  OptimizerStateDict d;
  d.optimizer = name();
  int64_t n = 0;
  for (const ParamGroup& g : groups_) {
    d.param_groups.push_back(g.options);
    std::vector<int64_t>& ids = d.params.emplace_back();
    for (size_t k = 0; k < g.params.size(); ++k, ++n) {
      ids.push_back(n);
      if (state_[static_cast<size_t>(n)].step > 0) d.state[n] = state_[static_cast<size_t>(n)];
    }
  }
  return d;
}

void Optimizer::load_state_dict(const OptimizerStateDict& d) {
  const std::string who = name() + ".load_state_dict";
  if (d.optimizer != name())
    throw Error(who + ": the state is " + (d.optimizer.empty() ? "unnamed" : d.optimizer) +
                "'s, not " + name() + "'s");
  if (d.param_groups.size() != groups_.size() || d.params.size() != groups_.size())
    throw Error(who + ": the state has " + std::to_string(d.param_groups.size()) +
                " parameter groups, this optimiser " + std::to_string(groups_.size()));
  // Everything is checked before anything changes (Note [Optimiser state]).
  std::vector<const Tensor*> by_number;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    if (d.params[gi].size() != g.params.size())
      throw Error(who + ": group " + std::to_string(gi) + " has " +
                  std::to_string(d.params[gi].size()) + " parameters in the state, " +
                  std::to_string(g.params.size()) + " here");
    for (size_t k = 0; k < g.params.size(); ++k) {
      if (d.params[gi][k] != static_cast<int64_t>(by_number.size()))
        throw Error(who + ": group " + std::to_string(gi) + " numbers its parameter " +
                    std::to_string(k) + " " + std::to_string(d.params[gi][k]) + ", expected " +
                    std::to_string(by_number.size()));
      by_number.push_back(&g.params[k]);
    }
    Options o = d.param_groups[gi];
    for (const auto& [key, value] : o)
      if (!defaults_.count(key))
        throw Error(who + ": group " + std::to_string(gi) + " has unknown option '" + key +
                    "' (known: " + known_keys(defaults_) + ")");
    for (const auto& [key, value] : defaults_)
      if (!o.count(key))
        throw Error(who + ": group " + std::to_string(gi) + " lacks option '" + key + "'");
    check_options(gi, o);
  }
  const std::vector<std::string> names = buffer_names();
  for (const auto& [n, st] : d.state) {
    if (n < 0 || n >= static_cast<int64_t>(by_number.size()))
      throw Error(who + ": state for parameter " + std::to_string(n) + ", but there are " +
                  std::to_string(by_number.size()));
    if (st.step < 0)
      throw Error(who + ": parameter " + std::to_string(n) + " has step " +
                  std::to_string(st.step));
    const Tensor& p = *by_number[static_cast<size_t>(n)];
    for (const auto& [key, t] : st.buffers) {
      if (std::find(names.begin(), names.end(), key) == names.end())
        throw Error(who + ": parameter " + std::to_string(n) + " has unknown buffer '" + key + "'");
      if (!t.defined() || t.shape() != p.shape())
        throw ShapeError(who + ": parameter " + std::to_string(n) + "'s " + key + " is " +
                         (t.defined() ? detail::shape_list(t.shape()) : std::string("undefined")) +
                         ", the parameter " + detail::shape_list(p.shape()));
    }
  }
  // Copies first (a device may run out of memory), then the swap.
  std::vector<ParamState> fresh(by_number.size());
  {
    NoGradGuard no_grad;
    for (const auto& [n, st] : d.state) {
      const Tensor& p = *by_number[static_cast<size_t>(n)];
      ParamState& out = fresh[static_cast<size_t>(n)];
      out.step = st.step;
      for (const auto& [key, t] : st.buffers)
        out.buffers[key] = t.detach().to(p.device()).to(p.dtype()).clone();
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = d.param_groups[gi];
  state_ = std::move(fresh);
}

// ---- SGD ------------------------------------------------------------------------------------

namespace {
Options sgd_defaults(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0}};
}
Options adam_defaults(double lr, double b1, double b2, double eps, double wd) {
  return {{"lr", lr}, {"beta1", b1}, {"beta2", b2}, {"eps", eps}, {"weight_decay", wd}};
}
}  // namespace

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& o)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(parameters), {}}}, o) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& o)
    : Optimizer(sgd_defaults(o)), opt_(o) {
  add_param_groups(std::move(groups));
}

void SGD::check_options(size_t gi, const Options& o) const {
  require(o.at("lr") >= 0, "SGD", gi, "lr", o.at("lr"), ">= 0");
  require(o.at("momentum") >= 0, "SGD", gi, "momentum", o.at("momentum"), ">= 0");
  require(o.at("weight_decay") >= 0, "SGD", gi, "weight_decay", o.at("weight_decay"), ">= 0");
  require(o.at("nesterov") == 0 || o.at("nesterov") == 1, "SGD", gi, "nesterov", o.at("nesterov"),
          "0 or 1");
  if (o.at("nesterov") != 0 && (o.at("momentum") <= 0 || o.at("dampening") != 0))
    throw Error("SGD: group " + std::to_string(gi) +
                ": nesterov momentum needs momentum > 0 and dampening == 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  size_t n = 0;
  for (ParamGroup& g : groups_) {
    const double lr = g.options["lr"], momentum = g.options["momentum"];
    const double dampening = g.options["dampening"], wd = g.options["weight_decay"];
    const bool nesterov = g.options["nesterov"] != 0;
    for (Tensor& p : g.params) {
      ParamState& st = state_[n++];
      Tensor d = p.grad();
      if (!d.defined()) continue;
      if (wd != 0) d = d + p.detach() * wd;
      if (momentum != 0) {
        auto it = st.buffers.find("momentum_buffer");
        if (it == st.buffers.end()) {
          if (is_capturing(p.device()))
            throw CaptureError(p.device().str() +
                               ": SGD.step with momentum cannot be captured in a graph before "
                               "its momentum buffers exist (the first step creates them, and a "
                               "replay would create them again); run one step before the "
                               "capture");
          it = st.buffers.emplace("momentum_buffer", d.clone()).first;
        } else {
          it->second.mul_(momentum);
          it->second.add_(d, 1.0 - dampening);
        }
        d = nesterov ? d + it->second * momentum : it->second;
      }
      ++st.step;
      p.add_(d, -lr);
    }
  }
}

// ---- Adam, AdamW ----------------------------------------------------------------------------

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& o)
    : Adam(std::vector<ParamGroup>{ParamGroup{std::move(parameters), {}}}, o, false) {}
Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& o)
    : Adam(std::move(groups), o, false) {}
Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& o, bool decoupled)
    : Optimizer(adam_defaults(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay)),
      opt_(o),
      decoupled_(decoupled) {
  add_param_groups(std::move(groups));
}

namespace {
AdamOptions as_adam(const AdamWOptions& o) {
  return {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.fused};
}

// One parameter of a fused update (Note [Fused Adam] in plugin_abi.h).
struct FusedParam {
  Tensor p, grad, m, v;
  int64_t step;
};

// True when p's update can go to the device's adamw kernel: the plugin has it for p's dtype and
// the four tensors are dense with one dtype (a gradient of another dtype or layout takes the
// per-op path).
bool fusable(const Tensor& p, const Tensor& grad) {
  return p.is_contiguous() && grad.is_contiguous() && grad.dtype() == p.dtype() &&
         grad.shape() == p.shape() && grad.device() == p.device() &&
         p.device().supports(Op::adamw, p.dtype());
}

// Launches the adamw kernel over `items`, one launch per (device, dtype, step): the parameters
// of a group share their options, and the step count is an attribute of the launch.
void launch_fused(std::vector<FusedParam>& items, const Options& o, bool decoupled) {
  std::stable_sort(items.begin(), items.end(), [](const FusedParam& a, const FusedParam& b) {
    if (&a.p.device() != &b.p.device()) return &a.p.device() < &b.p.device();
    if (a.p.dtype() != b.p.dtype()) return a.p.dtype() < b.p.dtype();
    return a.step < b.step;
  });
  std::vector<bp_tensor_desc> in, out;
  for (size_t i = 0; i < items.size();) {
    size_t j = i;
    in.clear();
    out.clear();
    while (j < items.size() && &items[j].p.device() == &items[i].p.device() &&
           items[j].p.dtype() == items[i].p.dtype() && items[j].step == items[i].step) {
      const FusedParam& f = items[j++];
      if (f.p.numel() == 0) continue;
      in.push_back(detail::desc(f.p));
      in.push_back(detail::desc(f.grad));
      in.push_back(detail::desc(f.m));
      in.push_back(detail::desc(f.v));
      out.push_back(in[in.size() - 4]);
      out.push_back(in[in.size() - 2]);
      out.push_back(in[in.size() - 1]);
    }
    if (!in.empty()) {
      const bp_attr attrs[] = {detail::attr_f(BP_ATTR_ID_LR, o.at("lr")),
                               detail::attr_f(BP_ATTR_ID_BETA1, o.at("beta1")),
                               detail::attr_f(BP_ATTR_ID_BETA2, o.at("beta2")),
                               detail::attr_f(BP_ATTR_ID_EPS, o.at("eps")),
                               detail::attr_f(BP_ATTR_ID_WEIGHT_DECAY, o.at("weight_decay")),
                               detail::attr_i(BP_ATTR_ID_STEP, items[i].step),
                               detail::attr_i(BP_ATTR_ID_DECOUPLED, decoupled ? 1 : 0)};
      detail::launch(items[i].p.device(), Op::adamw, items[i].p.dtype(), in, out, attrs);
    }
    i = j;
  }
}
}  // namespace

AdamW::AdamW(std::vector<Tensor> parameters, const AdamWOptions& o)
    : Adam(std::vector<ParamGroup>{ParamGroup{std::move(parameters), {}}}, as_adam(o), true) {}
AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& o)
    : Adam(std::move(groups), as_adam(o), true) {}

void Adam::check_options(size_t gi, const Options& o) const {
  const std::string n = name();
  require(o.at("lr") >= 0, n, gi, "lr", o.at("lr"), ">= 0");
  require(o.at("beta1") >= 0 && o.at("beta1") < 1, n, gi, "beta1", o.at("beta1"), "in [0, 1)");
  require(o.at("beta2") >= 0 && o.at("beta2") < 1, n, gi, "beta2", o.at("beta2"), "in [0, 1)");
  require(o.at("eps") >= 0, n, gi, "eps", o.at("eps"), ">= 0");
  require(o.at("weight_decay") >= 0, n, gi, "weight_decay", o.at("weight_decay"), ">= 0");
}

void Adam::step() {
  NoGradGuard no_grad;
  size_t n = 0;
  for (ParamGroup& g : groups_) {
    const double lr = g.options["lr"], b1 = g.options["beta1"], b2 = g.options["beta2"];
    const double eps = g.options["eps"], wd = g.options["weight_decay"];
    std::vector<FusedParam> fused;
    for (Tensor& p : g.params) {
      ParamState& st = state_[n++];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (is_capturing(p.device()))
        throw CaptureError(p.device().str() + ": " + name() +
                           ".step cannot be captured in a graph: its bias correction uses the "
                           "step count on the host, which a replay would not advance");
      if (opt_.fused && fusable(p, grad)) {
        if (st.buffers.empty()) {
          st.buffers["exp_avg"] = zeros_like(p);
          st.buffers["exp_avg_sq"] = zeros_like(p);
        }
        Tensor m = st.buffers["exp_avg"], v = st.buffers["exp_avg_sq"];
        // Buffers from load_state_dict are dense copies on p's device; state left on another
        // device (p moved after it was made) takes the per-op path, which names the mismatch.
        if (m.is_contiguous() && v.is_contiguous() && m.dtype() == p.dtype() &&
            v.dtype() == p.dtype() && &m.device() == &p.device() && &v.device() == &p.device()) {
          fused.push_back({p.detach(), grad, m, v, ++st.step});
          continue;
        }
      }
      if (wd != 0) {
        if (decoupled_)
          p.mul_(1.0 - lr * wd);
        else
          grad = grad + p.detach() * wd;
      }
      if (st.buffers.empty()) {
        st.buffers["exp_avg"] = zeros_like(p);
        st.buffers["exp_avg_sq"] = zeros_like(p);
      }
      Tensor& m = st.buffers["exp_avg"];
      Tensor& v = st.buffers["exp_avg_sq"];
      const int64_t t = ++st.step;
      m.mul_(b1).add_(grad, 1.0 - b1);
      v.mul_(b2).add_(grad * grad, 1.0 - b2);
      const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
      const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
      Tensor denom = v.sqrt() / std::sqrt(bc2) + eps;
      p.add_(m / denom, -lr / bc1);
    }
    if (!fused.empty()) launch_fused(fused, g.options, decoupled_);
  }
}

}  // namespace bp::optim

namespace bp {

OptimizerFactory sgd(const optim::SGDOptions& options) {
  return [options](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(params), options);
  };
}

OptimizerFactory adam(const optim::AdamOptions& options) {
  return [options](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::Adam>(std::move(params), options);
  };
}

OptimizerFactory adamw(const optim::AdamWOptions& options) {
  return [options](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(params), options);
  };
}

}  // namespace bp
