// bp::nn layers of convolutional networks: Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d,
// BatchNorm2d, Dropout, Flatten and ModuleList, with torch.nn's names, argument order,
// initialisation and state_dict keys (Note [Module state] in nn.hpp), so a PyTorch model's
// safetensors file loads into the Backplane model of the same structure.
//
// Constructors check their arguments (ShapeError naming the layer and the rule); forward()
// checks its input as bp::nn::functional does (Note [Convolution checks]).
#pragma once

#include <backplane/nn.hpp>
#include <backplane/nn_functional.hpp>

#include <optional>

namespace bp::nn {

using functional::Pair2;

// torch.nn.Conv2d: weight [out, in / groups, kH, kW] and bias [out], both uniform in
// [-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in / groups * kH * kW (PyTorch's
// kaiming_uniform_(a=sqrt(5)) and its bias rule), drawn from the default Philox generator.
class BP_API Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Pair2 kernel_size, Pair2 stride = 1,
         Pair2 padding = 0, Pair2 dilation = 1, int64_t groups = 1, bool bias = true);
  Conv2d(int64_t in_channels, int64_t out_channels, Pair2 kernel_size, Pair2 stride, Pair2 padding,
         Pair2 dilation, int64_t groups, bool bias, Device& device, DType dtype = DType::f32);

  const Tensor& weight() const { return slot(weight_slot_); }
  const Tensor& bias() const;  // undefined without bias
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  int64_t in_, out_, groups_;
  Pair2 kernel_, stride_, padding_, dilation_;
  bool has_bias_;
  size_t weight_slot_ = 0, bias_slot_ = 0;
};

// torch.nn.MaxPool2d (stride defaults to kernel_size). forward() gives the values;
// forward_with_indices also the int64 positions (return_indices=True), which MaxUnpool-style
// code and the max_pool2d backward use.
class BP_API MaxPool2d : public Module {
 public:
  // return_indices is kept for PyTorch's argument order (forward() returns the values; use
  // forward_with_indices for both).
  explicit MaxPool2d(Pair2 kernel_size, std::optional<Pair2> stride = {}, Pair2 padding = 0,
                     Pair2 dilation = 1, bool return_indices = false, bool ceil_mode = false);
  bool return_indices() const noexcept { return return_indices_; }
  Tensor forward(const Tensor& input) override;
  ValuesIndices forward_with_indices(const Tensor& input);
  std::string name() const override;

 private:
  Pair2 kernel_, stride_, padding_, dilation_;
  bool return_indices_, ceil_mode_;
};

// torch.nn.AvgPool2d.
class BP_API AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Pair2 kernel_size, std::optional<Pair2> stride = {}, Pair2 padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  Pair2 kernel_, stride_, padding_;
  bool ceil_mode_, count_include_pad_;
};

// torch.nn.AdaptiveAvgPool2d.
class BP_API AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Pair2 output_size);
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  Pair2 output_size_;
};

// torch.nn.BatchNorm2d over [N, C, H, W] inputs. State (PyTorch's keys): weight (1) and bias
// (0) when affine; running_mean (0), running_var (1) and num_batches_tracked (int64, 0-d)
// when track_running_stats. Training normalises with the batch statistics and updates the
// running ones with `momentum`, or with the cumulative average 1 / num_batches_tracked when
// momentum is empty (PyTorch's momentum=None); evaluation (eval()) normalises with the running
// statistics, or with the batch's when they are not tracked. Inside a bp::Graph capture the
// momentum is fixed at capture, so captured training steps need a numeric momentum.
class BP_API BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
  BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
              bool track_running_stats, Device& device, DType dtype = DType::f32);

  const Tensor& weight() const;        // undefined unless affine
  const Tensor& bias() const;          // undefined unless affine
  const Tensor& running_mean() const;  // undefined unless track_running_stats
  const Tensor& running_var() const;
  const Tensor& num_batches_tracked() const;
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 protected:
  void on_state_loaded() override;

 private:
  int64_t features_;
  double eps_;
  std::optional<double> momentum_;
  bool affine_, track_;
  size_t weight_slot_ = 0, bias_slot_ = 0, mean_slot_ = 0, var_slot_ = 0, count_slot_ = 0;
  int64_t batches_ = 0;  // host mirror of num_batches_tracked (no device read per step)
  Tensor one_;           // int64 1 on the buffers' device, added to num_batches_tracked
};

// torch.nn.Dropout: bp::nn::functional::dropout(x, p, is_training()).
class BP_API Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  double p_;
};

// torch.nn.Flatten: dims start_dim..end_dim merged into one.
class BP_API Flatten : public Module {
 public:
  explicit Flatten(int start_dim = 1, int end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  int start_, end_;
};

// torch.nn.ModuleList: children named "0", "1", ... held in order; not callable itself
// (forward() throws bp::Error), its layers are run by the owning module.
class BP_API ModuleList : public Module {
 public:
  ModuleList() = default;
  template <typename T, typename... Args>
  T& add(Args&&... args) {
    auto m = std::make_shared<T>(std::forward<Args>(args)...);
    T& ref = *m;
    append(std::move(m));
    return ref;
  }
  Module& append(std::shared_ptr<Module> module);
  size_t size() const noexcept { return items_.size(); }
  // The i-th module; bp::Error naming the index and the size when out of range.
  Module& operator[](size_t index) const;
  std::vector<Module*>::const_iterator begin() const { return items_.begin(); }
  std::vector<Module*>::const_iterator end() const { return items_.end(); }
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ModuleList"; }

 private:
  std::vector<Module*> items_;  // owned through Module's children
};

}  // namespace bp::nn
