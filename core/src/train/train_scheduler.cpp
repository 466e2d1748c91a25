// Learning-rate schedulers (Note [Schedulers] in lr_scheduler.hpp).
#include <backplane/errors.hpp>
#include <backplane/lr_scheduler.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace bp::optim::lr_scheduler {

LRScheduler::LRScheduler(Optimizer& optimizer) : opt_(optimizer) {}

void LRScheduler::start() {
  base_lrs_.clear();
  for (const ParamGroup& g : opt_.param_groups()) base_lrs_.push_back(g.lr());
  step();
}

void LRScheduler::apply(int64_t epoch) {
  std::vector<double> lrs;
  for (size_t g = 0; g < opt_.param_groups().size(); ++g) lrs.push_back(lr_at(g, epoch));
  apply_extra(epoch);
  for (size_t g = 0; g < lrs.size(); ++g) opt_.param_groups()[g].set_lr(lrs[g]);
  last_epoch_ = epoch;
  last_lr_ = std::move(lrs);
}

void LRScheduler::step() {
  if (opt_.param_groups().size() != base_lrs_.size())
    throw Error(name() + ": the optimizer has " + std::to_string(opt_.param_groups().size()) +
                " parameter groups, the scheduler was built for " +
                std::to_string(base_lrs_.size()));
  apply(last_epoch_ + 1);
}

std::map<std::string, double> LRScheduler::state_dict() const {
  std::map<std::string, double> s{{"last_epoch", static_cast<double>(last_epoch_)}};
  for (size_t g = 0; g < base_lrs_.size(); ++g) s["base_lr." + std::to_string(g)] = base_lrs_[g];
  return s;
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& state) {
  const std::string who = name() + ".load_state_dict";
  std::vector<double> base(opt_.param_groups().size());
  auto e = state.find("last_epoch");
  if (e == state.end()) throw Error(who + ": no 'last_epoch' in the state");
  if (!(e->second >= 0) || e->second != std::floor(e->second) || e->second > 1e15)
    throw Error(who + ": last_epoch " + std::to_string(e->second) + " is not a whole number >= 0");
  for (const auto& [key, value] : state) {
    if (key == "last_epoch") continue;
    size_t g = base.size();
    if (key.rfind("base_lr.", 0) == 0 && key.size() > 8 && key.size() < 16 &&
        std::all_of(key.begin() + 8, key.end(), [](char c) { return c >= '0' && c <= '9'; }))
      g = std::stoul(key.substr(8));
    if (g >= base.size())
      throw Error(who + ": unexpected key '" + key + "' (this optimizer has " +
                  std::to_string(base.size()) + " parameter groups)");
    if (!(value >= 0) || !std::isfinite(value))
      throw Error(who + ": " + key + " is " + std::to_string(value));
    base[g] = value;
  }
  if (state.size() != base.size() + 1)
    throw Error(who + ": the state has " + std::to_string(state.size() - 1) +
                " base learning rates, this optimizer " + std::to_string(base.size()) +
                " parameter groups");
  const std::vector<double> old = base_lrs_;
  base_lrs_ = std::move(base);
  try {
    apply(static_cast<int64_t>(e->second));
  } catch (...) {
    base_lrs_ = old;
    throw;
  }
}

// ---- StepLR, LinearLR, CosineAnnealingLR, LambdaLR ------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1)
    throw Error("StepLR: step_size " + std::to_string(step_size) + " must be at least 1");
  start();
}
double StepLR::lr_at(size_t g, int64_t epoch) const {
  return base_lrs_[g] * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer), start_(start_factor), end_(end_factor), total_(total_iters) {
  if (!(start_factor > 0 && start_factor <= 1) || !(end_factor >= 0 && end_factor <= 1))
    throw Error("LinearLR: start_factor " + std::to_string(start_factor) + " and end_factor " +
                std::to_string(end_factor) + " must lie in (0, 1] and [0, 1]");
  if (total_iters < 1)
    throw Error("LinearLR: total_iters " + std::to_string(total_iters) + " must be at least 1");
  start();
}
double LinearLR::lr_at(size_t g, int64_t epoch) const {
  const double t = static_cast<double>(std::min(epoch, total_)) / static_cast<double>(total_);
  return base_lrs_[g] * (start_ + (end_ - start_) * t);
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), t_max_(T_max), eta_min_(eta_min) {
  if (T_max < 1) throw Error("CosineAnnealingLR: T_max " + std::to_string(T_max) + " < 1");
  start();
}
double CosineAnnealingLR::lr_at(size_t g, int64_t epoch) const {
  const double x = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max_);
  return eta_min_ + (base_lrs_[g] - eta_min_) * (1 + std::cos(x)) / 2;
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda, std::string name)
    : LRScheduler(optimizer), fn_(std::move(lr_lambda)), name_(std::move(name)) {
  if (!fn_) throw Error(name_ + ": no lr_lambda given");
  start();
}
double LambdaLR::lr_at(size_t g, int64_t epoch) const {
  const double f = fn_(epoch);
  if (!(f >= 0) || !std::isfinite(f))
    throw Error(name_ + ": lr_lambda(" + std::to_string(epoch) + ") returned " + std::to_string(f) +
                "; a factor must be finite and >= 0");
  return base_lrs_[g] * f;
}

std::unique_ptr<LambdaLR> get_cosine_schedule_with_warmup(Optimizer& optimizer,
                                                          int64_t num_warmup_steps,
                                                          int64_t num_training_steps) {
  if (num_warmup_steps < 0 || num_training_steps <= num_warmup_steps)
    throw Error("get_cosine_schedule_with_warmup: num_warmup_steps " +
                std::to_string(num_warmup_steps) + " and num_training_steps " +
                std::to_string(num_training_steps) + " must satisfy 0 <= warmup < training");
  const int64_t w = num_warmup_steps, t = num_training_steps;
  auto f = [w, t](int64_t e) {
    if (e < w) return static_cast<double>(e) / static_cast<double>(std::max<int64_t>(1, w));
    const double p = static_cast<double>(e - w) / static_cast<double>(std::max<int64_t>(1, t - w));
    return std::max(0.0, (1 + std::cos(std::numbers::pi * p)) / 2);
  };
  return std::make_unique<LambdaLR>(optimizer, f, "CosineWithWarmup");
}

// ---- OneCycleLR -----------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, const OneCycleOptions& options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr), options) {
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lr, const OneCycleOptions& o)
    : LRScheduler(optimizer), o_(o) {
  const size_t groups = optimizer.param_groups().size();
  if (max_lr.size() != groups)
    throw Error("OneCycleLR: " + std::to_string(max_lr.size()) + " max_lr values for " +
                std::to_string(groups) + " parameter groups");
  if (o.total_steps < 1)
    throw Error("OneCycleLR: total_steps " + std::to_string(o.total_steps) + " must be at least 1");
  if (!(o.pct_start >= 0 && o.pct_start <= 1))
    throw Error("OneCycleLR: pct_start " + std::to_string(o.pct_start) + " must lie in [0, 1]");
  if (!(o.div_factor > 0) || !(o.final_div_factor > 0))
    throw Error("OneCycleLR: div_factor and final_div_factor must be > 0");
  if (o.cycle_momentum) {
    const Options& opts = optimizer.param_groups()[0].options;
    momentum_key_ = opts.count("momentum") ? "momentum" : opts.count("beta1") ? "beta1" : "";
    if (momentum_key_.empty())
      throw Error("OneCycleLR: cycle_momentum needs an optimizer with 'momentum' or 'beta1'");
  }
  for (size_t g = 0; g < groups; ++g) {
    if (!(max_lr[g] > 0))
      throw Error("OneCycleLR: max_lr " + std::to_string(max_lr[g]) + " must be > 0");
    max_.push_back(max_lr[g]);
    initial_.push_back(max_lr[g] / o.div_factor);
    min_.push_back(initial_.back() / o.final_div_factor);
    optimizer.param_groups()[g].set_lr(initial_.back());
  }
  start();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (o_.anneal_cos) return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
  return (end - start) * pct + start;
}

OneCycleLR::Point OneCycleLR::at(size_t g, int64_t epoch) const {
  if (epoch > o_.total_steps)
    throw Error("OneCycleLR: tried to step " + std::to_string(epoch) +
                " times; the specified number of total steps is " + std::to_string(o_.total_steps));
  const double total = static_cast<double>(o_.total_steps);
  const double up_end = o_.pct_start * total - 1;
  const double lo = o_.base_momentum, hi = o_.max_momentum;
  struct Phase {
    double end_step, lr0, lr1, m0, m1;
  };
  std::vector<Phase> phases;
  if (o_.three_phase)
    phases = {{up_end, initial_[g], max_[g], hi, lo},
              {2 * o_.pct_start * total - 2, max_[g], initial_[g], lo, hi},
              {total - 1, initial_[g], min_[g], hi, hi}};
  else
    phases = {{up_end, initial_[g], max_[g], hi, lo}, {total - 1, max_[g], min_[g], lo, hi}};
  const double step = static_cast<double>(epoch);
  double start_step = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    if (step <= p.end_step || i + 1 == phases.size()) {
      // A phase of no steps (total_steps 1) is at its end: PyTorch divides by zero there.
      const double span = p.end_step - start_step;
      const double pct = span > 0 ? (step - start_step) / span : 1.0;
      return {anneal(p.lr0, p.lr1, pct), anneal(p.m0, p.m1, pct)};
    }
    start_step = p.end_step;
  }
  return {min_[g], hi};
}

double OneCycleLR::lr_at(size_t g, int64_t epoch) const {
  return at(g, epoch).lr;
}

void OneCycleLR::apply_extra(int64_t epoch) {
  if (momentum_key_.empty()) return;
  for (size_t g = 0; g < opt_.param_groups().size(); ++g)
    opt_.param_groups()[g].options[momentum_key_] = at(g, epoch).momentum;
}

}  // namespace bp::optim::lr_scheduler
