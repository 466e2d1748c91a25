// WALKTHROUGH item 13: a training loop that moves the model and each batch to the first GPU if
// there is one (the Trainer with num_gpus), so the same code runs on a CPU-only machine. A small
// MLP learns a synthetic regression problem; the same run is then repeated on the CPU and the
// two loss curves are compared.
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/train.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>

namespace {

// y = tanh(2 x0) + 0.5 x1^2 - x2 + noise: not linear, so the hidden layer has work to do.
// Made on the CPU from a fixed seed: the same data for every run.
bp::DataLoader make_data() {
  bp::Device& cpu = bp::device("cpu:0");
  bp::Generator gen(7);
  bp::Tensor X = bp::uniform({1024, 3}, -1.0, 1.0, cpu, bp::DType::f32, &gen);
  bp::Tensor x0 = X.slice(1, 0, 1), x1 = X.slice(1, 1, 2), x2 = X.slice(1, 2, 3);
  bp::Tensor noise = bp::uniform({1024, 1}, -0.01, 0.01, cpu, bp::DType::f32, &gen);
  bp::Tensor Y = (x0 * 2.0).tanh() + x1 * x1 * 0.5 - x2 + noise;
  return bp::DataLoader(X, Y, {.batch_size = 64, .shuffle = true, .seed = 1});
}

std::vector<double> train(const bp::TrainerOptions& where) {
  bp::manual_seed(42);  // the same initial weights on every device (Philox)
  bp::nn::Sequential net;
  net.add<bp::nn::LazyLinear>(32);  // input size taken from the first batch
  net.add<bp::nn::Tanh>();
  net.add<bp::nn::Linear>(32, 1);
  bp::DataLoader data = make_data();
  bp::TrainerOptions options = where;
  options.max_epochs = 15;
  options.gradient_clip_val = 1.0;
  options.on_epoch = [](int epoch, double loss) {
    std::printf("  epoch %2d  loss %.6f\n", epoch + 1, loss);
  };
  bp::Trainer trainer(options);
  std::cout << "training on " << trainer.device().str() << " ("
            << trainer.device().properties().name << ")\n";
  auto losses = trainer.fit(net, data, bp::nn::mse_loss, bp::sgd({.lr = 0.1, .momentum = 0.9}));
  std::cout << "  weight of layer 0 is on " << net.get<bp::nn::Linear>(0).weight().device().str()
            << "\n";
  return losses;
}

}  // namespace

int main() try {
  // The first GPU if there is one, else the CPU (like d2l's Trainer(num_gpus=1)).
  std::vector<double> best = train({.num_gpus = 1});
  std::cout << "\n";
  std::vector<double> cpu = train({.device = "cpu:0"});

  bool falling = best.back() < best.front() / 5;
  double worst = 0;
  for (size_t e = 0; e < best.size(); ++e)
    worst = std::max(worst, std::fabs(best[e] - cpu[e]) / std::max(cpu[e], 1e-12));
  bool close = worst < 1e-2;
  std::printf("\nloss fell from %.4f to %.6f: %s\n", best.front(), best.back(),
              falling ? "yes" : "NO");
  std::printf("largest relative difference between the two devices' epoch losses: %.2e (%s)\n",
              worst, close ? "within 1e-2" : "OUT OF TOLERANCE");
  return falling && close ? 0 : 1;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
