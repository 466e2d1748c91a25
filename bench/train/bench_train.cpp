// One SGD training step of Linear(1024,1024)-ReLU-Linear(1024,10) at batch 256 on every device:
// zero_grad, forward, cross-entropy, backward, SGD update (lr 0.01, momentum 0.9), against
// PyTorch on the same machine (bench/train/torch_train.py, run when python3 has torch).
//
//   bp-bench-train [--iters 300] [--warmup 30] [--device cuda:0]... [--no-torch] [--python python3]
//        [--torch-script PATH]
#include "bench_common.hpp"

#include <backplane/nn.hpp>
#include <backplane/train.hpp>

int main(int argc, char** argv) try {
  bench::Args args = bench::parse_args(
      argc, argv,
      "usage: bp-bench-train [--iters N] [--warmup N] [--device D]... [--no-torch] [--python PY]\n"
      "       [--torch-script PATH]\n");
  std::vector<bench::Row> rows;
  for (bp::Device* d : bench::selected_devices(args)) {
    bp::manual_seed(0);
    bp::nn::Sequential net;
    net.add<bp::nn::Linear>(1024, 1024, true, *d);
    net.add<bp::nn::ReLU>();
    net.add<bp::nn::Linear>(1024, 10, true, *d);
    bp::Tensor x = bp::randn({256, 1024}, *d);
    std::vector<int64_t> labels(256);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7) % 10);
    bp::Tensor y = bp::from_vector(labels, {256}, *d);
    bp::optim::SGD opt(net.parameters(), {.lr = 0.01, .momentum = 0.9});
    auto step = [&] {
      opt.zero_grad();
      bp::Tensor loss = bp::nn::cross_entropy(net(x), y);
      loss.backward();
      opt.step();
    };
    bench::Row row;
    row.device = d->str();
    row.description = d->properties().name;
    row.ours = bench::measure(*d, step, args.iters, args.warmup);
    rows.push_back(row);
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
  bench::print_table(
      "MLP training step (SGD, momentum 0.9, cross-entropy): Linear(1024,1024)-ReLU-"
      "Linear(1024,10), batch 256, f32",
      rows, note);
  return 0;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
