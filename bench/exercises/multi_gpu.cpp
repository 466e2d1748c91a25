// WALKTHROUGH item 16: two large matrix products on two GPUs at the same time versus one after
// the other on one GPU. Each device has its own stream, so the products queued on different
// GPUs overlap; the speed-up should be close to the number of GPUs.
#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

int main() try {
  std::vector<bp::Device*> gpus = bp::all_devices("cuda");
  if (gpus.size() < 2) {
    std::printf("needs two GPUs; found %zu CUDA device(s): %s\n",
                bp::num_devices("cuda") > 0 ? gpus.size() : 0, gpus[0]->str().c_str());
    return 0;
  }
  const int64_t n = 8192;
  const int reps = 10;
  std::vector<bp::Tensor> as, bs;
  for (int k = 0; k < 2; ++k) {
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
    for (int r = 0; r < 2 * reps; ++r) (void)bp::matmul(as[0], bs[0]);
  });
  double two = time([&] {
    for (int r = 0; r < reps; ++r)
      for (int k = 0; k < 2; ++k) (void)bp::matmul(as[k], bs[k]);
  });
  std::printf("%d products of %lldx%lld f32: one GPU %.1f ms, two GPUs %.1f ms, speed-up %.2fx\n",
              2 * reps, static_cast<long long>(n), static_cast<long long>(n), one * 1e3, two * 1e3,
              one / two);
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
