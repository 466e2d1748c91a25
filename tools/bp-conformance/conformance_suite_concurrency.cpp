// The concurrency suite: several host threads, each with its own stream, using one device at
// once (allocation, copies, kernel resolution and launches), with every result checked.
#include "conformance_catalogue.hpp"
#include "conformance_kernels.hpp"
#include "conformance_suites.hpp"

#include <mutex>
#include <thread>

namespace bpc {

namespace {

constexpr int kThreads = 4;

// Runs body(thread_index, stream) on kThreads threads, each with its own stream; collects the
// first failure of each thread.
void run_threads(Context& c, const std::function<void(int, bp_stream*)>& body) {
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      bp_stream* s = nullptr;
      try {
        c.check(c.t().stream_create(c.device(), &s), "stream_create");
        body(t, s);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(format("thread %d: %s", t, e.what()));
      }
      if (s) {
        take_error(c.api(), c.t().stream_synchronize(s));
        take_error(c.api(), c.t().stream_destroy(s));
      }
    });
  }
  for (auto& th : threads) th.join();
  if (!failures.empty()) {
    std::string all;
    for (const auto& f : failures) all += (all.empty() ? "" : "; ") + f;
    throw Failure(all);
  }
}

}  // namespace

void build_concurrency_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "concurrency", ctx.device_label());

  b.add("threads_roundtrip", [](Context& c) {
    c.sync(c.stream());
    bp_memory_stats base = read_stats(c);
    bp_kernel* probe = nullptr;
    bp_error* pe = c.t().find_kernel(c.device(), "add", BP_DTYPE_F32, &probe);
    const bool kernel = pe == nullptr && probe != nullptr;
    take_error(c.api(), pe);
    run_threads(c, [&c, kernel](int t, bp_stream* s) {
      Rng rng(c.seed_for(format("threads_roundtrip/%d", t)));
      for (int iter = 0; iter < 25; ++iter) {
        const int64_t n = rng.integer(1000, 70000);
        const uint64_t bytes = static_cast<uint64_t>(n) * 4;
        std::vector<float> host(static_cast<size_t>(n)), back(static_cast<size_t>(n));
        for (float& v : host) v = static_cast<float>(rng.uniform(-4, 4));
        DeviceBuffer in(c, bytes, s), o(c, bytes, s);
        c.check(c.t().copy_h2d(s, in.get(), 0, host.data(), bytes), "copy_h2d");
        if (kernel) {
          bp_kernel* k = find_kernel_checked(c, "add", BP_DTYPE_F32);
          bp_tensor_desc d = make_desc(in.get(), 0, BP_DTYPE_F32, {n}, {1});
          bp_tensor_desc od = make_desc(o.get(), 0, BP_DTYPE_F32, {n}, {1});
          bp_tensor_desc ins[2] = {d, d};
          c.check(c.t().launch(k, s, ins, 2, &od, 1, nullptr, 0),
                  format("launch add f32 [%lld]", static_cast<long long>(n)));
        } else {
          c.check(c.t().copy_d2d(s, o.get(), 0, in.get(), 0, bytes), "copy_d2d");
        }
        c.check(c.t().copy_d2h(s, back.data(), o.get(), 0, bytes), "copy_d2h");
        c.check(c.t().stream_synchronize(s), "stream_synchronize");
        for (int64_t i = 0; i < n; ++i) {
          float want = kernel ? host[static_cast<size_t>(i)] + host[static_cast<size_t>(i)]
                              : host[static_cast<size_t>(i)];
          if (back[static_cast<size_t>(i)] != want)
            throw Failure(format("iteration %d: element %lld of %lld is %g, expected %g", iter,
                                 static_cast<long long>(i), static_cast<long long>(n),
                                 static_cast<double>(back[static_cast<size_t>(i)]),
                                 static_cast<double>(want)));
        }
      }
    });
    c.sync(c.stream());
    bp_memory_stats now = read_stats(c);
    if (now.allocated != base.allocated || now.num_allocs != base.num_allocs)
      throw Failure(
          format("statistics did not return to the baseline after the threads freed "
                 "everything: %llu bytes in %llu allocations, expected %llu in %llu",
                 static_cast<unsigned long long>(now.allocated),
                 static_cast<unsigned long long>(now.num_allocs),
                 static_cast<unsigned long long>(base.allocated),
                 static_cast<unsigned long long>(base.num_allocs)));
    c.note(format("%d threads x 25 iterations of alloc/h2d/%s/d2h/free", kThreads,
                  kernel ? "add f32" : "copy_d2d"));
  });

  b.add("threads_find_kernel", [](Context& c) {
    SupportTable st = SupportTable::build(c);
    std::vector<std::pair<const char*, int32_t>> pairs;
    for (const OpInfo& op : catalogue())
      for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d)
        if (st.get(op.name, d).support != BP_SUPPORT_NO) pairs.push_back({op.name, d});
    if (pairs.empty()) throw Skipped("the plugin declares no kernels");
    run_threads(c, [&c, &pairs](int, bp_stream*) {
      for (int round = 0; round < 3; ++round)
        for (auto [op, d] : pairs) find_kernel_checked(c, op, d);
    });
    c.note(
        format("%d threads resolved %zu (op, dtype) pairs 3 times each", kThreads, pairs.size()));
  });

  b.add("threads_alloc_free", [](Context& c) {
    c.sync(c.stream());
    bp_memory_stats base = read_stats(c);
    run_threads(c, [&c](int t, bp_stream* s) {
      Rng rng(c.seed_for(format("threads_alloc_free/%d", t)));
      std::vector<DeviceBuffer> live;
      for (int i = 0; i < 400; ++i) {
        if (!live.empty() && rng.coin()) {
          live.erase(live.begin() + rng.integer(0, static_cast<int64_t>(live.size()) - 1));
        } else {
          live.emplace_back(c, static_cast<uint64_t>(rng.integer(1, 1 << 16)), s);
        }
      }
      live.clear();
      c.check(c.t().stream_synchronize(s), "stream_synchronize");
    });
    c.sync(c.stream());
    bp_memory_stats now = read_stats(c);
    if (now.allocated != base.allocated || now.num_allocs != base.num_allocs)
      throw Failure(
          format("statistics did not return to the baseline: %llu bytes in %llu "
                 "allocations, expected %llu in %llu",
                 static_cast<unsigned long long>(now.allocated),
                 static_cast<unsigned long long>(now.num_allocs),
                 static_cast<unsigned long long>(base.allocated),
                 static_cast<unsigned long long>(base.num_allocs)));
    c.note(format("%d threads x 400 random alloc/free operations", kThreads));
  });
}

}  // namespace bpc
