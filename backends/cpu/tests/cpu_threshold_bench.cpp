// Measures the parallel policy of the CPU kernels (Note [CPU serial thresholds] in
// cpu_kernels.hpp). Not a test: run it by hand on the target machine.
//
// For each cost class it times a dense f32 kernel (add, exp, sum, and a dense copy, which is a
// memcpy) in two steps:
//   1. grain: at 4M elements, forced parallel, for task grains from 256 elements up; the best
//      grain is the largest within 5% of the fastest.
//   2. threshold: at sizes from 1K to 4M elements, forced serial and forced parallel with that
//      grain; the serial threshold is the smallest size from which the parallel run is faster
//      at every larger size.
// Medians of `repetitions` launches after three warm-ups.
//
// Usage: cpu_threshold_bench [repetitions (default 30)] [threads (default: all)]
#include "../cpu_kernels.hpp"

#include <backplane/abi/plugin_abi.h>

#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using bp::cpu::CpuKernel;

bp_tensor_desc dense(void* p, bp_dtype dtype, int64_t n) {
  bp_tensor_desc d{};
  d.struct_size = sizeof(d);
  d.buffer = static_cast<bp_buffer*>(p);
  d.dtype = dtype;
  d.rank = 1;
  d.shape[0] = n;
  d.strides[0] = 1;
  return d;
}

struct Case {
  const char* name;
  const char* op;
  bp::cpu::Cost cost;
  int inputs;
  bool reduce;
  int64_t unit;  // bytes per element for kBytes, else 1
};

// Median wall time in microseconds of `reps` launches.
double time_us(const CpuKernel& k, const std::vector<bp_tensor_desc>& in, const bp_tensor_desc& out,
               int reps) {
  const bp::sdk::Attrs attrs(nullptr, 0);
  std::vector<double> t;
  for (int r = 0; r < reps + 3; ++r) {
    const auto a = std::chrono::steady_clock::now();
    bp::cpu::run_kernel(k, in.data(), static_cast<int32_t>(in.size()), &out, 1, attrs);
    const auto b = std::chrono::steady_clock::now();
    if (r >= 3) t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using bp::cpu::Cost;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  const int threads = argc > 2 ? std::atoi(argv[2]) : tbb::info::default_concurrency();
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                                  static_cast<size_t>(threads));
  std::printf("threads: %d (oneTBB default concurrency %d)\n", threads,
              tbb::info::default_concurrency());
  const Case cases[] = {
      {"add (cheap elementwise)", "add", Cost::kCheap, 2, false, 1},
      {"exp (transcendental)", "exp", Cost::kTranscendental, 1, false, 1},
      {"sum (whole-tensor reduction)", "sum", Cost::kReduction, 1, true, 1},
      {"copy of a dense tensor (memcpy, bytes)", "copy", Cost::kBytes, 1, false, 4}};
  const int64_t max_n = int64_t{1} << 22;
  const int64_t never = int64_t{1} << 60;
  std::vector<float> a(max_n, 1.5f), b(max_n, 0.25f), o(max_n);
  auto descs = [&](const Case& c, int64_t n) {
    std::vector<bp_tensor_desc> in = {dense(a.data(), BP_DTYPE_F32, n)};
    if (c.inputs == 2) in.push_back(dense(b.data(), BP_DTYPE_F32, n));
    return std::make_pair(in, dense(o.data(), BP_DTYPE_F32, c.reduce ? 1 : n));
  };
  for (const Case& c : cases) {
    const CpuKernel& k = *bp::cpu::kernel_for(bp_op_from_name(c.op), BP_DTYPE_F32);
    std::printf("\n%s\n  grain at %lld elements (forced parallel):\n", c.name,
                static_cast<long long>(max_n));
    const auto [in_max, out_max] = descs(c, max_n);
    std::vector<std::pair<int64_t, double>> grains;
    for (int64_t g = 256; g <= max_n / 16; g *= 2) {
      bp::cpu::set_parallelism(c.cost, {0, g * c.unit});
      grains.push_back({g, time_us(k, in_max, out_max, reps)});
      std::printf("%12lld %10.2f us\n", static_cast<long long>(g), grains.back().second);
    }
    double fastest = grains[0].second;
    for (const auto& [g, t] : grains) fastest = std::min(fastest, t);
    int64_t grain = grains[0].first;
    for (const auto& [g, t] : grains)
      if (t <= 1.05 * fastest) grain = g;
    std::printf("  chosen grain: %lld elements\n", static_cast<long long>(grain));
    std::printf("%12s %12s %12s %8s\n", "elements", "serial us", "parallel us", "speedup");
    int64_t threshold = -1;
    for (int64_t n = 1024; n <= max_n; n *= 2) {
      const auto [in, out] = descs(c, n);
      bp::cpu::set_parallelism(c.cost, {never, grain * c.unit});
      const double serial = time_us(k, in, out, reps);
      bp::cpu::set_parallelism(c.cost, {0, grain * c.unit});
      const double parallel = time_us(k, in, out, reps);
      const double speedup = serial / parallel;
      std::printf("%12lld %12.2f %12.2f %8.2f\n", static_cast<long long>(n), serial, parallel,
                  speedup);
      if (speedup > 1.0 && threshold < 0) threshold = n;
      if (speedup <= 1.0) threshold = -1;
    }
    std::printf("  => serial below %lld elements, grain %lld elements\n",
                static_cast<long long>(threshold), static_cast<long long>(grain));
  }
  return 0;
}
