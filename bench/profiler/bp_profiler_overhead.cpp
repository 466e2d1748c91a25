// bp-profiler-overhead: what the profiler costs per op. The 1-element add, queued N times and
// synchronised once, with the profiler off (compiled in: Note [Profiler cost when off]) and on,
// interleaved REPS times on one device; prints the median microseconds per op of each, and the
// time stop() takes to resolve the session's device times.
//
//   bp-profiler-overhead DEVICE [N] [REPS]        (defaults 20000 and 7)
//
// "off" against a build without the profiler is bp-tiny-add of the previous commit in the same
// run (tools/gpu/profiler.sh); on the CPU, callgrind counts the instructions of both
// (docs/profiling.md).
#include <backplane/backplane.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double per_op_us(const bp::Tensor& x, const bp::Tensor& y, long n) {
  auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) {
    bp::Tensor z = x + y;
  }
  x.device().synchronize();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / double(n);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: bp-profiler-overhead DEVICE [N] [REPS]\n");
    return 2;
  }
  bp::Device& d = bp::device(argv[1]);
  const long n = argc > 2 ? std::atol(argv[2]) : 20000;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 7;
  if (n <= 0 || reps <= 0) {
    std::fprintf(stderr, "bp-profiler-overhead: N and REPS must be positive\n");
    return 2;
  }
  bp::Tensor x = bp::rand({1}, d), y = bp::rand({1}, d);
  per_op_us(x, y, 200);  // warm up: kernel cache, allocator caches
  bp::profiler::start();
  per_op_us(x, y, 200);
  bp::profiler::stop();
  std::vector<double> off, on, resolve_ms;
  for (int r = 0; r < reps; ++r) {
    off.push_back(per_op_us(x, y, n));
    bp::profiler::start();
    on.push_back(per_op_us(x, y, n));
    auto t0 = Clock::now();
    bp::profiler::stop();
    resolve_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  size_t recorded = 0;
  for (const auto& row : bp::profiler::key_averages())
    if (row.name == "add") recorded = static_cast<size_t>(row.calls);
  std::printf("%s (%s): 1-element add, %ld ops x %d runs, median\n", d.str().c_str(),
              d.properties().name.c_str(), n, reps);
  std::printf("  profiler compiled in, off: %8.3f us/op\n", median(off));
  std::printf(
      "  profiler on:               %8.3f us/op  (+%.3f us/op; %zu adds recorded in the "
      "last run; stop() resolved them in %.1f ms)\n",
      median(on), median(on) - median(off), recorded, median(resolve_ms));
  if (recorded != static_cast<size_t>(n)) {
    std::fprintf(stderr, "bp-profiler-overhead: recorded %zu adds, expected %ld\n", recorded, n);
    return 1;
  }
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "bp-profiler-overhead: %s\n", e.what());
  return 1;
}
