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
  dnnl_cached(prefix + "keep", make);
  for (size_t i = 0; i < kDnnlCacheCapacity + 40; ++i) {
    dnnl_cached(prefix + std::to_string(i), make);
    if (i % 16 == 0) dnnl_cached(prefix + "keep", make);  // stays recently used
  }
  EXPECT_EQ(dnnl_cache_size(), kDnnlCacheCapacity);
  const int before = builds.load();
  dnnl_cached(prefix + "keep", make);  // still cached: no build
  EXPECT_EQ(builds.load(), before);
  dnnl_cached(prefix + "0", make);  // the oldest was evicted: built again
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
      seen[static_cast<size_t>(t)] = dnnl_cached("threads-test", [&] {
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
  EXPECT_THROW(dnnl_cached("failing-test",
                           [&]() -> DnnlPrimitive {
                             ++calls;
                             throw std::runtime_error("no implementation");
                           }),
               std::runtime_error);
  const auto held = dnnl_cached("failing-test", [&] {
    ++calls;
    DnnlPrimitive p;
    p.native = false;
    return p;
  });
  EXPECT_EQ(calls, 2);
  for (size_t i = 0; i < kDnnlCacheCapacity + 1; ++i)
    dnnl_cached("evict " + std::to_string(i), [] { return DnnlPrimitive{}; });
  EXPECT_FALSE(held->native);  // evicted from the cache, alive through the shared_ptr
}

}  // namespace
}  // namespace bp::cpu
