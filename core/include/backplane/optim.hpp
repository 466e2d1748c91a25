// Optimisers (torch.optim's names and update rules): SGD, Adam and AdamW over parameter groups,
// with state_dict / load_state_dict for checkpoints (backplane/checkpoint.hpp). Updates run in
// place on each parameter's device (Note [Training on a device] in train.hpp).
//
// Note [Parameter groups]
//   An optimiser holds one or more groups, as torch.optim's param_groups: each group's tensors
//   share its options ("lr", "weight_decay" and the optimiser's own: "momentum", "dampening",
//   "nesterov" for SGD; "beta1", "beta2", "eps" for Adam and AdamW). Options a group does not
//   set come from the optimiser's defaults; a key the optimiser does not know is an Error
//   naming it and the known keys. Options may be changed between steps (a scheduler changes
//   "lr"; OneCycleLR also "momentum" or "beta1"); the next step uses them. A parameter may
//   appear in one group only. Parameters are numbered across groups in order: the numbers key
//   the per-parameter state in a state_dict, as in PyTorch.
//
// Note [Optimiser state]
//   state_dict() returns the hyper-parameters of every group, the parameter numbers of each
//   group and, for each parameter that has taken a step, its step count and buffers
//   ("momentum_buffer" for SGD; "exp_avg", "exp_avg_sq" for Adam and AdamW: PyTorch's names)
//   as tensors on the parameters' devices (not copies: save or clone them before the next
//   step). load_state_dict() checks everything before it changes anything: the optimiser kind,
//   the number of groups and of parameters in each, every buffer's name, shape and dtype
//   against its parameter (Error / ShapeError naming the group or parameter); then it copies
//   the buffers onto each parameter's device and sets the options and step counts.
#pragma once

#include <backplane/export.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace bp::optim {

using Options = std::map<std::string, double>;

// One group of parameters and its options (Note [Parameter groups]).
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;  // missing keys take the optimiser's defaults

  double lr() const { return options.at("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

// Note [Optimiser state]: per parameter, the steps it has taken and its buffers.
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;
};
struct OptimizerStateDict {
  std::string optimizer;                     // "SGD", "Adam", "AdamW"
  std::vector<Options> param_groups;         // each group's options
  std::vector<std::vector<int64_t>> params;  // each group's parameter numbers
  std::map<int64_t, ParamState> state;       // by parameter number
};

// Base of the optimisers: the groups (tensor handles, not copies) and each parameter's state.
class BP_API Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient, in place on its device; parameters without
  // a gradient are skipped.
  virtual void step() = 0;
  // "SGD", "Adam", "AdamW".
  virtual std::string name() const = 0;
  // Drops every parameter's gradient (the next backward() starts from nothing).
  void zero_grad();

  // Every group's parameters, in order.
  std::vector<Tensor> parameters() const;
  std::vector<ParamGroup>& param_groups() noexcept { return groups_; }
  const std::vector<ParamGroup>& param_groups() const noexcept { return groups_; }
  // Appends a group (Note [Parameter groups]); Error for a parameter already held.
  void add_param_group(ParamGroup group);
  // The first group's learning rate; set_lr sets every group's.
  double lr() const { return groups_.at(0).lr(); }
  void set_lr(double lr);

  OptimizerStateDict state_dict() const;
  void load_state_dict(const OptimizerStateDict& state);

 protected:
  explicit Optimizer(Options defaults);
  // For the derived constructors (check_options is virtual): Error for no groups.
  void add_param_groups(std::vector<ParamGroup> groups);
  // Error when an option is out of range, naming the optimiser, the group and the option.
  virtual void check_options(size_t group, const Options& o) const = 0;
  // The buffers a parameter's state holds once it has stepped ("exp_avg", ...).
  virtual std::vector<std::string> buffer_names() const = 0;

  std::vector<ParamGroup> groups_;
  Options defaults_;
  std::vector<ParamState> state_;  // by parameter number

 private:
  void complete(ParamGroup& g, size_t index);
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2 penalty added to the gradient
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
};

// torch.optim.SGD: d = g + wd * p; with momentum, buf = d on the first step and
// buf = momentum * buf + (1 - dampening) * d after; d = nesterov ? d + momentum * buf : buf;
// p -= lr * d. Throws Error for negative hyper-parameters or an invalid nesterov setting.
class BP_API SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> parameters, const SGDOptions& options);
  SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults);
  void step() override;
  std::string name() const override { return "SGD"; }
  const SGDOptions& options() const noexcept { return opt_; }

 protected:
  void check_options(size_t group, const Options& o) const override;
  std::vector<std::string> buffer_names() const override { return {"momentum_buffer"}; }

 private:
  SGDOptions opt_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
  bool fused = false;         // Note [Fused optimiser step]
};

// torch.optim.Adam (amsgrad off): g += wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t counted per parameter.
// Throws Error for hyper-parameters out of range. The bias correction uses the step count on
// the host, so a step cannot be captured in a bp::Graph (CaptureError).
//
// Note [Fused optimiser step]
//   With `fused` (torch.optim.Adam/AdamW's fused=True) a step updates the parameters of a group
//   with the catalogue op adamw: one launch per (device, dtype, step count) instead of a dozen
//   elementwise ops per parameter; the cuda backend runs it as a few multi-tensor kernels. The
//   results equal the per-op update's within the dtype's rounding (each of p, m and v is
//   rounded once instead of after every op). A parameter whose device's plugin lacks the op
//   (plugins of ABI minor < 7), or whose gradient or state is not dense and of its dtype, takes
//   the per-op path, so fused works everywhere. state_dict and load_state_dict are unchanged.
class BP_API Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> parameters, const AdamOptions& options);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults);
  void step() override;
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  const AdamOptions& options() const noexcept { return opt_; }

 protected:
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults, bool decoupled);
  void check_options(size_t group, const Options& o) const override;
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamOptions opt_;
  bool decoupled_;
};

// torch.optim.AdamW: the weight decay is decoupled from the gradient: p *= 1 - lr * wd before
// Adam's update with wd = 0 (Loshchilov and Hutter). PyTorch's default weight_decay is 0.01.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool fused = false;  // Note [Fused optimiser step]
};
class BP_API AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> parameters, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults = {});
};

}  // namespace bp::optim
