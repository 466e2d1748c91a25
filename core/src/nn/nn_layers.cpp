// bp::nn layers: Linear and LazyLinear.
#include <backplane/nn.hpp>
#include <backplane/runtime.hpp>

#include <cmath>

namespace bp::nn {

namespace {
void check_features(const char* what, int64_t in, int64_t out) {
  if (in < 0 || out < 0)
    throw ShapeError(std::string(what) + ": feature counts must be non-negative, got in_features=" +
                     std::to_string(in) + ", out_features=" + std::to_string(out));
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Linear(in_features, out_features, bias, default_device()) {}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Device& device, DType dtype)
    : out_features_(out_features), has_bias_(bias) {
  check_features("Linear", in_features, out_features);
  if (!is_floating(dtype))
    throw DTypeError("Linear: parameters need a floating dtype, got " +
                     std::string(dtype_name(dtype)));
  weight_slot_ = register_uninitialized_parameter("weight", {out_features, in_features});
  if (has_bias_) bias_slot_ = register_uninitialized_parameter("bias", {out_features});
  materialize(in_features, device, dtype);
}

Linear::Linear(Lazy, int64_t out_features, bool bias)
    : out_features_(out_features), has_bias_(bias) {
  check_features("LazyLinear", 0, out_features);
  weight_slot_ = register_uninitialized_parameter("weight", {out_features, -1});
  if (has_bias_) bias_slot_ = register_uninitialized_parameter("bias", {out_features});
}

void Linear::materialize(int64_t in_features, Device& device, DType dtype) {
  // torch.nn.Linear.reset_parameters: kaiming_uniform(a=sqrt(5)) for the weight reduces to
  // the bound 1/sqrt(fan_in), the same bound as the bias.
  double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  set_slot(weight_slot_, uniform({out_features_, in_features}, -bound, bound, device, dtype));
  if (has_bias_) set_slot(bias_slot_, uniform({out_features_}, -bound, bound, device, dtype));
}

const Tensor& Linear::bias() const {
  static const Tensor none;
  return has_bias_ ? slot(bias_slot_) : none;
}

int64_t Linear::in_features() const {
  const Tensor& w = weight();
  return w.defined() ? w.size(1) : -1;
}

Tensor Linear::forward(const Tensor& x) {
  return forward(x, Activation::none);
}

Tensor Linear::forward(const Tensor& x, Activation activation) {
  const Tensor& w = weight();
  if (!w.defined())
    throw ShapeError(name() +
                     ": the parameters are not initialised (run a LazyLinear once or load it)");
  int64_t in = w.size(1);
  if (x.rank() == 0 || x.size(-1) != in)
    throw ShapeError(name() + ": input of shape " +
                     Dims(std::span<const int64_t>(x.shape())).str() +
                     " does not end in in_features=" + std::to_string(in));
  return bp::linear(x, w, has_bias_ ? bias() : Tensor(), activation);
}

std::string Linear::name() const {
  return "Linear(in_features=" + std::to_string(in_features()) +
         ", out_features=" + std::to_string(out_features_) +
         ", bias=" + (has_bias_ ? "true" : "false") + ")";
}

LazyLinear::LazyLinear(int64_t out_features, bool bias) : Linear(Lazy{}, out_features, bias) {}

Tensor LazyLinear::forward(const Tensor& x) {
  if (!weight().defined()) {
    if (x.rank() == 0) throw ShapeError("LazyLinear: cannot infer in_features from a 0-d input");
    if (!is_floating(x.dtype()))
      throw DTypeError(
          "LazyLinear: the first input must be floating (its dtype becomes the "
          "parameters' dtype), got " +
          std::string(dtype_name(x.dtype())));
    materialize(x.size(-1), x.device(), x.dtype());
  }
  return Linear::forward(x);
}

std::string LazyLinear::name() const {
  if (weight().defined()) return Linear::name();
  return "LazyLinear(in_features=?, out_features=" + std::to_string(out_features()) +
         ", bias=" + (has_bias() ? "true" : "false") + ")";
}

}  // namespace bp::nn
