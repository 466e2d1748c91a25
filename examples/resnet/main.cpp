// ResNet-18 (CIFAR shape) on a device: optionally loads weights exported from PyTorch
// (safetensors with torchvision's keys), classifies a random batch and runs SGD steps on it.
//
//   example-resnet [--device cpu:0] [--weights resnet18.safetensors] [--width 64]
//                  [--batch 8] [--steps 2]
#include "resnet.hpp"

#include <cstdio>
#include <string>

int main(int argc, char** argv) try {
  std::string device = "cpu:0", weights;
  int64_t width = 64, batch = 8;
  int steps = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw bp::Error("example-resnet: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--device")
      device = value();
    else if (a == "--weights")
      weights = value();
    else if (a == "--width")
      width = std::stoll(value());
    else if (a == "--batch")
      batch = std::stoll(value());
    else if (a == "--steps")
      steps = std::stoi(value());
    else
      throw bp::Error("example-resnet: unknown argument " + a);
  }
  bp::Device& dev = bp::device(device);
  bp::manual_seed(0);
  resnet::ResNet18 net(10, width, dev);
  if (!weights.empty()) bp::load(net, weights, dev);
  size_t count = 0;
  for (const auto& p : net.parameters()) count += static_cast<size_t>(p.numel());
  std::printf("ResNet-18 (CIFAR, width %lld) on %s: %zu parameters\n",
              static_cast<long long>(width), dev.str().c_str(), count);
  bp::Tensor x = bp::randn({batch, 3, 32, 32}, dev);
  bp::Tensor y = bp::argmax(bp::rand({batch, 10}, dev), 1);
  bp::optim::SGD opt(net.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    bp::Tensor loss = bp::nn::cross_entropy(net(x), y);
    loss.backward();
    opt.step();
    std::printf("step %d  loss %.4f\n", s + 1, loss.item<double>());
  }
  net.eval();
  bp::NoGradGuard no_grad;
  bp::Tensor pred = bp::argmax(net(x), 1);
  std::printf("predicted classes after %d steps: ", steps);
  for (int64_t c : pred.to_vector<int64_t>()) std::printf("%lld ", static_cast<long long>(c));
  std::printf("\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "example-resnet: %s\n", e.what());
  return 2;
}
