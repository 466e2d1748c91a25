// Scenario "ddp": DistributedDataParallel on every rank with DistributedSampler shards must give
// the parameters of one process training on the combined batch (computed here too), within
// 1e-5 relative; the ranks start from different weights, so the broadcast is tested as well.
// Then a parameter that gets no gradient must be named by the next forward().
#include "dist_rank.hpp"

#include <backplane/nn.hpp>
#include <backplane/parallel.hpp>
#include <backplane/train.hpp>

#include <cmath>
#include <cstdlib>

namespace bpt {

namespace {

namespace d = bp::dist;
using bp::Tensor;

std::shared_ptr<bp::nn::Sequential> make_mlp(uint64_t seed, bp::Device& dev) {
  bp::manual_seed(seed);
  auto net = std::make_shared<bp::nn::Sequential>();
  net->add<bp::nn::Linear>(8, 32);
  net->add<bp::nn::Tanh>();
  net->add<bp::nn::Linear>(32, 16);
  net->add<bp::nn::ReLU>();
  net->add<bp::nn::Linear>(16, 1);
  net->to(dev);
  return net;
}

// y = sin(x0) + x1 * x2 - 0.5 x3 + small noise, from a fixed generator: the same on every rank.
std::pair<Tensor, Tensor> make_data(int64_t n) {
  bp::Device& cpu = bp::device("cpu:0");
  bp::Generator gen(11);
  Tensor X = bp::uniform({n, 8}, -1.0, 1.0, cpu, bp::DType::f32, &gen);
  Tensor Y = X.slice(1, 0, 1) * 0.8 + X.slice(1, 1, 2) * X.slice(1, 2, 3) - X.slice(1, 3, 4) * 0.5 +
             bp::uniform({n, 1}, -0.01, 0.01, cpu, bp::DType::f32, &gen);
  return {X, Y};
}

void train(bp::nn::Module& model, bp::DataLoader& data, bp::Device& dev, int epochs,
           std::vector<double>* losses) {
  bp::optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int e = 0; e < epochs; ++e) {
    double sum = 0;
    int batches = 0;
    for (bp::Batch b : data) {
      opt.zero_grad();
      Tensor loss = bp::nn::mse_loss(model(b.x.to(dev)), b.y.to(dev));
      loss.backward();
      opt.step();
      sum += loss.item<double>();
      ++batches;
    }
    if (losses) losses->push_back(sum / batches);
  }
}

// A module with a parameter its forward never uses.
class WithUnused : public bp::nn::Module {
 public:
  WithUnused() {
    used_ = &register_module("used", std::make_shared<bp::nn::Linear>(4, 2));
    register_module("unused", std::make_shared<bp::nn::Linear>(4, 2));
  }
  Tensor forward(const Tensor& x) override { return (*used_)(x); }
  std::string name() const override { return "WithUnused"; }

 private:
  bp::nn::Linear* used_;
};

}  // namespace

int run_ddp(const std::vector<std::string>& args) {
  std::string device;  // --device D; default: cuda:<local rank>, or the CPU
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--device") device = args[i + 1];
  d::init_process_group();
  Checker ck;
  ck.rank = d::get_rank();
  int world = d::get_world_size();
  bp::Device& dev = device.empty() ? d::local_device("cuda") : bp::device(device);
  const int64_t n = 256, per_rank_batch = 16;
  const int epochs = 3;
  auto [X, Y] = make_data(n);

  // Data-parallel: each rank starts from different weights; DDP broadcasts rank 0's.
  auto net = make_mlp(42 + static_cast<uint64_t>(ck.rank), dev);
  bp::nn::DistributedDataParallel ddp(net, {.bucket_cap_mb = 0.001});
  bp::DataLoader shard(X, Y,
                       {.batch_size = per_rank_batch,
                        .sampler = std::make_shared<bp::DistributedSampler>(
                            bp::DistributedSamplerOptions{.seed = 3})});
  std::vector<double> losses;
  train(ddp, shard, dev, epochs, &losses);
  ddp.synchronize_gradients();

  // One process on the combined batch, from rank 0's initial weights.
  auto ref = make_mlp(42, dev);
  bp::DataLoader whole(
      X, Y,
      {.batch_size = per_rank_batch * world,
       .sampler = std::make_shared<bp::DistributedSampler>(
           bp::DistributedSamplerOptions{.num_replicas = 1, .rank = 0, .seed = 3})});
  train(*ref, whole, dev, epochs, nullptr);

  auto mine = net->named_parameters();
  auto want = ref->named_parameters();
  double worst = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    auto a = mine[k].second.to_vector<double>();
    auto b = want[k].second.to_vector<double>();
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
    worst = std::max(worst, rel);
    std::string name = "ddp_parameter[" + mine[k].first + "]";
    if (rel <= 1e-5)
      ck.pass(name);
    else
      ck.fail(name, "relative difference " + std::to_string(rel) +
                        " from one process on the combined batch exceeds 1e-5");
  }
  auto layout = ddp.bucket_layout();
  if (layout.size() >= 3)
    ck.pass("ddp_buckets");
  else
    ck.fail("ddp_buckets",
            "expected several buckets at 0.001 MB, got " + std::to_string(layout.size()));
  if (losses.back() < losses.front())
    ck.pass("ddp_loss_falls");
  else
    ck.fail("ddp_loss_falls", "loss did not fall: " + std::to_string(losses.front()) + " -> " +
                                  std::to_string(losses.back()));
  std::printf(
      "rank %d: %zu buckets, epoch losses %.6f .. %.6f, worst parameter difference "
      "%.2e\n",
      ck.rank, layout.size(), losses.front(), losses.back(), worst);

  // A parameter that gets no gradient: the next forward names it.
  auto partial = std::make_shared<WithUnused>();
  partial->to(dev);
  bp::nn::DistributedDataParallel ddp2(partial);
  Tensor x = bp::ones({3, 4}, dev);
  ddp2(x).sum().backward();
  try {
    ddp2(x);
    ck.fail("ddp_unused_parameter", "the second forward did not throw");
  } catch (const bp::Error& e) {
    std::string m = e.what();
    if (m.find("unused.weight") != std::string::npos && m.find("no gradient") != std::string::npos)
      ck.pass("ddp_unused_parameter");
    else
      ck.fail("ddp_unused_parameter", "message does not name unused.weight: " + m);
  }
  d::destroy_process_group();
  return ck.finish("ddp");
}

}  // namespace bpt
