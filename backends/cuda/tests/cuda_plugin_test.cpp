// The CUDA plugin's own cases on a real GPU, through its C table (the plugin loaded by
// libbackplane's loader): its properties and support matrix, a 2^24-element f32 sum, host <->
// device copies through pinned and pageable (staged) memory with guard bytes, peer copies and
// kernels alternating between two devices, its memory statistics (cache trim, NULL-stream
// allocations), out of memory, its launch error messages, and a few printed timings. Every op x
// dtype against the float64 reference, memory, copies, streams and events are the conformance
// kit's shared cases: conformance.cuda (bp-conformance on this plugin, every device). Every test
// skips cleanly when the plugin reports no device (CI).
#include "cuda_test_support.hpp"

#include <backplane/abi/op_catalogue.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>

namespace bp_cuda_test {
namespace {

// ---- Plugin surface --------------------------------------------------------------------------

TEST(CudaPlugin, PropertiesAndListOps) {
  BP_REQUIRE_GPU();
  for (int32_t d = 0; d < plugin().count; ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    check(api()->device_properties(d, &p), "device_properties");
    EXPECT_GT(std::strlen(p.name), 0u);
    EXPECT_STREQ(p.vendor, "NVIDIA");
    EXPECT_EQ(std::string(p.uuid).rfind("GPU-", 0), 0u) << p.uuid;
    EXPECT_EQ(std::strlen(p.uuid), 40u) << p.uuid;
    EXPECT_EQ(std::strlen(p.pci_bus_id), 12u) << p.pci_bus_id;
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_GT(p.free_memory, 0u);
    EXPECT_LE(p.free_memory, p.total_memory);
    EXPECT_GE(p.compute_major, 7);
    EXPECT_GT(p.cores, 0);
    EXPECT_EQ(p.supports_f64, 1);
    EXPECT_EQ(p.unified_memory, 0);
    std::printf("cuda:%d %s %s %s cc %d.%d, %d SMs, %llu MiB\n", d, p.name, p.uuid, p.pci_bus_id,
                p.compute_major, p.compute_minor, p.cores,
                static_cast<unsigned long long>(p.total_memory >> 20));
  }
  const bp_op_support* list = nullptr;
  int32_t n = 0;
  check(api()->list_ops(0, &list, &n), "list_ops");
  ASSERT_EQ(n, static_cast<int32_t>(BP_OP_COUNT) * static_cast<int32_t>(BP_DTYPE_COUNT));
  std::map<std::string, int> yes;
  for (int32_t i = 0; i < n; ++i) {
    const bp_op_support& s = list[i];
    bp_kernel* k = nullptr;
    bp_error* e = api()->find_kernel(0, s.op, s.dtype, &k);
    if (s.support == BP_SUPPORT_YES) {
      EXPECT_EQ(e, nullptr) << s.op << " " << bp_dtype_name(s.dtype);
      ++yes[s.op];
    } else {
      EXPECT_EQ(s.support, BP_SUPPORT_NO);
      EXPECT_GT(std::strlen(s.reason), 0u);
      ASSERT_NE(e, nullptr) << s.op << " " << bp_dtype_name(s.dtype);
      EXPECT_EQ(e->code, BP_ERROR_UNSUPPORTED);
    }
    if (e) api()->error_free(e);
  }
  // The support matrix of the catalogue.
  const std::map<std::string, int> expected = {{"fill", 8},
                                               {"copy", 8},
                                               {"cast", 8},
                                               {"add", 7},
                                               {"sub", 7},
                                               {"mul", 7},
                                               {"div", 4},
                                               {"pow", 4},
                                               {"maximum", 7},
                                               {"minimum", 7},
                                               {"eq", 8},
                                               {"ne", 8},
                                               {"lt", 8},
                                               {"le", 8},
                                               {"gt", 8},
                                               {"ge", 8},
                                               {"where", 8},
                                               {"neg", 6},
                                               {"exp", 4},
                                               {"log", 4},
                                               {"sqrt", 4},
                                               {"relu", 6},
                                               {"sigmoid", 4},
                                               {"tanh", 4},
                                               {"abs", 6},
                                               {"sum", 6},
                                               {"mean", 4},
                                               {"max", 6},
                                               {"matmul", 4},
                                               {"uniform", 4},
                                               {"normal", 4},
                                               {"sumsq", 4},
                                               {"norm", 4},
                                               {"linear", 4},
                                               {"conv2d", 4},
                                               {"conv2d_backward_input", 4},
                                               {"conv2d_backward_weight", 4},
                                               {"max_pool2d", 4},
                                               {"max_pool2d_backward", 4},
                                               {"avg_pool2d", 4},
                                               {"avg_pool2d_backward", 4},
                                               {"adaptive_avg_pool2d", 4},
                                               {"adaptive_avg_pool2d_backward", 4},
                                               {"batch_norm", 4},
                                               {"batch_norm_backward", 4},
                                               {"dropout", 4},
                                               {"max_dim", 6},
                                               {"min_dim", 6},
                                               {"gather", 8},
                                               {"scatter_add", 7},
                                               {"softmax", 4},
                                               {"log_softmax", 4},
                                               {"softmax_backward", 4},
                                               {"log_softmax_backward", 4},
                                               {"layer_norm", 4},
                                               {"layer_norm_backward", 4},
                                               {"gelu", 4},
                                               {"gelu_backward", 4},
                                               {"silu", 4},
                                               {"silu_backward", 4},
                                               {"embedding", 4},
                                               {"embedding_backward", 4},
                                               {"scaled_dot_product_attention", 4},
                                               {"scaled_dot_product_attention_backward", 4},
                                               {"triu", 8},
                                               {"tril", 8},
                                               {"cumsum", 6},
                                               {"sin", 4},
                                               {"cos", 4},
                                               {"rsqrt", 4},
                                               {"adamw", 4},
                                               {"cross_entropy", 4},
                                               {"cross_entropy_backward", 4}};
  EXPECT_EQ(yes, expected);
  bp_kernel* k = nullptr;
  const Err unknown = error_of(api()->find_kernel(0, "no_such_op", BP_DTYPE_F32, &k));
  EXPECT_EQ(unknown.code, BP_ERROR_UNSUPPORTED);
  const Err bad_device = error_of(api()->find_kernel(plugin().count, "add", BP_DTYPE_F32, &k));
  EXPECT_EQ(bad_device.code, BP_ERROR_INVALID_ARGUMENT);
}

// ---- Reductions ------------------------------------------------------------------------------

TEST(CudaPlugin, SumF32Accuracy) {
  BP_REQUIRE_GPU();
  const Tensor t = dense(BP_DTYPE_F32, {1 << 24}, range_values(0.0, 1.0));
  Tensor out = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  launch("sum", BP_DTYPE_F32, {&t}, {&out});
  double ref = 0;
  for (double v : t.storage) ref += v;
  const double got = out.download()[0];
  EXPECT_TRUE(
      close(BP_DTYPE_F32, {got}, {ref}, bp_test::rtol(BP_DTYPE_F32, bp_test::OpClass::reduction)));
}

// ---- Copies ----------------------------------------------------------------------------------

std::vector<unsigned char> random_bytes(size_t n) {
  std::vector<unsigned char> b(n);
  uint64_t x = rng()();
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = static_cast<unsigned char>(x >> 56);
  }
  return b;
}

TEST(CudaPlugin, HostDeviceCopiesWithGuards) {
  BP_REQUIRE_GPU();
  constexpr size_t kGuard = 64;
  for (size_t size : {size_t{1}, size_t{3}, size_t{4097}, size_t{1} << 20, (size_t{1} << 20) + 13,
                      (size_t{20} << 20) + 7}) {
    for (int pinned = 0; pinned < 2; ++pinned) {
      SCOPED_TRACE("size " + std::to_string(size) + (pinned ? " pinned" : " pageable"));
      DevBuf dev(size + 2 * kGuard);
      check(api()->memset(stream(), dev.get(), 0, 0xAB, dev.size()), "memset");
      const std::vector<unsigned char> data = random_bytes(size);
      // Host source and destination at odd offsets, with guard bytes around the destination.
      unsigned char* host = nullptr;
      std::vector<unsigned char> pageable;
      const size_t host_bytes = size + 2 * kGuard + 3;
      if (pinned) {
        void* p = nullptr;
        check(api()->host_alloc(0, host_bytes, &p), "host_alloc");
        host = static_cast<unsigned char*>(p);
      } else {
        pageable.resize(host_bytes);
        host = pageable.data();
      }
      unsigned char* src = host + 3;
      std::memcpy(src, data.data(), size);
      check(api()->copy_h2d(stream(), dev.get(), kGuard - 3, src, size), "copy_h2d");
      if (!pinned) {
        // Pageable source: this plugin has copied it (into pinned chunks or the driver's
        // staging buffers) by the time copy_h2d returns, so it may be overwritten at once.
        std::memset(src, 0, size);
      } else {
        sync();
      }
      std::memset(host, 0xCD, host_bytes);
      unsigned char* dst = host + kGuard + 3;
      check(api()->copy_d2h(stream(), dst, dev.get(), kGuard - 3, size), "copy_d2h");
      if (pinned) sync();  // pageable: the data must be there when copy_d2h returns
      EXPECT_EQ(std::memcmp(dst, data.data(), size), 0);
      for (size_t i = 0; i < kGuard + 3; ++i) ASSERT_EQ(host[i], 0xCD) << "host guard " << i;
      for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(dst[size + i], 0xCD) << "host guard after";
      // Device guard bytes untouched.
      std::vector<unsigned char> all(dev.size());
      check(api()->copy_d2h(stream(), all.data(), dev.get(), 0, all.size()), "copy_d2h all");
      sync();
      for (size_t i = 0; i < kGuard - 3; ++i) ASSERT_EQ(all[i], 0xAB) << "device guard " << i;
      for (size_t i = kGuard - 3 + size; i < all.size(); ++i)
        ASSERT_EQ(all[i], 0xAB) << "device guard " << i;
      // Device to device at odd offsets.
      DevBuf other(size + 8);
      check(api()->copy_d2d(stream(), other.get(), 5, dev.get(), kGuard - 3, size), "copy_d2d");
      std::vector<unsigned char> back(size);
      check(api()->copy_d2h(stream(), back.data(), other.get(), 5, size), "copy_d2h");
      sync();
      EXPECT_EQ(back, data);
      if (pinned) check(api()->host_free(0, host), "host_free");
    }
  }
}

TEST(CudaPlugin, PeerCopy) {
  BP_REQUIRE_GPU();
  if (plugin().count < 2) GTEST_SKIP() << "needs two devices";
  bp_stream* s1 = nullptr;
  check(api()->stream_create(1, &s1), "stream_create(1)");
  {
    const size_t size = (size_t{3} << 20) + 5;
    const std::vector<unsigned char> data = random_bytes(size);
    DevBuf src(size);
    DevBuf dst(size + 16, 1, s1);
    check(api()->copy_h2d(stream(), src.get(), 0, data.data(), size), "copy_h2d");
    sync();
    check(api()->copy_peer(s1, 1, dst.get(), 16, 0, src.get(), 0, size), "copy_peer");
    std::vector<unsigned char> back(size);
    check(api()->copy_d2h(s1, back.data(), dst.get(), 16, size), "copy_d2h");
    check(api()->stream_synchronize(s1), "sync s1");
    EXPECT_EQ(back, data);
  }
  check(api()->stream_synchronize(s1), "sync s1");
  check(api()->stream_destroy(s1), "stream_destroy");
}

TEST(CudaPlugin, KernelsAlternateBetweenDevices) {
  BP_REQUIRE_GPU();
  if (plugin().count < 2) GTEST_SKIP() << "needs two devices";
  // Devices come in PCI bus order (as nvidia-smi lists them), with distinct UUIDs.
  std::vector<std::string> buses, uuids;
  for (int32_t d = 0; d < plugin().count; ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    check(api()->device_properties(d, &p), "device_properties");
    buses.push_back(p.pci_bus_id);
    uuids.push_back(p.uuid);
  }
  EXPECT_TRUE(std::is_sorted(buses.begin(), buses.end()));
  EXPECT_EQ(std::set<std::string>(uuids.begin(), uuids.end()).size(), uuids.size());
  // The same thread launches on cuda:0 and cuda:1 in turn (Note [Current-device cache]).
  const int n = 4099;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>(uniform(-3, 3));
  bp_stream* s[2] = {stream(), nullptr};
  check(api()->stream_create(1, &s[1]), "stream_create(1)");
  {
    std::unique_ptr<DevBuf> in[2], out[2];
    bp_kernel* k[2] = {nullptr, nullptr};
    for (int d = 0; d < 2; ++d) {
      in[d] = std::make_unique<DevBuf>(n * 4, d, s[d]);
      out[d] = std::make_unique<DevBuf>(n * 4, d, s[d]);
      check(api()->copy_h2d(s[d], in[d]->get(), 0, host.data(), n * 4), "copy_h2d");
      check(api()->find_kernel(d, "neg", BP_DTYPE_F32, &k[d]), "find_kernel");
    }
    for (int round = 0; round < 3; ++round) {
      for (int d = 0; d < 2; ++d) {
        bp_tensor_desc ti{}, to{};
        ti.struct_size = to.struct_size = sizeof ti;
        ti.dtype = to.dtype = BP_DTYPE_F32;
        ti.rank = to.rank = 1;
        ti.shape[0] = to.shape[0] = n;
        ti.strides[0] = to.strides[0] = 1;
        // Round 1 runs in place on the input, so later rounds see the sign flipped.
        ti.buffer = in[d]->get();
        to.buffer = round == 1 ? in[d]->get() : out[d]->get();
        check(api()->launch(k[d], s[d], &ti, 1, &to, 1, nullptr, 0), "launch");
      }
    }
    for (int d = 0; d < 2; ++d) {
      std::vector<float> back(n);
      check(api()->copy_d2h(s[d], back.data(), out[d]->get(), 0, n * 4), "copy_d2h");
      check(api()->stream_synchronize(s[d]), "sync");
      // out = neg(neg(x)) = x after the in-place round.
      EXPECT_EQ(back, host) << "cuda:" << d;
    }
  }
  check(api()->stream_synchronize(s[1]), "sync");
  check(api()->stream_destroy(s[1]), "stream_destroy");
}

// ---- Memory ----------------------------------------------------------------------------------

bp_memory_stats stats() {
  bp_memory_stats s{};
  s.struct_size = sizeof s;
  check(api()->memory_stats(0, &s), "memory_stats");
  return s;
}

TEST(CudaPlugin, MemoryStatisticsReturnToBaseline) {
  BP_REQUIRE_GPU();
  sync();
  const bp_memory_stats base = stats();
  const uint64_t sizes[] = {1, 1000, 3u << 20, 5, 700000};
  uint64_t total = 0;
  {
    std::vector<std::unique_ptr<DevBuf>> bufs;
    for (uint64_t s : sizes) {
      bufs.push_back(std::make_unique<DevBuf>(s));
      total += s;
    }
    const bp_memory_stats mid = stats();
    EXPECT_EQ(mid.allocated, base.allocated + total);
    EXPECT_EQ(mid.num_allocs, base.num_allocs + 5);
    EXPECT_GE(mid.peak_allocated, mid.allocated);
    EXPECT_GE(mid.reserved, mid.allocated);
  }
  const bp_memory_stats after = stats();
  EXPECT_EQ(after.allocated, base.allocated);
  EXPECT_EQ(after.num_allocs, base.num_allocs);
  EXPECT_GE(after.peak_allocated, base.allocated + total);
  check(api()->memory_reset_peak(0), "memory_reset_peak");
  EXPECT_EQ(stats().peak_allocated, after.allocated);
  // Zero-byte allocations are valid and free.
  bp_buffer* z = reinterpret_cast<bp_buffer*>(1);
  check(api()->mem_alloc(0, stream(), 0, &z), "mem_alloc 0");
  check(api()->mem_free(0, stream(), z, 0), "mem_free 0");
  check(api()->memory_empty_cache(0), "memory_empty_cache");
  const bp_memory_stats trimmed = stats();
  EXPECT_EQ(trimmed.allocated, base.allocated);
  EXPECT_LE(trimmed.reserved, after.reserved);
  // NULL stream: synchronous allocation and free (Note [NULL streams]).
  bp_buffer* b = nullptr;
  check(api()->mem_alloc(0, nullptr, 4096, &b), "mem_alloc NULL stream");
  check(api()->mem_free(0, nullptr, b, 4096), "mem_free NULL stream");
  EXPECT_EQ(stats().allocated, base.allocated);
}

TEST(CudaPlugin, OutOfMemoryIsAnErrorNotACrash) {
  BP_REQUIRE_GPU();
  bp_buffer* b = nullptr;
  const Err e = error_of(api()->mem_alloc(0, stream(), uint64_t{1} << 50, &b));
  EXPECT_EQ(e.code, BP_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(e.native, "cudaErrorMemoryAllocation");
  EXPECT_NE(e.message.find(std::to_string(uint64_t{1} << 50)), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("cuda:0"), std::string::npos) << e.message;
  // The device still works afterwards.
  Tensor a = dense(BP_DTYPE_F32, {1000}, any_values(BP_DTYPE_F32));
  Tensor out = dense(BP_DTYPE_F32, {1000}, any_values(BP_DTYPE_F32));
  launch("neg", BP_DTYPE_F32, {&a}, {&out});
  std::vector<double> ref;
  for (double v : a.values()) ref.push_back(-v);
  EXPECT_TRUE(close(BP_DTYPE_F32, out.download(), ref, 0.0));
}

// ---- Errors ----------------------------------------------------------------------------------

TEST(CudaPlugin, BadLaunchesAreInvalidArguments) {
  BP_REQUIRE_GPU();
  Tensor a = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  Tensor b = dense(BP_DTYPE_F32, {4, 6}, any_values(BP_DTYPE_F32));
  Tensor out = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  Err e = error_of(try_launch("add", BP_DTYPE_F32, {&a, &b}, {&out}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("add"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[4, 6]"), std::string::npos) << e.message;
  e = error_of(try_launch("add", BP_DTYPE_F32, {&a}, {&out}));  // no "scalar"
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  Tensor i32 = dense(BP_DTYPE_I32, {4, 5}, any_values(BP_DTYPE_I32));
  e = error_of(try_launch("add", BP_DTYPE_F32, {&a, &i32}, {&out}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  e = error_of(try_launch("div", BP_DTYPE_I32, {&i32, &i32}, {&i32}));
  EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED);
  sync();
}

// ---- Timings (printed, not asserted) ---------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CudaPlugin, PrintTimings) {
  BP_REQUIRE_GPU();
  // One-element add queued 20,000 times: launch only, then with output allocation and free.
  Tensor a = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  Tensor out = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  bp_kernel* add = nullptr;
  check(api()->find_kernel(0, "add", BP_DTYPE_F32, &add), "find_kernel");
  const bp_tensor_desc in[2] = {a.desc(), a.desc()};
  bp_tensor_desc o = out.desc();
  const int iters = 20000;
  for (int pass = 0; pass < 2; ++pass) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      bp_buffer* buf = nullptr;
      if (pass == 1) {
        check(api()->mem_alloc(0, stream(), 4, &buf), "mem_alloc");
        o.buffer = buf;
        o.offset = 0;
      }
      check(api()->launch(add, stream(), in, 2, &o, 1, nullptr, 0), "launch");
      if (pass == 1) check(api()->mem_free(0, stream(), buf, 4), "mem_free");
    }
    sync();
    std::printf("1-element add x%d (%s): %.2f us/op\n", iters,
                pass ? "with alloc+free" : "launch only", seconds_since(t0) / iters * 1e6);
  }
  // The plugin's own cost per launch: the same loop on empty tensors queues no kernel.
  {
    bp_tensor_desc e = a.desc();
    e.buffer = nullptr;
    e.shape[0] = 0;
    const bp_tensor_desc ein[2] = {e, e};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      check(api()->launch(add, stream(), ein, 2, &e, 1, nullptr, 0), "launch");
    std::printf("empty add x%d (plugin overhead, no kernel): %.3f us/op\n", iters,
                seconds_since(t0) / iters * 1e6);
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      bp_buffer* buf = nullptr;
      check(api()->mem_alloc(0, stream(), 4, &buf), "mem_alloc");
      check(api()->mem_free(0, stream(), buf, 4), "mem_free");
    }
    std::printf("4-byte mem_alloc + mem_free x%d: %.3f us/op\n", iters,
                seconds_since(t1) / iters * 1e6);
  }
  // Bandwidth of add and sum at 2^26 f32, timed with events.
  const int64_t n = int64_t{1} << 26;
  auto big = [&](int dt) {
    Tensor t;
    t.dtype = dt;
    t.shape = {n};
    t.strides = {1};
    t.buf = std::make_shared<DevBuf>(static_cast<uint64_t>(n) * dsize(dt));
    return t;
  };
  Tensor x = big(BP_DTYPE_F32), y = big(BP_DTYPE_F32), z = big(BP_DTYPE_F32);
  launch("uniform", BP_DTYPE_F32, {}, {&x}, {attr_i("seed", 1)});
  launch("uniform", BP_DTYPE_F32, {}, {&y}, {attr_i("seed", 2)});
  Tensor s = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  bp_event* e0 = nullptr;
  bp_event* e1 = nullptr;
  check(api()->event_create(0, &e0), "event_create");
  check(api()->event_create(0, &e1), "event_create");
  auto time_ms = [&](const std::function<void()>& f, int reps) {
    f();
    check(api()->event_record(e0, stream()), "record");
    for (int i = 0; i < reps; ++i) f();
    check(api()->event_record(e1, stream()), "record");
    check(api()->event_synchronize(e1), "sync");
    double ms = 0;
    check(api()->event_elapsed_ms(e0, e1, &ms), "elapsed");
    return ms / reps;
  };
  const double bytes = static_cast<double>(n) * 4;
  double ms = time_ms([&] { launch("add", BP_DTYPE_F32, {&x, &y}, {&z}); }, 20);
  std::printf("add f32 2^26: %.0f GB/s (read+write)\n", 3 * bytes / ms / 1e6);
  ms = time_ms([&] { launch("exp", BP_DTYPE_F32, {&x}, {&z}); }, 20);
  std::printf("exp f32 2^26: %.0f GB/s (read+write)\n", 2 * bytes / ms / 1e6);
  ms = time_ms([&] { launch("sum", BP_DTYPE_F32, {&x}, {&s}); }, 20);
  std::printf("sum f32 2^26: %.0f GB/s (read)\n", bytes / ms / 1e6);
  Tensor rows = x;
  rows.shape = {8192, 8192};
  rows.strides = {8192, 1};
  Tensor row_out = dense(BP_DTYPE_F32, {8192, 1}, any_values(BP_DTYPE_F32));
  ms = time_ms([&] { launch("sum", BP_DTYPE_F32, {&rows}, {&row_out}); }, 10);
  std::printf("sum f32 [8192, 8192] over dim 1: %.0f GB/s (read)\n", bytes / ms / 1e6);
  Tensor col_out = dense(BP_DTYPE_F32, {1, 8192}, any_values(BP_DTYPE_F32));
  ms = time_ms([&] { launch("sum", BP_DTYPE_F32, {&rows}, {&col_out}); }, 10);
  std::printf("sum f32 [8192, 8192] over dim 0: %.0f GB/s (read)\n", bytes / ms / 1e6);
  ms = time_ms([&] { launch("uniform", BP_DTYPE_F32, {}, {&z}, {attr_i("seed", 3)}); }, 10);
  std::printf("uniform f32 2^26: %.0f GB/s (write)\n", bytes / ms / 1e6);
  ms = time_ms([&] { launch("normal", BP_DTYPE_F32, {}, {&z}, {attr_i("seed", 3)}); }, 10);
  std::printf("normal f32 2^26: %.0f GB/s (write)\n", bytes / ms / 1e6);
  Tensor tr = x;
  tr.shape = {8192, 8192};
  tr.strides = {1, 8192};
  Tensor zt = z;
  zt.shape = {8192, 8192};
  zt.strides = {8192, 1};
  ms = time_ms([&] { launch("copy", BP_DTYPE_F32, {&tr}, {&zt}); }, 10);
  std::printf("transpose-copy f32 8192^2: %.0f GB/s (read+write)\n", 2 * bytes / ms / 1e6);
  // Matmul.
  for (int tf32 = 0; tf32 < 2; ++tf32) {
    Tensor ma = x, mb = y, mc = z;
    ma.shape = mb.shape = mc.shape = {1, 4096, 4096};
    ma.strides = mb.strides = mc.strides = {0, 4096, 1};
    ms = time_ms(
        [&] {
          launch("matmul", BP_DTYPE_F32, {&ma, &mb}, {&mc}, {attr_i("allow_tf32", tf32)});
        },
        5);
    std::printf("matmul f32 4096^3 (tf32 %d): %.1f TFLOP/s\n", tf32,
                2.0 * 4096 * 4096 * 4096 / ms / 1e9);
  }
  check(api()->event_destroy(e0), "event_destroy");
  check(api()->event_destroy(e1), "event_destroy");
  // Host <-> device, 256 MiB.
  const size_t hb = size_t{256} << 20;
  DevBuf dev(hb);
  std::vector<unsigned char> pageable(hb, 1);
  void* pinned = nullptr;
  check(api()->host_alloc(0, hb, &pinned), "host_alloc");
  std::memset(pinned, 1, hb);
  for (int pin = 0; pin < 2; ++pin) {
    void* h = pin ? pinned : pageable.data();
    for (int dir = 0; dir < 2; ++dir) {
      // One untimed copy first: the first staged copy of a process allocates the pinned
      // chunks and starts the host workers.
      if (dir == 0)
        check(api()->copy_h2d(stream(), dev.get(), 0, h, hb), "h2d");
      else
        check(api()->copy_d2h(stream(), h, dev.get(), 0, hb), "d2h");
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < 3; ++r) {
        if (dir == 0)
          check(api()->copy_h2d(stream(), dev.get(), 0, h, hb), "h2d");
        else
          check(api()->copy_d2h(stream(), h, dev.get(), 0, hb), "d2h");
      }
      sync();
      std::printf("%s 256 MiB %s: %.1f GB/s\n", dir ? "device->host" : "host->device",
                  pin ? "pinned" : "pageable",
                  3.0 * static_cast<double>(hb) / seconds_since(t0) / 1e9);
    }
  }
  check(api()->host_free(0, pinned), "host_free");
}

}  // namespace
}  // namespace bp_cuda_test
