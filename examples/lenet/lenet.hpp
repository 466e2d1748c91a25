// LeNet-5 as Dive into Deep Learning builds it (section "Convolutional Neural Networks
// (LeNet)"): two 5x5 convolutions with average pooling, then three fully connected layers,
// with sigmoid activations as in the book or ReLU. Sized for 16x16 inputs (scikit-learn's 8x8
// digits padded by 4 on each side): 16x16 -> conv(pad 2) 6@16x16 -> pool 6@8x8 -> conv
// 16@4x4 -> pool 16@2x2 -> 64 -> 120 -> 84 -> 10.
#pragma once

#include <backplane/backplane.hpp>

#include <cmath>

#include <memory>
#include <string>

namespace lenet {

inline std::shared_ptr<bp::nn::Module> activation(const std::string& name) {
  if (name == "sigmoid") return std::make_shared<bp::nn::Sigmoid>();
  if (name == "relu") return std::make_shared<bp::nn::ReLU>();
  throw bp::Error("lenet: activation must be sigmoid or relu, got '" + name + "'");
}

// The model on `device`; one bp::manual_seed gives the same weights on every device.
inline std::shared_ptr<bp::nn::Sequential> make(bp::Device& device, const std::string& act) {
  using namespace bp::nn;
  auto net = std::make_shared<Sequential>();
  net->add<Conv2d>(1, 6, 5, 1, 2, 1, 1, true, device);
  net->add(activation(act));
  net->add<AvgPool2d>(2, 2);
  net->add<Conv2d>(6, 16, 5, 1, 0, 1, 1, true, device);
  net->add(activation(act));
  net->add<AvgPool2d>(2, 2);
  net->add<Flatten>();
  net->add<Linear>(16 * 2 * 2, 120, true, device);
  net->add(activation(act));
  net->add<Linear>(120, 84, true, device);
  net->add(activation(act));
  net->add<Linear>(84, 10, true, device);
  // Xavier-uniform weights, as d2l initialises its LeNet: without them the default (PyTorch's
  // kaiming_uniform_ with a = sqrt(5)) leaves the loss on a plateau for the first epochs, and the
  // moment SGD leaves it depends on the last bits of every sum, so devices that round
  // differently train to different models.
  bp::NoGradGuard no_grad;
  for (auto& [key, p] : net->named_parameters()) {
    if (p.rank() < 2) continue;  // biases keep their default
    int64_t receptive = 1;
    for (int d = 2; d < p.rank(); ++d) receptive *= p.size(d);
    const double fan_in = static_cast<double>(p.size(1) * receptive);
    const double fan_out = static_cast<double>(p.size(0) * receptive);
    const double bound = std::sqrt(6.0 / (fan_in + fan_out));
    p.copy_(bp::uniform(p.shape(), -bound, bound, p.device()));
  }
  return net;
}

// Digits of values 0..16 (u8 [N, 8, 8]) as the model's input: f32 [N, 1, 16, 16] in [0, 1],
// the 8x8 image in the middle.
inline bp::Tensor images(const bp::Tensor& u8) {
  const int64_t n = u8.size(0);
  bp::Tensor x = bp::zeros({n, 1, 16, 16}, u8.device());
  x.slice(2, 4, 12).slice(3, 4, 12).copy_((u8.to(bp::DType::f32) / 16.0).unsqueeze(1));
  return x;
}

// The share of `x`'s rows whose largest logit is the label (evaluation mode, no gradients).
inline double accuracy(bp::nn::Module& net, const bp::Tensor& x, const bp::Tensor& y) {
  bp::NoGradGuard no_grad;
  net.eval();
  bp::Tensor pred = bp::argmax(net(x), 1);
  net.train();
  return bp::eq(pred, y).to(bp::DType::f32).mean().item<double>();
}

}  // namespace lenet
