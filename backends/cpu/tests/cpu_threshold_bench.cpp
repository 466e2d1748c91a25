// Measures where the CPU kernels should stop running serially (Note [CPU serial thresholds] in
// cpu_kernels.hpp). Not a test: run it by hand on the target machine.
//
// For each kernel class it times a dense f32 launch at sizes from 1K to 4M elements twice,
// once forced serial (threshold above every size) and once forced parallel (threshold 1), and
// prints both times and the speed-up. The threshold is the smallest size from which the
// parallel run is faster at every larger size.
//
// Usage: cpu_threshold_bench [repetitions (default 30)]
#include "../cpu_kernels.hpp"

#include <backplane/plugin_abi.h>

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
  int inputs;
  bool reduce;
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
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  std::printf("threads (oneTBB default concurrency): %d\n", tbb::info::default_concurrency());
  const Case cases[] = {{"add (cheap elementwise)", "add", 2, false},
                        {"copy (strided-copy path)", "copy", 1, false},
                        {"exp (transcendental)", "exp", 1, false},
                        {"sum (whole-tensor reduction)", "sum", 1, true}};
  const int64_t max_n = int64_t{1} << 22;
  std::vector<float> a(max_n, 1.5f), b(max_n, 0.25f), o(max_n);
  for (const Case& c : cases) {
    const CpuKernel& k = *bp::cpu::find_kernel(c.op, BP_DTYPE_F32);
    std::printf("\n%s\n%10s %12s %12s %8s\n", c.name, "elements", "serial us", "parallel us",
                "speedup");
    int64_t threshold = -1;
    for (int64_t n = 1024; n <= max_n; n *= 2) {
      std::vector<bp_tensor_desc> in = {dense(a.data(), BP_DTYPE_F32, n)};
      if (c.inputs == 2) in.push_back(dense(b.data(), BP_DTYPE_F32, n));
      bp_tensor_desc out = dense(o.data(), BP_DTYPE_F32, c.reduce ? 1 : n);
      bp::cpu::set_serial_threshold(int64_t{1} << 40);
      const double serial = time_us(k, in, out, reps);
      bp::cpu::set_serial_threshold(1);
      const double parallel = time_us(k, in, out, reps);
      const double speedup = serial / parallel;
      std::printf("%10lld %12.2f %12.2f %8.2f\n", static_cast<long long>(n), serial, parallel,
                  speedup);
      if (speedup > 1.0 && threshold < 0) threshold = n;
      if (speedup <= 1.0) threshold = -1;
    }
    std::printf("parallel wins from %lld elements on\n", static_cast<long long>(threshold));
  }
  return 0;
}
