// bp-bench: Backplane's device benchmarks, one JSON object per measurement on stdout
// ({"metric": ..., "device": ..., "value": ..., "unit": ...}) and a table on stderr.
// bench/compare.py runs this and the PyTorch/NumPy reference in one command and prints the
// ratios.
//
//   bp-bench [--device cuda:0] [--quick] [--only substring]
//
// Method (Note [Benchmark method]): warm up first; time device work with the device's events
// (host clocks around synchronised regions on devices without timing events); report the
// median of repeated runs; inputs are random (never zeros) and large inputs exceed the caches.
#include <backplane/backplane.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

bool g_quick = false;
std::string g_only;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds per call of `fn` (median over `reps` timed batches of `inner` calls).
double time_ms(bp::Device& d, const std::function<void()>& fn, int reps, int inner = 1) {
  for (int i = 0; i < std::max(2, reps / 5); ++i) fn();
  d.synchronize();
  auto start = d.create_event(), stop = d.create_event();
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    start->record(d.default_stream());
    for (int i = 0; i < inner; ++i) fn();
    stop->record(d.default_stream());
    stop->synchronize();
    double ms = start->elapsed_ms(*stop);
    if (ms <= 0)  // devices without timing events
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    samples.push_back(ms / inner);
  }
  return median(samples);
}

// Host wall-clock microseconds per call (for per-op overheads), median of reps.
double host_us(bp::Device& d, const std::function<void()>& fn, int reps, int inner) {
  for (int i = 0; i < inner; ++i) fn();
  d.synchronize();
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) fn();
    d.synchronize();
    samples.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        inner);
  }
  return median(samples);
}

void emit(const std::string& metric, bp::Device& d, double value, const char* unit) {
  std::printf("{\"metric\": \"%s\", \"device\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"}\n",
              metric.c_str(), d.str().c_str(), value, unit);
  std::fflush(stdout);
  std::fprintf(stderr, "  %-44s %-10s %12.3f %s\n", metric.c_str(), d.str().c_str(), value, unit);
}

bool wanted(const std::string& metric) {
  return g_only.empty() || metric.find(g_only) != std::string::npos;
}

void bench_elementwise(bp::Device& d) {
  const int64_t n = g_quick ? (1 << 22) : (1 << 26);
  const double mb = n * 4.0;
  const std::string size = " f32 2^" + std::to_string(63 - __builtin_clzll(n));
  auto a = bp::rand({n}, d), b = bp::rand({n}, d);
  const int reps = g_quick ? 5 : 20;
  struct Case {
    const char* name;
    double bytes_per_element;  // read + written, in units of one f32 array
    std::function<void()> fn;
  } cases[] = {
      {"add", 3, [&] { auto c = a + b; }},     {"exp", 2, [&] { auto c = a.exp(); }},
      {"mul", 3, [&] { auto c = a * b; }},     {"sum", 1, [&] { auto c = a.sum(); }},
      {"norm", 1, [&] { auto c = a.norm(); }},
  };
  for (const Case& c : cases) {
    std::string metric = c.name + size;
    if (!wanted(metric)) continue;
    double ms = time_ms(d, c.fn, reps);
    emit(metric, d, c.bytes_per_element * mb / ms / 1e6, "GB/s");
  }
}

void bench_matmul(bp::Device& d, bool gpu) {
  std::vector<int64_t> sizes =
      gpu ? std::vector<int64_t>{4096, 8192} : std::vector<int64_t>{1024, 2048};
  if (g_quick) sizes = {gpu ? 2048 : 512};
  struct Mode {
    const char* name;
    bp::DType dt;
    bool tf32;
  };
  std::vector<Mode> modes = {{"f32", bp::DType::f32, false}};
  if (gpu) {
    modes.push_back({"tf32", bp::DType::f32, true});
    modes.push_back({"bf16", bp::DType::bf16, false});
  }
  for (int64_t n : sizes)
    for (const Mode& m : modes) {
      std::string metric = std::string("matmul ") + m.name + " " + std::to_string(n);
      if (!wanted(metric)) continue;
      bp::set_allow_tf32(m.tf32);
      auto a = bp::rand({n, n}, d, m.dt), b = bp::rand({n, n}, d, m.dt);
      int reps = n >= 8192 ? 5 : 10;
      double ms = time_ms(
          d, [&] { auto c = bp::matmul(a, b); }, reps);
      emit(metric, d, 2.0 * n * n * n / ms / 1e9, "TFLOP/s");
    }
  bp::set_allow_tf32(false);
}

void bench_copies(bp::Device& d) {
  const uint64_t bytes = g_quick ? (32ull << 20) : (256ull << 20);
  auto buf = d.allocator().allocate(bytes);
  d.memset(d.default_stream(), *buf, 0, 1, bytes);
  std::vector<char> pageable(bytes, 1);
  char* pinned = static_cast<char*>(d.host_alloc(bytes));
  std::memset(pinned, 1, bytes);
  std::string mib = std::to_string(bytes >> 20) + " MiB";
  auto run = [&](const char* name, std::function<void()> fn) {
    std::string metric = std::string(name) + " " + mib;
    if (!wanted(metric)) return;
    double ms = time_ms(d, fn, g_quick ? 3 : 10);
    emit(metric, d, bytes / ms / 1e6, "GB/s");
  };
  bp::Stream& s = d.default_stream();
  run("h2d pinned", [&] { d.copy_from_host(s, *buf, 0, pinned, bytes); });
  run("h2d pageable", [&] { d.copy_from_host(s, *buf, 0, pageable.data(), bytes); });
  run("d2h pinned", [&] { d.copy_to_host(s, pinned, *buf, 0, bytes); });
  run("d2h pageable", [&] { d.copy_to_host(s, pageable.data(), *buf, 0, bytes); });
  d.synchronize();
  d.host_free(pinned);
}

// The rows "<op> fwd<tail>" (`forward`, no gradient recorded) and "<op> fwd+bwd<tail>" (`step`,
// forward and backward), each as its work (bytes or flops) per millisecond over `scale`, in
// `unit`. `wants` tells whether --only asks for either, so a caller can skip making inputs.
struct FwdBwdRows {
  bp::Device& d;
  std::string op, tail;
  int reps;
  bool wants() const { return wanted(op + " fwd" + tail) || wanted(op + " fwd+bwd" + tail); }
  void run(double fwd_work, double step_work, double scale, const char* unit,
           const std::function<void()>& forward, const std::function<void()>& step) const {
    if (wanted(op + " fwd" + tail)) {
      bp::NoGradGuard no_grad;
      emit(op + " fwd" + tail, d, fwd_work / time_ms(d, forward, reps) / scale, unit);
    }
    if (wanted(op + " fwd+bwd" + tail))
      emit(op + " fwd+bwd" + tail, d, step_work / time_ms(d, step, reps) / scale, unit);
  }
};

const char* dtype_tail(bp::DType dt) {
  return dt == bp::DType::f32 ? "f32" : "bf16";
}

// layer_norm over GPT-2 small's activations ([8192, 768] on GPUs, [512, 768] elsewhere) with
// weight and bias, forward and forward + backward (dx, dweight, dbias); GB/s count the least
// bytes moved: x read and y written forward, then dy and x read and dx written backward.
void bench_layer_norm(bp::Device& d, bool gpu) {
  namespace F = bp::nn::functional;
  const int64_t rows = gpu ? 8192 : 512, cols = 768;
  for (bp::DType dt : {bp::DType::f32, bp::DType::bf16}) {
    const FwdBwdRows r{d, "layer_norm", " [" + std::to_string(rows) + ",768] " + dtype_tail(dt),
                       g_quick ? 3 : 20};
    if (!r.wants()) continue;
    const double bytes = static_cast<double>(rows * cols) * bp::dtype_size(dt);
    auto x = bp::randn({rows, cols}, d, dt).requires_grad_();
    auto w = bp::rand({cols}, d, dt).requires_grad_();
    auto b = bp::randn({cols}, d, dt).requires_grad_();
    auto dy = bp::randn({rows, cols}, d, dt);
    r.run(
        2 * bytes, 5 * bytes, 1e6, "GB/s", [&] { auto y = F::layer_norm(x, {cols}, w, b); },
        [&] { F::layer_norm(x, {cols}, w, b).backward(dy); });
  }
}

// batch_norm in training at ResNet-18's widest CIFAR activation ([256, 64, 32, 32] on GPUs,
// [32, 64, 32, 32] elsewhere), forward and forward + backward; GB/s count x read and y written
// forward, and dy and x read and dx written backward.
void bench_batch_norm(bp::Device& d, bool gpu) {
  namespace F = bp::nn::functional;
  const int64_t n = gpu ? 256 : 32, c = 64;
  for (bp::DType dt : {bp::DType::f32, bp::DType::bf16}) {
    const FwdBwdRows r{d, "batch_norm", " [" + std::to_string(n) + ",64,32,32] " + dtype_tail(dt),
                       g_quick ? 3 : 20};
    if (!r.wants()) continue;
    auto x = bp::randn({n, c, 32, 32}, d, dt).requires_grad_();
    auto w = bp::rand({c}, d).requires_grad_();
    auto b = bp::randn({c}, d).requires_grad_();
    auto rm = bp::zeros({c}, d), rv = bp::ones({c}, d);
    auto dy = bp::randn({n, c, 32, 32}, d, dt);
    const double bytes = static_cast<double>(x.numel() * bp::dtype_size(dt));
    r.run(
        2 * bytes, 5 * bytes, 1e6, "GB/s", [&] { auto y = F::batch_norm(x, rm, rv, w, b, true); },
        [&] { F::batch_norm(x, rm, rv, w, b, true).backward(dy); });
  }
}

// Attention's layout change (Note [Wide strided copies] in the CUDA plugin): [B, T, H, D] storage
// read as [B, H, T, D] and made dense, as GPT-2 small's q, k and v at batch 8 x 1024 (H 12, D 64)
// on GPUs, batch 1 elsewhere; GB/s count bytes read plus written.
void bench_transpose_copy(bp::Device& d, bool gpu) {
  const int64_t B = gpu ? 8 : 1, T = 1024, H = 12, D = 64;
  for (bp::DType dt : {bp::DType::f32, bp::DType::bf16}) {
    const std::string metric =
        "copy heads transpose [" + std::to_string(B) + ",1024,12,64] " + dtype_tail(dt);
    if (!wanted(metric)) continue;
    auto x = bp::randn({B, T, H, D}, d, dt);
    const double ms = time_ms(
        d, [&] { auto y = x.transpose(1, 2).contiguous(); }, g_quick ? 3 : 20);
    emit(metric, d, 2.0 * static_cast<double>(x.numel() * bp::dtype_size(dt)) / ms / 1e6, "GB/s");
  }
}

// --only matches these names as printed (issue 17: it used to match "alloc", "queued" and
// "synced" instead).
void bench_overheads(bp::Device& d) {
  const std::string alloc = "alloc+free 1 MiB", queued = "1-element add queued",
                    inplace = "1-element add_ in place queued", synced = "1-element add + sync";
  if (wanted(alloc)) {
    double us = host_us(
        d, [&] { auto b = d.allocator().allocate(1 << 20); }, 11, 2000);
    emit(alloc, d, us, "us");
  }
  if (!wanted(queued) && !wanted(inplace) && !wanted(synced)) return;
  auto x = bp::rand({1}, d), y = bp::rand({1}, d);
  if (wanted(queued)) {
    double us = host_us(
        d, [&] { auto z = x + y; }, 5, g_quick ? 2000 : 20000);
    emit(queued, d, us, "us/op");
  }
  if (wanted(inplace)) {
    auto acc = bp::zeros({1}, d);
    double us = host_us(
        d, [&] { acc.add_(y); }, 5, g_quick ? 2000 : 20000);
    emit(inplace, d, us, "us/op");
  }
  if (wanted(synced)) {
    double us = host_us(
        d,
        [&] {
          auto z = x + y;
          d.synchronize();
        },
        5, g_quick ? 500 : 5000);
    emit(synced, d, us, "us/op");
  }
}

// 1000 one-element add_ captured once and replayed (bp::Graph), against the same 1000 queued
// eagerly; per op, each batch of replays synchronised at its end.
void bench_graphs(bp::Device& d) {
  const std::string eager = "1000 tiny add_ eager", replay = "1000 tiny add_ graph replay";
  if (!wanted(eager) && !wanted(replay)) return;
  constexpr int kOps = 1000;
  auto acc = bp::zeros({1}, d), y = bp::rand({1}, d);
  auto block = [&] {
    for (int i = 0; i < kOps; ++i) acc.add_(y);
  };
  if (wanted(eager)) emit(eager, d, host_us(d, block, 5, g_quick ? 2 : 20) / kOps, "us/op");
  if (wanted(replay)) {
    bp::Graph g = bp::capture(d, block);
    emit(replay, d,
         host_us(
             d, [&] { g.replay(); }, 5, g_quick ? 5 : 50) /
             kOps,
         "us/op");
  }
}

// Note [Convolution rows]
//   ResNet-18's CIFAR shapes at batch 256 (3x3 convolutions, padding 1, and the stride-2
//   downsample into 128 channels), f32 with TF32 off and bf16, as TFLOP/s of 2 N K P Q C R S.
//   A backward row times the backward pass alone: each repetition runs the forward on a fresh
//   leaf outside the timed region, then times y.backward(dy) between two events, with only the
//   input (bwd_input) or only the weight (bwd_weight) requiring a gradient. Pooling rows count
//   the bytes of the input read and the output written (GB/s). bench/torch_bench.py measures
//   the same with PyTorch (cuDNN, cudnn.benchmark off, its default).
struct ConvShape {
  const char* name;
  int64_t c, hw, k, stride;
};
constexpr ConvShape kConvShapes[] = {{"64x32x32", 64, 32, 64, 1},
                                     {"128x16x16", 128, 16, 128, 1},
                                     {"256x8x8", 256, 8, 256, 1},
                                     {"512x4x4", 512, 4, 512, 1},
                                     {"64x32x32 s2 to 128", 64, 32, 128, 2}};

// Milliseconds of `timed` alone, each repetition after an untimed `setup`.
double time_split_ms(bp::Device& d, const std::function<void()>& setup,
                     const std::function<void()>& timed, int reps) {
  for (int i = 0; i < 2; ++i) {
    setup();
    timed();
  }
  d.synchronize();
  auto start = d.create_event(), stop = d.create_event();
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    setup();
    start->record(d.default_stream());
    timed();
    stop->record(d.default_stream());
    stop->synchronize();
    samples.push_back(start->elapsed_ms(*stop));
  }
  return median(samples);
}

void bench_conv(bp::Device& d, bool gpu) {
  namespace F = bp::nn::functional;
  const int64_t n = g_quick ? 32 : (gpu ? 256 : 32);
  const int reps = g_quick ? 5 : 20;
  struct Mode {
    const char* name;
    bp::DType dt;
  };
  std::vector<Mode> modes = {{"f32", bp::DType::f32}};
  if (gpu) modes.push_back({"bf16", bp::DType::bf16});
  bp::set_allow_tf32(false);
  for (const Mode& m : modes) {
    for (const ConvShape& s : kConvShapes) {
      const std::string tail = std::string(" ") + s.name + " " + m.name;
      const int64_t p = (s.hw + 2 - 3) / s.stride + 1;
      const double flops = 2.0 * n * s.k * p * p * s.c * 9;
      auto x = bp::randn({n, s.c, s.hw, s.hw}, d, m.dt);
      auto w = bp::randn({s.k, s.c, 3, 3}, d, m.dt) * 0.05;
      auto dy = bp::randn({n, s.k, p, p}, d, m.dt);
      if (wanted("conv2d fwd" + tail)) {
        bp::NoGradGuard no_grad;
        const double ms = time_ms(
            d, [&] { auto y = F::conv2d(x, w, bp::Tensor(), s.stride, 1); }, reps);
        emit("conv2d fwd" + tail, d, flops / ms / 1e9, "TFLOP/s");
      }
      for (int which = 0; which < 2; ++which) {
        const std::string metric = (which == 0 ? "conv2d bwd_input" : "conv2d bwd_weight") + tail;
        if (!wanted(metric)) continue;
        bp::Tensor y;
        auto setup = [&] {
          bp::Tensor xl = which == 0 ? x.detach().requires_grad_() : x;
          bp::Tensor wl = which == 1 ? w.detach().requires_grad_() : w;
          y = F::conv2d(xl, wl, bp::Tensor(), s.stride, 1);
        };
        const double ms = time_split_ms(
            d, setup, [&] { y.backward(dy); }, reps);
        emit(metric, d, flops / ms / 1e9, "TFLOP/s");
      }
    }
    auto x = bp::randn({n, 64, 32, 32}, d, m.dt);
    const double esize = static_cast<double>(bp::dtype_size(m.dt));
    const double in_bytes = static_cast<double>(x.numel()) * esize;
    // Both directions move x's bytes once and a quarter of x's elements as values and as int64
    // indices: forward reads x and writes both; backward reads both and writes dx.
    const double mp_bytes = in_bytes * 1.25 + in_bytes * 0.25 * 8 / esize;
    const std::string mpb = std::string("max_pool2d bwd 3x3 s2 64x32x32 ") + m.name;
    if (wanted(mpb)) {
      auto dy = bp::randn({n, 64, 16, 16}, d, m.dt);
      bp::Tensor y;
      const double ms = time_split_ms(
          d, [&] { y = F::max_pool2d(x.detach().requires_grad_(), 3, 2, 1); },
          [&] { y.backward(dy); }, reps);
      emit(mpb, d, mp_bytes / ms / 1e6, "GB/s");
    }
    bp::NoGradGuard no_grad;
    const std::string mp = std::string("max_pool2d 3x3 s2 64x32x32 ") + m.name;
    if (wanted(mp)) {
      const double ms = time_ms(
          d, [&] { auto y = F::max_pool2d(x, 3, 2, 1); }, reps);
      emit(mp, d, mp_bytes / ms / 1e6, "GB/s");
    }
    const std::string ap = std::string("avg_pool2d 2x2 s2 64x32x32 ") + m.name;
    if (wanted(ap)) {
      const double ms = time_ms(
          d, [&] { auto y = F::avg_pool2d(x, 2); }, reps);
      emit(ap, d, in_bytes * 1.25 / ms / 1e6, "GB/s");
    }
    auto x4 = bp::randn({n, 512, 4, 4}, d, m.dt);
    const std::string aap = std::string("adaptive_avg_pool2d 512x4x4 ") + m.name;
    if (wanted(aap)) {
      const double ms = time_ms(
          d, [&] { auto y = F::adaptive_avg_pool2d(x4, 1); }, reps);
      emit(aap, d, static_cast<double>(x4.numel()) * esize * (1 + 1.0 / 16) / ms / 1e6, "GB/s");
    }
  }
}

// Note [Attention rows]
//   scaled_dot_product_attention at GPT-2's head size (E = 64, 12 heads) on GPUs: batch 8 at
//   L = S = 1024, batch 2 at 4096, batch 1 at 16384, with and without the causal mask, f32 (TF32
//   off) and bf16. "fwd" times the forward alone; "fwd+bwd" the forward and y.backward(dy) into
//   leaves q, k, v (their gradients accumulate, as in training). TFLOP/s count 4 B H L S E for the
//   forward's two products and 2.5 times that for the backward's five, halved under the causal
//   mask. bench/torch_bench.py times torch.nn.functional.scaled_dot_product_attention the same way.
void bench_attention(bp::Device& d, bool gpu) {
  if (!gpu) return;
  namespace F = bp::nn::functional;
  struct Shape {
    int64_t b, h, l;
  };
  constexpr Shape kShapes[] = {{8, 12, 1024}, {2, 12, 4096}, {1, 12, 16384}};
  constexpr int64_t kE = 64;
  const int reps = g_quick ? 5 : 20;
  bp::set_allow_tf32(false);
  for (bp::DType dt : {bp::DType::f32, bp::DType::bf16}) {
    for (const Shape& s : kShapes) {
      for (bool causal : {false, true}) {
        const FwdBwdRows r{
            d, "sdpa", " L=" + std::to_string(s.l) + (causal ? " causal " : " ") + dtype_tail(dt),
            reps};
        if (!r.wants()) continue;
        const double fwd = 4.0 * s.b * s.h * s.l * s.l * kE * (causal ? 0.5 : 1.0);
        auto q = bp::randn({s.b, s.h, s.l, kE}, d, dt).requires_grad_();
        auto k = bp::randn({s.b, s.h, s.l, kE}, d, dt).requires_grad_();
        auto v = bp::randn({s.b, s.h, s.l, kE}, d, dt).requires_grad_();
        auto dy = bp::randn({s.b, s.h, s.l, kE}, d, dt);
        auto attend = [&] {
          return F::scaled_dot_product_attention(q, k, v, bp::Tensor(), 0.0, causal);
        };
        r.run(
            fwd, 3.5 * fwd, 1e9, "TFLOP/s", [&] { auto y = attend(); },
            [&] { attend().backward(dy); });
      }
    }
  }
}

// Note [Cross-entropy rows]
//   nn::cross_entropy (the mean over the rows) of a language model's logits: GPT-2's 50,257
//   classes over 8192 rows (batch 8 x 1024 tokens) on GPUs, 512 rows elsewhere, f32 and bf16.
//   "fwd" times the loss alone; "fwd+bwd" the loss and backward into the logits (a leaf: its
//   gradient is written, not accumulated, after the first call zeroes it). GB/s count the logits'
//   bytes once forward and three times forward and backward (read, read, write), the least any
//   implementation moves. bench/torch_bench.py times torch.nn.functional.cross_entropy the same
//   way, on logits of the same dtype and no autocast (its bf16 log_softmax reads and writes
//   bf16).
void bench_cross_entropy(bp::Device& d, bool gpu) {
  const int64_t rows = gpu ? 8192 : 512, classes = 50257;
  const int reps = g_quick ? 3 : (gpu ? 20 : 5);
  for (bp::DType dt : {bp::DType::f32, bp::DType::bf16}) {
    const FwdBwdRows r{d, "cross_entropy", " " + std::to_string(rows) + "x50257 " + dtype_tail(dt),
                       reps};
    if (!r.wants()) continue;
    const double bytes = static_cast<double>(rows * classes) * bp::dtype_size(dt);
    auto x = bp::randn({rows, classes}, d, dt).requires_grad_();
    std::mt19937_64 gen(static_cast<uint64_t>(rows));
    std::uniform_int_distribution<int64_t> cls(0, classes - 1);
    std::vector<int64_t> tv(static_cast<size_t>(rows));
    for (int64_t& v : tv) v = cls(gen);
    auto t = bp::from_vector(tv, {rows}, d);
    r.run(
        bytes, 3 * bytes, 1e6, "GB/s", [&] { auto l = bp::nn::cross_entropy(x, t); },
        [&] {
          x.zero_grad();
          bp::nn::cross_entropy(x, t).backward();
        });
  }
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<bp::Device*> devs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) {
      devs.push_back(&bp::device(argv[++i]));
    } else if (!std::strcmp(argv[i], "--quick")) {
      g_quick = true;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      g_only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bp-bench [--device DEV]... [--quick] [--only SUBSTRING]\n");
      return 2;
    }
  }
  if (devs.empty()) devs = bp::devices();
  for (bp::Device* d : devs) {
    bool gpu = !d->properties().unified_memory;
    std::fprintf(stderr, "%s (%s)\n", d->str().c_str(), d->properties().name.c_str());
    bench_elementwise(*d);
    bench_matmul(*d, gpu);
    if (gpu) bench_copies(*d);
    bench_overheads(*d);
    bench_graphs(*d);
    try {  // a backend without the convolutional family still gets every other row
      bench_conv(*d, gpu);
    } catch (const bp::Error& e) {
      std::fprintf(stderr, "bp-bench: convolution rows on %s skipped: %s\n", d->str().c_str(),
                   e.what());
    }
    try {  // likewise the transformer family
      bench_cross_entropy(*d, gpu);
      bench_transpose_copy(*d, gpu);
      bench_layer_norm(*d, gpu);
      bench_batch_norm(*d, gpu);
      bench_attention(*d, gpu);
    } catch (const bp::Error& e) {
      std::fprintf(stderr, "bp-bench: attention rows on %s skipped: %s\n", d->str().c_str(),
                   e.what());
    }
  }
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "bp-bench: %s\n", e.what());
  return 1;
}
