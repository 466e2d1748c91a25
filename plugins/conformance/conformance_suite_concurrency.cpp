// The concurrency suite: several host threads using one device at once (allocation, copies,
// kernel resolution and launches), each with its own stream or all on one stream (Note
// [Stream threading] in plugin_abi.h), with every result checked.
#include "conformance_catalogue.hpp"
#include "conformance_kernels.hpp"
#include "conformance_suites.hpp"

#include <barrier>
#include <cmath>
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

// Threads sharing one stream in one_stream_threads; rounds of work, the first of which is the
// first use of the stream and of every kernel on it.
constexpr int kStreamThreads = 8;
constexpr int kStreamRounds = 3;
// How far `reserved` may end above its baseline once everything is freed and the caches are
// emptied: allocator bookkeeping, never a whole leaked workspace (cuBLAS's is 4-32 MiB).
constexpr uint64_t kReservedSlack = uint64_t{2} << 20;

// Work of one thread in one round of one_stream_threads: out = a x b on matmul (when the plugin
// has matmul f32), then e = out + d (add f32), or a device copy when it has neither.
struct StreamWork {
  int64_t m = 0, k = 0, n = 0;
  std::vector<float> a, b, d;  // a[m,k], b[k,n], d[m,n]
};

// ||got - ref|| / ||ref|| over float values against a double reference.
double relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double diff = static_cast<double>(got[i]) - ref[i];
    if (!std::isfinite(static_cast<double>(got[i]))) return INFINITY;
    num += diff * diff;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

void build_concurrency_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "concurrency", ctx.device_label());

  // Note [Stream threading] in plugin_abi.h: several threads queue work on ONE stream at once,
  // the first matmul and add on that stream included (and, as the suite's first test, the
  // first use of those kernels in the process), and each thread's results must be its own.
  // Afterwards the stream is destroyed and the caches emptied: the statistics must be back at the
  // baseline, and `reserved` too (a per-stream workspace set up twice by racing threads leaks one
  // of them).
  b.add("one_stream_threads", [](Context& c) {
    auto has = [&c](const char* op) {
      bp_kernel* k = nullptr;
      bp_error* e = c.t().find_kernel(c.device(), op, BP_DTYPE_F32, &k);
      const bool ok = e == nullptr && k != nullptr;
      take_error(c.api(), e);
      return ok;
    };
    const bool matmul = has("matmul"), add = has("add");
    const bool empty_cache = c.t().memory_empty_cache != nullptr;
    c.sync(c.stream());
    if (empty_cache) c.check(c.t().memory_empty_cache(c.device()), "memory_empty_cache");
    const bp_memory_stats base = read_stats(c);

    bp_stream* shared = nullptr;
    c.check(c.t().stream_create(c.device(), &shared), "stream_create");
    std::mutex mu;
    std::vector<std::string> failures;
    std::barrier sync_point(kStreamThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kStreamThreads; ++t) {
      threads.emplace_back([&, t] {
        Rng rng(c.seed_for(format("one_stream_threads/%d", t)));
        bool failed = false;
        for (int round = 0; round < kStreamRounds; ++round) {
          // Every thread reaches the barrier once per round, even after a failure.
          StreamWork w;
          w.m = rng.integer(7, 70);
          w.k = rng.integer(5, 66);
          w.n = rng.integer(3, 72);
          auto fill = [&rng](std::vector<float>& v, int64_t count) {
            v.resize(static_cast<size_t>(count));
            for (float& x : v) x = static_cast<float>(rng.uniform(-1, 1));
          };
          fill(w.a, w.m * w.k);
          fill(w.b, w.k * w.n);
          fill(w.d, w.m * w.n);
          const int64_t mn = w.m * w.n;
          std::vector<DeviceBuffer> bufs;
          try {
            if (!failed) {
              bufs.emplace_back(c, w.a.size() * 4, shared);
              bufs.emplace_back(c, w.b.size() * 4, shared);
              bufs.emplace_back(c, w.d.size() * 4, shared);
              bufs.emplace_back(c, static_cast<uint64_t>(mn) * 4, shared);  // a x b
              bufs.emplace_back(c, static_cast<uint64_t>(mn) * 4, shared);  // + d
              c.check(c.t().copy_h2d(shared, bufs[0].get(), 0, w.a.data(), w.a.size() * 4),
                      "copy_h2d");
              c.check(c.t().copy_h2d(shared, bufs[1].get(), 0, w.b.data(), w.b.size() * 4),
                      "copy_h2d");
              c.check(c.t().copy_h2d(shared, bufs[2].get(), 0, w.d.data(), w.d.size() * 4),
                      "copy_h2d");
            }
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(mu);
            failures.push_back(format("thread %d, round %d: %s", t, round, e.what()));
            failed = true;
          }
          sync_point.arrive_and_wait();
          if (failed) continue;
          try {
            std::vector<float> prod(static_cast<size_t>(mn)), sum(static_cast<size_t>(mn));
            std::vector<double> ref_prod(static_cast<size_t>(mn)), ref_sum(prod.size());
            for (int64_t i = 0; i < w.m; ++i)
              for (int64_t j = 0; j < w.n; ++j) {
                double acc = 0;
                if (matmul) {
                  for (int64_t p = 0; p < w.k; ++p)
                    acc += static_cast<double>(w.a[static_cast<size_t>(i * w.k + p)]) *
                           static_cast<double>(w.b[static_cast<size_t>(p * w.n + j)]);
                } else {
                  acc = w.d[static_cast<size_t>(i * w.n + j)];  // the copy's source
                }
                ref_prod[static_cast<size_t>(i * w.n + j)] = acc;
              }
            if (matmul) {
              bp_kernel* k = find_kernel_checked(c, "matmul", BP_DTYPE_F32);
              bp_tensor_desc io[3] = {
                  make_desc(bufs[0].get(), 0, BP_DTYPE_F32, {1, w.m, w.k}, {w.m * w.k, w.k, 1}),
                  make_desc(bufs[1].get(), 0, BP_DTYPE_F32, {1, w.k, w.n}, {w.k * w.n, w.n, 1}),
                  make_desc(bufs[3].get(), 0, BP_DTYPE_F32, {1, w.m, w.n}, {mn, w.n, 1})};
              c.check(c.launch(k, shared, io, 2, &io[2], 1, {attr_int("allow_tf32", 0)}),
                      format("launch matmul f32 [%lld,%lld]x[%lld,%lld]",
                             static_cast<long long>(w.m), static_cast<long long>(w.k),
                             static_cast<long long>(w.k), static_cast<long long>(w.n)));
            } else {
              c.check(c.t().copy_d2d(shared, bufs[3].get(), 0, bufs[2].get(), 0,
                                     static_cast<uint64_t>(mn) * 4),
                      "copy_d2d");
            }
            for (size_t i = 0; i < ref_sum.size(); ++i)
              ref_sum[i] = add ? ref_prod[i] + static_cast<double>(w.d[i]) : ref_prod[i];
            if (add) {
              bp_kernel* k = find_kernel_checked(c, "add", BP_DTYPE_F32);
              bp_tensor_desc io[3] = {
                  make_desc(bufs[3].get(), 0, BP_DTYPE_F32, {w.m, w.n}, {w.n, 1}),
                  make_desc(bufs[2].get(), 0, BP_DTYPE_F32, {w.m, w.n}, {w.n, 1}),
                  make_desc(bufs[4].get(), 0, BP_DTYPE_F32, {w.m, w.n}, {w.n, 1})};
              c.check(c.t().launch(k, shared, io, 2, &io[2], 1, nullptr, 0),
                      format("launch add f32 [%lld,%lld]", static_cast<long long>(w.m),
                             static_cast<long long>(w.n)));
            } else {
              c.check(c.t().copy_d2d(shared, bufs[4].get(), 0, bufs[3].get(), 0,
                                     static_cast<uint64_t>(mn) * 4),
                      "copy_d2d");
            }
            c.check(c.t().copy_d2h(shared, prod.data(), bufs[3].get(), 0, prod.size() * 4),
                    "copy_d2h");
            c.check(c.t().copy_d2h(shared, sum.data(), bufs[4].get(), 0, sum.size() * 4),
                    "copy_d2h");
            c.check(c.t().stream_synchronize(shared), "stream_synchronize");
            const double tol = tolerance(BP_DTYPE_F32, true);
            const double e1 = relative_error(prod, ref_prod), e2 = relative_error(sum, ref_sum);
            if (e1 > tol || e2 > tol)
              throw Failure(format(
                  "%s [%lld,%lld] relative error %.3g, then %s relative error %.3g (tolerance "
                  "%g): the results of another thread's calls on the stream?",
                  matmul ? "matmul" : "copy", static_cast<long long>(w.m),
                  static_cast<long long>(w.n), e1, add ? "add" : "copy", e2, tol));
            for (DeviceBuffer& buf : bufs) buf.release();
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(mu);
            failures.push_back(format("thread %d, round %d: %s", t, round, e.what()));
            failed = true;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    c.check(c.t().stream_synchronize(shared), "stream_synchronize");
    c.check(c.t().stream_destroy(shared), "stream_destroy");
    if (!failures.empty()) {
      std::string all;
      for (const auto& f : failures) all += (all.empty() ? "" : "; ") + f;
      throw Failure(all);
    }
    c.sync(c.stream());
    if (empty_cache) c.check(c.t().memory_empty_cache(c.device()), "memory_empty_cache");
    const bp_memory_stats now = read_stats(c);
    if (now.allocated != base.allocated || now.num_allocs != base.num_allocs)
      throw Failure(
          format("statistics did not return to the baseline after the stream was destroyed: %llu "
                 "bytes in %llu allocations, expected %llu in %llu",
                 static_cast<unsigned long long>(now.allocated),
                 static_cast<unsigned long long>(now.num_allocs),
                 static_cast<unsigned long long>(base.allocated),
                 static_cast<unsigned long long>(base.num_allocs)));
    if (empty_cache && now.reserved > base.reserved + kReservedSlack)
      throw Failure(
          format("reserved memory grew from %llu to %llu bytes although everything was freed, the "
                 "stream destroyed and the caches emptied: per-stream state set up twice by racing "
                 "threads and leaked?",
                 static_cast<unsigned long long>(base.reserved),
                 static_cast<unsigned long long>(now.reserved)));
    c.note(
        format("%d threads x %d rounds of alloc/h2d/%s/%s/d2h/free on one stream; reserved "
               "%llu -> %llu bytes",
               kStreamThreads, kStreamRounds, matmul ? "matmul f32" : "copy_d2d",
               add ? "add f32" : "copy_d2d", static_cast<unsigned long long>(base.reserved),
               static_cast<unsigned long long>(now.reserved)));
  });

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
