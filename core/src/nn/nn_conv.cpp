// bp::nn layers of convolutional networks (nn_conv.hpp).
#include <backplane/nn_conv.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace bp::nn {

namespace F = functional;

namespace {

std::string pair_str(Pair2 p) {
  std::string s = "(";  // appended, not "(" + ...: GCC 12 warns falsely (-Wrestrict) on that
  s += std::to_string(p.h);
  s += ", ";
  s += std::to_string(p.w);
  s += ")";
  return s;
}

void check_at_least(const std::string& layer, const char* what, Pair2 v, int64_t least) {
  if (v.h < least || v.w < least)
    throw ShapeError(layer + ": " + what + " must be >= " + std::to_string(least) + ", got " +
                     pair_str(v));
}

void check_floating(const char* layer, DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError(std::string(layer) + ": parameters need a floating dtype, got " +
                     std::string(dtype_name(dtype)));
}

}  // namespace

// ---- Conv2d -----------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Pair2 kernel_size, Pair2 stride,
               Pair2 padding, Pair2 dilation, int64_t groups, bool bias)
    : Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
             default_device()) {}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Pair2 kernel_size, Pair2 stride,
               Pair2 padding, Pair2 dilation, int64_t groups, bool bias, Device& device,
               DType dtype)
    : in_(in_channels),
      out_(out_channels),
      groups_(groups),
      kernel_(kernel_size),
      stride_(stride),
      padding_(padding),
      dilation_(dilation),
      has_bias_(bias) {
  check_floating("Conv2d", dtype);
  if (groups < 1) throw ShapeError("Conv2d: groups must be >= 1, got " + std::to_string(groups));
  if (in_channels < 1 || out_channels < 1)
    throw ShapeError("Conv2d: in_channels and out_channels must be >= 1, got " +
                     std::to_string(in_channels) + " and " + std::to_string(out_channels));
  if (in_channels % groups != 0 || out_channels % groups != 0)
    throw ShapeError("Conv2d: in_channels (" + std::to_string(in_channels) +
                     ") and out_channels (" + std::to_string(out_channels) +
                     ") must be multiples of groups (" + std::to_string(groups) + ")");
  check_at_least("Conv2d", "kernel_size", kernel_, 1);
  check_at_least("Conv2d", "stride", stride_, 1);
  check_at_least("Conv2d", "dilation", dilation_, 1);
  check_at_least("Conv2d", "padding", padding_, 0);
  // torch.nn.Conv2d.reset_parameters: kaiming_uniform_(a=sqrt(5)) gives the bound
  // gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)), i.e. 1 / sqrt(fan_in); the bias
  // uses the same bound.
  const int64_t fan_in = in_channels / groups * kernel_.h * kernel_.w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_slot_ = register_parameter(
      "weight", uniform({out_channels, in_channels / groups, kernel_.h, kernel_.w}, -bound, bound,
                        device, dtype));
  if (has_bias_)
    bias_slot_ = register_parameter("bias", uniform({out_channels}, -bound, bound, device, dtype));
}

const Tensor& Conv2d::bias() const {
  static const Tensor none;
  return has_bias_ ? slot(bias_slot_) : none;
}

Tensor Conv2d::forward(const Tensor& x) {
  return F::conv2d(x, weight(), bias(), stride_, padding_, dilation_, groups_);
}

std::string Conv2d::name() const {
  std::string s = "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
                  ", kernel_size=" + pair_str(kernel_) + ", stride=" + pair_str(stride_);
  if (padding_.h != 0 || padding_.w != 0) s += ", padding=" + pair_str(padding_);
  if (dilation_.h != 1 || dilation_.w != 1) s += ", dilation=" + pair_str(dilation_);
  if (groups_ != 1) s += ", groups=" + std::to_string(groups_);
  if (!has_bias_) s += ", bias=False";
  return s + ")";
}

// ---- pooling ----------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Pair2 kernel_size, std::optional<Pair2> stride, Pair2 padding, Pair2 dilation,
                     bool return_indices, bool ceil_mode)
    : kernel_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      dilation_(dilation),
      return_indices_(return_indices),
      ceil_mode_(ceil_mode) {
  check_at_least("MaxPool2d", "kernel_size", kernel_, 1);
  check_at_least("MaxPool2d", "stride", stride_, 1);
  check_at_least("MaxPool2d", "dilation", dilation_, 1);
  check_at_least("MaxPool2d", "padding", padding_, 0);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return F::max_pool2d(x, kernel_, stride_, padding_, dilation_, ceil_mode_);
}

ValuesIndices MaxPool2d::forward_with_indices(const Tensor& x) {
  return F::max_pool2d_with_indices(x, kernel_, stride_, padding_, dilation_, ceil_mode_);
}

std::string MaxPool2d::name() const {
  auto one = [](Pair2 p) { return p.h == p.w ? std::to_string(p.h) : pair_str(p); };
  return "MaxPool2d(kernel_size=" + one(kernel_) + ", stride=" + one(stride_) +
         ", padding=" + one(padding_) + ", dilation=" + one(dilation_) +
         ", ceil_mode=" + (ceil_mode_ ? "True" : "False") + ")";
}

AvgPool2d::AvgPool2d(Pair2 kernel_size, std::optional<Pair2> stride, Pair2 padding, bool ceil_mode,
                     bool count_include_pad)
    : kernel_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      ceil_mode_(ceil_mode),
      count_include_pad_(count_include_pad) {
  check_at_least("AvgPool2d", "kernel_size", kernel_, 1);
  check_at_least("AvgPool2d", "stride", stride_, 1);
  check_at_least("AvgPool2d", "padding", padding_, 0);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return F::avg_pool2d(x, kernel_, stride_, padding_, ceil_mode_, count_include_pad_);
}

std::string AvgPool2d::name() const {
  auto one = [](Pair2 p) { return p.h == p.w ? std::to_string(p.h) : pair_str(p); };
  return "AvgPool2d(kernel_size=" + one(kernel_) + ", stride=" + one(stride_) +
         ", padding=" + one(padding_) + ")";
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Pair2 output_size) : output_size_(output_size) {
  check_at_least("AdaptiveAvgPool2d", "output_size", output_size_, 1);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return F::adaptive_avg_pool2d(x, output_size_);
}

std::string AdaptiveAvgPool2d::name() const {
  return "AdaptiveAvgPool2d(output_size=" + pair_str(output_size_) + ")";
}

// ---- BatchNorm2d ------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats)
    : BatchNorm2d(num_features, eps, momentum, affine, track_running_stats, default_device()) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats, Device& device, DType dtype)
    : features_(num_features),
      eps_(eps),
      momentum_(momentum),
      affine_(affine),
      track_(track_running_stats) {
  check_floating("BatchNorm2d", dtype);
  if (num_features < 1)
    throw ShapeError("BatchNorm2d: num_features must be >= 1, got " + std::to_string(num_features));
  if (!(eps > 0)) throw ShapeError("BatchNorm2d: eps must be > 0, got " + std::to_string(eps));
  if (affine_) {
    weight_slot_ = register_parameter("weight", ones({num_features}, device, dtype));
    bias_slot_ = register_parameter("bias", zeros({num_features}, device, dtype));
  }
  if (track_) {
    mean_slot_ = register_buffer("running_mean", zeros({num_features}, device, dtype));
    var_slot_ = register_buffer("running_var", ones({num_features}, device, dtype));
    count_slot_ = register_buffer("num_batches_tracked", zeros({}, device, DType::i64));
  }
}

namespace {
const Tensor& none_tensor() {
  static const Tensor none;
  return none;
}
}  // namespace

const Tensor& BatchNorm2d::weight() const {
  return affine_ ? slot(weight_slot_) : none_tensor();
}
const Tensor& BatchNorm2d::bias() const {
  return affine_ ? slot(bias_slot_) : none_tensor();
}
const Tensor& BatchNorm2d::running_mean() const {
  return track_ ? slot(mean_slot_) : none_tensor();
}
const Tensor& BatchNorm2d::running_var() const {
  return track_ ? slot(var_slot_) : none_tensor();
}
const Tensor& BatchNorm2d::num_batches_tracked() const {
  return track_ ? slot(count_slot_) : none_tensor();
}

void BatchNorm2d::on_state_loaded() {
  if (!track_) return;
  batches_ = slot(count_slot_).item<int64_t>();
  one_ = Tensor();
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (x.rank() != 4)
    throw ShapeError("BatchNorm2d: expected a 4-d input [N, C, H, W], got shape [" +
                     Dims(std::span<const int64_t>(x.shape())).str() + "]");
  if (x.size(1) != features_)
    throw ShapeError("BatchNorm2d: input of shape [" +
                     Dims(std::span<const int64_t>(x.shape())).str() + "] has " +
                     std::to_string(x.size(1)) + " channels, the layer " +
                     std::to_string(features_) + " (num_features)");
  const bool use_batch = is_training() || !track_;
  double momentum = momentum_.value_or(0.0);
  if (is_training() && track_) {
    const Tensor& count = slot(count_slot_);
    if (!one_.defined() || &one_.device() != &count.device())
      one_ = ones({}, count.device(), DType::i64);
    {
      NoGradGuard no_grad;
      Tensor c = count;
      c.add_(one_);
    }
    ++batches_;
    if (!momentum_) momentum = 1.0 / static_cast<double>(batches_);
  }
  return F::batch_norm(x, running_mean(), running_var(), weight(), bias(), use_batch, momentum,
                       eps_);
}

std::string BatchNorm2d::name() const {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%g", eps_);
  std::string m = "None";
  if (momentum_) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", *momentum_);
    m = buf;
  }
  return "BatchNorm2d(" + std::to_string(features_) + ", eps=" + eps + ", momentum=" + m +
         ", affine=" + (affine_ ? "True" : "False") +
         ", track_running_stats=" + (track_ ? "True" : "False") + ")";
}

// ---- Dropout, Flatten, ModuleList -------------------------------------------------------------

Dropout::Dropout(double p) : p_(p) {
  if (!(p >= 0.0 && p <= 1.0))
    throw Error("Dropout: probability p must be in [0, 1], got " + std::to_string(p));
}

Tensor Dropout::forward(const Tensor& x) {
  return F::dropout(x, p_, is_training());
}

std::string Dropout::name() const {
  char buf[48];
  std::snprintf(buf, sizeof buf, "Dropout(p=%g, inplace=False)", p_);
  return buf;
}

Tensor Flatten::forward(const Tensor& x) {
  const int r = std::max(x.rank(), 1);
  auto norm = [&](int d) {
    if (d < -r || d >= r)
      throw ShapeError("Flatten: dim " + std::to_string(d) +
                       " is out of range for an input of rank " + std::to_string(x.rank()));
    return d < 0 ? d + r : d;
  };
  const int s = norm(start_), e = norm(end_);
  if (s > e)
    throw ShapeError("Flatten: start_dim (" + std::to_string(start_) + ") comes after end_dim (" +
                     std::to_string(end_) + ")");
  if (x.rank() == 0) return x.reshape({1});
  Shape shape;
  for (int d = 0; d < s; ++d) shape.push_back(x.size(d));
  int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= x.size(d);
  shape.push_back(merged);
  for (int d = e + 1; d < x.rank(); ++d) shape.push_back(x.size(d));
  return x.reshape(shape);
}

std::string Flatten::name() const {
  return "Flatten(start_dim=" + std::to_string(start_) + ", end_dim=" + std::to_string(end_) + ")";
}

Module& ModuleList::append(std::shared_ptr<Module> module) {
  Module* raw = module.get();
  register_module(std::to_string(items_.size()), std::move(module));
  items_.push_back(raw);
  return *raw;
}

Module& ModuleList::operator[](size_t index) const {
  if (index >= items_.size())
    throw Error("ModuleList: index " + std::to_string(index) + " is out of range (" +
                std::to_string(items_.size()) + " modules)");
  return *items_[index];
}

Tensor ModuleList::forward(const Tensor&) {
  throw Error(
      "ModuleList is not callable: it only holds modules; run them from the owning module's "
      "forward()");
}

}  // namespace bp::nn
