// One SGD training step of Linear(1024,1024)-ReLU-Linear(1024,10) at batch 256 on every device:
// zero_grad, forward, cross-entropy, backward, SGD update (lr 0.01, momentum 0.9), against
// PyTorch on the same machine (bench/train/torch_train.py, run when python3 has torch); then
// the same step captured in a bp::Graph and replayed, against PyTorch's eager step and its own
// CUDA-graph replay, and the losses of 20 eager and 20 replayed steps compared.
//
//   bp-bench-train [--iters 300] [--warmup 30] [--device cuda:0]... [--no-torch] [--python python3]
//        [--torch-script PATH]
#include "bench_common.hpp"

#include <backplane/graph.hpp>
#include <backplane/nn.hpp>
#include <backplane/train.hpp>

#include <cmath>
#include <memory>

namespace {

struct Net {
  bp::nn::Sequential net;
  bp::Tensor x, y, loss;
  std::unique_ptr<bp::optim::SGD> opt;
  explicit Net(bp::Device& d) {
    bp::manual_seed(0);
    net.add<bp::nn::Linear>(1024, 1024, true, d);
    net.add<bp::nn::ReLU>();
    net.add<bp::nn::Linear>(1024, 10, true, d);
    x = bp::randn({256, 1024}, d);
    std::vector<int64_t> labels(256);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7) % 10);
    y = bp::from_vector(labels, {256}, d);
    opt = std::make_unique<bp::optim::SGD>(net.parameters(),
                                           bp::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  }
  void step() {
    opt->zero_grad();
    loss = bp::nn::cross_entropy(net(x), y);
    loss.backward();
    opt->step();
  }
};

// The losses of `steps` steps run eagerly and of the same steps replayed from a graph captured
// after one eager step (momentum buffers exist then), from the same initial weights: the
// largest difference (0: identical).
double loss_difference(bp::Device& d, int steps) {
  Net eager(d), replayed(d);
  double worst = 0;
  eager.step();
  replayed.step();
  bp::Graph g = bp::capture(d, [&] { replayed.step(); });
  for (int k = 1; k < steps; ++k) {
    eager.step();
    g.replay();
    worst = std::max(worst, std::fabs(static_cast<double>(eager.loss.item<float>()) -
                                      replayed.loss.item<float>()));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::Args args = bench::parse_args(
      argc, argv,
      "usage: bp-bench-train [--iters N] [--warmup N] [--device D]... [--no-torch] [--python PY]\n"
      "       [--torch-script PATH]\n");
  std::vector<bench::Row> rows, graph_rows;
  std::vector<double> diffs;
  for (bp::Device* d : bench::selected_devices(args)) {
    Net n(*d);
    bench::Row row;
    row.device = d->str();
    row.description = d->properties().name;
    row.ours = bench::measure(
        *d, [&] { n.step(); }, args.iters, args.warmup);
    rows.push_back(row);
    // The same step captured once (after the warm-up above) and replayed.
    bp::Graph g = bp::capture(*d, [&] { n.step(); });
    bench::Row grow = row;
    grow.description += g.native() ? " (native graph)" : " (recorded graph)";
    grow.ours = bench::measure(
        *d, [&] { g.replay(); }, args.iters, args.warmup);
    graph_rows.push_back(grow);
    diffs.push_back(loss_difference(*d, 20));
  }
  std::vector<bench::TorchResult> torch;
  std::string note = "skipped (--no-torch)";
  if (args.torch) {
    note.clear();
    torch = bench::run_torch(
        args.python, bench::find_script(args, BP_TORCH_TRAIN_SCRIPT, "bench/train/torch_train.py"),
        args.iters, note);
  }
  for (bench::Row& r : rows) r.torch = bench::torch_for(torch, bp::device(r.device));
  for (bench::Row& r : graph_rows) r.torch = bench::torch_for(torch, bp::device(r.device));
  bench::print_table(
      "MLP training step (SGD, momentum 0.9, cross-entropy): Linear(1024,1024)-ReLU-"
      "Linear(1024,10), batch 256, f32",
      rows, note);
  bench::print_table(
      "The same step captured in a bp::Graph and replayed, against PyTorch's eager step",
      graph_rows, note);
  std::printf(
      "\nReplayed step against PyTorch's own CUDA-graph replay of that step (torch.cuda.graph):\n");
  for (const bench::Row& r : graph_rows) {
    if (r.torch && r.torch->has_graph)
      std::printf(
          "  %-8s replay %9.1f us (queued %9.1f) vs PyTorch graph %9.1f us (queued %9.1f): "
          "%.2fx / %.2fx\n",
          r.device.c_str(), r.ours.median_us, r.ours.queued_us, r.torch->graph.median_us,
          r.torch->graph.queued_us, r.ours.median_us / r.torch->graph.median_us,
          r.ours.queued_us / r.torch->graph.queued_us);
    else
      std::printf("  %-8s replay %9.1f us (queued %9.1f); no PyTorch graph for this device\n",
                  r.device.c_str(), r.ours.median_us, r.ours.queued_us);
  }
  std::printf("\nLosses of 20 steps, eager against graph replay (same initial weights):\n");
  for (size_t i = 0; i < graph_rows.size(); ++i)
    std::printf("  %-8s largest difference %.3g%s\n", graph_rows[i].device.c_str(), diffs[i],
                diffs[i] == 0 ? " (identical)" : "");
  return 0;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
