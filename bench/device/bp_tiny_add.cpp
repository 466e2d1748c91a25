// bp-tiny-add: N one-element additions on one device, then one synchronisation. Made for
// instruction counts of the per-op path under callgrind, where only the loop is collected:
//
//   valgrind --tool=callgrind --toggle-collect=bp_tiny_add_loop bp-tiny-add cpu:0 10000
//
// gives the instructions of N ops (plus one sync); divide by N for the per-op cost. Prints the
// host microseconds per op as well (meaningless under valgrind, useful without it).
#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

extern "C" __attribute__((noinline)) void bp_tiny_add_loop(const bp::Tensor& x, const bp::Tensor& y,
                                                           long n) {
  for (long i = 0; i < n; ++i) {
    bp::Tensor z = x + y;
  }
  x.device().synchronize();
}

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bp-tiny-add DEVICE N\n");
    return 2;
  }
  bp::Device& d = bp::device(argv[1]);
  const long n = std::atol(argv[2]);
  bp::Tensor x = bp::rand({1}, d), y = bp::rand({1}, d);
  bp_tiny_add_loop(x, y, 100);  // warm up: kernel cache, allocator caches
  auto t0 = std::chrono::steady_clock::now();
  bp_tiny_add_loop(x, y, n);
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %ld one-element adds, %.3f us/op\n", d.str().c_str(), n, us / double(n));
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "bp-tiny-add: %s\n", e.what());
  return 1;
}
