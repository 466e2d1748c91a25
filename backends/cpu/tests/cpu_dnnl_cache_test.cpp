// The primitive cache of Note [CPU primitive cache] (cpu_dnnl_cache.hpp), linked from the
// backend's objects: bounded with least-recently-used eviction, one build per key even when
// many threads miss it together, a failed build retried, and entries that outlive eviction.
#include "../cpu_dnnl_cache.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace bp::cpu {
namespace {

TEST(DnnlCache, BoundedLeastRecentlyUsed) {
  std::atomic<int> builds{0};
  auto make = [&] {
    ++builds;
    return DnnlPrimitive{};
  };
  const std::string prefix = "lru-test ";
  dnnl_cached(prefix + "keep", 1, make);
  for (size_t i = 0; i < kDnnlCacheCapacity + 40; ++i) {
    dnnl_cached(prefix + std::to_string(i), 1, make);
    if (i % 16 == 0) dnnl_cached(prefix + "keep", 1, make);  // stays recently used
  }
  EXPECT_EQ(dnnl_cache_size(), kDnnlCacheCapacity);
  const int before = builds.load();
  dnnl_cached(prefix + "keep", 1, make);  // still cached: no build
  EXPECT_EQ(builds.load(), before);
  dnnl_cached(prefix + "0", 1, make);  // the oldest was evicted: built again
  EXPECT_EQ(builds.load(), before + 1);
}

TEST(DnnlCache, OneBuildPerKeyAcrossThreads) {
  std::atomic<int> builds{0};
  std::atomic<int> go{0};
  std::vector<std::thread> threads;
  std::vector<const DnnlPrimitive*> seen(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      ++go;
      while (go.load() < 8) std::this_thread::yield();
      seen[static_cast<size_t>(t)] = dnnl_cached("threads-test", 1, [&] {
                                       ++builds;
                                       std::this_thread::sleep_for(std::chrono::milliseconds(20));
                                       return DnnlPrimitive{};
                                     }).get();
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(builds.load(), 1);
  for (const DnnlPrimitive* p : seen) EXPECT_EQ(p, seen[0]);
}

TEST(DnnlCache, AFailedBuildIsRetriedAndEntriesOutliveEviction) {
  int calls = 0;
  EXPECT_THROW(dnnl_cached("failing-test", 1,
                           [&]() -> DnnlPrimitive {
                             ++calls;
                             throw std::runtime_error("no implementation");
                           }),
               std::runtime_error);
  const auto held = dnnl_cached("failing-test", 1, [&] {
    ++calls;
    DnnlPrimitive p;
    p.native = false;
    return p;
  });
  EXPECT_EQ(calls, 2);
  for (size_t i = 0; i < kDnnlCacheCapacity + 1; ++i)
    dnnl_cached("evict " + std::to_string(i), 1, [] { return DnnlPrimitive{}; });
  EXPECT_FALSE(held->native);  // evicted from the cache, alive through the shared_ptr
}

// Note [CPU primitive cache]: an entry is built with OpenMP's thread count set to the count it
// is for, records it, and is keyed by it (oneDNN 2.x fixes a primitive's thread count when it
// is created; one built on a thread whose count differs from its calls' starts OpenMP teams
// of its own). Before this, a convolution probed on the launching thread (count: every core)
// was run one-threaded on oneTBB workers.
TEST(DnnlCache, EntriesAreBuiltForAndKeyedByTheirOpenMpThreadCount) {
  const int outer = omp_get_max_threads();
  std::vector<int> built_with;
  auto make = [&] {
    built_with.push_back(omp_get_max_threads());
    return DnnlPrimitive{};
  };
  const auto one = dnnl_cached("omp-test", 1, make);
  const auto three = dnnl_cached("omp-test", 3, make);
  EXPECT_EQ(one->threads, 1);
  EXPECT_EQ(three->threads, 3);
  EXPECT_NE(one.get(), three.get());
  ASSERT_EQ(built_with.size(), 2u);
  EXPECT_EQ(built_with[0], 1);
  EXPECT_EQ(built_with[1], 3);
  EXPECT_EQ(omp_get_max_threads(), outer) << "the count is restored after the build";
  EXPECT_EQ(dnnl_cached("omp-test", 3, make).get(), three.get());  // cached: no build
  EXPECT_EQ(dnnl_cached("omp-test", 0, make).get(), one.get());    // at least one thread
  EXPECT_EQ(built_with.size(), 2u);
}

}  // namespace
}  // namespace bp::cpu
