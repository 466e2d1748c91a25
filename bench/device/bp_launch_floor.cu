// bp-launch-floor: where one tiny op's host time goes on a CUDA device, layer by layer, in one
// run (issue 13's breakdown of the per-op cost above a bare launch):
//
//   1. empty kernel, queued                      the runtime's launch floor on this machine
//   2. one-element add kernel, queued            the same with an add's arguments
//   3. the CUDA plugin's launch slot, direct     + the plugin: checks, plan, vector test
//   4. Backplane acc.add_(y)                      + libbackplane: checks, kernel cache, autograd
//                                                  test, descriptors (no allocation)
//   5. Backplane z = x + y                        + the output tensor's allocation and free
//   6. empty kernel + cudaStreamSynchronize, and z = x + y + Device::synchronize
//   7. 1000 acc.add_(y) captured in a bp::Graph, replayed, per op
//
//   bp-launch-floor [--device cuda:0] [--ops 20000]
//
// Each row: host microseconds per op, median of 5 batches of `ops` calls, each batch followed by
// one synchronisation. Plain numbers for a report; the layer costs are the differences.
#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/plugin_abi.h>
#include <backplane/backplane.hpp>

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

__global__ void empty_kernel() {}
__global__ void add_kernel(float* out, const float* a, const float* b, long long n) {
  long long i = blockIdx.x * 256LL + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "bp-launch-floor: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double per_op_us(const std::function<void()>& batch, const std::function<void()>& sync, long ops) {
  batch();
  sync();
  std::vector<double> s;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    batch();
    sync();
    s.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        double(ops));
  }
  return median(s);
}

void row(const char* what, double us, double floor) {
  std::printf("  %-46s %8.3f us/op   %+7.3f us over the empty launch\n", what, us, us - floor);
}

const bp_plugin_api* cuda_table() {
  for (const bp::PluginReport& r : bp::load_report()) {
    if (r.device_type != "cuda" || r.status != bp::PluginReport::Status::loaded) continue;
    void* h = dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) h = dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) break;
    auto get = reinterpret_cast<bp_plugin_get_api_fn>(dlsym(h, BP_PLUGIN_ENTRY_SYMBOL));
    return get ? get(BP_ABI_MAJOR, BP_ABI_MINOR) : nullptr;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dev_name = "cuda:0";
  long ops = 20000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) {
      dev_name = argv[++i];
    } else if (!std::strcmp(argv[i], "--ops") && i + 1 < argc) {
      ops = std::max(100L, std::atol(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bp-launch-floor [--device cuda:N] [--ops N]\n");
      return 2;
    }
  }
  bp::Device& d = bp::device(dev_name);
  if (d.type() != "cuda") {
    std::fprintf(stderr, "bp-launch-floor: %s is not a CUDA device\n", dev_name.c_str());
    return 2;
  }
  std::printf("%s (%s): host time per one-element op, %ld ops per batch, median of 5\n",
              d.str().c_str(), d.properties().name.c_str(), ops);

  // 1-2: the bare runtime on a stream of our own.
  CHECK_CUDA(cudaSetDevice(d.index()));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, 3 * 256));
  auto sync_raw = [&] { CHECK_CUDA(cudaStreamSynchronize(s)); };
  const double floor = per_op_us(
      [&] {
        for (long i = 0; i < ops; ++i) empty_kernel<<<1, 32, 0, s>>>();
      },
      sync_raw, ops);
  row("empty kernel, queued (cudaLaunchKernel)", floor, floor);
  row("one-element add kernel, queued",
      per_op_us(
          [&] {
            for (long i = 0; i < ops; ++i)
              add_kernel<<<1, 256, 0, s>>>(buf, buf + 64, buf + 128, 1);
          },
          sync_raw, ops),
      floor);

  const long synced_ops = std::max(100L, ops / 4);
  row("empty kernel + cudaStreamSynchronize",
      per_op_us(
          [&] {
            for (long i = 0; i < synced_ops; ++i) {
              empty_kernel<<<1, 32, 0, s>>>();
              CHECK_CUDA(cudaStreamSynchronize(s));
            }
          },
          sync_raw, synced_ops),
      floor);

  // 3: the plugin's launch slot with prepared descriptors, no libbackplane in between.
  bp::Tensor x = bp::rand({1}, d), y = bp::rand({1}, d), acc = bp::zeros({1}, d);
  if (const bp_plugin_api* api = cuda_table()) {
    bp_kernel* k = nullptr;
    bp_stream* ps = nullptr;
    if (!api->find_kernel_id(d.index(), BP_OP_ADD, BP_DTYPE_F32, &k) &&
        !api->stream_create(d.index(), &ps)) {
      bp_buffer* b[3] = {};
      for (auto& bb : b)
        if (bp_error* e = api->mem_alloc(d.index(), ps, 4, &bb)) api->error_free(e);
      bp_tensor_desc t[3];
      for (int i = 0; i < 3; ++i) {
        std::memset(&t[i], 0, sizeof t[i]);
        t[i].struct_size = sizeof t[i];
        t[i].buffer = b[i];
        t[i].dtype = BP_DTYPE_F32;
        t[i].rank = 1;
        t[i].shape[0] = 1;
        t[i].strides[0] = 1;
      }
      row("CUDA plugin launch slot, direct",
          per_op_us(
              [&] {
                for (long i = 0; i < ops; ++i)
                  if (bp_error* e = api->launch(k, ps, t, 2, t + 2, 1, nullptr, 0))
                    api->error_free(e);
              },
              [&] { api->stream_synchronize(ps); }, ops),
          floor);
      for (int i = 0; i < 3; ++i) api->mem_free(d.index(), ps, b[i], 4);
      api->stream_destroy(ps);
    }
  } else {
    std::printf("  (the CUDA plugin's table could not be opened: row 3 skipped)\n");
  }

  // 4-6: through libbackplane.
  auto sync_bp = [&] { d.synchronize(); };
  row("Backplane acc.add_(y), queued",
      per_op_us(
          [&] {
            for (long i = 0; i < ops; ++i) acc.add_(y);
          },
          sync_bp, ops),
      floor);
  row("Backplane z = x + y, queued",
      per_op_us(
          [&] {
            for (long i = 0; i < ops; ++i) bp::Tensor z = x + y;
          },
          sync_bp, ops),
      floor);
  row("Backplane z = x + y, then Device::synchronize",
      per_op_us(
          [&] {
            for (long i = 0; i < synced_ops; ++i) {
              bp::Tensor z = x + y;
              d.synchronize();
            }
          },
          sync_bp, synced_ops),
      floor);
  bp::Graph g = bp::capture(d, [&] {
    for (int i = 0; i < 1000; ++i) acc.add_(y);
  });
  const long replays = std::max(1L, ops / 1000);
  row("1000 acc.add_(y) in a bp::Graph, replayed",
      per_op_us(
          [&] {
            for (long i = 0; i < replays; ++i) g.replay();
          },
          sync_bp, replays * 1000),
      floor);
  CHECK_CUDA(cudaFree(buf));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "bp-launch-floor: %s\n", e.what());
  return 1;
}
