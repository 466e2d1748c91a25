// bp-profile-mlp-step: a profiler trace of the MLP training step of bp-bench-train
// (Linear(1024,1024)-ReLU-Linear(1024,10), batch 256, cross-entropy, SGD with momentum) on one
// device, with the per-op table and a memory snapshot.
//
//   bp-profile-mlp-step DEVICE OUT_PREFIX [STEPS]     (default 5 steps, after 10 warm-up steps)
//
// Writes OUT_PREFIX.trace.json (open it in https://ui.perfetto.dev or chrome://tracing) and
// OUT_PREFIX.snapshot.json (tools/bp-memviz turns either into an HTML page), and prints the
// table (bp::profiler::table()) and the wall time per step with and without the profiler.
#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

int main(int argc, char** argv) try {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: bp-profile-mlp-step DEVICE OUT_PREFIX [STEPS]\n");
    return 2;
  }
  bp::Device& d = bp::device(argv[1]);
  const std::string prefix = argv[2];
  const int steps = argc > 3 ? std::atoi(argv[3]) : 5;
  if (steps <= 0) {
    std::fprintf(stderr, "bp-profile-mlp-step: STEPS must be positive\n");
    return 2;
  }
  bp::record_memory_history(true);
  bp::manual_seed(0);
  bp::nn::Sequential net;
  net.add<bp::nn::Linear>(1024, 1024, true, d);
  net.add<bp::nn::ReLU>();
  net.add<bp::nn::Linear>(1024, 10, true, d);
  bp::Tensor x = bp::randn({256, 1024}, d);
  std::vector<int64_t> labels(256);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7) % 10);
  bp::Tensor y = bp::from_vector(labels, {256}, d);
  bp::optim::SGD opt(net.parameters(), {.lr = 0.01, .momentum = 0.9});
  auto step = [&] {
    bp::profiler::Range r("train_step");
    opt.zero_grad();
    bp::Tensor loss = bp::nn::cross_entropy(net(x), y);
    loss.backward();
    opt.step();
  };
  auto timed = [&](int n) {
    d.synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) step();
    d.synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
               .count() /
           n;
  };
  timed(10);  // warm up
  double off_us = timed(steps);
  bp::profiler::start();
  double on_us = timed(steps);
  bp::profiler::stop();
  bp::profiler::save(prefix + ".trace.json");
  {
    std::ofstream f(prefix + ".snapshot.json");
    f << bp::memory_snapshot(d).json();
    if (!f) throw bp::IOError("cannot write " + prefix + ".snapshot.json");
  }
  std::printf("%s (%s): MLP training step, %d steps\n", d.str().c_str(),
              d.properties().name.c_str(), steps);
  std::printf("  wall per step: %.1f us without the profiler, %.1f us with it\n", off_us, on_us);
  std::printf("%s", bp::profiler::table(25).c_str());
  std::printf("wrote %s.trace.json and %s.snapshot.json\n", prefix.c_str(), prefix.c_str());
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "bp-profile-mlp-step: %s\n", e.what());
  return 1;
}
