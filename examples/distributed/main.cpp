// The walkthrough's training example (examples/train, walkthrough item 13 of docs/names.md) trained
// data-parallel: run it with `bp-run -n 2 build/bin/example-distributed`. Each rank takes its
// shard of every batch (DistributedSampler), DistributedDataParallel averages the gradients,
// and the epoch losses are averaged across ranks. Rank 0 then trains the same model in one
// process on the combined batch (32 per rank x 2 = 64, examples/train's batch) and prints both
// loss curves side by side: they agree to rounding. Started without bp-run it is a group of one,
// which is that single-process run. Each rank uses its own GPU when there are enough
// (cuda:<local rank>), else the CPU.
#include <backplane/backplane.hpp>
#include <backplane/dist.hpp>
#include <backplane/nn.hpp>
#include <backplane/parallel.hpp>
#include <backplane/train.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

namespace {

namespace d = bp::dist;

constexpr int kEpochs = 15;
constexpr int64_t kPerRankBatch = 32;

// examples/train's data: y = tanh(2 x0) + 0.5 x1^2 - x2 + noise, from a fixed seed.
std::pair<bp::Tensor, bp::Tensor> make_data() {
  bp::Device& cpu = bp::device("cpu:0");
  bp::Generator gen(7);
  bp::Tensor X = bp::uniform({1024, 3}, -1.0, 1.0, cpu, bp::DType::f32, &gen);
  bp::Tensor x0 = X.slice(1, 0, 1), x1 = X.slice(1, 1, 2), x2 = X.slice(1, 2, 3);
  bp::Tensor noise = bp::uniform({1024, 1}, -0.01, 0.01, cpu, bp::DType::f32, &gen);
  return {X, (x0 * 2.0).tanh() + x1 * x1 * 0.5 - x2 + noise};
}

// examples/train's model, materialised on `dev` (LazyLinear learns its input size).
std::shared_ptr<bp::nn::Sequential> make_model(bp::Device& dev, const bp::Tensor& X) {
  bp::manual_seed(42);
  auto net = std::make_shared<bp::nn::Sequential>();
  net->add<bp::nn::LazyLinear>(32);
  net->add<bp::nn::Tanh>();
  net->add<bp::nn::Linear>(32, 1);
  net->to(dev);
  (*net)(X.slice(0, 0, 1).to(dev));  // the lazy layer's first call creates its weights
  return net;
}

// One training run; `model` is the network or its DistributedDataParallel wrapper. Returns the
// epoch losses averaged over `world` ranks (one host read per epoch).
std::vector<double> train(bp::nn::Module& model, bp::DataLoader& data, bp::Device& dev, int world) {
  bp::optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  std::vector<double> losses;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    bp::Tensor total = bp::zeros({1}, dev);
    int64_t batches = 0;
    for (bp::Batch b : data) {
      opt.zero_grad();
      bp::Tensor loss = bp::nn::mse_loss(model(b.x.to(dev)), b.y.to(dev));
      loss.backward();
      bp::nn::clip_grad_norm_(model.parameters(), 1.0);
      opt.step();
      bp::NoGradGuard no_grad;
      total.add_(loss.detach().reshape({1}));
      ++batches;
    }
    bp::Tensor mean = total / static_cast<double>(batches);
    if (world > 1) d::all_reduce(mean, d::ReduceOp::avg).wait();
    losses.push_back(mean.item<double>());
  }
  return losses;
}

}  // namespace

int main() try {
  d::init_process_group();  // rank and world size from bp-run (a group of one without it)
  int rank = d::get_rank(), world = d::get_world_size();
  bp::Device& dev = d::local_device("cuda");
  auto [X, Y] = make_data();
  if (rank == 0)
    std::printf("%d rank(s), %lld examples per rank and step (%lld combined), rank 0 on %s\n",
                world, static_cast<long long>(kPerRankBatch),
                static_cast<long long>(kPerRankBatch * world), dev.str().c_str());

  auto net = make_model(dev, X);
  bp::nn::DistributedDataParallel ddp(net);  // every rank starts from rank 0's weights
  bp::DataLoader shard(X, Y,
                       {.batch_size = kPerRankBatch,
                        .sampler = std::make_shared<bp::DistributedSampler>(
                            bp::DistributedSamplerOptions{.seed = 1})});
  std::vector<double> parallel = train(ddp, shard, dev, world);

  int status = 0;
  if (rank == 0) {
    // The same training in one process on the combined batch.
    auto single_net = make_model(dev, X);
    bp::DataLoader whole(
        X, Y,
        {.batch_size = kPerRankBatch * world,
         .sampler = std::make_shared<bp::DistributedSampler>(
             bp::DistributedSamplerOptions{.num_replicas = 1, .rank = 0, .seed = 1})});
    std::vector<double> single = train(*single_net, whole, dev, 1);
    double worst = 0;
    std::printf("epoch  data-parallel (%d ranks)  one process, combined batch\n", world);
    for (int e = 0; e < kEpochs; ++e) {
      std::printf("%5d  %24.6f  %28.6f\n", e + 1, parallel[e], single[e]);
      worst = std::max(worst, std::fabs(parallel[e] - single[e]) / std::max(single[e], 1e-12));
    }
    bool falling = parallel.back() < parallel.front() / 5;
    bool same = worst < 1e-4;
    std::printf("loss fell from %.4f to %.6f: %s\n", parallel.front(), parallel.back(),
                falling ? "yes" : "NO");
    std::printf("largest relative difference between the two curves: %.2e (%s)\n", worst,
                same ? "within 1e-4" : "OUT OF TOLERANCE");
    status = falling && same ? 0 : 1;
  }
  d::destroy_process_group();
  return status;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
