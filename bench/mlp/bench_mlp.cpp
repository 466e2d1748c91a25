// Forward of Linear(1024,1024)-ReLU-Linear(1024,10) at batch 256 on every device, against
// PyTorch on the same machine (bench/mlp/torch_mlp.py, run when python3 has torch).
//
//   bp-bench-mlp [--iters 300] [--warmup 30] [--device cuda:0]... [--no-torch] [--python python3]
//        [--torch-script PATH]
#include "bench_common.hpp"

#include <backplane/nn.hpp>

int main(int argc, char** argv) try {
  bench::Args args = bench::parse_args(
      argc, argv,
      "usage: bp-bench-mlp [--iters N] [--warmup N] [--device D]... [--no-torch] [--python PY]\n"
      "       [--torch-script PATH]\n");
  std::vector<bench::Row> rows;
  for (bp::Device* d : bench::selected_devices(args)) {
    bp::manual_seed(0);
    bp::nn::Sequential net;
    net.add<bp::nn::Linear>(1024, 1024, true, *d);
    net.add<bp::nn::ReLU>();
    net.add<bp::nn::Linear>(1024, 10, true, *d);
    bp::Tensor x = bp::randn({256, 1024}, *d);
    bp::NoGradGuard no_grad;
    bench::Row row;
    row.device = d->str();
    row.description = d->properties().name;
    row.ours = bench::measure(
        *d, [&] { net(x); }, args.iters, args.warmup);
    rows.push_back(row);
  }
  std::vector<bench::TorchResult> torch;
  std::string note = "skipped (--no-torch)";
  if (args.torch) {
    note.clear();
    torch = bench::run_torch(
        args.python, bench::find_script(args, BP_TORCH_MLP_SCRIPT, "bench/mlp/torch_mlp.py"),
        args.iters, note);
  }
  for (bench::Row& r : rows) r.torch = bench::torch_for(torch, bp::device(r.device));
  bench::print_table("MLP forward: Linear(1024,1024)-ReLU-Linear(1024,10), batch 256, f32", rows,
                     note);
  return 0;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
