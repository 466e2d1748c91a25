// ResNet-18 (CIFAR shape, width 8) against PyTorch: tests/fixtures/torch/resnet18_w8.safetensors
// (written by make_resnet_fixture.py where PyTorch exists) holds the state, an input batch, the
// evaluation and training-mode logits, the loss, every parameter's gradient and the running
// statistics after the step. On every device with the convolution ops: logits within 1e-4
// relative (f32), gradients and statistics within 1e-3 relative (norm-wise per tensor).
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>

#include "resnet/resnet.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

// BP_RESNET_FIXTURE names another fixture (a full-width one written by make_resnet_fixture.py
// --width 64 on the GPU machine); the model's width is read from the file.
std::string fixture_path() {
  if (const char* p = std::getenv("BP_RESNET_FIXTURE"); p && *p) return p;
  return std::string(BP_SOURCE_DIR) + "/tests/fixtures/torch/resnet18_w8.safetensors";
}

// ||a - b|| / ||b||.
double rel_error(const bp::Tensor& a, const bp::Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

TEST(ResNetFixture, MatchesPyTorch) {
  if (!std::filesystem::exists(fixture_path()))
    GTEST_SKIP() << fixture_path()
                 << " is absent: run tests/fixtures/torch/make_resnet_fixture.py where PyTorch "
                    "is installed";
  int ran = 0;
  for (bp::Device* d : bp::devices()) {
    if (!d->supports(bp::Op::conv2d, bp::DType::f32) ||
        !d->supports(bp::Op::batch_norm_backward, bp::DType::f32))
      continue;
    ++ran;
    SCOPED_TRACE(d->str());
    auto file = bp::load_file(fixture_path(), *d);
    std::map<std::string, bp::Tensor> state;
    for (const auto& [k, v] : file)
      if (k.rfind("state.", 0) == 0) state[k.substr(6)] = v.clone();
    const int64_t width = file.at("state.conv1.weight").size(0);
    resnet::ResNet18 net(10, width, *d);
    net.load_state_dict(state);
    const bp::Tensor& x = file.at("input");
    net.eval();
    {
      bp::NoGradGuard no_grad;
      double e = rel_error(net(x), file.at("logits_eval"));
      EXPECT_LE(e, 1e-4) << "evaluation logits, relative error " << e;
      std::printf("%s width %lld: evaluation logits relative error %.3g\n", d->str().c_str(),
                  static_cast<long long>(width), e);
    }
    net.train();
    bp::Tensor logits = net(x);
    bp::Tensor loss = bp::nn::cross_entropy(logits, file.at("labels"));
    EXPECT_LE(rel_error(logits, file.at("logits_train")), 1e-4) << "training-mode logits";
    EXPECT_LE(rel_error(loss.reshape({1}), file.at("loss")), 1e-4) << "loss";
    loss.backward();
    double worst = 0;
    std::string worst_key;
    for (const auto& [k, p] : net.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << k << " has no gradient";
      double e = rel_error(p.grad(), file.at("grad." + k));
      EXPECT_LE(e, 1e-3) << "gradient of " << k << ", relative error " << e;
      if (e > worst) worst = e, worst_key = k;
    }
    std::printf("%s width %lld: training logits %.3g, loss %.3g, worst gradient %.3g (%s)\n",
                d->str().c_str(), static_cast<long long>(width),
                rel_error(logits, file.at("logits_train")),
                rel_error(loss.reshape({1}), file.at("loss")), worst, worst_key.c_str());
    for (const auto& [k, b] : net.named_buffers()) {
      if (file.count("after." + k)) {
        EXPECT_LE(rel_error(b, file.at("after." + k)), 1e-4) << "running statistic " << k;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no device has conv2d and batch_norm_backward in f32";
}
