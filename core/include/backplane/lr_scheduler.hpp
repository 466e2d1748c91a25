// Learning-rate schedulers (torch.optim.lr_scheduler's names and formulas): StepLR, LinearLR,
// CosineAnnealingLR, LambdaLR, OneCycleLR, and the cosine schedule with linear warm-up of
// Hugging Face's get_cosine_schedule_with_warmup.
//
// Note [Schedulers]
//   As in PyTorch, a scheduler records each group's current "lr" as its base learning rate when
//   it is built and then sets every group's "lr" for step 0; call scheduler.step() after each
//   optimizer.step(), and the groups' "lr" follow the schedule (epoch e = number of step()
//   calls). Every formula is the closed form of its epoch (CosineAnnealingLR included: PyTorch
//   computes the same values by a recurrence, equal to rounding). state_dict() holds the epoch
//   and the base learning rates; load_state_dict() restores them and sets the groups' "lr" for
//   that epoch, so a resumed run continues the schedule. A LambdaLR's function is code and is
//   not saved (as in PyTorch): build the scheduler with the same function before loading.
//
// Thread-safety: none; a scheduler changes its optimizer's groups.
#pragma once

#include <backplane/export.hpp>
#include <backplane/optim.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace bp::optim::lr_scheduler {

class BP_API LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances the epoch by one and sets every group's learning rate for it.
  void step();
  // The learning rate of each group set by the last step() (get_last_lr in PyTorch).
  std::vector<double> get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const noexcept { return last_epoch_; }
  std::vector<double> base_lrs() const { return base_lrs_; }
  // "StepLR", "OneCycleLR", ...: a checkpoint refuses another kind's state.
  virtual std::string name() const = 0;

  // {"last_epoch": e, "base_lr.0": ..., "base_lr.1": ...} (Note [Schedulers]).
  std::map<std::string, double> state_dict() const;
  // Error naming the key for a missing or unexpected entry or a group count that differs.
  void load_state_dict(const std::map<std::string, double>& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Records the base learning rates and applies epoch 0; the derived constructor calls it
  // once its own members are set.
  void start();
  // Group `g`'s learning rate at `epoch`.
  virtual double lr_at(size_t g, int64_t epoch) const = 0;
  // Sets options other than "lr" for `epoch` (OneCycleLR's momentum).
  virtual void apply_extra(int64_t /*epoch*/) {}

  Optimizer& opt_;
  std::vector<double> base_lrs_;

 private:
  void apply(int64_t epoch);
  int64_t last_epoch_ = -1;
  std::vector<double> last_lr_;
};

// lr = base * gamma^floor(epoch / step_size). Error for step_size < 1.
class BP_API StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string name() const override { return "StepLR"; }

 protected:
  double lr_at(size_t g, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base * (start + (end - start) * min(epoch, total_iters) / total_iters). Error unless
// 0 < start_factor <= 1, 0 <= end_factor <= 1 and total_iters >= 1.
class BP_API LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);
  std::string name() const override { return "LinearLR"; }

 protected:
  double lr_at(size_t g, int64_t epoch) const override;

 private:
  double start_, end_;
  int64_t total_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2. Error for T_max < 1.
class BP_API CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
  std::string name() const override { return "CosineAnnealingLR"; }

 protected:
  double lr_at(size_t g, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// lr = base * lr_lambda(epoch). The function must return a finite factor >= 0 (Error
// otherwise, naming the epoch and the value).
class BP_API LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda,
           std::string name = "LambdaLR");
  std::string name() const override { return name_; }

 protected:
  double lr_at(size_t g, int64_t epoch) const override;

 private:
  std::function<double(int64_t)> fn_;
  std::string name_;
};

// Linear warm-up from 0 over num_warmup_steps, then a half cosine to 0 at num_training_steps
// (Hugging Face's get_cosine_schedule_with_warmup, num_cycles 0.5): factor = e / warmup for
// e < warmup, else max(0, (1 + cos(pi * p)) / 2) with p = (e - warmup) / (total - warmup).
// A LambdaLR named "CosineWithWarmup". Error unless 0 <= warmup < total.
BP_API std::unique_ptr<LambdaLR> get_cosine_schedule_with_warmup(Optimizer& optimizer,
                                                                 int64_t num_warmup_steps,
                                                                 int64_t num_training_steps);

struct OneCycleOptions {
  int64_t total_steps = 0;        // required (> 0)
  double pct_start = 0.3;         // share of the steps spent increasing the rate
  bool anneal_cos = true;         // false: linear annealing ('linear' in PyTorch)
  bool cycle_momentum = true;     // cycles "momentum" (SGD) or "beta1" (Adam, AdamW) inversely
  double base_momentum = 0.85;    // momentum at the peak learning rate
  double max_momentum = 0.95;     // momentum at the start and the end
  double div_factor = 25.0;       // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // final lr = initial lr / final_div_factor
  bool three_phase = false;       // PyTorch's three_phase
};

// torch.optim.lr_scheduler.OneCycleLR (Smith and Topsekar): every group's rate rises from
// max_lr / div_factor to max_lr over pct_start of total_steps, then falls to the final rate;
// the momentum moves the opposite way. Stepping past total_steps is an Error, as in PyTorch.
// max_lr applies to every group (one value) or one a group.
class BP_API OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lr, const OneCycleOptions& options);
  OneCycleLR(Optimizer& optimizer, double max_lr, const OneCycleOptions& options);
  std::string name() const override { return "OneCycleLR"; }

 protected:
  double lr_at(size_t g, int64_t epoch) const override;
  void apply_extra(int64_t epoch) override;

 private:
  struct Point {
    double lr, momentum;
  };
  Point at(size_t g, int64_t epoch) const;
  double anneal(double start, double end, double pct) const;
  OneCycleOptions o_;
  std::vector<double> initial_, max_, min_;  // per group
  std::string momentum_key_;                 // "momentum", "beta1" or empty
};

}  // namespace bp::optim::lr_scheduler
