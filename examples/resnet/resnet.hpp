// ResNet-18 in its CIFAR shape (3x32x32 inputs): torchvision's resnet18 with a 3x3 stride-1
// first convolution and no max pooling, as the CIFAR variant is usually written. Children carry
// torchvision's names (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0, fc, ...), so its
// state_dict keys are PyTorch's and a safetensors file of the PyTorch model loads as it is.
// `width` scales every layer (64 for ResNet-18; the test fixture uses 8).
#pragma once

#include <backplane/backplane.hpp>

#include <cmath>
#include <memory>

namespace resnet {

// torchvision's init: kaiming_normal_(mode="fan_out", nonlinearity="relu") for convolutions
// (BatchNorm2d starts at weight 1, bias 0).
inline void kaiming_normal_fan_out(const bp::Tensor& w) {
  bp::NoGradGuard no_grad;
  const double fan_out = static_cast<double>(w.size(0) * w.size(2) * w.size(3));
  bp::Tensor t = w;
  t.copy_(bp::randn(w.shape(), w.device(), w.dtype()) * std::sqrt(2.0 / fan_out));
}

class BasicBlock : public bp::nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride, bp::Device& d, bp::DType dt) {
    using namespace bp::nn;
    conv1_ = &register_module("conv1",
                              std::make_shared<Conv2d>(in, out, 3, stride, 1, 1, 1, false, d, dt));
    bn1_ =
        &register_module("bn1", std::make_shared<BatchNorm2d>(out, 1e-5, 0.1, true, true, d, dt));
    conv2_ =
        &register_module("conv2", std::make_shared<Conv2d>(out, out, 3, 1, 1, 1, 1, false, d, dt));
    bn2_ =
        &register_module("bn2", std::make_shared<BatchNorm2d>(out, 1e-5, 0.1, true, true, d, dt));
    kaiming_normal_fan_out(conv1_->weight());
    kaiming_normal_fan_out(conv2_->weight());
    if (stride != 1 || in != out) {
      auto ds = std::make_shared<Sequential>();
      auto& c = ds->add<Conv2d>(in, out, 1, stride, 0, 1, 1, false, d, dt);
      kaiming_normal_fan_out(c.weight());
      ds->add<BatchNorm2d>(out, 1e-5, 0.1, true, true, d, dt);
      downsample_ = &register_module("downsample", ds);
    }
  }
  bp::Tensor forward(const bp::Tensor& x) override {
    bp::Tensor y = (*bn1_)((*conv1_)(x)).relu();
    y = (*bn2_)((*conv2_)(y));
    return (y + (downsample_ ? (*downsample_)(x) : x)).relu();
  }
  std::string name() const override { return "BasicBlock"; }

 private:
  bp::nn::Conv2d *conv1_, *conv2_;
  bp::nn::BatchNorm2d *bn1_, *bn2_;
  bp::nn::Sequential* downsample_ = nullptr;
};

class ResNet18 : public bp::nn::Module {
 public:
  explicit ResNet18(int64_t num_classes = 10, int64_t width = 64,
                    bp::Device& d = bp::default_device(), bp::DType dt = bp::DType::f32) {
    using namespace bp::nn;
    conv1_ =
        &register_module("conv1", std::make_shared<Conv2d>(3, width, 3, 1, 1, 1, 1, false, d, dt));
    kaiming_normal_fan_out(conv1_->weight());
    bn1_ =
        &register_module("bn1", std::make_shared<BatchNorm2d>(width, 1e-5, 0.1, true, true, d, dt));
    int64_t in = width;
    for (int l = 0; l < 4; ++l) {
      const int64_t out = width << l, stride = l == 0 ? 1 : 2;
      auto layer = std::make_shared<Sequential>();
      layer->add(std::make_shared<BasicBlock>(in, out, stride, d, dt));
      layer->add(std::make_shared<BasicBlock>(out, out, 1, d, dt));
      layers_[l] = &register_module("layer" + std::to_string(l + 1), layer);
      in = out;
    }
    fc_ = &register_module("fc", std::make_shared<Linear>(in, num_classes, true, d, dt));
  }
  bp::Tensor forward(const bp::Tensor& x) override {
    bp::Tensor y = (*bn1_)((*conv1_)(x)).relu();
    for (auto* layer : layers_) y = (*layer)(y);
    y = bp::nn::functional::adaptive_avg_pool2d(y, 1);
    y = y.reshape({y.size(0), -1});
    return (*fc_)(y);
  }
  std::string name() const override { return "ResNet18"; }

 private:
  bp::nn::Conv2d* conv1_;
  bp::nn::BatchNorm2d* bn1_;
  bp::nn::Sequential* layers_[4];
  bp::nn::Linear* fc_;
};

}  // namespace resnet
