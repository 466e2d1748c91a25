// A program that knows nothing of the profiler: run with BACKPLANE_TRACE=path, it leaves a
// whole-run trace at exit (observe.env_trace checks it). On every device: x = ones(n); two adds;
// a read to the host.
#include <backplane/backplane.hpp>

#include <cstdio>

int main() {
  for (bp::Device* d : bp::devices()) {
    auto x = bp::ones({257}, *d);
    auto y = (x + x) + x;
    float v = y.to_vector<float>()[0];
    if (v != 3.0f) {
      std::fprintf(stderr, "%s: got %g, expected 3\n", d->str().c_str(), v);
      return 1;
    }
  }
  std::printf("done\n");
  return 0;
}
