// The SDK's size-class cache (size_class_cache.hpp) and allocation counters
// (memory_counters.hpp): classes, reuse, bounds, and many threads parking and taking blocks at
// once without any block being handed out twice or lost.
#include <gtest/gtest.h>
#include <backplane/sdk/memory_counters.hpp>
#include <backplane/sdk/size_class_cache.hpp>
#include <backplane_test/seed.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

using bp::sdk::class_bytes;
using bp::sdk::size_class;

std::mt19937_64& rng() {
  return bp_test::rng("bp_sdk_tests");
}

TEST(SizeClasses, ExactValues) {
  EXPECT_EQ(size_class(1), 0);
  EXPECT_EQ(size_class(512), 0);
  EXPECT_EQ(class_bytes(0), 512u);
  EXPECT_EQ(size_class(513), 1);
  EXPECT_EQ(class_bytes(1), 640u);  // 512 + 128: four classes per power of two
  EXPECT_EQ(class_bytes(2), 768u);
  EXPECT_EQ(class_bytes(3), 896u);
  EXPECT_EQ(class_bytes(4), 1024u);
  EXPECT_EQ(size_class(1024), 4);
  EXPECT_EQ(size_class(1025), 5);
  EXPECT_EQ(class_bytes(5), 1280u);
  EXPECT_EQ(size_class(uint64_t{1} << 20), 44);
  EXPECT_EQ(class_bytes(44), uint64_t{1} << 20);
  EXPECT_EQ(size_class((uint64_t{1} << 20) + 1), 45);
  EXPECT_EQ(class_bytes(45), (uint64_t{5} << 18));
  EXPECT_EQ(class_bytes(size_class(uint64_t{3} << 40)), uint64_t{3} << 40);
}

TEST(SizeClasses, EveryClassCoversItsRangeWithAtMostAQuarterSlack) {
  for (int c = 0; c < 1 + 4 * 50; ++c) {
    const uint64_t b = class_bytes(c);
    ASSERT_EQ(size_class(b), c) << "class " << c;
    ASSERT_EQ(size_class(b + 1), c + 1) << "class " << c;
    if (c > 0) {
      ASSERT_GT(b, class_bytes(c - 1));
    }
  }
  std::uniform_int_distribution<int> bits(1, 50);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t n = 1 + (rng()() >> (64 - bits(rng())));
    const uint64_t b = class_bytes(size_class(n));
    ASSERT_GE(b, n);
    if (n > 512) {
      ASSERT_LT(b - n, n / 4 + 1) << n;
    }
    ASSERT_GE(b, 512u);
  }
}

struct Block {
  std::atomic<int> holders{0};  // threads that believe they own it (must never exceed 1)
  int payload = 0;
};

template <int MaxLog2, int PerClass>
using Cache = bp::sdk::SizeClassCache<Block, MaxLog2, PerClass>;

TEST(SizeClassCache, ClassOfRefusesBlocksAboveTheLargestClass) {
  using C = Cache<20, 4>;
  EXPECT_EQ(C::kNumClasses, 45);
  EXPECT_EQ(C::class_of(1), 0);
  EXPECT_EQ(C::class_of(uint64_t{1} << 20), 44);
  EXPECT_EQ(C::class_of((uint64_t{1} << 20) + 1), -1);
  EXPECT_EQ(C::class_of(~uint64_t{0}), -1);
}

TEST(SizeClassCache, ParkedBlockIsTakenBackOnceAndOnlyForItsClass) {
  Cache<20, 4> cache(uint64_t{1} << 30);
  Block a, b;
  const int c = size_class(3000);
  EXPECT_EQ(cache.take(c), nullptr);
  ASSERT_TRUE(cache.put(c, &a));
  EXPECT_EQ(cache.bytes(), class_bytes(c));
  EXPECT_EQ(cache.take(c + 1), nullptr);
  EXPECT_EQ(cache.take(c - 1), nullptr);
  ASSERT_TRUE(cache.put(c, &b));
  EXPECT_EQ(cache.bytes(), 2 * class_bytes(c));
  Block* first = cache.take(c);
  Block* second = cache.take(c);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(first, second);
  EXPECT_TRUE((first == &a && second == &b) || (first == &b && second == &a));
  EXPECT_EQ(cache.take(c), nullptr);
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(SizeClassCache, FullClassAndByteBoundRefuseBlocks) {
  Block blocks[8];
  {
    Cache<20, 4> cache(uint64_t{1} << 30);  // four slots per class
    const int c = size_class(100000);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(cache.put(c, &blocks[i])) << i;
    EXPECT_FALSE(cache.put(c, &blocks[4])) << "a class holds four blocks";
    EXPECT_EQ(cache.bytes(), 4 * class_bytes(c)) << "a refused block is not counted";
    EXPECT_TRUE(cache.put(c + 1, &blocks[4])) << "another class has room";
    ASSERT_NE(cache.take(c), nullptr);
    EXPECT_TRUE(cache.put(c, &blocks[5])) << "a slot freed by take is reused";
  }
  {
    const int c = size_class(4096);
    Cache<20, 4> cache(3 * class_bytes(c));  // room for three blocks of class c
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.put(c, &blocks[i])) << i;
    EXPECT_FALSE(cache.put(c, &blocks[3])) << "past max_bytes";
    EXPECT_FALSE(cache.put(0, &blocks[3])) << "past max_bytes (a smaller class)";
    EXPECT_EQ(cache.bytes(), 3 * class_bytes(c));
    ASSERT_NE(cache.take(c), nullptr);
    EXPECT_TRUE(cache.put(0, &blocks[3]));
  }
}

TEST(SizeClassCache, DrainHandsBackEveryBlockWithItsClass) {
  Cache<24, 4> cache(uint64_t{1} << 30);
  std::vector<Block> blocks(40);
  std::vector<int> cls(blocks.size());
  std::uniform_int_distribution<int> pick(0, Cache<24, 4>::kNumClasses - 1);
  size_t parked = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    cls[i] = pick(rng());
    if (cache.put(cls[i], &blocks[i])) {
      blocks[i].payload = 1;
      ++parked;
    }
  }
  std::vector<int> seen(blocks.size(), 0);
  const int n = cache.drain([&](Block* b, int c) {
    const size_t i = static_cast<size_t>(b - blocks.data());
    ASSERT_LT(i, blocks.size());
    EXPECT_EQ(c, cls[i]);
    EXPECT_EQ(b->payload, 1) << "only parked blocks come back";
    ++seen[i];
  });
  EXPECT_EQ(static_cast<size_t>(n), parked);
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(seen[i], blocks[i].payload) << i;
  EXPECT_EQ(cache.bytes(), 0u);
  for (int c = 0; c < Cache<24, 4>::kNumClasses; ++c) EXPECT_EQ(cache.take(c), nullptr);
}

// Many threads park and take blocks of three classes through four slots each, so slots are
// contended all the time. Every block carries a holder count: taking a block that someone
// else still holds (a block handed out twice) makes it 2. A thread writes its id into the
// payload while it holds a block and checks it is unchanged before parking it again (under
// ThreadSanitizer a second holder is also a data race). At the end every block is held by a
// thread or parked, exactly once: none lost, none duplicated.
TEST(SizeClassCache, ConcurrentParkAndTakeNeverHandsABlockOutTwice) {
  constexpr int kThreads = 8, kBlocksPerThread = 6, kIters = 200000;
  constexpr int kClasses[] = {0, 7, 30};
  using C = Cache<20, 4>;
  // Byte bound between 2 and 3 full classes: puts also fail on bytes, not only on slots.
  C cache(4 * (class_bytes(0) + class_bytes(7) + class_bytes(30)) / 2 + class_bytes(30));
  std::vector<std::unique_ptr<Block>> blocks;
  for (int i = 0; i < kThreads * kBlocksPerThread; ++i) blocks.push_back(std::make_unique<Block>());
  const uint64_t seed = rng()();
  std::atomic<int> double_holds{0}, payload_changes{0}, ready{0};
  std::vector<std::vector<std::pair<Block*, int>>> held(kThreads);  // (block, class)
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 g(seed + static_cast<uint64_t>(t));
      auto& mine = held[t];
      for (int i = 0; i < kBlocksPerThread; ++i) {
        Block* b = blocks[t * kBlocksPerThread + i].get();
        b->holders.fetch_add(1);
        b->payload = t;
        mine.push_back({b, kClasses[i % 3]});
      }
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (int it = 0; it < kIters; ++it) {
        if (!mine.empty() && (g() & 1)) {  // park one of ours
          const size_t k = g() % mine.size();
          auto [b, c] = mine[k];
          if (b->payload != t) payload_changes.fetch_add(1);
          b->holders.fetch_sub(1);
          if (cache.put(c, b)) {
            mine[k] = mine.back();
            mine.pop_back();
          } else if (b->holders.fetch_add(1) != 0) {
            double_holds.fetch_add(1);
          }
        } else {  // take one of a random class
          const int c = kClasses[g() % 3];
          if (Block* b = cache.take(c)) {
            if (b->holders.fetch_add(1) != 0) double_holds.fetch_add(1);
            b->payload = t;
            mine.push_back({b, c});
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(double_holds.load(), 0) << "a block was handed out while another thread held it";
  EXPECT_EQ(payload_changes.load(), 0) << "a held block was written by another thread";
  std::vector<int> count(blocks.size(), 0);
  auto index = [&](Block* b) {
    for (size_t i = 0; i < blocks.size(); ++i)
      if (blocks[i].get() == b) return i;
    ADD_FAILURE() << "a pointer that is no block came out of the cache";
    return size_t{0};
  };
  for (auto& mine : held)
    for (auto [b, c] : mine) {
      ++count[index(b)];
      EXPECT_EQ(b->holders.load(), 1);
    }
  uint64_t parked_bytes = 0;
  cache.drain([&](Block* b, int c) {
    ++count[index(b)];
    parked_bytes += class_bytes(c);
    EXPECT_EQ(b->holders.load(), 0) << "a parked block is held by nobody";
  });
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(count[i], 1) << "block " << i;
  EXPECT_LE(parked_bytes, cache.max_bytes());
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(MemoryCounters, CountsBytesPeakLiveAndTotal) {
  bp::sdk::MemoryCounters m;
  m.on_alloc(100);
  m.on_alloc(0);
  m.on_alloc(50);
  EXPECT_EQ(m.allocated(), 150u);
  EXPECT_EQ(m.live(), 3u);
  EXPECT_EQ(m.total(), 3u);
  EXPECT_EQ(m.peak(), 150u);
  m.on_free(100);
  EXPECT_EQ(m.allocated(), 50u);
  EXPECT_EQ(m.live(), 2u);
  EXPECT_EQ(m.total(), 3u);
  EXPECT_EQ(m.peak(), 150u);
  m.reset_peak();
  EXPECT_EQ(m.peak(), 50u);
  m.on_alloc(20);
  EXPECT_EQ(m.peak(), 70u);
  bp_memory_stats s{};
  s.struct_size = sizeof s;
  s.reserved = 12345;
  m.fill(s);
  EXPECT_EQ(s.allocated, 70u);
  EXPECT_EQ(s.peak_allocated, 70u);
  EXPECT_EQ(s.num_allocs, 3u);
  EXPECT_EQ(s.reserved, 12345u) << "fill leaves reserved alone";
}

TEST(MemoryCounters, ManyThreadsEndExact) {
  bp::sdk::MemoryCounters m;
  constexpr int kThreads = 8, kIters = 5000;
  const uint64_t seed = rng()();
  std::vector<uint64_t> max_live(kThreads, 0), allocs(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 g(seed + static_cast<uint64_t>(t));
      std::vector<uint64_t> live;
      uint64_t bytes = 0;
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 4 && (live.empty() || (g() & 1))) {
          const uint64_t n = g() % 10000;
          m.on_alloc(n);
          live.push_back(n);
          bytes += n;
          ++allocs[t];
          max_live[t] = std::max(max_live[t], bytes);
        } else {
          const size_t k = g() % live.size();
          m.on_free(live[k]);
          bytes -= live[k];
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (uint64_t n : live) m.on_free(n);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(m.allocated(), 0u);
  EXPECT_EQ(m.live(), 0u);
  uint64_t total = 0, sum_max = 0, one_max = 0;
  for (int t = 0; t < kThreads; ++t) {
    total += allocs[t];
    sum_max += max_live[t];
    one_max = std::max(one_max, max_live[t]);
  }
  EXPECT_EQ(m.total(), total);
  EXPECT_GE(m.peak(), one_max);
  EXPECT_LE(m.peak(), sum_max);
}

}  // namespace
