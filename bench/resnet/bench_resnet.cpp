// ResNet-18 (CIFAR shape, 3x32x32, 10 classes) on each device: training images/s of one SGD
// step with momentum (zero_grad, forward, cross entropy, backward, update) of the f32 model, and
// of the same model under bp::autocast bf16, eager and captured in a bp::Graph and replayed;
// inference latency at batch 1 and throughput at batch 256. One JSON line per result, as bp-bench
// prints, so bench/compare.py puts it beside bench/resnet/torch_resnet.py (PyTorch: eager f32 with
// TF32 off, autocast bf16 with channels-last) in one table:
//
//   python3 bench/compare.py --bp build/bin/bp-bench-resnet
//       --ref-bin bench/resnet/torch_resnet.py --device cuda:0 --repeat 5
//   (one command line)
//
//   bp-bench-resnet [--device D]... [--quick] [--only SUBSTRING] [--batch 256] [--iters N]
//
// Timing: after warm-up, `iters` steps each followed by Device::synchronize(); the median.
#include "resnet/resnet.hpp"

#include <backplane/autocast.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Options {
  std::vector<std::string> devices;
  bool quick = false;
  std::string only;
  int64_t batch = 256;
  int iters = 20, warmup = 3;
};

double median_us(bp::Device& dev, const std::function<void()>& step, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
  dev.synchronize();
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    dev.synchronize();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void emit(const std::string& metric, bp::Device& dev, double value, const char* unit,
          const std::string& note) {
  std::printf(
      "{\"metric\": \"%s\", \"device\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", "
      "\"impl\": \"backplane\", \"note\": \"%s\"}\n",
      metric.c_str(), dev.str().c_str(), value, unit, note.c_str());
  std::fflush(stdout);
}

// One SGD step of an f32 model; with `autocast` set, forward and loss under
// bp::autocast(device type, that dtype), as PyTorch's torch.autocast row runs.
struct Trainer {
  resnet::ResNet18 net;
  bp::Tensor x, y, loss;
  bp::optim::SGD opt;
  std::string type;
  std::optional<bp::DType> autocast;
  Trainer(bp::Device& d, std::optional<bp::DType> low, int64_t batch)
      : net(10, 64, d, bp::DType::f32),
        x(bp::randn({batch, 3, 32, 32}, d)),
        y(bp::argmax(bp::rand({batch, 10}, d), 1)),
        opt(net.parameters(), {.lr = 0.01, .momentum = 0.9}),
        type(d.type()),
        autocast(low) {}
  void step() {
    opt.zero_grad();
    {
      bp::autocast scope(type, autocast, autocast.has_value());
      loss = bp::nn::cross_entropy(net(x), y);
    }
    loss.backward();
    opt.step();
  }
};

void bench_device(bp::Device& dev, const Options& o) {
  auto wanted = [&](const std::string& m) {
    return o.only.empty() || m.find(o.only) != std::string::npos;
  };
  const std::string b = std::to_string(o.batch);
  for (bp::DType dt : {bp::DType::f32, bp::DType::bf16}) {
    const std::string name = dt == bp::DType::f32 ? "f32" : "bf16";
    const std::string eager = "resnet18_train_" + name + "_b" + b;
    const std::string graph = "resnet18_train_" + name + "_graph_b" + b;
    if (!wanted(eager) && !wanted(graph)) continue;
    if (!dev.supports(bp::Op::conv2d, dt) || !dev.supports(bp::Op::batch_norm_backward, dt)) {
      std::fprintf(stderr, "%s: no %s convolution kernels, %s skipped\n", dev.str().c_str(),
                   name.c_str(), eager.c_str());
      continue;
    }
    bp::manual_seed(0);
    Trainer t(dev, dt == bp::DType::f32 ? std::nullopt : std::optional<bp::DType>(dt), o.batch);
    const double us = median_us(
        dev, [&] { t.step(); }, o.iters, o.warmup);
    const std::string how = dt == bp::DType::f32 ? "" : ", autocast bf16";
    if (wanted(eager))
      emit(eager, dev, o.batch / (us * 1e-6), "img/s", "SGD momentum, eager" + how);
    if (wanted(graph)) {
      bp::Graph g = bp::capture(dev, [&] { t.step(); });
      const double gus = median_us(
          dev, [&] { g.replay(); }, o.iters, o.warmup);
      emit(graph, dev, o.batch / (gus * 1e-6), "img/s", "SGD momentum, bp::Graph replay" + how);
    }
  }
  bp::manual_seed(0);
  resnet::ResNet18 net(10, 64, dev);
  net.eval();
  bp::NoGradGuard no_grad;
  if (wanted("resnet18_infer_b1")) {
    bp::Tensor x = bp::randn({1, 3, 32, 32}, dev);
    emit("resnet18_infer_b1", dev,
         median_us(
             dev, [&] { net(x); }, o.iters * 2, o.warmup),
         "us", "f32 latency");
  }
  if (wanted("resnet18_infer_b" + b)) {
    bp::Tensor x = bp::randn({o.batch, 3, 32, 32}, dev);
    const double us = median_us(
        dev, [&] { net(x); }, o.iters, o.warmup);
    emit("resnet18_infer_b" + b, dev, o.batch / (us * 1e-6), "img/s", "f32 throughput");
  }
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw bp::Error("bp-bench-resnet: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--device")
      o.devices.push_back(value());
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--only")
      o.only = value();
    else if (a == "--batch")
      o.batch = std::stoll(value());
    else if (a == "--iters")
      o.iters = std::stoi(value());
    else
      throw bp::Error("bp-bench-resnet: unknown argument " + a);
  }
  if (o.quick) {
    o.batch = std::min<int64_t>(o.batch, 32);
    o.iters = std::min(o.iters, 5);
    o.warmup = 1;
  }
  std::vector<bp::Device*> devs;
  if (o.devices.empty())
    devs = bp::devices();
  else
    for (const auto& d : o.devices) devs.push_back(&bp::device(d));
  for (bp::Device* d : devs) bench_device(*d, o);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bp-bench-resnet: %s\n", e.what());
  return 2;
}
