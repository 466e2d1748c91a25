// docs/names.md, walkthrough item 16: large matrix products on every GPU of the machine at the same
// time versus the same number one after the other on one GPU. Each device has its own stream, so
// the products queued on different GPUs overlap; the speed-up should be close to the number of
// GPUs.
#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

int main() try {
  std::vector<bp::Device*> gpus = bp::all_devices("cuda");
  if (gpus.size() < 2) {
    std::printf("needs two GPUs or more; found %zu CUDA device(s)\n", gpus.size());
    return 0;
  }
  const int g = static_cast<int>(gpus.size());
  const int64_t n = 8192;
  const int reps = 10;
  std::vector<bp::Tensor> as, bs;
  for (int k = 0; k < g; ++k) {
    as.push_back(bp::rand({n, n}, *gpus[k]));
    bs.push_back(bp::rand({n, n}, *gpus[k]));
    (void)bp::matmul(as[k], bs[k]);
  }
  bp::synchronize();
  auto time = [&](auto fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    bp::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double one = time([&] {
    for (int r = 0; r < g * reps; ++r) (void)bp::matmul(as[0], bs[0]);
  });
  double all = time([&] {
    for (int r = 0; r < reps; ++r)
      for (int k = 0; k < g; ++k) (void)bp::matmul(as[k], bs[k]);
  });
  std::printf(
      "%d products of %lldx%lld f32: one GPU %.1f ms, %d GPUs %.1f ms, speed-up %.2fx "
      "(%.2f of %d)\n",
      g * reps, static_cast<long long>(n), static_cast<long long>(n), one * 1e3, g, all * 1e3,
      one / all, one / all / g, g);
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
