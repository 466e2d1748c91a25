// torch-per-op: libtorch's (PyTorch's C++ API) per-op costs, measured exactly as bp-bench
// measures Backplane's (bench/device/bp_bench.cpp, bench_overheads), so that a per-op ratio is
// C++ against C++ on one machine in one run. It prints bp-bench's JSON lines, so
// bench/compare.py takes it as the reference:
//
//   python3 bench/compare.py --device cuda:0 --only 1-element --ref-bin torch-per-op
//
// Built against the libtorch that PyTorch's pip package ships (headers and libraries), by
// tools/gpu/libtorch_bench.sh on the GPU machine; it is not part of the CMake build, which must
// not need PyTorch.
//
//   torch-per-op [--device cpu:0|cuda:N]... [--quick] [--only SUBSTRING]
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <torch/version.h>
#ifdef BP_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

bool g_quick = false;
std::string g_only;

bool wanted(const std::string& metric) {
  return g_only.empty() || metric.find(g_only) != std::string::npos;
}

void sync(const c10::Device& d) {
#ifdef BP_TORCH_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)d;
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Host wall-clock microseconds per call, median of `reps` batches of `inner` calls after one
// warm-up batch (bp-bench's host_us).
double host_us(const c10::Device& d, const std::function<void()>& fn, int reps, int inner) {
  for (int i = 0; i < inner; ++i) fn();
  sync(d);
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) fn();
    sync(d);
    samples.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        inner);
  }
  return median(samples);
}

void emit(const std::string& metric, const std::string& device, double value, const char* unit) {
  std::printf(
      "{\"metric\": \"%s\", \"device\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"impl\": "
      "\"libtorch %s (C++)\"}\n",
      metric.c_str(), device.c_str(), value, unit, TORCH_VERSION);
  std::fflush(stdout);
  std::fprintf(stderr, "  %-44s %-10s %12.3f %s\n", metric.c_str(), device.c_str(), value, unit);
}

void bench_overheads(const std::string& name) {
  const c10::Device d(name);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(d);
  const std::string alloc = "alloc+free 1 MiB", queued = "1-element add queued",
                    inplace = "1-element add_ in place queued", synced = "1-element add + sync";
  if (wanted(alloc)) {
    const auto u8 = at::TensorOptions().dtype(at::kByte).device(d);
    emit(alloc, name,
         host_us(
             d, [&] { auto b = at::empty({1 << 20}, u8); }, 11, 2000),
         "us");
  }
  at::Tensor x = at::rand({1}, f32), y = at::rand({1}, f32);
  if (wanted(queued))
    emit(queued, name,
         host_us(
             d, [&] { auto z = x + y; }, 5, g_quick ? 2000 : 20000),
         "us/op");
  if (wanted(inplace)) {
    at::Tensor acc = at::zeros({1}, f32);
    emit(inplace, name,
         host_us(
             d, [&] { acc.add_(y); }, 5, g_quick ? 2000 : 20000),
         "us/op");
  }
  if (wanted(synced))
    emit(synced, name,
         host_us(
             d,
             [&] {
               auto z = x + y;
               sync(d);
             },
             5, g_quick ? 500 : 5000),
         "us/op");
}

// bp-bench's bench_graphs: 1000 one-element add_ queued eagerly, and captured in a CUDA graph
// (at::cuda::CUDAGraph, captured on a side stream as PyTorch requires) and replayed.
void bench_graphs(const std::string& name) {
  const std::string eager = "1000 tiny add_ eager", replay = "1000 tiny add_ graph replay";
  if (!wanted(eager) && !wanted(replay)) return;
  constexpr int kOps = 1000;
  const c10::Device d(name);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(d);
  at::Tensor acc = at::zeros({1}, f32), y = at::rand({1}, f32);
  auto block = [&] {
    for (int i = 0; i < kOps; ++i) acc.add_(y);
  };
  if (wanted(eager)) emit(eager, name, host_us(d, block, 5, g_quick ? 2 : 20) / kOps, "us/op");
#ifdef BP_TORCH_CUDA
  if (wanted(replay) && d.is_cuda()) {
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
      c10::cuda::CUDAStreamGuard guard(side);
      block();  // warm-up on the capture stream
      side.synchronize();
      graph.capture_begin();
      block();
      graph.capture_end();
    }
    emit(replay, name,
         host_us(
             d, [&] { graph.replay(); }, 5, g_quick ? 5 : 50) /
             kOps,
         "us/op");
  }
#endif
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> devices;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) {
      devices.push_back(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      g_quick = true;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      g_only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: torch-per-op [--device DEV]... [--quick] [--only SUBSTRING]\n");
      return 2;
    }
  }
  if (devices.empty()) {
    devices.push_back("cpu:0");
#ifdef BP_TORCH_CUDA
    if (at::hasCUDA()) devices.insert(devices.begin(), "cuda:0");
#endif
  }
  for (const std::string& dev : devices) {
    std::fprintf(stderr, "%s (libtorch %s)\n", dev.c_str(), TORCH_VERSION);
    const std::string torch_name = dev.rfind("cpu", 0) == 0 ? std::string("cpu") : dev;
    bench_overheads(torch_name);  // PyTorch's "cpu"
    bench_graphs(torch_name);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "torch-per-op: %s\n", e.what());
  return 1;
}
