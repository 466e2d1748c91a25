// docs/names.md, walkthrough item 14: a large matrix product on the CPU and on the GPU, timed, and
// a tiny one, to show where the GPU stops paying off (launch and transfer costs dominate small
// work).
#include <backplane/backplane.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {
// Median wall time in microseconds of `reps` products (synchronised, after one warm-up).
double time_us(bp::Device& d, int64_t n, int reps) {
  auto a = bp::rand({n, n}, d), b = bp::rand({n, n}, d);
  auto c = bp::matmul(a, b);
  d.synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    c = bp::matmul(a, b);
    d.synchronize();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main() try {
  std::vector<bp::Device*> devs = {&bp::device("cpu:0")};
  if (bp::num_devices("cuda") > 0) devs.push_back(&bp::device("cuda:0"));
  std::printf("%-8s %8s %14s %12s\n", "device", "n", "time (us)", "GFLOP/s");
  for (int64_t n : {4, 16, 64, 256, 1024, 2048}) {
    for (bp::Device* d : devs) {
      double us = time_us(*d, n, n >= 1024 ? 5 : 50);
      std::printf("%-8s %8lld %14.1f %12.1f\n", d->str().c_str(), static_cast<long long>(n), us,
                  2.0 * n * n * n / us / 1e3);
    }
  }
  if (devs.size() == 1) std::printf("(no GPU found: only the CPU was timed)\n");
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
