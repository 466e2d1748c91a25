// A program that knows nothing of the profiler: run with BACKPLANE_TRACE=path, it leaves a
// whole-run trace at exit (observe.env_trace checks it). On every device: x = ones(n); two adds;
// a read to the host. With `--snapshot PATH` it also records the memory history, keeps a few
// blocks of different sizes alive on cpu:0 and writes memory_snapshot(cpu:0) there. With
// `--hold` it allocates 3 MiB on cpu:0, prints "holding" and sleeps (at most 120 s) until killed
// (observe.smi_watch, with BACKPLANE_PUBLISH_STATS=1).
#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc == 2 && !std::strcmp(argv[1], "--hold")) {
    bp::Tensor held = bp::ones({3 << 18}, bp::device("cpu:0"));  // 3 MiB of f32
    std::printf("holding\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  const char* snapshot = argc > 2 && !std::strcmp(argv[1], "--snapshot") ? argv[2] : nullptr;
  if (snapshot) bp::record_memory_history(true);
  std::vector<bp::Tensor> keep;
  if (snapshot) {
    bp::Device& cpu = bp::device("cpu:0");
    keep.push_back(bp::ones({1 << 16}, cpu));
    keep.push_back(keep[0] * 3);
    keep.push_back(bp::ones({1000, 64}, cpu).exp());
    keep.push_back(bp::zeros({12345}, cpu, bp::DType::i64));
  }
  for (bp::Device* d : bp::devices()) {
    auto x = bp::ones({257}, *d);
    auto y = (x + x) + x;
    float v = y.to_vector<float>()[0];
    if (v != 3.0f) {
      std::fprintf(stderr, "%s: got %g, expected 3\n", d->str().c_str(), v);
      return 1;
    }
  }
  if (snapshot) {
    std::ofstream f(snapshot);
    f << bp::memory_snapshot(bp::device("cpu:0")).json();
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", snapshot);
      return 1;
    }
  }
  std::printf("done\n");
  return 0;
}
