// The random seed of a test run, shared by every test suite: fresh for each run, printed, and
// replayable with BP_TEST_SEED (tools/stress-seeds.sh runs the kernel suites with many fresh
// seeds).
#ifndef BACKPLANE_TEST_SEED_HPP_
#define BACKPLANE_TEST_SEED_HPP_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace bp_test {

// BP_TEST_SEED when set (decimal or 0x hex), else a fresh 64-bit seed; printed once to stderr
// as "<program>: random seed N (rerun with BP_TEST_SEED=N)".
inline uint64_t test_seed(const char* program = "test") {
  static const uint64_t seed = [program] {
    uint64_t s;
    if (const char* v = std::getenv("BP_TEST_SEED"); v && *v) {
      s = std::strtoull(v, nullptr, 0);
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::fprintf(stderr, "%s: random seed %llu (rerun with BP_TEST_SEED=%llu)\n", program,
                 static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// The run's generator, seeded with test_seed(program).
inline std::mt19937_64& rng(const char* program = "test") {
  static std::mt19937_64 g(test_seed(program));
  return g;
}

}  // namespace bp_test

#endif  // BACKPLANE_TEST_SEED_HPP_
