// Not a test: times a few ops of libbackplane-opencl.so on each device through the ABI, with
// the plugin's own events (so it also shows whether the driver's marker timing works).
// Usage: opencl_plugin_bench [plugin.so]
#include <backplane/abi/plugin_abi.h>

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const bp_plugin_api* g_api = nullptr;

void check(bp_error* e, const char* what) {
  if (!e) return;
  std::fprintf(stderr, "%s: %s\n", what, e->message);
  g_api->error_free(e);
  std::exit(1);
}

bp_tensor_desc desc(bp_buffer* b, int32_t dt, std::vector<int64_t> shape,
                    std::vector<int64_t> strides) {
  bp_tensor_desc d{};
  d.struct_size = sizeof d;
  d.buffer = b;
  d.dtype = dt;
  d.rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    d.shape[i] = shape[i];
    d.strides[i] = strides[i];
  }
  return d;
}

bp_attr attr_f(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  return a;
}

bp_attr attr_i(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  return a;
}

// Runs `body` `reps` times between two events; returns milliseconds per repetition.
template <typename Body>
double time_ms(int32_t dev, bp_stream* s, int reps, Body body) {
  bp_event *a = nullptr, *b = nullptr;
  check(g_api->event_create(dev, &a), "event_create");
  check(g_api->event_create(dev, &b), "event_create");
  body();  // warm-up (first launch compiles)
  check(g_api->stream_synchronize(s), "sync");
  auto t0 = std::chrono::steady_clock::now();
  check(g_api->event_record(a, s), "record");
  for (int i = 0; i < reps; ++i) body();
  check(g_api->event_record(b, s), "record");
  check(g_api->event_synchronize(b), "event_synchronize");
  auto t1 = std::chrono::steady_clock::now();
  double ms = 0;
  check(g_api->event_elapsed_ms(a, b, &ms), "elapsed");
  double host = std::chrono::duration<double, std::milli>(t1 - t0).count();
  std::printf("    (events %.3f ms, host %.3f ms for %d reps)\n", ms, host, reps);
  g_api->event_destroy(a);
  g_api->event_destroy(b);
  return ms / reps;
}

void launch(int32_t dev, bp_stream* s, const char* op, int32_t dt, std::vector<bp_tensor_desc> in,
            std::vector<bp_tensor_desc> out, std::vector<bp_attr> attrs = {}) {
  bp_kernel* k = nullptr;
  check(g_api->find_kernel(dev, op, dt, &k), op);
  check(g_api->launch(k, s, in.data(), static_cast<int32_t>(in.size()), out.data(),
                      static_cast<int32_t>(out.size()), attrs.data(),
                      static_cast<int32_t>(attrs.size())),
        op);
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : BP_OPENCL_PLUGIN_PATH;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  auto get = reinterpret_cast<bp_plugin_get_api_fn>(dlsym(h, BP_PLUGIN_ENTRY_SYMBOL));
  g_api = get(BP_ABI_MAJOR, BP_ABI_MINOR);
  check(g_api->init(), "init");
  const char* reason = nullptr;
  int32_t n = g_api->device_count(&reason);
  std::printf("%d OpenCL device(s)%s%s\n", n, n ? "" : ": ", n ? "" : reason);
  for (int32_t dev = 0; dev < n; ++dev) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    check(g_api->device_properties(dev, &p), "properties");
    std::printf("opencl:%d  %s  (%s, %d CUs, %.1f GiB)\n", dev, p.name, p.vendor, p.cores,
                static_cast<double>(p.total_memory) / (1 << 30));
    bp_stream* s = nullptr;
    check(g_api->stream_create(dev, &s), "stream");

    const int64_t N = 1 << 24;
    bp_buffer *x = nullptr, *y = nullptr, *z = nullptr, *r = nullptr;
    check(g_api->mem_alloc(dev, s, N * 4, &x), "alloc");
    check(g_api->mem_alloc(dev, s, N * 4, &y), "alloc");
    check(g_api->mem_alloc(dev, s, N * 4, &z), "alloc");
    check(g_api->mem_alloc(dev, s, 4, &r), "alloc");
    bp_tensor_desc dx = desc(x, BP_DTYPE_F32, {N}, {1}), dy = desc(y, BP_DTYPE_F32, {N}, {1}),
                   dz = desc(z, BP_DTYPE_F32, {N}, {1}), dr = desc(r, BP_DTYPE_F32, {1}, {1});
    launch(dev, s, "fill", BP_DTYPE_F32, {}, {dx}, {attr_f("value", 1.0)});
    launch(dev, s, "fill", BP_DTYPE_F32, {}, {dy}, {attr_f("value", 2.0)});

    double ms = time_ms(dev, s, 20, [&] { launch(dev, s, "add", BP_DTYPE_F32, {dx, dy}, {dz}); });
    std::printf("  add f32 16M:        %8.3f ms  %7.1f GB/s\n", ms, 12.0 * N / ms / 1e6);
    bp_tensor_desc bx = desc(x, BP_DTYPE_F32, {4096, 4096}, {4096, 1});
    bp_tensor_desc by = desc(y, BP_DTYPE_F32, {4096, 4096}, {0, 1});
    bp_tensor_desc bz = desc(z, BP_DTYPE_F32, {4096, 4096}, {4096, 1});
    ms = time_ms(dev, s, 20, [&] { launch(dev, s, "mul", BP_DTYPE_F32, {bx, by}, {bz}); });
    std::printf("  mul f32 broadcast:  %8.3f ms  %7.1f GB/s\n", ms, 8.0 * N / ms / 1e6);
    ms = time_ms(dev, s, 20, [&] { launch(dev, s, "sum", BP_DTYPE_F32, {dx}, {dr}); });
    std::printf("  sum f32 16M -> 1:   %8.3f ms  %7.1f GB/s\n", ms, 4.0 * N / ms / 1e6);
    bp_tensor_desc rows = desc(z, BP_DTYPE_F32, {4096, 1}, {1, 1});
    ms = time_ms(dev, s, 20, [&] { launch(dev, s, "sum", BP_DTYPE_F32, {bx}, {rows}); });
    std::printf("  sum f32 rows 4096:  %8.3f ms  %7.1f GB/s\n", ms, 4.0 * N / ms / 1e6);
    ms = time_ms(dev, s, 20, [&] {
      launch(dev, s, "uniform", BP_DTYPE_F32, {}, {dx}, {attr_f("low", 0), attr_f("high", 1)});
    });
    std::printf("  uniform f32 16M:    %8.3f ms  %7.1f GB/s\n", ms, 4.0 * N / ms / 1e6);
    for (int32_t dt : {BP_DTYPE_F32, BP_DTYPE_F16}) {
      const int64_t M = 2048;
      bp_tensor_desc a = desc(x, dt, {1, M, M}, {0, M, 1}), b = desc(y, dt, {1, M, M}, {0, M, 1}),
                     c = desc(z, dt, {1, M, M}, {0, M, 1});
      launch(dev, s, "fill", dt, {}, {desc(x, dt, {M * M}, {1})}, {attr_f("value", 0.5)});
      launch(dev, s, "fill", dt, {}, {desc(y, dt, {M * M}, {1})}, {attr_f("value", 0.25)});
      ms = time_ms(dev, s, 5, [&] { launch(dev, s, "matmul", dt, {a, b}, {c}); });
      std::printf("  matmul %s 2048^3:   %8.3f ms  %7.2f TFLOP/s\n", bp_dtype_name(dt), ms,
                  2.0 * M * M * M / ms / 1e9);
    }
    // ResNet-18's CIFAR 3x3 convolution (64 -> 64 channels, 32x32) and its neighbours; batch 64
    // on a GPU, 4 on a CPU device (PoCL).
    {
      const int64_t B = p.kind == BP_DEVICE_KIND_GPU ? 64 : 4, C = 64, H = 32;
      const int reps = p.kind == BP_DEVICE_KIND_GPU ? 20 : 2;
      const int64_t img = B * C * H * H;
      bp_tensor_desc cx = desc(x, BP_DTYPE_F32, {B, C, H, H}, {C * H * H, H * H, H, 1});
      bp_tensor_desc cy = desc(y, BP_DTYPE_F32, {B, C, H, H}, {C * H * H, H * H, H, 1});
      bp_tensor_desc cw = desc(z, BP_DTYPE_F32, {C, C, 3, 3}, {C * 9, 9, 3, 1});
      launch(dev, s, "uniform", BP_DTYPE_F32, {}, {desc(x, BP_DTYPE_F32, {img}, {1})});
      launch(dev, s, "uniform", BP_DTYPE_F32, {}, {desc(z, BP_DTYPE_F32, {C * C * 9}, {1})});
      std::vector<bp_attr> ca = {attr_i("pad_h", 1), attr_i("pad_w", 1)};
      const double flop = 2.0 * B * C * H * H * C * 9;
      const char* ops[] = {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"};
      for (const char* op : ops) {
        std::string o = op;
        ms = time_ms(dev, s, reps, [&] {
          if (o == "conv2d") launch(dev, s, op, BP_DTYPE_F32, {cx, cw}, {cy}, ca);
          if (o == "conv2d_backward_input") launch(dev, s, op, BP_DTYPE_F32, {cy, cw}, {cx}, ca);
          if (o == "conv2d_backward_weight") launch(dev, s, op, BP_DTYPE_F32, {cx, cy}, {cw}, ca);
        });
        std::printf("  %-22s f32 [%lld,64,32,32] 3x3: %8.3f ms  %7.2f TFLOP/s\n", op,
                    static_cast<long long>(B), ms, flop / ms / 1e9);
      }
      bp_tensor_desc px =
          desc(z, BP_DTYPE_F32, {B, C, H / 2, H / 2}, {C * H * H / 4, H * H / 4, H / 2, 1});
      bp_tensor_desc pi =
          desc(r, BP_DTYPE_I64, {B, C, H / 2, H / 2}, {C * H * H / 4, H * H / 4, H / 2, 1});
      bp_buffer* ib = nullptr;
      check(g_api->mem_alloc(dev, s, static_cast<uint64_t>(img / 4) * 8, &ib), "alloc");
      pi.buffer = ib;
      std::vector<bp_attr> pa = {attr_i("kernel_h", 2), attr_i("kernel_w", 2)};
      ms = time_ms(dev, s, reps, [&] {
        launch(dev, s, "max_pool2d", BP_DTYPE_F32, {cx}, {px, pi}, pa);
      });
      std::printf("  max_pool2d 2x2 f32:    %8.3f ms  %7.1f GB/s\n", ms, 5.0 * img / ms / 1e6);
      ms = time_ms(dev, s, reps, [&] {
        launch(dev, s, "max_pool2d_backward", BP_DTYPE_F32, {px, pi}, {cx});
      });
      std::printf("  max_pool2d_backward:   %8.3f ms  %7.1f GB/s\n", ms, 5.0 * img / ms / 1e6);
      g_api->mem_free(dev, s, ib, 0);
    }
    // The transformer family at the character GPT's shapes (6 heads of 64, context 256): causal
    // attention forward and backward, batch 16 on a GPU, 1 on a CPU device; layer_norm of its
    // [batch x 256, 384] activations.
    {
      const bool gpu = p.kind == BP_DEVICE_KIND_GPU;
      const int64_t B = gpu ? 16 : 1, H = 6, L = 256, E = 64;
      const int reps = gpu ? 10 : 1;
      const int64_t n = B * H * L * E;
      std::vector<bp_buffer*> bufs(10, nullptr);
      for (size_t i = 0; i < bufs.size(); ++i)
        check(g_api->mem_alloc(dev, s, static_cast<uint64_t>(n) * 4, &bufs[i]), "alloc");
      auto t4 = [&](size_t i) {
        return desc(bufs[i], BP_DTYPE_F32, {B, H, L, E}, {H * L * E, L * E, E, 1});
      };
      bp_tensor_desc lse = desc(bufs[9], BP_DTYPE_F32, {B, H, L}, {H * L, L, 1});
      for (size_t i : {0, 1, 2, 4})
        launch(dev, s, "uniform", BP_DTYPE_F32, {}, {desc(bufs[i], BP_DTYPE_F32, {n}, {1})},
               {attr_f("low", -1), attr_f("high", 1)});
      std::vector<bp_attr> aa = {attr_i("causal", 1)};
      const double flop = 2.0 * B * H * L * L * E;  // q k^T and p v, half of them masked
      ms = time_ms(dev, s, reps, [&] {
        launch(dev, s, "scaled_dot_product_attention", BP_DTYPE_F32, {t4(0), t4(1), t4(2)},
               {t4(3), lse}, aa);
      });
      std::printf("  attention fwd f32 [%lld,6,256,64] causal: %8.3f ms  %7.2f TFLOP/s\n",
                  static_cast<long long>(B), ms, flop / ms / 1e9);
      ms = time_ms(dev, s, reps, [&] {
        launch(dev, s, "scaled_dot_product_attention_backward", BP_DTYPE_F32,
               {t4(0), t4(1), t4(2), t4(3), t4(4), lse}, {t4(5), t4(6), t4(7)}, aa);
      });
      std::printf("  attention bwd f32 [%lld,6,256,64] causal: %8.3f ms  %7.2f TFLOP/s\n",
                  static_cast<long long>(B), ms, 2.5 * flop / ms / 1e9);
      const int64_t M = B * L, D = 384;
      bp_tensor_desc lx = desc(bufs[0], BP_DTYPE_F32, {M, D}, {D, 1});
      bp_tensor_desc ly = desc(bufs[3], BP_DTYPE_F32, {M, D}, {D, 1});
      bp_tensor_desc ldy = desc(bufs[4], BP_DTYPE_F32, {M, D}, {D, 1});
      bp_tensor_desc lw = desc(bufs[1], BP_DTYPE_F32, {D}, {1});
      bp_tensor_desc lb = desc(bufs[2], BP_DTYPE_F32, {D}, {1});
      bp_tensor_desc lm = desc(bufs[5], BP_DTYPE_F32, {M}, {1});
      bp_tensor_desc lr = desc(bufs[6], BP_DTYPE_F32, {M}, {1});
      bp_tensor_desc ldw = desc(bufs[7], BP_DTYPE_F32, {D}, {1});
      bp_tensor_desc ldb = desc(bufs[8], BP_DTYPE_F32, {D}, {1});
      ms = time_ms(dev, s, reps, [&] {
        launch(dev, s, "layer_norm", BP_DTYPE_F32, {lx, lw, lb}, {ly, lm, lr});
      });
      std::printf("  layer_norm f32 [%lld,384]:     %8.3f ms  %7.1f GB/s\n",
                  static_cast<long long>(M), ms, 8.0 * M * D / ms / 1e6);
      ms = time_ms(dev, s, reps, [&] {
        launch(dev, s, "layer_norm_backward", BP_DTYPE_F32, {ldy, lx, lm, lr, lw}, {ly, ldw, ldb});
      });
      std::printf("  layer_norm_backward f32:      %8.3f ms  %7.1f GB/s\n", ms,
                  16.0 * M * D / ms / 1e6);
      for (bp_buffer* b : bufs) g_api->mem_free(dev, s, b, static_cast<uint64_t>(n) * 4);
    }
    // Launch overhead: a 1-element add, many times.
    bp_tensor_desc one = desc(x, BP_DTYPE_F32, {1}, {1});
    check(g_api->stream_synchronize(s), "sync");
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) launch(dev, s, "add", BP_DTYPE_F32, {one, one}, {one});
    auto t1 = std::chrono::steady_clock::now();
    check(g_api->stream_synchronize(s), "sync");
    std::printf("  launch (host side):  %8.2f us per 1-element add\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count() / 2000);
    for (bp_buffer* b : {x, y, z, r}) g_api->mem_free(dev, s, b, 0);
    g_api->stream_destroy(s);
  }
  return 0;
}
