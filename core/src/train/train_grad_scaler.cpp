// torch.amp.GradScaler (Note [Gradient scaling] in grad_scaler.hpp).
#include <backplane/device.hpp>
#include <backplane/functions.hpp>
#include <backplane/grad_scaler.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace bp::amp {

namespace {

void check_options(double init_scale, double growth, double backoff, double interval) {
  if (!(init_scale > 0) || !std::isfinite(init_scale))
    throw Error("GradScaler: scale must be positive and finite, got " + std::to_string(init_scale));
  if (!(growth > 1) || !std::isfinite(growth))
    throw Error("GradScaler: growth_factor must be > 1, got " + std::to_string(growth));
  if (!(backoff > 0 && backoff < 1))
    throw Error("GradScaler: backoff_factor must be in (0, 1), got " + std::to_string(backoff));
  if (!(interval >= 1) || interval != std::trunc(interval))
    throw Error("GradScaler: growth_interval must be a whole number >= 1, got " +
                std::to_string(interval));
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& o)
    : scale_(o.init_scale),
      growth_factor_(o.growth_factor),
      backoff_factor_(o.backoff_factor),
      growth_interval_(o.growth_interval),
      enabled_(o.enabled) {
  check_options(o.init_scale, o.growth_factor, o.backoff_factor,
                static_cast<double>(o.growth_interval));
}

Tensor GradScaler::scale(const Tensor& outputs) const {
  if (!outputs.defined()) throw Error("GradScaler::scale: the tensor is undefined");
  if (!enabled_) return outputs;
  return outputs * scale_;
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!enabled_) return;
  PerOptimizer& p = per_optimizer_[&optimizer];
  if (p.stage == Stage::unscaled)
    throw Error("GradScaler::unscale_: already called on this optimizer since the last update()");
  if (p.stage == Stage::stepped)
    throw Error("GradScaler::unscale_: called after step() (call it before step(), once)");
  // Check every gradient before changing any.
  for (const optim::ParamGroup& g : optimizer.param_groups())
    for (const Tensor& param : g.params) {
      Tensor grad = param.grad();
      if (grad.defined() && grad.dtype() == DType::f16)
        throw DTypeError(
            "GradScaler::unscale_: a parameter has an f16 gradient; keep parameters in f32 and "
            "run the forward pass under bp::autocast (f16 gradients cannot be unscaled safely)");
    }
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  std::vector<Tensor> flags;  // one per device, over all groups
  for (const optim::ParamGroup& g : optimizer.param_groups()) {
    // Per device: the 0-d sums of this group's gradients, then one reduction.
    std::vector<std::pair<Device*, std::vector<Tensor>>> partials;
    for (const Tensor& param : g.params) {
      Tensor grad = param.grad();
      if (!grad.defined()) continue;
      grad.mul_(inv);
      Device* d = &grad.device();
      auto it = std::find_if(partials.begin(), partials.end(),
                             [&](const auto& e) { return e.first == d; });
      if (it == partials.end()) it = partials.insert(partials.end(), {d, {}});
      it->second.push_back(grad.sum().to(DType::f32));
    }
    for (auto& entry : partials) {
      Device* dev = entry.first;  // a plain variable: lambdas capture no structured binding
      Tensor flag = (stack(entry.second) * 0.0).sum();  // 0 when finite, nan otherwise
      auto it = std::find_if(flags.begin(), flags.end(),
                             [&](const Tensor& f) { return &f.device() == dev; });
      if (it == flags.end())
        flags.push_back(flag);
      else
        *it = *it + flag;
    }
  }
  p.flags = std::move(flags);
  p.found_inf.reset();
  p.stage = Stage::unscaled;
}

bool GradScaler::found_inf(PerOptimizer& p) {
  if (!p.found_inf) {
    bool found = false;
    for (const Tensor& f : p.flags) found = found || !std::isfinite(f.item<float>());
    p.found_inf = found;
  }
  return *p.found_inf;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  auto it = per_optimizer_.find(&optimizer);
  if (it != per_optimizer_.end() && it->second.stage == Stage::stepped)
    throw Error(
        "GradScaler::step: already called for this optimizer since the last update() (call "
        "update() after each step)");
  if (it == per_optimizer_.end() || it->second.stage == Stage::ready) unscale_(optimizer);
  PerOptimizer& p = per_optimizer_[&optimizer];
  if (p.flags.empty())
    throw Error(
        "GradScaler::step: no parameter of this optimizer has a gradient (run backward() on "
        "the scaled loss first)");
  const bool skip = found_inf(p);
  p.stage = Stage::stepped;
  if (!skip) optimizer.step();
  return !skip;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) return;
  if (new_scale) {
    if (!(*new_scale > 0) || !std::isfinite(*new_scale))
      throw Error("GradScaler::update: new_scale must be positive and finite, got " +
                  std::to_string(*new_scale));
    scale_ = *new_scale;
  } else {
    if (per_optimizer_.empty())
      throw Error(
          "GradScaler::update: no optimizer was unscaled or stepped since the last update()");
    bool found = false;
    for (auto& [opt, p] : per_optimizer_) found = found_inf(p) || found;
    if (found) {
      scale_ *= backoff_factor_;
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == growth_interval_) {
      scale_ *= growth_factor_;
      growth_tracker_ = 0;
    }
  }
  per_optimizer_.clear();
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!enabled_) return {};
  return {{"scale", scale_},
          {"growth_factor", growth_factor_},
          {"backoff_factor", backoff_factor_},
          {"growth_interval", static_cast<double>(growth_interval_)},
          {"_growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!enabled_)
    throw Error("GradScaler::load_state_dict: this scaler is disabled (enabled=false)");
  if (state.empty())
    throw Error("GradScaler::load_state_dict: the state is empty (saved by a disabled scaler)");
  auto get = [&](const char* key) {
    auto it = state.find(key);
    if (it == state.end())
      throw Error(std::string("GradScaler::load_state_dict: missing key \"") + key +
                  "\" (expected scale, growth_factor, backoff_factor, growth_interval, "
                  "_growth_tracker)");
    return it->second;
  };
  const double s = get("scale"), gf = get("growth_factor"), bf = get("backoff_factor"),
               gi = get("growth_interval"), gt = get("_growth_tracker");
  check_options(s, gf, bf, gi);
  if (!(gt >= 0 && gt < gi) || gt != std::trunc(gt))
    throw Error("GradScaler::load_state_dict: _growth_tracker must be a whole number in [0, " +
                std::to_string(static_cast<int64_t>(gi)) + "), got " + std::to_string(gt));
  scale_ = s;
  growth_factor_ = gf;
  backoff_factor_ = bf;
  growth_interval_ = static_cast<int64_t>(gi);
  growth_tracker_ = static_cast<int64_t>(gt);
}

}  // namespace bp::amp
