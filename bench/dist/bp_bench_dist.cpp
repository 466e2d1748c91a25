// bp-bench-dist: collectives and data-parallel training across the ranks of a process group,
// run under bp-run (tools/gpu/dist.sh runs it beside bench/dist/torch_dist.py and prints the
// ratios with bench/dist/compare_dist.py).
//
//   bp-run -n 2 bp-bench-dist collectives [--sizes 64K,1,4,64,256] [--dtypes f32,bf16] [--iters 20]
//   bp-run -n 2 bp-bench-dist latency [--iters 2000]
//   bp-run -n 2 bp-bench-dist ddp [--steps 60] [--warmup 10] [--batch 1024]
//   bp-run -n 2 bp-bench-dist curve [--steps 20] [--combined 2048]
//
// Rank 0 prints RESULT lines (the same as torch_dist.py's):
//   RESULT collective <op> <dtype> <size> <us per op> <algbw GB/s> <busbw GB/s>
//   RESULT latency all_reduce f32 4B <us per call>
// A size is MiB, or KiB with a K suffix ("64K"); sizes under 64 MiB run at least 200 calls.
// Each timed loop runs --repeat times (default 5); the median is printed.
//   RESULT ddp <world> <batch per rank> <samples/s> <ms per step>
//   RESULT curve <world> <step> <loss averaged over ranks>
// Bus bandwidth follows nccl-tests: all_reduce algbw * 2(n-1)/n; all_gather and reduce_scatter
// algbw * (n-1)/n, where the size is the whole buffer (all_gather's output, reduce_scatter's
// input). Each rank uses cuda:<local rank> (the CPU when there is no GPU, for smoke tests).
#include <backplane/backplane.hpp>
#include <backplane/dist.hpp>
#include <backplane/nn.hpp>
#include <backplane/parallel.hpp>
#include <backplane/train.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace d = bp::dist;
using Clock = std::chrono::steady_clock;

std::string arg(const std::vector<std::string>& a, const char* name, const char* def) {
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == name) return a[i + 1];
  return def;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "64K" KiB, "4B" bytes, "256" MiB.
int64_t size_bytes(const std::string& s) {
  const int64_t v = std::atoll(s.c_str());
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) return v << 10;
  if (!s.empty() && s.back() == 'B') return v;
  return v << 20;
}

// Per-call time of a one-element (4-byte) f32 all_reduce issued and waited on one at a time,
// as a tensor-parallel layer or a barrier does: the host's issue cost plus NCCL's latency.
int latency(const std::vector<std::string>& a, bp::Device& dev) {
  const int calls = std::atoi(arg(a, "--iters", "2000").c_str());
  const int repeats = std::max(1, std::atoi(arg(a, "--repeat", "5").c_str()));
  bp::Tensor x = bp::rand({1}, dev);
  for (int w = 0; w < 20; ++w) d::all_reduce(x).wait();
  d::barrier();
  dev.synchronize();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) d::all_reduce(x).wait();
    dev.synchronize();
    times.push_back(seconds_since(t0) / calls);
  }
  const double per = median(times);
  if (d::get_rank() == 0) std::printf("RESULT latency all_reduce f32 4B %.2f\n", per * 1e6);
  std::fflush(stdout);
  return 0;
}

int collectives(const std::vector<std::string>& a, bp::Device& dev) {
  int n = d::get_world_size(), rank = d::get_rank();
  int iters = std::atoi(arg(a, "--iters", "20").c_str());
  const int repeats = std::max(1, std::atoi(arg(a, "--repeat", "5").c_str()));
  std::vector<std::string> sizes;
  std::stringstream ss(arg(a, "--sizes", "64K,1,4,64,256"));
  for (std::string s; std::getline(ss, s, ',');) sizes.push_back(s);
  std::vector<bp::DType> dtypes;
  std::stringstream ds(arg(a, "--dtypes", "f32,bf16"));
  for (std::string s; std::getline(ds, s, ',');) dtypes.push_back(bp::dtype_from_name(s));
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"})
    for (bp::DType dt : dtypes)
      for (const std::string& size : sizes) {
        const int64_t esize = static_cast<int64_t>(bp::dtype_size(dt));
        int64_t elems = size_bytes(size) / esize;
        elems -= elems % n;
        if (elems < n) elems = n;
        // Small messages are latency-bound: more calls for a stable mean.
        const int calls = size_bytes(size) < (64 << 20) ? std::max(iters, 200) : iters;
        bp::Tensor full = bp::rand({elems}, dev).to(dt), part = bp::rand({elems / n}, dev).to(dt);
        auto call = [&]() -> d::Work {
          if (!std::strcmp(op, "all_reduce")) return d::all_reduce(full);
          if (!std::strcmp(op, "all_gather")) return d::all_gather(full, part);
          return d::reduce_scatter(part, full);
        };
        for (int w = 0; w < 3; ++w) call().wait();  // the first creates the communicator
        d::barrier();
        dev.synchronize();
        std::vector<double> times;
        for (int r = 0; r < repeats; ++r) {
          auto t0 = Clock::now();
          std::vector<d::Work> works;
          for (int i = 0; i < calls; ++i) works.push_back(call());
          for (auto& w : works) w.wait();
          dev.synchronize();
          times.push_back(seconds_since(t0) / calls);
        }
        double t = median(times);
        double bytes = static_cast<double>(elems) * static_cast<double>(esize);
        double algbw = bytes / t / 1e9;
        double factor = !std::strcmp(op, "all_reduce") ? 2.0 * (n - 1) / n : (n - 1.0) / n;
        if (rank == 0)
          std::printf("RESULT collective %s %s %s %.1f %.2f %.2f\n", op,
                      std::string(bp::dtype_name(dt)).c_str(), size.c_str(), t * 1e6, algbw,
                      algbw * factor);
        std::fflush(stdout);
      }
  return 0;
}

std::shared_ptr<bp::nn::Sequential> mlp(bp::Device& dev) {
  bp::manual_seed(0);
  auto net = std::make_shared<bp::nn::Sequential>();
  net->add<bp::nn::Linear>(4096, 4096);
  net->add<bp::nn::ReLU>();
  net->add<bp::nn::Linear>(4096, 4096);
  net->add<bp::nn::ReLU>();
  net->add<bp::nn::Linear>(4096, 10);
  net->to(dev);
  return net;
}

// The rows [first, first + rows) of the combined batch of `step` (the same on every rank).
bp::Batch batch_rows(bp::Device& dev, int64_t step, int64_t combined, int64_t first, int64_t rows) {
  bp::Generator gx(1000 + static_cast<uint64_t>(step)), gy(5000 + static_cast<uint64_t>(step));
  bp::Tensor X = bp::randn({combined, 4096}, dev, bp::DType::f32, &gx);
  bp::Tensor Y = (bp::uniform({combined}, 0.0, 10.0, dev, bp::DType::f32, &gy)).to(bp::DType::i64);
  return {X.slice(0, first, first + rows).contiguous(),
          Y.slice(0, first, first + rows).contiguous()};
}

int ddp(const std::vector<std::string>& a, bp::Device& dev, bool curve) {
  int n = d::get_world_size(), rank = d::get_rank();
  int steps = std::atoi(arg(a, "--steps", curve ? "20" : "60").c_str());
  int warmup = curve ? 0 : std::atoi(arg(a, "--warmup", "10").c_str());
  int64_t combined = std::atoll(arg(a, "--combined", "2048").c_str());
  int64_t per = curve ? combined / n : std::atoll(arg(a, "--batch", "1024").c_str());
  auto net = mlp(dev);
  std::unique_ptr<bp::nn::DistributedDataParallel> wrapped;
  if (n > 1) wrapped = std::make_unique<bp::nn::DistributedDataParallel>(net);
  bp::nn::Module& model = wrapped ? static_cast<bp::nn::Module&>(*wrapped) : *net;
  bp::optim::SGD opt(model.parameters(), {.lr = 0.01});
  // Throughput: a few batches made up front, cycled. Curve: each step's share of one
  // combined batch.
  std::vector<bp::Batch> data;
  if (!curve)
    for (int k = 0; k < 4; ++k) data.push_back(batch_rows(dev, k * n + rank, per, 0, per));
  std::vector<bp::Tensor> losses;
  auto step = [&](int s) {
    bp::Batch b = curve ? batch_rows(dev, s, combined, rank * per, per) : data[s % data.size()];
    opt.zero_grad();
    bp::Tensor loss = bp::nn::cross_entropy(model(b.x), b.y);
    loss.backward();
    opt.step();
    losses.push_back(loss.detach());
  };
  for (int s = 0; s < warmup; ++s) step(s);
  if (n > 1) d::barrier();
  dev.synchronize();
  losses.clear();
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) step(s);
  dev.synchronize();
  double t = seconds_since(t0);
  if (curve) {
    for (int s = 0; s < steps; ++s) {
      bp::Tensor l = losses[static_cast<size_t>(s)].reshape({1}).clone();
      if (n > 1) d::all_reduce(l, d::ReduceOp::avg).wait();
      if (rank == 0) std::printf("RESULT curve %d %d %.7f\n", n, s, l.item<double>());
    }
  } else if (rank == 0) {
    std::printf("RESULT ddp %d %lld %.0f %.3f\n", n, static_cast<long long>(per),
                static_cast<double>(per) * n * steps / t, t / steps * 1e3);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty() ||
      (a[0] != "collectives" && a[0] != "latency" && a[0] != "ddp" && a[0] != "curve")) {
    std::fprintf(stderr,
                 "usage: bp-run -n N bp-bench-dist collectives|latency|ddp|curve [options]\n");
    return 2;
  }
  d::init_process_group();
  bp::Device& dev = d::local_device("cuda");
  if (d::get_rank() == 0)
    std::printf("bp-bench-dist %s: %d rank(s), rank 0 on %s (%s)\n", a[0].c_str(),
                d::get_world_size(), dev.str().c_str(), dev.properties().name.c_str());
  int rc = a[0] == "collectives" ? collectives(a, dev)
           : a[0] == "latency"   ? latency(a, dev)
                                 : ddp(a, dev, a[0] == "curve");
  d::destroy_process_group();
  return rc;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "bp-bench-dist: %s\n", e.what());
  return 1;
}
