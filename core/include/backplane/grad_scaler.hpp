// Loss scaling for f16 training: torch.amp.GradScaler (bf16 needs none: its range is f32's).
//
// Note [Gradient scaling]
//   Small f16 gradients underflow to zero. scale(loss) multiplies the loss by the scale S
//   (65536 at first), so every gradient of the backward pass is S times larger; unscale_(opt)
//   multiplies each gradient of the optimiser's groups by 1/S in place and records, on the
//   gradients' devices, whether any was inf or nan: per group and device, one 0-d partial sum per
//   gradient and one reduction over them, with nothing read back to the host. step(opt) reads
//   that flag (one value per device) and calls opt.step() only when every gradient was finite.
//   update() then halves S (backoff_factor) when a step was skipped, and doubles it
//   (growth_factor) after growth_interval finite steps in a row. A finite gradient whose f32
//   sum overflows counts as non-finite (its update would overflow too). Gradient clipping goes
//   between unscale_ and step, on the unscaled gradients, as in PyTorch:
//     scaler.scale(loss).backward(); scaler.unscale_(opt); clip_grad_norm_(...);
//     scaler.step(opt); scaler.update();
//   Per optimiser, unscale_ may run once and step once between two update() calls (Error
//   otherwise). f16 gradients are refused (DTypeError): keep the parameters in f32 and run the
//   forward pass under bp::autocast, as PyTorch requires.
#pragma once

#include <backplane/export.hpp>
#include <backplane/optim.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace bp::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // >= 1
  bool enabled = true;             // false: scale() and unscale_() do nothing, step() steps
};

// torch.amp.GradScaler (Note [Gradient scaling]). Not thread-safe.
class BP_API GradScaler {
 public:
  // Error when an option is out of range, naming it.
  explicit GradScaler(const GradScalerOptions& options = {});

  // outputs * scale (outputs itself when disabled), recorded for autograd. Error for an
  // undefined tensor.
  Tensor scale(const Tensor& outputs) const;
  // Divides the gradients of `optimizer`'s parameters by the scale in place and records whether
  // any is inf or nan. Error when already called for this optimiser since the last update(), or
  // after step(); DTypeError for an f16 gradient.
  void unscale_(optim::Optimizer& optimizer);
  // Unscales (unless unscale_ ran), then runs optimizer.step() when every gradient was finite.
  // Returns whether the step ran. Error when step already ran for this optimiser since the last
  // update(), or when no parameter of the optimiser has a gradient.
  bool step(optim::Optimizer& optimizer);
  // Adjusts the scale from the steps since the last update() (Note [Gradient scaling]), or sets
  // it to `new_scale` (> 0). Error when no optimiser was unscaled or stepped since the last one.
  void update(std::optional<double> new_scale = std::nullopt);

  // The current scale (1.0 when disabled).
  double get_scale() const noexcept { return enabled_ ? scale_ : 1.0; }
  double get_growth_factor() const noexcept { return growth_factor_; }
  double get_backoff_factor() const noexcept { return backoff_factor_; }
  int64_t get_growth_interval() const noexcept { return growth_interval_; }
  // Finite steps since the scale last changed.
  int64_t growth_tracker() const noexcept { return growth_tracker_; }
  bool is_enabled() const noexcept { return enabled_; }

  // PyTorch's keys: "scale", "growth_factor", "backoff_factor", "growth_interval",
  // "_growth_tracker" (empty when disabled).
  std::map<std::string, double> state_dict() const;
  // Error naming a missing key or an out-of-range value; nothing changes then.
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    std::vector<Tensor> flags;  // one 0-d tensor per device: 0 when finite, nan otherwise
    std::optional<bool> found_inf;
  };
  bool found_inf(PerOptimizer& p);

  double scale_, growth_factor_, backoff_factor_;
  int64_t growth_interval_, growth_tracker_ = 0;
  bool enabled_;
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace bp::amp
