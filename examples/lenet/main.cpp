// LeNet-5 (d2l) trained on scikit-learn's handwritten digits, read from the safetensors file
// that examples/python/export_digits.py writes (tests/fixtures/digits/digits.safetensors):
//
//   example-lenet [--data PATH] [--device cpu:0] [--epochs 40] [--activation relu|sigmoid]
//                 [--lr 0.1] [--decay-epochs 10] [--seed 0] [--min-accuracy 0.95]
//
// The last --decay-epochs epochs run at a tenth of the learning rate (a step schedule): the
// model settles into its minimum, so the same seed gives nearly the same accuracy on every
// device even though the devices round differently and SGD amplifies that while it learns.
// Prints the loss of every epoch, then the test accuracy as a JSON line; exits 1 when the
// accuracy is below --min-accuracy (the CI test runs it so).
#include "lenet.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) try {
  std::string data = "digits.safetensors", device = "cpu:0", act = "relu";
  int epochs = 40, decay_epochs = 10;
  double lr = 0.1, min_accuracy = 0.0;
  uint64_t seed = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw bp::Error("example-lenet: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--data")
      data = value();
    else if (a == "--device")
      device = value();
    else if (a == "--epochs")
      epochs = std::stoi(value());
    else if (a == "--activation")
      act = value();
    else if (a == "--lr")
      lr = std::stod(value());
    else if (a == "--decay-epochs")
      decay_epochs = std::stoi(value());
    else if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--min-accuracy")
      min_accuracy = std::stod(value());
    else
      throw bp::Error("example-lenet: unknown argument " + a);
  }
  bp::Device& dev = bp::device(device);
  bp::Device& cpu = bp::device("cpu:0");
  auto file = bp::load_file(data, cpu);
  bp::Tensor x_train = lenet::images(file.at("x_train")), y_train = file.at("y_train");
  bp::Tensor x_test = lenet::images(file.at("x_test")).to(dev), y_test = file.at("y_test").to(dev);

  bp::manual_seed(seed);
  auto net = lenet::make(cpu, act);  // the Trainer moves it to `dev` (the same Philox values)
  bp::DataLoader loader(x_train, y_train, {.batch_size = 32, .shuffle = true, .seed = seed});
  bp::TrainerOptions options;
  options.device = device;
  options.max_epochs = epochs;
  options.on_epoch = [](int epoch, double loss) {
    std::printf("epoch %2d  loss %.4f\n", epoch + 1, loss);
  };
  if (decay_epochs < 0 || decay_epochs > epochs)
    throw bp::Error("example-lenet: --decay-epochs must lie in 0.." + std::to_string(epochs));
  options.max_epochs = epochs - decay_epochs;
  bp::Trainer(options).fit(*net, loader, bp::nn::cross_entropy,
                           bp::sgd({.lr = lr, .momentum = 0.9}));
  options.max_epochs = decay_epochs;
  options.on_epoch = [&](int epoch, double loss) {
    std::printf("epoch %2d  loss %.4f  (lr %g)\n", epochs - decay_epochs + epoch + 1, loss,
                lr / 10);
  };
  if (decay_epochs > 0)
    bp::Trainer(options).fit(*net, loader, bp::nn::cross_entropy,
                             bp::sgd({.lr = lr / 10, .momentum = 0.9}));
  const double acc = lenet::accuracy(*net, x_test, y_test);
  std::printf(
      "{\"model\": \"lenet\", \"device\": \"%s\", \"activation\": \"%s\", \"epochs\": %d, "
      "\"seed\": %llu, \"test_accuracy\": %.4f}\n",
      dev.str().c_str(), act.c_str(), epochs, static_cast<unsigned long long>(seed), acc);
  if (acc < min_accuracy) {
    std::fprintf(stderr, "example-lenet: test accuracy %.4f is below %.4f\n", acc, min_accuracy);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "example-lenet: %s\n", e.what());
  return 2;
}
