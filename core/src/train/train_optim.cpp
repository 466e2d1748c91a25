// Optimisers (Note [Training on a device] in train.hpp): in-place updates on each parameter's
// device, state created lazily on the first step.
#include <backplane/graph.hpp>
#include <backplane/train.hpp>

#include <cmath>

namespace bp::optim {

namespace {
void check_param(const char* opt, const char* name, double v, bool ok) {
  if (!ok) throw Error(std::string(opt) + ": invalid " + name + " " + std::to_string(v));
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> parameters, double lr)
    : params_(std::move(parameters)), lr_(lr) {
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& p = params_[k];
    if (!p.defined())
      throw Error("optimizer: parameter " + std::to_string(k) +
                  " is undefined (a lazy layer that has not run?)");
    if (!is_floating(p.dtype()))
      throw DTypeError("optimizer: parameter " + std::to_string(k) + " is " +
                       std::string(dtype_name(p.dtype())) + ", not floating");
  }
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

namespace {
// The entry `name` of `state` checked against the parameters (count, shapes), or null when
// absent.
const std::vector<Tensor>* state_entry(const Optimizer::State& state, const std::string& name,
                                       const std::vector<Tensor>& params, bool per_param_shape) {
  auto it = state.find(name);
  if (it == state.end()) return nullptr;
  if (it->second.size() != params.size())
    throw ShapeError("load_state: '" + name + "' has " + std::to_string(it->second.size()) +
                     " entries for " + std::to_string(params.size()) + " parameters");
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor& t = it->second[k];
    if (t.defined() && per_param_shape && t.shape() != params[k].shape())
      throw ShapeError("load_state: '" + name + "' entry " + std::to_string(k) + " has shape " +
                       t.dims().str() + ", the parameter " + params[k].dims().str());
    if (t.defined() && !per_param_shape && t.numel() != 1)
      throw ShapeError("load_state: '" + name + "' entry " + std::to_string(k) +
                       " must hold one value");
  }
  return &it->second;
}

void check_names(const Optimizer::State& state, std::initializer_list<const char*> names,
                 const char* who) {
  for (const auto& [name, v] : state) {
    bool known = false;
    for (const char* n : names) known = known || name == n;
    if (!known) throw Error(std::string(who) + ".load_state: unknown state '" + name + "'");
  }
}

Tensor state_copy(const Tensor& t, const Tensor& param) {
  if (!t.defined()) return Tensor();
  return t.detach().to(param.device()).to(param.dtype()).clone();
}
}  // namespace

void Optimizer::load_state(const State& state) {
  if (!state.empty())
    throw Error("load_state: this optimiser keeps no state, got '" + state.begin()->first + "'");
}

Optimizer::State SGD::state() const {
  return {{"momentum_buffer", momentum_}};
}

void SGD::load_state(const State& state) {
  check_names(state, {"momentum_buffer"}, "SGD");
  const auto* buf = state_entry(state, "momentum_buffer", params_, true);
  if (!buf) return;
  for (size_t k = 0; k < params_.size(); ++k) momentum_[k] = state_copy((*buf)[k], params_[k]);
}

Optimizer::State Adam::state() const {
  std::vector<Tensor> steps(params_.size());
  for (size_t k = 0; k < params_.size(); ++k)
    if (m_[k].defined()) steps[k] = full({}, static_cast<double>(t_[k]), Tensor::cpu_device());
  return {{"exp_avg", m_}, {"exp_avg_sq", v_}, {"step", steps}};
}

void Adam::load_state(const State& state) {
  check_names(state, {"exp_avg", "exp_avg_sq", "step"}, "Adam");
  const auto* m = state_entry(state, "exp_avg", params_, true);
  const auto* v = state_entry(state, "exp_avg_sq", params_, true);
  const auto* t = state_entry(state, "step", params_, false);
  if (!m || !v || !t) {
    if (m || v || t) throw Error("Adam.load_state: needs exp_avg, exp_avg_sq and step together");
    return;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    bool dm = (*m)[k].defined(), dv = (*v)[k].defined(), dt = (*t)[k].defined();
    if (dm != dv || dm != dt)
      throw Error("Adam.load_state: entry " + std::to_string(k) +
                  " has some of exp_avg, exp_avg_sq and step but not all");
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    m_[k] = state_copy((*m)[k], params_[k]);
    v_[k] = state_copy((*v)[k], params_[k]);
    t_[k] = (*t)[k].defined() ? static_cast<int64_t>((*t)[k].item<double>()) : 0;
  }
}

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& o)
    : Optimizer(std::move(parameters), o.lr), opt_(o), momentum_(params_.size()) {
  check_param("SGD", "lr", o.lr, o.lr >= 0);
  check_param("SGD", "momentum", o.momentum, o.momentum >= 0);
  check_param("SGD", "weight_decay", o.weight_decay, o.weight_decay >= 0);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw Error("SGD: nesterov momentum needs momentum > 0 and dampening == 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor& p = params_[k];
    Tensor d = p.grad();
    if (!d.defined()) continue;
    if (opt_.weight_decay != 0) d = d + p.detach() * opt_.weight_decay;
    if (opt_.momentum != 0) {
      Tensor& buf = momentum_[k];
      if (!buf.defined()) {
        if (is_capturing(p.device()))
          throw CaptureError(p.device().str() +
                             ": SGD.step with momentum cannot be captured in a graph before its "
                             "momentum buffers exist (the first step creates them, and a "
                             "replay would create them again); run one step before the capture");
        buf = d.clone();
      } else {
        buf.mul_(opt_.momentum);
        buf.add_(d, 1.0 - opt_.dampening);
      }
      d = opt_.nesterov ? d + buf * opt_.momentum : buf;
    }
    p.add_(d, -lr_);
  }
}

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& o)
    : Optimizer(std::move(parameters), o.lr),
      opt_(o),
      m_(params_.size()),
      v_(params_.size()),
      t_(params_.size(), 0) {
  check_param("Adam", "lr", o.lr, o.lr >= 0);
  check_param("Adam", "beta1", o.beta1, o.beta1 >= 0 && o.beta1 < 1);
  check_param("Adam", "beta2", o.beta2, o.beta2 >= 0 && o.beta2 < 1);
  check_param("Adam", "eps", o.eps, o.eps >= 0);
  check_param("Adam", "weight_decay", o.weight_decay, o.weight_decay >= 0);
}

void Adam::step() {
  NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor& p = params_[k];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (is_capturing(p.device()))
      throw CaptureError(p.device().str() +
                         ": Adam.step cannot be captured in a graph: its bias correction uses "
                         "the step count on the host, which a replay would not advance");
    if (opt_.weight_decay != 0) g = g + p.detach() * opt_.weight_decay;
    if (!m_[k].defined()) {
      m_[k] = zeros_like(p);
      v_[k] = zeros_like(p);
    }
    int64_t t = ++t_[k];
    m_[k].mul_(opt_.beta1).add_(g, 1.0 - opt_.beta1);
    v_[k].mul_(opt_.beta2).add_(g * g, 1.0 - opt_.beta2);
    double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(t));
    double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(t));
    Tensor denom = v_[k].sqrt() / std::sqrt(bc2) + opt_.eps;
    p.add_(m_[k] / denom, -lr_ / bc1);
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

}  // namespace bp
